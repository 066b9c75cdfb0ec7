"""Published GPU measurements beside the runtime model's predictions, every row from the row alone.

Reads tables in the format of ``shared/data/published/*.json`` (each row: model, parallel degrees,
batch, schedule, hardware, what was measured, and for Zero Bubble rows the authors' profiled
per-stage F/B/W and transfer times). Each row goes to the model of the codebase that ran it:

* **pipeline rows in samples/s/GPU** (the Zero Bubble paper, tp = dp = cp = 1): the row's
  pipeline is built from per-stage times (its own, or those of the same model in the same source
  scaled by layers per stage and micro-batch size: :mod:`experiments.benchmarks.published_stages`),
  scheduled as the row's schedule does and simulated under the runtime that ran it
  (:mod:`pipeline.runtime`); its peak memory, where the row gives one, is walked along that order
  (:mod:`experiments.benchmarks.published_memory`);
* **whole-job rows in TFLOP/s per GPU** (Megatron-LM's TP x PP x DP runs): rebuilt analytically
  by the whole-job model (:mod:`experiments.benchmarks.published_job`, docs/whole-job.md);
* **torchtitan rows in tokens/s per GPU** (FSDP2, TP / async TP, CP, PP, torch.compile, Float8,
  activation checkpointing): the torchtitan runtime model
  (:mod:`experiments.benchmarks.published_titan`, docs/torchtitan.md), with peak memory where the
  row gives it.

A row is refused only for what it leaves out, and the reason names it; a row whose fields
contradict each other (degrees that do not multiply to its GPUs, a GPU or unit we do not know) is
refused with the field named. A whole-job row that leaves its schedule open (Megatron's "1F1B
family" on a pipeline without its ``vpp``) gets no point but the range of the schedules it could
have run (:func:`~experiments.benchmarks.published_job.interleaving_range`), each printed, with how
far the measurement lies outside it (``"span"`` in ``--json``; the summary counts these rows apart).

Schedules: ``1F1B`` and ``1F1B-I`` (every layer its own chunk: ceil(layers / p) chunks per device)
run Megatron-LM's orders on the ``megatron`` runtime; ``ZB-1p`` / ``ZB-2p`` are the best
list-scheduled orders within p / 2p micro-batches of activations per device on the ``zb`` runtime
(their ILP-searched schedules are not public as orders); ``ZB-V`` is the V placement (two chunks
per device) under p micro-batches of activations (the hand-built order where m >= 2p - 1, else
the list scheduler) on ``zb``; ``ZB-2p`` with an all-reduce before the optimizer step runs on
``zb-sync``.

Printed: measured beside predicted per row; then the summary: median and maximum absolute
throughput error, the median error of each schedule's ratio to 1F1B in its group, and the pairs
of rows in a group (same model, pipeline and global batch) ranked as measured (ties within 1%).
``--json`` prints one object per row, ``{"id", "unit", "measured", "predicted", "stage_times",
"analytic"}`` (plus ``"reason"`` where it cannot predict, ``"memory_measured_gb"`` and
``"memory_predicted_gb"``, ``"memory_notes"`` where the row gives its peak memory), then the summary. ``--all DIR``:
every table in DIR, one line per file and a total. ``--fit-memory``: the memory walk's constants
(:func:`experiments.benchmarks.published_memory.fit_memory`). ``--fit`` grid-searches the
runtime's three shared parameters (compute scale, per-action overhead, step time) on every
pipeline row given, ranking first (the fewest pairs ranked unlike the measurements), then the
median error (on a file of whole-job rows: the source's compute scale and per-iteration time).

  python -m experiments.benchmarks.published ../shared/data/published/zero_bubble_qi2024_dev.json
  python -m experiments.benchmarks.published --all ../shared/data/published/
  python -m experiments.benchmarks.published FILE --json
  python -m experiments.benchmarks.published --all ../shared/data/published/ --fit
  python -m experiments.benchmarks.published FILE --runtime ideal     # the model without a runtime
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import multiprocessing
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from experiments.benchmarks.published_job import (
    fit_job_source,
    infer_job_degrees,
    interleaving_range,
    is_tflops_unit,
    mfu_fraction,
    predict_job,
    predict_job_row,
    source_of,
)
from experiments.benchmarks.published_memory import ZB_MEMORY, MemoryModel, fit_memory, memory_pairs, row_peak_memory
from experiments.benchmarks.published_report import fmt, print_rows, range_distance, summary_line
from experiments.benchmarks.published_rows import (
    SAMPLES_PER_GPU,
    UNITS,
    V_SCHEDULES,
    row_group,
    row_problem,
    schedule_kind,
)
from experiments.benchmarks.published_stages import StageTimes, analytic_stage_times, gpu_preset_of, stage_times
from experiments.benchmarks.published_titan import is_titan_row, predict_torchtitan_row
from pipeline.engine import list_schedule
from pipeline.hardware import get_gpu
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, even_partition, interleaved_placement, sequential_placement
from pipeline.runtime import RUNTIMES, Runtime
from pipeline.schedules import build_plan
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import Cluster, LayerCost, ModelProfile, TrainingConfig
from pipeline.v_greedy import v_greedy_plan
from pipeline.zb_greedy import fork_memory, zb_greedy_best

__all__ = ["main", "predict_rows", "predict_row", "row_problem", "Prediction", "summarize", "UNITS"]

TIE = 0.01
#: The runtimes a pipeline row runs on (``--runtime`` replaces them all).
PIPELINE_RUNTIMES = ("megatron", "zb", "zb-sync")


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
    stage_times: str | None = None
    """Where the per-stage times came from (:class:`StageTimes.source`); None for analytic rows."""
    analytic: float | None = None
    """A pipeline row's prediction from its dimensions alone (the cost model's stage times), beside
    the one from profiled stage times; None where it cannot be priced."""
    memory_measured_gb: float | None = None
    """The row's published peak memory (GB as the source reports it), where it gives one."""
    memory_predicted_gb: float | None = None
    """The model's peak memory of the row where it gives one: GiB for torchtitan and whole-job rows, the
    source's GB for pipeline rows (:mod:`experiments.benchmarks.published_memory`)."""
    memory_notes: str | None = None
    """What the memory prediction assumed that the row leaves out, or why there is none."""
    span: tuple[float, float] | None = None
    """Where the source leaves the schedule open (Megatron-Core's interleaving): the lowest and highest
    prediction over the schedules it could have run (``predicted`` None, ``reason`` lists them)."""
    plan: Plan | None = field(default=None, repr=False, compare=False)
    """A pipeline row's simulated plan (its memory is walked along its order); not printed."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "unit": self.unit, "measured": self.measured,
                               "predicted": self.predicted, "stage_times": self.stage_times,
                               "analytic": self.analytic}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.memory_measured_gb is not None:
            out.update(memory_measured_gb=self.memory_measured_gb, memory_predicted_gb=self.memory_predicted_gb)
        if self.memory_notes:
            out["memory_notes"] = self.memory_notes
        if self.span is not None:
            out["span"] = list(self.span)
        return out


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


#: GPUs per node where a row does not say: an HGX A100/H100 node (the Zero Bubble paper's 32 GPUs
#: "across 4 nodes", Sec 5.1).
GPUS_PER_NODE = 8


#: Share of the GPU preset's NIC bandwidth a pipeline transfer between nodes reaches on the Zero
#: Bubble paper's RoCE cluster (its bandwidth is not published): fitted once with the runtime's
#: three values across every pipeline row of shared/data/published (``--all DIR --fit``), ranking
#: first; it moves only rows whose pipeline spans nodes (the 16-GPU rows of Table 6/7).
NIC_EFFICIENCY = 0.5


def _row_cluster(row: dict[str, Any], times: StageTimes, P: int, nic_efficiency: float) -> Cluster:
    """The row's links: within a node a transfer takes the profiled ``T_comm``; across nodes (a
    pipeline longer than a node) the activation's bf16 bytes (``2 * mbs * seq * hidden``) go over
    the GPU preset's NIC (:mod:`pipeline.hardware`) at ``nic_efficiency`` of its bandwidth and at
    its latency. Without the dimensions or a known GPU every link takes ``T_comm``."""
    model, batch = row["model"], row["batch"]
    gpu = gpu_preset_of(row)
    per_node = int(row.get("gpus_per_node") or GPUS_PER_NODE)
    dims = all(model.get(k) for k in ("hidden", "seq_len"))
    if per_node >= P or gpu is None or not dims or times.T_comm <= 0:
        return Cluster(devices=P, latency_us=1000 * times.T_comm, p2p_gbps=1e9, memory_gb=1e9)
    nbytes = 2.0 * int(batch["micro_batch_size"]) * int(model["seq_len"]) * int(model["hidden"])
    spec = get_gpu(gpu)
    return Cluster(devices=P, latency_us=0.0, p2p_gbps=nbytes / (times.T_comm * 1e-3) / 1e9, memory_gb=1e9,
                   gpus_per_node=per_node, inter_node_gbps=spec.inter_node_gbps * nic_efficiency,
                   inter_node_latency_us=spec.inter_node_latency_us, extra={"out_bytes": nbytes})


def _pipeline_plan(schedule: str, times: StageTimes, row: dict[str, Any], runtime: Runtime,
                   nic_efficiency: float) -> tuple[Plan, ModelProfile, Cluster, TrainingConfig]:
    """The row's pipeline: one profile stage per chunk, each a share of the stage's times."""
    P, M = int(row["parallel"]["pp"]), int(row["batch"]["num_microbatches"])
    layers = int(row["model"]["layers"])
    stated = row["parallel"].get("vpp")  # a number where the row gives one; else the ZB paper's per-layer chunks
    numeric = isinstance(stated, int) and not isinstance(stated, bool) and stated > 1
    chunks = stated if numeric else math.ceil(layers / P)
    v = chunks if schedule == "interleaved" else (2 if schedule in V_SCHEDULES else 1)
    S = P * v
    cluster = _row_cluster(row, times, P, nic_efficiency)
    out_bytes = int(cluster.extra.get("out_bytes", 1))
    stage = tuple(LayerCost(f"stage{k}", "stage", times.T_F / v, times.T_B / v, times.T_W / v, 0, 1, out_bytes)
                  for k in range(S))
    profile = ModelProfile(str(row.get("id")), stage, time_unit="ms")
    training = TrainingConfig(runtime=runtime)
    partition = even_partition(S, S)
    if schedule in ("v-half", "v-min"):  # the fork's own order (its runtime's, whatever the profiled times)
        return v_greedy_plan(schedule, P, M, partition=partition), profile, cluster, training
    if schedule in V_SCHEDULES or schedule in ("zb-h1", "zb-h2", "gpipe"):
        return build_plan(schedule, profile, cluster, microbatches=M, partition=partition,
                          training=training), profile, cluster, training
    placement = sequential_placement(P) if v == 1 else interleaved_placement(P, v)

    def make(order: Any) -> Plan:
        return Plan(P, M, partition, placement, order)

    if schedule == "1f1b":
        plan = make(one_f_one_b_order(P, M))
    elif schedule == "interleaved":
        plan = make(interleaved_order(P, v, M))
    else:
        costs = stage_costs(profile, cluster, partition, placement=placement, training=training)
        budget = P if schedule == "zb-1p" else 2 * P
        model = row["model"]
        if all(model.get(k) for k in ("hidden", "heads", "seq_len")):
            # the fork's own greedy on the times its profiler would measure (the runtime's)
            mem = fork_memory(int(model["hidden"]), int(model["heads"]), int(model["seq_len"]))
            comm = max(costs.comm) if costs.comm else 0.0
            plan = make(zb_greedy_best(f=costs.f, b=costs.i, w=costs.w, comm=comm, microbatches=M, mem=mem,
                                       max_mem=[budget * mem[0]] * P).orders)
        else:
            plan = _zb_order(costs, placement, P, M, budget=budget, make=make, profile=profile, cluster=cluster,
                             training=training)
    return plan, profile, cluster, training


def predict_row(row: dict[str, Any], rows: Sequence[dict[str, Any]], *,
                overrides: dict[str, Runtime] | None = None, infer_degrees: bool = False,
                nic_efficiency: float = NIC_EFFICIENCY, with_analytic: bool = True,
                memory: MemoryModel = ZB_MEMORY) -> Prediction:
    """Predict one published row (see the module docstring); ``rows`` are its source's rows (donors
    of stage times, the flags of whole-job rows); ``memory``: a pipeline row's peak-memory constants."""
    meas = row.get("measured") if isinstance(row.get("measured"), dict) else {}
    unit = meas.get("throughput_unit") or "?"
    out = Prediction(str(row.get("id")), row_group(row), str(row.get("schedule") or "-"), unit,
                     meas.get("throughput"), None)
    problem = row_problem(row)
    if problem is not None:
        return replace(out, reason=problem)
    par, batch = row["parallel"], row["batch"]
    if meas.get("throughput") is None and meas.get("mfu") is not None and source_of(row) is not None:
        return _mfu_row(row, out, meas)
    if meas.get("throughput") is None:
        return replace(out, reason="no throughput published (the row gives "
                       + ("its MFU only" if meas.get("mfu") else "no measurement") + ", and no degrees)")
    if is_tflops_unit(unit):
        job_row = infer_job_degrees(row, rows) if infer_degrees else None
        predicted, reason = predict_job_row(job_row or row)
        out = replace(out, schedule=f"{job_row['schedule']} (inferred)") if job_row else out
        choices = interleaving_range(job_row or row) if predicted is not None else []
        if len(choices) > 1:  # the source leaves open a schedule Megatron could run several ways
            return _ranged(out, choices)
        return replace(out, predicted=predicted, reason=reason)
    if is_titan_row(row):
        titan = predict_torchtitan_row(row)
        memory = meas.get("peak_memory_gb")
        return replace(out, predicted=titan.tokens_per_s_per_gpu, reason=titan.refused,
                       stage_times="torchtitan model", memory_measured_gb=memory,
                       memory_predicted_gb=titan.peak_memory_gib if memory else None)
    if unit != SAMPLES_PER_GPU:
        return replace(out, reason=f"unit {unit!r}: the runtime of this row is not modelled yet")
    if any(par.get(k, 1) not in (1, None) for k in ("tp", "dp", "cp")):
        return replace(out, reason="a samples/s/GPU row with tp, dp or cp > 1: give its throughput in "
                       "TFLOP/s per GPU (the whole-job model) or its degrees as a pure pipeline")
    kind = schedule_kind(str(row.get("schedule")))
    if kind is None:
        return replace(out, reason=f"unknown schedule {row.get('schedule')!r}; known: 1F1B, 1F1B-I, ZB-1p, "
                       "ZB-2p, ZB-V, ZB-H1, ZB-H2, V-Half, V-Min, V-ZB, GPipe, DualPipeV")
    for name, value in (("parallel.pp", par.get("pp")), ("batch.micro_batch_size", batch.get("micro_batch_size")),
                        ("batch.num_microbatches", batch.get("num_microbatches")),
                        ("model.layers", row["model"].get("layers"))):
        if not value:
            return replace(out, reason=f"row field {name!r} is not published")
    times = stage_times(row, rows)
    if isinstance(times, str):
        # no profiled times anywhere in the source: the cost model's, from the row's dimensions
        analytic = analytic_stage_times(row, ends_lighter=False)
        if isinstance(analytic, str):
            return replace(out, reason=f"{times}; {analytic}")
        times = analytic
    schedule, runtime_name = kind
    runtime = (overrides or {}).get(runtime_name, RUNTIMES[runtime_name])
    if schedule in V_SCHEDULES and int(row["model"]["layers"]) + 2 < 2 * int(par["pp"]):
        return replace(out, reason=f"{row.get('schedule')} needs two chunks per device: at least 2 x pp - 2 layers")
    predicted, error, plan = _simulated(schedule, times, row, runtime, nic_efficiency)
    if predicted is None:
        return replace(out, reason=error, stage_times=times.source)
    analytic = analytic_stage_times(row) if times.source != "analytic" else times
    if with_analytic and not isinstance(analytic, str):
        analytic_value, _, _ = _simulated(schedule, analytic, row, runtime, nic_efficiency)
        out = replace(out, analytic=analytic_value)
    out = replace(out, predicted=predicted, stage_times=times.source, plan=plan)
    if meas.get("peak_memory_gb"):
        peak, notes = row_peak_memory(plan, row, rows, model=memory)
        out = replace(out, memory_measured_gb=meas["peak_memory_gb"], memory_predicted_gb=peak, memory_notes=notes)
    return out


