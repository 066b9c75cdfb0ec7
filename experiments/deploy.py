"""Deployment targets on the command line: ``--target`` and ``--trace``, the exports and the table.

``search`` and ``run`` take ``--target {executor,torchtitan,megatron}``: the target's own search
method joins the methods (:data:`agents.target_search.TARGET_METHODS`), the best plan is the fastest
feasible one the target can run, and the output folder receives, for the fastest plan each
runtime can run, ``megatron_args.txt`` (Megatron-LM's arguments) and ``torchtitan.toml`` (its
``[parallelism]`` fragment, beside the plan's CSV), or a one-line reason. ``--trace FILE.json``
writes the predicted (and measured, where there is one) timeline in the Chrome trace format.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents.base import SearchResult
from pipeline.errors import ConfigError
from pipeline.plan import Plan
from pipeline.simulator import stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig
from pipeline.targets import TARGETS, megatron_args, model_reason, target_reason, torchtitan_fragment
from pipeline.trace import chrome_trace, write_trace

__all__ = ["add_target_arguments", "add_trace_argument", "with_target_method", "best_for",
           "write_exports", "write_plan_trace", "print_targets"]


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=TARGETS, default="executor",
                        help="runtime the plan must run in: executor (any plan), torchtitan (loop or V placement, "
                             "any CSV order), megatron (looped placement, Megatron's own 1F1B/interleaved order, "
                             "uneven layout); default executor")


def add_trace_argument(parser: argparse.ArgumentParser, what: str = "the plan's predicted timeline") -> None:
    parser.add_argument("--trace", metavar="FILE.json",
                        help=f"write {what} in the Chrome trace format (Perfetto, chrome://tracing)")


def with_target_method(methods: Sequence[str], target: str) -> list[str]:
    """``methods`` plus the target's own search method (once; the executor's, ``adaptis``, only
    when asked for: every plan runs there)."""
    from agents.target_search import TARGET_METHODS

    out = list(methods)
    if target != "executor" and TARGET_METHODS[target] not in out:
        out.append(TARGET_METHODS[target])
    return out


def best_for(target: str, candidates: Sequence[SearchResult], profile: ModelProfile) -> SearchResult | None:
    """The fastest feasible search result whose plan ``target`` can run (the first of equals)."""
    ok = [c for c in candidates if c.feasible and target_reason(target, c.plan, profile) is None]
    return min(ok, key=lambda c: c.iteration_time, default=None)


def write_exports(out: Path, candidates: Sequence[SearchResult], profile: ModelProfile, *,
                  best: SearchResult | None, reference: float | None) -> list[dict[str, Any]]:
    """Write ``megatron_args.txt`` and ``torchtitan.toml`` for the fastest plan each of those
    runtimes can run (``best``'s CSV ``plan.csv`` when it is that plan, else its own
    ``torchtitan_plan.csv``/``.json``); one row per target with its best method, time, speedup
    over ``reference`` and the file written or the reason none was. Also ``targets.json``."""
    rows = []
    for target in TARGETS:
        pick = best_for(target, candidates, profile)
        row: dict[str, Any] = {"target": target, "method": pick.method if pick else None,
                               "iteration_time": pick.iteration_time if pick else None,
                               "speedup": reference / pick.iteration_time if pick and reference else None, "file": None}
        if pick is None:
            row["reason"] = model_reason(target, profile) or "no feasible plan among the searched ones runs there"
        elif target == "executor":
            row["file"] = "plan.json" if best is not None and pick.plan == best.plan else None
        elif target == "megatron":
            (out / "megatron_args.txt").write_text(megatron_args(pick.plan, profile))
            row["file"] = "megatron_args.txt"
        else:
            if best is not None and pick.plan == best.plan:
                csv = out / "plan.csv"
            else:
                csv = out / "torchtitan_plan.csv"
                pick.plan.save_csv(csv)
                pick.plan.save(out / "torchtitan_plan.json")
            (out / "torchtitan.toml").write_text(torchtitan_fragment(pick.plan, profile, csv_path=str(csv)))
            row["file"] = "torchtitan.toml"
        if row.get("reason"):
            for name in {"megatron": ("megatron_args.txt",), "torchtitan": ("torchtitan.toml",)}.get(target, ()):
                (out / name).unlink(missing_ok=True)
        rows.append(row)
    (out / "targets.json").write_text(json.dumps(rows) + "\n")
    return rows


def print_targets(rows: Sequence[Mapping[str, Any]], chosen: str, unit: str) -> None:
    """The per-target lines: best method, time, speedup over Megatron, what was written."""
    print("\nper deployment target (fastest feasible plan the runtime can run; speedup over the Megatron baseline):")
    for r in rows:
        mark = "*" if r["target"] == chosen else " "
        if r["method"] is None:
            print(f" {mark} {r['target']:<10}  cannot: {r['reason']}")
            continue
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "n/a"
        file = f" -> {r['file']}" if r.get("file") else ""
        print(f" {mark} {r['target']:<10}  {r['method']:<20} {r['iteration_time']:10.4g} {unit}  {speed}{file}")


def write_plan_trace(path: str | Path, plan: Plan, profile: ModelProfile, *, cluster: Cluster,
                     predicted: Mapping[str, Any] | None, measured: Mapping[str, Any] | None = None,
                     training: TrainingConfig = TrainingConfig(), title: str = "") -> Path:
    """Write a Chrome trace of ``plan``: the predicted timeline with its transfers (priced by the
    profile and cluster) and the measured one when given."""
    if predicted is None and measured is None:
        raise ConfigError("no timeline to write: the plan did not simulate", field="--trace")
    comm = None
    if predicted is not None:
        costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training)
        comm = costs.comm
        unit = predicted.get("time_unit", profile.time_unit)
        if unit != profile.time_unit:  # predicted timelines converted to ms by replay: convert comm too
            from pipeline.spec import TIME_UNITS

            comm = tuple(c * TIME_UNITS[profile.time_unit] / TIME_UNITS[unit] for c in comm)
    trace = chrome_trace(predicted=predicted, measured=measured, placement=plan.placement, comm=comm,
                         title=title or plan.method)
    return write_trace(path, trace)
