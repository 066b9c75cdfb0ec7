"""The whole workflow in one tracked run: costs, search (tuner + RL policy), replay, summary.

On this machine (no --gpu, no --cluster) it profiles the model and the link on --devices local
ranks with the executor (gloo on CPU), searches plans with those measured costs, replays the best
plan and the Megatron baseline under torchrun, and compares prediction with measurement. With
--gpu NAME it uses the analytic costs of that GPU for a cluster of --devices and skips the
replay (the cluster is not this machine) with a note.

Ends with one summary: predicted and measured iteration times, speedup over Megatron, bubbles,
peak memory, and where the time went (per device busy/bubble and dominant layer kind; layer kinds
by share of the compute; measured time by F/I/W/B). Writes to --out: plan.json, plan.csv,
profile.json, cluster.json, search_rows.jsonl (each method's row as it ends; kept on Ctrl-C),
gantt_predicted.png, gantt_measured.png, gantt_fidelity.png and summary.json. Before each torchrun
job the ranks' memory is checked against this machine's (executor/preflight.py). Logs one W&B
group (offline by default): runs profile, [train,] search, [replay,] summary; the summary run
holds the metrics, tables, Gantt charts and the plan artifact.
Every field of experiments.workflow.WorkflowConfig is a flag (its docstring is the help below).
--target {executor,torchtitan,megatron} keeps the plan inside what that runtime runs and writes
megatron_args.txt / torchtitan.toml (experiments/deploy.py); --trace FILE.json writes the best
plan's predicted and measured timelines in the Chrome trace format.

Examples:
  python -m experiments run                                     # tiny-hybrid on 2 local CPU ranks
  python -m experiments run --model tiny-hybrid --devices 2 --train-policy 2000
  python -m experiments run --model gemma-medium --gpu h100 --devices 8   # analytic, no replay
  python -m experiments run --hf-config config.json --gpu a100 --devices 4 --memory-gb 40
  python -m experiments run --model gemma-small --gpu h100 --devices 4 --target megatron --trace t.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from agents.run_methods import Interrupted
from experiments.common import (
    add_strict_arg,
    check_file_path,
    check_microbatches,
    interrupted,
    non_negative_float,
    non_negative_int,
    print_table,
)
from experiments.dataclass_args import add_dataclass_arguments, dataclass_from_args
from experiments.deploy import print_targets
from experiments.workflow import SEARCH_ROWS, WorkflowConfig, WorkflowReport, run_workflow

__all__ = ["NAME", "HELP", "add_arguments", "run", "config_from_args", "print_report", "method_list", "GROUPS",
           "drift_note"]

NAME = "run"
#: How far apart (relative) the calibration plans may measure in the calibration job and the final
#: replay before ``run`` says the machine changed speed between the two.
DRIFT_NOTE = 0.10
HELP = "the whole workflow: profile or analytic costs, search (tuner + RL), replay, compare, one W&B group"


def method_list(text: str) -> tuple[str, ...]:
    """``--method``: comma-separated method names, blanks dropped (the search always adds megatron)."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


#: WorkflowConfig fields whose flag is not named after them.
RENAME = {"profile_path": "profile", "cluster_path": "cluster", "methods": "method", "project": "wandb_project"}
#: Fields whose values are not "a whole number >= 1" / "a positive number" / text (the types' checks).
PARSERS = {"seed": int, "methods": method_list, "train_policy": non_negative_int, "warmup": non_negative_int,
           "calibration_plans": non_negative_int, "memory_reserve_gb": non_negative_float}
#: How the help names a flag's value where the flag's own name would not say it.
METAVARS = {"hf_config": "FILE", "profile_path": "FILE", "cluster_path": "FILE", "head_shards": "K",
            "train_policy": "TIMESTEPS", "calibration_plans": "N", "trace": "FILE.json"}