def _ranged(out: Prediction, choices: list[tuple[int, float]]) -> Prediction:
    """A row whose interleaving is not published: no point prediction, the range over ``choices``."""
    low, high = min(t for _, t in choices), max(t for _, t in choices)
    gap = None if out.measured is None else range_distance(out.measured, (low, high))
    where = "" if gap is None else "; the measurement inside it" if gap == 0 else \
        f"; range error {100 * gap:+.1f}% (the measurement {'below' if gap > 0 else 'above'} it)"
    text = ", ".join(f"vpp {v}: {t:.1f}" for v, t in choices)
    return replace(out, span=(low, high), reason=f"interleaving not published (no vpp): Megatron-Core could run "
                   f"{text} (vpp 1 = 1F1B, its default){where}")


def _mfu_row(row: dict[str, Any], out: Prediction, meas: dict[str, Any]) -> Prediction:
    """A row that publishes its MFU (and peak memory) instead of a throughput, such as a table of
    one model at several vocabulary sizes: the whole-job model's MFU in Megatron's FLOP formula, and its
    peak memory where the row gives one, in its ``peak_memory_unit`` (GB: 1e9 bytes), else in its source's
    (Megatron's "GB" is GiB). Its source's fitted compute scale applies; FlashAttention unless the row says
    otherwise (the cost model's default: such a table is not the 2021 TFLOP/s runs, whose codebase had none)."""
    got, source, memory = predict_job(row, default_flash=True), source_of(row), meas.get("peak_memory_gb")
    unit = {"gib": 2.0**30, "gb": 1e9}.get(str(meas.get("peak_memory_unit") or "").lower())
    unit = unit or (source.memory_unit_bytes if source is not None else 1e9)
    predicted = None
    if memory and got.peak_memory_gib is not None:
        predicted = got.peak_memory_gib * 2**30 / unit
    return replace(out, unit="MFU", measured=mfu_fraction(float(meas["mfu"])), predicted=got.mfu,
                   reason=got.reason, stage_times="whole-job model", memory_measured_gb=memory,
                   memory_predicted_gb=predicted)


