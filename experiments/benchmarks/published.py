"""Published GPU measurements beside the runtime model's predictions.

Reads a table in the format of ``shared/data/published/*.json`` (each row: model, parallel degrees,
batch, schedule, hardware, what was measured, and for Zero Bubble rows the authors' profiled
per-stage F/B/W and transfer times). For each pure-pipeline row (tp = dp = cp = 1) whose stage
times are known, it builds the row's pipeline from those times, schedules it as the row's schedule
does, simulates it under the runtime that ran it (:mod:`pipeline.runtime`) and predicts the row's
throughput in the row's unit. Rows without stage times take those of the same model and micro-batch
size from another row of the file (an input the authors published, not a fit). Rows in TFLOP/s per
GPU (Megatron-LM's multi-dimensional runs: TP x PP x DP) are rebuilt analytically by the whole-job
model (:mod:`experiments.benchmarks.published_job`, docs/whole-job.md). Rows without their degrees
or stage times, or with a schedule we do not know, get ``"predicted": null`` and a reason.

Schedules: ``1F1B`` and ``1F1B-I`` (every layer its own chunk: ceil(layers / p) chunks per device)
run Megatron-LM's orders on the ``megatron`` runtime; ``ZB-1p`` / ``ZB-2p`` are the best
list-scheduled orders within p / 2p micro-batches of activations per device on the ``zb`` runtime
(their ILP-searched schedules are not public as orders); ``ZB-2p`` with an all-reduce before the
optimizer step runs on ``zb-sync``.

Printed: measured beside predicted per row; then the summary: median and maximum absolute
throughput error, the median error of each schedule's ratio to 1F1B in its group (same model and
micro-batches), and the groups whose schedules are ranked as measured (ties within 1%). ``--json``
prints one object per row, ``{"id", "unit", "measured", "predicted"}`` (plus ``"reason"`` where
it cannot predict), then the summary object. ``--fit`` grid-searches the runtime's three shared
parameters (compute scale, per-action overhead, step time) on the file's rows and prints the best
(on a file of whole-job rows: the source's compute scale and per-iteration time).

  python -m experiments.benchmarks.published ../shared/data/published/zero_bubble_qi2024_dev.json
  python -m experiments.benchmarks.published FILE --json
  python -m experiments.benchmarks.published FILE --fit
  python -m experiments.benchmarks.published FILE --runtime ideal     # the model without a runtime
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.benchmarks.published_job import fit_job_source, infer_job_degrees, is_tflops_unit, predict_job_row
from pipeline.engine import list_schedule
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, even_partition, interleaved_placement, sequential_placement
from pipeline.runtime import RUNTIMES, Runtime
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import Cluster, LayerCost, ModelProfile, TrainingConfig

__all__ = ["main", "predict_rows", "Prediction", "summarize"]

SAMPLES_PER_GPU = "samples/s/GPU"
TIE = 0.01


@dataclass(frozen=True)
class Prediction:
    """One row: measured and predicted throughput in the row's unit (``predicted`` None: see reason)."""

    id: str
    group: str
    schedule: str
    unit: str
    measured: float | None
    predicted: float | None
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "unit": self.unit, "measured": self.measured,
                               "predicted": self.predicted}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def _schedule_kind(name: str) -> tuple[str, str] | None:
    """(our schedule, runtime name) for a published schedule name, or None."""
    if name == "1F1B":
        return "1f1b", "megatron"
    if name == "1F1B-I":
        return "interleaved", "megatron"
    if name == "ZB-1p":
        return "zb-1p", "zb"
    if name == "ZB-2p":
        return "zb-2p", "zb"
    if name.startswith("ZB-2p") and "synchronization before optimizer" in name:
        return "zb-2p", "zb-sync"
    return None


def _stage_times(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float] | None, str]:
    """The row's profiled per-stage times, or those of the same model and micro-batch size (averaged)."""
    own = row.get("profiled_inputs")
    if own:
        return own, "own"
    key = (row["model"]["name"], row["batch"]["micro_batch_size"])
    same = [r["profiled_inputs"] for r in rows
            if r.get("profiled_inputs") and (r["model"]["name"], r["batch"]["micro_batch_size"]) == key]
    if not same:
        return None, "no profiled stage times for this model and micro-batch size"
    return {k: statistics.fmean(s[k] for s in same) for k in ("T_F", "T_B", "T_W", "T_comm")}, "same model"