#: The fields that name the model: one or the other (argparse refuses both).
MODEL_FIELDS = ("model", "hf_config")
#: Argument group of --help -> its fields, in order; fields in none are plain options.
GROUPS = {
    "model (one of)": ("profile_path", "seq_len", "microbatch_size", "scale", "granularity", "head_shards"),
    "cluster (default: this machine)": ("gpu", "cluster_path", "devices", "gpus_per_node", "memory_gb",
                                        "memory_reserve_gb"),
    "search": ("microbatches", "methods", "budget", "max_seconds", "seed", "perturb_moves", "policy",
               "train_policy"),
    "replay (this machine only)": ("replay", "steps", "choose", "candidates", "warmup", "profile_repeats",
                                   "calibration_plans", "contention", "threads", "timeout"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`experiments.workflow.WorkflowConfig` field (:mod:`experiments.dataclass_args`),
    in the groups of :data:`GROUPS`, plus ``--strict`` and ``--json``."""
    flags = {"rename": RENAME, "parsers": PARSERS, "metavars": METAVARS}
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    model = groups["model (one of)"]
    add_dataclass_arguments(model.add_mutually_exclusive_group(), WorkflowConfig, only=MODEL_FIELDS, **flags)
    for title, fields in GROUPS.items():
        add_dataclass_arguments(groups[title], WorkflowConfig, only=fields, **flags)
    add_strict_arg(model)
    placed = {*MODEL_FIELDS, *(name for fields in GROUPS.values() for name in fields)}
    rest = [f.name for f in dataclasses.fields(WorkflowConfig) if f.name not in placed]
    add_dataclass_arguments(parser, WorkflowConfig, only=rest, **flags)
    parser.add_argument("--json", action="store_true", help="print summary.json's content as one JSON line")


def config_from_args(args: argparse.Namespace) -> WorkflowConfig:
    """The :class:`WorkflowConfig` that the parsed arguments describe."""
    return dataclass_from_args(WorkflowConfig, args)


def drift_note(ratio: float | None) -> str | None:
    """What to tell the user when the calibration plans measured more than :data:`DRIFT_NOTE` apart
    between the calibration job and the final replay (``ratio``: final over calibration), else None."""
    if not ratio or abs(ratio - 1) <= DRIFT_NOTE:
        return None
    return (f"the machine ran {abs(ratio - 1):.0%} {'slower' if ratio > 1 else 'faster'} in this replay than in the "
            "calibration job: the same calibration plans measured that much apart, so a prediction made before this "
            "job is off by about as much; the one calibrated in the same job is the check")


def print_report(report: WorkflowReport) -> None:
    """The summary on stdout: comparison, where the time went, files, W&B group."""
    cfg, costs = report.config, report.costs
    p, c = costs.profile, costs.cluster
    where = (f"this machine ({costs.device or 'cpu'}, {costs.backend or 'gloo'}, costs {costs.source})" if costs.local
             else f"{c.name} (costs {costs.source})")
    unit = p.time_unit
    print(f"\n{cfg.label}: {p.num_layers} layers on {c.devices} devices of {where}, "
          f"{report.best.plan.microbatches} micro-batches of {p.microbatch_size}x{p.seq_len} tokens\n")
    table = []
    for r in report.rows:
        bubble = r.get("bubble")
        table.append({"method": r["method"] + ("" if r.get("feasible", True) or not r.get("valid") else " (OOM)"),
                      f"predicted_{unit}": r.get("iteration_time") if r.get("iteration_time") is not None
                      else (r.get("note") or r.get("error") or "")[:60],
                      "speedup": r.get("speedup"), "bubble_%": None if bubble is None else 100 * bubble,
                      "peak_GiB": r.get("peak_memory_max_gb"),
                      "measured_ms": r.get("measured_ms"), "meas_speedup": r.get("measured_speedup"),
                      "meas_bubble_%": r.get("measured_bubble_pct"), "pred_err_%": r.get("error_pct"),
                      "same_job_err_%": r.get("same_job_error_pct")})
    table = [{k: ("" if v is None else v) for k, v in row.items()} for row in table]
    empty = [k for k in table[0] if all(row[k] == "" for row in table)]
    table = [{k: v for k, v in row.items() if k not in empty} for row in table]
    print_table(table, list(table[0]), title="methods (speedup = over megatron; measured = replayed here)")
    s = report.summary
    line = f"\nbest: {s['best_method']} predicted {s['predicted_time']:.4g} {unit}"
    if "predicted_speedup" in s:
        line += f", {s['predicted_speedup']:.2f}x megatron predicted"
    if "measured_speedup" in s:
        line += (f", {s['measured_speedup']:.2f}x measured ({s['measured_ms']:.4g} ms vs "
                 f"{s['megatron_measured_ms']:.4g} ms)")
    elif "measured_ms" in s:
        line += f", measured {s['measured_ms']:.4g} ms"
    if "prediction_error_pct" in s:
        line += f"; prediction error {s['prediction_error_pct']:+.1f}%"
        if "same_job_error_pct" in s:
            line += f" ({s['same_job_error_pct']:+.1f}% calibrated on the random plans replayed in the same job)"
    if s.get("chosen_by") == "measured":
        line += "\n  (chosen by measurement on the even timed steps; the measured times are the odd steps')"
    note = drift_note(s.get("calibration_plans_ratio"))
    if note:
        line += f"\n  ({note})"
    print(line)
    print()
    print_table(report.devices, list(report.devices[0]),
                title=f"where the time went: {s['best_method']} per device (busy in {unit}; top_kind = layer kind "
                      "taking most of its compute)")
    print()
    print_table(report.kinds, list(report.kinds[0]), title="layer kinds by share of the compute (f/b/w per layer)")
    ops = ", ".join(f"{op} {pct:.0f}%" for op, pct in report.op_share.items())
    print(f"\n{'measured' if report.best.method in report.measured else 'predicted'} busy time by action: {ops}")
    if s.get("targets"):
        print_targets(s["targets"], cfg.target, unit)
    for note in report.notes:
        print(f"note: {note}")
    print(f"\nfiles: {cfg.out}/ (plan.json, plan.csv, profile.json, cluster.json, {SEARCH_ROWS}, "
          + ", ".join(sorted({k.split('/')[-1] for k in report.files if k.startswith('gantt')})) + " gantt PNGs, "
          "summary.json)")
    if report.run_dirs:
        print(f"W&B group {report.group!r} (offline): {len(report.run_dirs)} runs in "
              f"{min(report.run_dirs.values()).rsplit('/', 1)[0]}; upload with: wandb sync <run folder>")
    print(f"took {report.seconds.get('total', 0):.0f} s")


#: What the workflow writes to --out, in the order its phases write them.
KEPT_FILES = ("profile.json", "cluster.json", "calibrated_profile.json", "policy/policy.pth", SEARCH_ROWS, "plan.json",
              "plan.csv", "megatron_args.txt", "torchtitan.toml", "summary.json")


def kept_files(out: Path) -> str:
    """What an interrupted workflow left in ``out`` (for its last line): the files written so far, with
    the methods whose search rows were kept, or none."""
    kept = [name for name in KEPT_FILES if (out / name).is_file()]
    if not kept:
        return f"stopped before any file was written to {out}"
    line = f"kept {', '.join(kept)} in {out}"
    if "plan.json" not in kept:
        methods = []
        if SEARCH_ROWS in kept:
            for text in (out / SEARCH_ROWS).read_text().splitlines():
                try:
                    methods.append(str(json.loads(text)["method"]))
                except (ValueError, KeyError, TypeError):
                    continue
        if methods:
            line += (f" ({SEARCH_ROWS}: the rows of {len(methods)} finished method{'s' if len(methods) > 1 else ''}, "
                     f"{', '.join(methods)})")
        line += "; the search had not finished: no plan yet"
    return line


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    check_file_path(cfg.trace, "--trace")  # before the workflow, not after it
    if cfg.microbatches is not None:
        check_microbatches(cfg.microbatches, cfg.devices)
    try:
        report = run_workflow(cfg)
    except (KeyboardInterrupt, SystemExit, Interrupted) as stop:  # Ctrl-C, or SIGTERM (experiments.cli makes it
        return interrupted(stop, kept_files(Path(cfg.out)))  # SystemExit); a torchrun job was stopped by the executor
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        print_report(report)
    return 0