def _simulated(schedule: str, times: StageTimes, row: dict[str, Any], runtime: Runtime,
               nic_efficiency: float) -> tuple[float | None, str | None, Plan]:
    """(samples/s/GPU, None, plan) of the row's pipeline on ``times``, or (None, the simulator's error, plan)."""
    P, M = int(row["parallel"]["pp"]), int(row["batch"]["num_microbatches"])
    plan, profile, cluster, training = _pipeline_plan(schedule, times, row, runtime, nic_efficiency)
    result = simulate(plan, profile, cluster, training=training, record_timeline=False)
    if not result.valid:
        return None, result.error, plan
    seconds = result.iteration_time * profile.seconds_per_unit
    return int(row["batch"]["micro_batch_size"]) * M / seconds / P, None, plan


def predict_rows(rows: Sequence[dict[str, Any]], *, overrides: dict[str, Runtime] | None = None,
                 infer_degrees: bool = False, donors: Sequence[dict[str, Any]] | None = None,
                 nic_efficiency: float = NIC_EFFICIENCY, with_analytic: bool = True,
                 memory: MemoryModel = ZB_MEMORY) -> list[Prediction]:
    """:func:`predict_row` of every row (``donors``: the rows stage times may come from, default ``rows``;
    ``with_analytic=False`` leaves out the analytic column, as the fit does)."""
    pool = rows if donors is None else donors
    return [predict_row(r, pool, overrides=overrides, infer_degrees=infer_degrees, nic_efficiency=nic_efficiency,
                        with_analytic=with_analytic, memory=memory) for r in rows]