def _zb_order(costs: Any, placement: tuple[int, ...], devices: int, microbatches: int, *, budget: float,
              make: Callable[[Any], Plan], profile: ModelProfile, cluster: Cluster,
              training: TrainingConfig) -> Plan:
    """The fastest list-scheduled order (on the runtime) within ``budget`` micro-batches per device,
    as the plan ``make`` builds from it."""
    caps = budget_caps(costs, placement, devices, microbatches_per_device=[budget] * devices)
    best: tuple[float, Plan] | None = None
    pendings = (None, 1, 2, 4, max(1, devices // 2), devices, 2 * devices)
    for counts_w, pending, depth, eager in itertools.product((True, False), pendings, (True, False), (False, True)):
        config = ListSchedulerConfig(caps=caps, cap_counts_w=counts_w, max_pending_w=pending, depth_first=depth,
                                     eager_w=eager)
        plan = make(list_schedule(costs, placement, devices, microbatches=microbatches, config=config))
        result = simulate(plan, profile, cluster, training=training, validate=False, record_timeline=False)
        fits = max(result.peak_memory) <= budget * max(costs.act) * (1 + 1e-9)
        if fits and (best is None or result.iteration_time < best[0]):
            best = (result.iteration_time, plan)
    assert best is not None  # budget >= 1 micro-batch always fits
    return best[1]


def predict_row(row: dict[str, Any], rows: Sequence[dict[str, Any]], *,
                overrides: dict[str, Runtime] | None = None, infer_degrees: bool = False) -> Prediction:
    """Predict one published row (see the module docstring)."""
    par, batch, meas = row.get("parallel", {}), row.get("batch", {}), row.get("measured", {})
    M = batch.get("num_microbatches")
    group = f"{row['model']['name']} m={M}"
    unit = meas.get("throughput_unit") or "?"
    out = Prediction(row["id"], group, row["schedule"] or "-", unit, meas.get("throughput"), None)
    if meas.get("throughput") is None:
        return replace(out, reason="no throughput published (the row gives "
                       + ("its MFU only" if meas.get("mfu") else "no measurement") + ", and no degrees)")
    if is_tflops_unit(unit):
        job_row = infer_job_degrees(row, rows) if infer_degrees else None
        predicted, reason = predict_job_row(job_row or row)
        out = replace(out, schedule=f"{job_row['schedule']} (inferred)") if job_row else out
        return replace(out, predicted=predicted, reason=reason)
    if any(par.get(k, 1) not in (1, None) for k in ("tp", "dp", "cp")):
        return replace(out, reason="needs tensor/data/context parallelism (the whole-job issue), not a pure pipeline")
    if unit != SAMPLES_PER_GPU:
        return replace(out, reason=f"unit {unit!r}: only {SAMPLES_PER_GPU} is predicted")
    kind = _schedule_kind(row["schedule"])
    if kind is None:
        return replace(out, reason=f"unknown schedule {row['schedule']!r}")
    times, source = _stage_times(row, rows)
    if times is None:
        return replace(out, reason=source)
    schedule, runtime_name = kind
    runtime = (overrides or {}).get(runtime_name, RUNTIMES[runtime_name])
    P, L = int(par["pp"]), int(row["model"]["layers"])
    v = math.ceil(L / P) if schedule == "interleaved" else 1
    S = P * v
    layers = tuple(LayerCost(f"stage{k}", "stage", times["T_F"] / v, times["T_B"] / v, times["T_W"] / v, 0, 1, 1)
                   for k in range(S))
    profile = ModelProfile(row["id"], layers, time_unit="ms")
    cluster = Cluster(devices=P, latency_us=1000 * times["T_comm"], p2p_gbps=1e9, memory_gb=1e9)
    training = TrainingConfig(runtime=runtime)
    placement = sequential_placement(P) if v == 1 else interleaved_placement(P, v)
    partition = even_partition(S, S)

    def make(order: Any) -> Plan:
        return Plan(P, M, partition, placement, order)

    if schedule == "1f1b":
        plan = make(one_f_one_b_order(P, M))
    elif schedule == "interleaved":
        plan = make(interleaved_order(P, v, M))
    else:
        costs = stage_costs(profile, cluster, partition, placement=placement, training=training)
        plan = _zb_order(costs, placement, P, M, budget=P if schedule == "zb-1p" else 2 * P, make=make,
                         profile=profile, cluster=cluster, training=training)
    result = simulate(plan, profile, cluster, training=training, record_timeline=False)
    if not result.valid:
        return replace(out, reason=result.error)
    seconds = result.iteration_time * profile.seconds_per_unit
    samples = batch["micro_batch_size"] * M
    return replace(out, predicted=samples / seconds / P)


def predict_rows(rows: Sequence[dict[str, Any]], *, overrides: dict[str, Runtime] | None = None,
                 infer_degrees: bool = False) -> list[Prediction]:
    """:func:`predict_row` of every row."""
    return [predict_row(r, rows, overrides=overrides, infer_degrees=infer_degrees) for r in rows]


def summarize(preds: Sequence[Prediction]) -> dict[str, Any]:
    """Median / max absolute error, ratio-to-1F1B error, groups ranked as measured."""
    done = [p for p in preds if p.predicted is not None and p.measured]
    errors = [abs(p.predicted / p.measured - 1) for p in done]
    groups: dict[str, list[Prediction]] = {}
    for p in done:
        groups.setdefault(p.group, []).append(p)
    ratio_errors, ranked, unranked = [], 0, []
    for name, members in groups.items():
        base = next((p for p in members if p.schedule == "1F1B"), None)
        if base is not None:
            for p in members:
                if p is not base:
                    ratio_errors.append(abs((p.predicted / base.predicted) / (p.measured / base.measured) - 1))
        if len(members) > 1:
            ok = all(_same_order(a, b) for a, b in itertools.combinations(members, 2))
            ranked += ok
            if not ok:
                unranked.append(name)
    return {"summary": True, "rows": len(preds), "predicted": len(done),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "median_ratio_to_1f1b_error": statistics.median(ratio_errors) if ratio_errors else None,
            "groups": sum(len(m) > 1 for m in groups.values()), "groups_ranked_as_measured": ranked,
            "groups_misranked": unranked}


def _same_order(a: Prediction, b: Prediction) -> bool:
    """Whether two rows are ranked as measured (a measured tie within 1% accepts either order)."""
    assert a.predicted is not None and b.predicted is not None and a.measured and b.measured
    if abs(a.measured / b.measured - 1) <= TIE:
        return True
    return (a.measured > b.measured) == (a.predicted > b.predicted)


def _fit(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Grid search of (compute_scale, action_overhead_s, step_s), shared by every runtime: the fewest
    groups ranked unlike the measurements, then the least median absolute error, then max."""
    best: tuple[tuple[int, float, float], dict[str, float], dict[str, Any]] | None = None
    for scale, over_ms, step_ms in itertools.product((1.0, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07),
                                                     (0.0, 0.1, 0.2, 0.3, 0.5), (0.0, 10.0, 20.0, 40.0)):
        values = dict(compute_scale=scale, action_overhead_s=over_ms / 1e3, step_s=step_ms / 1e3)
        overrides = {n: replace(RUNTIMES[n], **values) for n in ("megatron", "zb", "zb-sync")}
        summary = summarize(predict_rows(rows, overrides=overrides))
        key = (len(summary["groups_misranked"]), summary["median_abs_error"], summary["max_abs_error"])
        if best is None or key < best[0]:
            best = (key, values, summary)
    assert best is not None
    return best[1], best[2]


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read a published table ({exc})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
        raise SystemExit(f"{path}: 'rows' must be a list of objects with an 'id' (see shared/data/published)")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a published table (shared/data/published/*.json)")
    parser.add_argument("--json", action="store_true", help="one JSON object per row, then the summary")
    parser.add_argument("--fit", action="store_true", help="grid-search the runtime's shared parameters")
    parser.add_argument("--infer-degrees", action="store_true",
                        help="whole-job rows that give only tp*pp: tp = min(8, tp*pp), 1F1B, the flags of the "
                             "file's pipelined rows (docs/whole-job.md)")
    parser.add_argument("--runtime", choices=tuple(RUNTIMES), default=None,
                        help="predict every row on this runtime instead of the one that ran it (ideal: the model "
                             "without any runtime, to see what the runtime model adds)")
    args = parser.parse_args(argv)
    rows = _load(args.file)
    forced = {n: RUNTIMES[args.runtime] for n in ("megatron", "zb", "zb-sync")} if args.runtime else None
    if args.fit and any(is_tflops_unit((r.get("measured") or {}).get("throughput_unit")) for r in rows):
        values, errors = fit_job_source(rows)
        print(json.dumps({"fit": values, **errors}))
        return 0
    if args.fit:
        values, summary = _fit(rows)
        print(json.dumps({"fit": values, **summary}))
        return 0
    preds = predict_rows(rows, overrides=forced, infer_degrees=args.infer_degrees)
    summary = summarize(preds)
    if args.json:
        for p in preds:
            print(json.dumps(p.as_json()))
        print(json.dumps(summary))
        return 0
    print(f"{'id':36} {'schedule':10} {'measured':>9} {'predicted':>9} {'error':>7}")
    for p in preds:
        if p.predicted is None:
            print(f"{p.id:36} {str(p.schedule or '-')[:10]:10} {p.measured!s:>9} {'-':>9}  {p.reason}")
        else:
            print(f"{p.id:36} {p.schedule[:10]:10} {p.measured:9.3f} {p.predicted:9.3f} "
                  f"{100 * (p.predicted / p.measured - 1):+6.1f}%")
    fmt = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    print(f"\n{summary['predicted']} of {summary['rows']} rows predicted; median |error| "
          f"{fmt(summary['median_abs_error'])}, max {fmt(summary['max_abs_error'])}; ratio to 1F1B median "
          f"|error| {fmt(summary['median_ratio_to_1f1b_error'])}; ranked as measured in "
          f"{summary['groups_ranked_as_measured']} of {summary['groups']} groups"
          + (f" (not: {', '.join(summary['groups_misranked'])})" if summary["groups_misranked"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