def _pairs(groups: dict[str, list[Prediction]]) -> tuple[int, int, list[str]]:
    """(pairs ranked as measured, pairs, the groups with a pair ranked unlike the measurements)."""
    ranked = total = 0
    wrong = []
    for name, members in groups.items():
        ok = [_same_order(a, b) for a, b in itertools.combinations(members, 2)]
        ranked, total = ranked + sum(ok), total + len(ok)
        if not all(ok):
            wrong.append(name)
    return ranked, total, wrong


def summarize(preds: Sequence[Prediction]) -> dict[str, Any]:
    """Median / max absolute error (of the prediction, and of the analytic one from the rows' dimensions
    where there is one), ratio-to-1F1B error, pairs and groups ranked as measured."""
    done = [p for p in preds if p.predicted is not None and p.measured]
    errors = [abs(p.predicted / p.measured - 1) for p in done]
    groups: dict[str, list[Prediction]] = {}
    for p in done:
        groups.setdefault(p.group, []).append(p)
    ratio_errors = []
    for members in groups.values():
        base = next((p for p in members if p.schedule == "1F1B"), None)
        if base is not None:
            ratio_errors += [abs((p.predicted / base.predicted) / (p.measured / base.measured) - 1)
                             for p in members if p is not base]
    ranked, pairs, wrong = _pairs(groups)
    peaks = [(p.group, p.memory_measured_gb, p.memory_predicted_gb) for p in done
             if p.memory_measured_gb and p.memory_predicted_gb is not None]
    memory = [abs(predicted / measured - 1) for _, measured, predicted in peaks]
    memory_ranked, memory_pair_count = memory_pairs(peaks)
    with_throughput = sum(p.measured is not None for p in preds)
    analytic = [abs(p.analytic / p.measured - 1) for p in done if p.analytic is not None]
    outside = [abs(range_distance(p.measured, p.span)) for p in preds if p.span is not None and p.measured]
    return {"summary": True, "ranged": len(outside), "ranged_inside": sum(d == 0 for d in outside),
            "range_max_distance": max(outside) if outside else None,
            "rows": len(preds), "with_throughput": with_throughput, "predicted": len(done),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "analytic_rows": len(analytic),
            "analytic_median_abs_error": statistics.median(analytic) if analytic else None,
            "analytic_max_abs_error": max(analytic) if analytic else None,
            "memory_rows": len(memory),
            "memory_median_abs_error": statistics.median(memory) if memory else None,
            "memory_max_abs_error": max(memory) if memory else None,
            "memory_pairs": memory_pair_count, "memory_pairs_ranked_as_measured": memory_ranked,
            "median_ratio_to_1f1b_error": statistics.median(ratio_errors) if ratio_errors else None,
            "pairs": pairs, "pairs_ranked_as_measured": ranked,
            "groups": sum(len(m) > 1 for m in groups.values()),
            "groups_ranked_as_measured": sum(len(m) > 1 for m in groups.values()) - len(wrong),
            "groups_misranked": wrong}


def _same_order(a: Prediction, b: Prediction) -> bool:
    """Whether two rows are ranked as measured (a measured tie within 1% accepts either order)."""
    assert a.predicted is not None and b.predicted is not None and a.measured and b.measured
    if abs(a.measured / b.measured - 1) <= TIE:
        return True
    return (a.measured > b.measured) == (a.predicted > b.predicted)


#: The ``--fit`` grid: the runtime's compute scale, per-action overhead (ms) and step (ms), the NIC
#: share of transfers between nodes, and the zero-bubble runtime's ``p2p_hold_share``.
FIT_GRID = ((1.03, 1.04, 1.05, 1.06), (0.0, 0.1), (0.0, 10.0), (0.5, 0.35), (0.0, 0.1, 0.2, 0.3, 0.4))


def _fit_point(point: tuple[float, ...], pipeline_rows: Sequence[dict[str, Any]],
               donors: Sequence[dict[str, Any]]) -> tuple[tuple[int, float, float], dict[str, float], dict[str, Any]]:
    """(ranking-first key, values, summary) of one grid point of :data:`FIT_GRID`."""
    scale, over_ms, step_ms, nic, share = point
    values = dict(compute_scale=scale, action_overhead_s=over_ms / 1e3, step_s=step_ms / 1e3)
    # the hold share is the zero-bubble fork's (Megatron's blocking p2p already holds the whole transfer)
    overrides = {n: replace(RUNTIMES[n], **values, p2p_hold_share=0.0 if n == "megatron" else share)
                 for n in PIPELINE_RUNTIMES}
    summary = summarize(predict_rows(pipeline_rows, overrides=overrides, donors=donors, nic_efficiency=nic,
                                     with_analytic=False))
    if summary["median_abs_error"] is None:
        raise SystemExit("no pipeline rows (samples/s/GPU) to fit")
    key = (summary["pairs"] - summary["pairs_ranked_as_measured"], summary["median_abs_error"],
           summary["max_abs_error"])
    return key, {**values, "nic_efficiency": nic, "p2p_hold_share": share}, summary


def _fit(tables: Sequence[Sequence[dict[str, Any]]], *, workers: int = 1) -> tuple[dict[str, float], dict[str, Any]]:
    """Grid search of (compute_scale, action_overhead_s, step_s) shared by every pipeline runtime,
    of the NIC share and of the zero-bubble runtime's hold share, across every table at once: the
    fewest pairs ranked unlike the measurements, then the least median absolute error, then max.
    ``workers`` processes price the grid's points side by side."""
    donors = [r for rows in tables for r in rows]
    pipeline_rows = [r for r in donors if (r.get("measured") or {}).get("throughput_unit") == SAMPLES_PER_GPU]
    points = list(itertools.product(*FIT_GRID))
    price = functools.partial(_fit_point, pipeline_rows=pipeline_rows, donors=donors)
    bar = functools.partial(tqdm, total=len(points), desc="fit", unit="point", disable=not sys.stderr.isatty())
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = list(bar(pool.imap(price, points)))
    else:
        results = [price(p) for p in bar(points)]
    key, values, summary = min(results, key=lambda r: r[0])
    return values, summary


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read a published table ({exc})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
        raise SystemExit(f"{path}: 'rows' must be a list of objects with an 'id' (see shared/data/published)")
    source = data.get("source")
    return [{**r, "_source": source} for r in rows]


def _tables(args: argparse.Namespace) -> list[tuple[Path, list[dict[str, Any]]]]:
    if args.all is not None:
        if not args.all.is_dir():
            raise SystemExit(f"--all: {args.all} is not a directory of published tables")
        paths = sorted(p for p in args.all.glob("*.json"))
        if not paths:
            raise SystemExit(f"--all: no *.json tables in {args.all}")
    elif args.file is not None:
        paths = [args.file]
    else:
        raise SystemExit("give a published table (FILE) or --all DIR")
    return [(p, _load(p)) for p in paths]


def _siblings(path: Path) -> list[list[dict[str, Any]]]:
    """The readable tables beside ``path`` (stage-time donors of the same source)."""
    out = []
    for other in sorted(path.parent.glob("*.json")):
        if other.resolve() != path.resolve():
            try:
                out.append(_load(other))
            except SystemExit:
                continue
    return out


def _donors(rows: Sequence[dict[str, Any]], others: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Stage-time donors of a table: its rows and those of every other table of the same source."""
    source = rows[0].get("_source") if rows else None
    extra = [r for other in others if other is not rows and source and other and other[0].get("_source") == source
             for r in other]
    return [*rows, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, nargs="?", help="a published table (shared/data/published/*.json)")
    parser.add_argument("--all", type=Path, metavar="DIR", default=None,
                        help="every *.json table in DIR: one line per file, then the total")
    parser.add_argument("--json", action="store_true", help="one JSON object per row, then the summary")
    parser.add_argument("--fit", action="store_true", help="grid-search the runtime's shared parameters")
    parser.add_argument("--fit-memory", action="store_true",
                        help="grid-search the peak-memory walk's constants on every pipeline row with a memory "
                             "(FILE with its sibling tables, or --all DIR), ranking first")
    parser.add_argument("--workers", type=int, default=1, help="processes for --fit's grid (default 1)")
    parser.add_argument("--infer-degrees", action="store_true",
                        help="whole-job rows that give only tp*pp: tp = min(8, tp*pp), 1F1B, the flags of the "
                             "file's pipelined rows (docs/whole-job.md)")
    parser.add_argument("--runtime", choices=tuple(RUNTIMES), default=None,
                        help="predict every pipeline row on this runtime instead of the one that ran it (ideal: "
                             "the model without any runtime, to see what the runtime model adds)")
    args = parser.parse_args(argv)
    if args.all is not None and args.file is not None:
        parser.error("give either FILE or --all DIR, not both")
    tables = _tables(args)
    forced = {n: RUNTIMES[args.runtime] for n in PIPELINE_RUNTIMES} if args.runtime else None
    if args.fit:
        if len(tables) == 1 and any(is_tflops_unit((r.get("measured") or {}).get("throughput_unit"))
                                    for r in tables[0][1]):
            values, errors = fit_job_source(tables[0][1])
            print(json.dumps({"fit": values, **errors}))
            return 0
        tables_rows = [rows for _, rows in tables]
        if args.workers < 1:
            parser.error(f"--workers must be at least 1, got {args.workers}")
        values, summary = _fit(tables_rows if args.all else [*tables_rows, *_siblings(tables[0][0])],
                               workers=args.workers)
        print(json.dumps({"fit": values, **summary}))
        return 0
    if args.fit_memory:
        pool = [r for rows in ([t for _, t in tables] if args.all else [tables[0][1], *_siblings(tables[0][0])])
                for r in rows]
        preds = predict_rows(pool, overrides=forced, with_analytic=False)
        items = [(r, p.plan, p.group) for r, p in zip(pool, preds) if p.plan is not None and p.memory_measured_gb]
        model, figures = fit_memory(items, pool)
        print(json.dumps({"fit_memory": asdict(model), **figures}))
        return 0
    everything: list[Prediction] = []
    others = [rows for _, rows in tables] if args.all else _siblings(tables[0][0])
    for path, rows in tables:
        preds = predict_rows(rows, overrides=forced, infer_degrees=args.infer_degrees, donors=_donors(rows, others))
        everything += preds
        summary = summarize(preds)
        if args.json:
            for p in preds:
                print(json.dumps({**p.as_json(), "file": path.name} if args.all else p.as_json()))
            if not args.all:
                print(json.dumps(summary))
        elif args.all:
            print(f"{path.name:40} {summary_line(summary)}")
        else:
            print_rows(preds)
            print(f"\n{summary_line(summary)}; ratio to 1F1B median |error| "
                  f"{fmt(summary['median_ratio_to_1f1b_error'])}")
    if args.all:
        total = summarize(everything)
        total_text = f"\n{'all files':40} {summary_line(total)}"
        print(json.dumps({**total, "files": len(tables)}) if args.json else total_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
