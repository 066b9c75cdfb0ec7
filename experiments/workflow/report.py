"""What the end-to-end workflow reports: a comparison per method and where the time went.

Pure functions over profiles, plans, simulator results and measured timelines (no torch, no
W&B), so the summary can be tested and reused by other commands.

* :func:`method_rows` — one row per searched method (an :class:`agents.base.SearchResult`): its
  :class:`experiments.results.MethodRow` and, for replayed plans (a :class:`Measurement` each), the
  measured figures.
* :func:`device_rows` — per device of a plan: predicted (and measured) busy time and bubble,
  peak memory against the limit, and the layer kind that takes most of its time.
* :func:`kind_rows` — per layer kind: how many layers, their share of the compute, and on which
  devices they sit.
* :func:`timeline_busy` — busy time per device and makespan of a timeline (simulated or measured).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.base import SearchResult
from pipeline.plan import Plan, parse_action
from pipeline.simulator import Result
from pipeline.spec import GIB, Cluster, ModelProfile

__all__ = ["Measurement", "timeline_busy", "method_rows", "device_rows", "kind_rows", "op_share",
           "format_ms"]


@dataclass
class Measurement:
    """What a replay of one method's plan measured, beside the prediction for that replay (ms)."""

    measured_ms: float
    """Median measured iteration time of the replay."""
    predicted_runtime_ms: float
    """The prediction for the replay: same plan, the profile adapted to PyTorch's runtime."""
    measured_timeline: dict[str, Any]
    predicted_timeline: dict[str, Any]
    loss: float | None = None
    """The replay's last loss."""
    measured_iteration_times: list[float] | None = None
    """Every timed iteration of the replay (ms)."""
    predicted_same_job_ms: float | None = None
    """The prediction with the runtime's terms re-fitted on the calibration plans replayed in the
    same job (round-robin with this plan): what the model says for this plan at the machine's speed
    during this replay. None when no calibration plans were replayed with it."""
    chosen_on_ms: float | None = None
    """With a choice by measurement, the median of the even timed steps, which chose the plan;
    ``measured_ms`` is then the median of the odd ones."""
    raw_iteration_times: list[float] | None = None
    """The timed iterations as measured, where ``measured_iteration_times`` have the rounds' drift
    taken out (:mod:`pipeline.calibration.drift`); None where they are the raw ones."""
    calibration_plans_ratio: float | None = None
    """The calibration plans' times in this replay's job over their times in the calibration job
    (median over the plans): how much slower (> 1) the machine ran than when the predictions'
    overheads were fitted. None without calibration plans in the job."""

    def steps_dict(self) -> dict[str, Any]:
        """The figures of this replay without its timelines (``summary.json``'s ``replays``)."""
        return {"measured_ms": self.measured_ms, "chosen_on_ms": self.chosen_on_ms,
                "predicted_runtime_ms": self.predicted_runtime_ms, "predicted_same_job_ms": self.predicted_same_job_ms,
                "measured_iteration_times": self.measured_iteration_times,
                "raw_iteration_times": self.raw_iteration_times}


def timeline_busy(timeline: Mapping[str, Any]) -> tuple[list[float], float]:
    """Busy time per device and the makespan (first start to last end) of a timeline dict."""
    events = timeline.get("events", [])
    devices = int(timeline.get("devices") or 1 + max((e["device"] for e in events), default=0))
    busy = [0.0] * devices
    for e in events:
        busy[e["device"]] += e["end"] - e["start"]
    if not events:
        return busy, 0.0
    start = min(e["start"] for e in events)
    return busy, max(e["end"] for e in events) - start


def _bubble(busy: Sequence[float], makespan: float) -> list[float]:
    return [max(0.0, 1.0 - b / makespan) if makespan > 0 else 0.0 for b in busy]


def method_rows(outcomes: Sequence[SearchResult], *, time_unit: str,
                measured: Mapping[str, Measurement] | None = None, bound: float | None = None) -> list[dict[str, Any]]:
    """The comparison table, fastest predicted first: each outcome's :class:`experiments.results.MethodRow`
    (speedups over the ``megatron`` outcome, distance to ``bound``) and, for the methods in
    ``measured`` (method -> its replay), the replay's figures in ms (docs/formats.md, "Method rows").
    ``time_unit`` names the unit of the rows without a valid plan too."""
    from experiments.results import method_rows as rows_of

    measured = measured or {}
    mega = next((o for o in outcomes if o.method == "megatron"), None)
    ref_measured = measured[mega.method].measured_ms if mega is not None and mega.method in measured else None
    rows = []
    for base in rows_of(outcomes, bound):
        row = base.as_dict()
        row["time_unit"] = time_unit
        m = measured.get(base.method) if base.valid else None
        if m is not None:
            busy, span = timeline_busy(m.measured_timeline)
            bubbles = _bubble(busy, span)
            row.update({
                "predicted_ms": m.predicted_runtime_ms, "measured_ms": m.measured_ms,
                "error_pct": 100 * (m.predicted_runtime_ms - m.measured_ms) / m.measured_ms
                if m.predicted_runtime_ms else None,
                "same_job_error_pct": 100 * (m.predicted_same_job_ms - m.measured_ms) / m.measured_ms
                if m.predicted_same_job_ms else None,
                "measured_speedup": ref_measured / m.measured_ms if ref_measured else None,
                "measured_bubble_pct": 100 * sum(bubbles) / len(bubbles) if bubbles else None,
            })
            if m.chosen_on_ms is not None:
                row["chosen_on_ms"] = m.chosen_on_ms
        rows.append(row)
    return rows


def _kinds_per_device(profile: ModelProfile, plan: Plan, cluster: Cluster) -> list[dict[str, float]]:
    """Compute time per device and layer kind for one iteration (f + b + w per micro-batch x M)."""
    out: list[dict[str, float]] = [{} for _ in range(plan.devices)]
    speeds = cluster.speeds
    for s, (a, b) in enumerate(plan.partition):
        d = plan.placement[s]
        for layer in profile.layers[a:b]:
            t = (layer.f + layer.b + layer.w) * plan.microbatches / speeds[d]
            out[d][layer.kind] = out[d].get(layer.kind, 0.0) + t
    return out


def device_rows(profile: ModelProfile, plan: Plan, cluster: Cluster, *, result: Result,
                measured_timeline: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per device: stages, predicted busy and bubble, peak memory vs limit, the dominant layer kind,
    and with a measured timeline the measured busy time (ms) and bubble."""
    kinds = _kinds_per_device(profile, plan, cluster)
    m_busy, m_span = timeline_busy(measured_timeline) if measured_timeline else ([], 0.0)
    m_bubble = _bubble(m_busy, m_span)
    rows = []
    for d in range(plan.devices):
        total = sum(kinds[d].values()) or 1.0
        top = max(kinds[d], key=kinds[d].__getitem__) if kinds[d] else "-"
        row: dict[str, Any] = {
            "device": d, "stages": ",".join(str(s) for s in plan.stages_of(d)),
            "layers": sum(b - a for s, (a, b) in enumerate(plan.partition) if plan.placement[s] == d),
            "busy": result.busy[d], "bubble_pct": 100 * result.bubble[d],
            "peak_mem_gb": result.peak_memory_gb[d], "limit_gb": result.memory_limit[d] / GIB,
            "top_kind": top, "top_kind_pct": 100 * kinds[d].get(top, 0.0) / total,
        }
        if measured_timeline and d < len(m_busy):
            row["measured_busy_ms"] = m_busy[d]
            row["measured_bubble_pct"] = 100 * m_bubble[d]
        rows.append(row)
    return rows


def kind_rows(profile: ModelProfile, plan: Plan | None = None) -> list[dict[str, Any]]:
    """Per layer kind, heaviest first: count, mean f/b/w, share of the compute, devices holding it."""
    by_kind: dict[str, list[int]] = {}
    for i, layer in enumerate(profile.layers):
        by_kind.setdefault(layer.kind, []).append(i)
    total = sum(x.f + x.b + x.w for x in profile.layers) or 1.0
    device_of: dict[int, int] = {}
    if plan is not None:
        for s, (a, b) in enumerate(plan.partition):
            for i in range(a, b):
                device_of[i] = plan.placement[s]
    rows = []
    for kind, idx in by_kind.items():
        layers = [profile.layers[i] for i in idx]
        time = sum(x.f + x.b + x.w for x in layers)
        row: dict[str, Any] = {
            "kind": kind, "count": len(idx), "f": sum(x.f for x in layers) / len(idx),
            "b": sum(x.b for x in layers) / len(idx), "w": sum(x.w for x in layers) / len(idx),
            "time_share_pct": 100 * time / total,
            "act_mib": sum(x.act_bytes for x in layers) / len(idx) / 2**20,
        }
        if device_of:
            row["devices"] = ",".join(str(d) for d in sorted({device_of[i] for i in idx}))
        rows.append(row)
    rows.sort(key=lambda r: -r["time_share_pct"])
    return rows


def op_share(timeline: Mapping[str, Any]) -> dict[str, float]:
    """Share (percent) of the busy time spent in F, I, W and B actions of a timeline."""
    totals: dict[str, float] = {}
    for e in timeline.get("events", []):
        op = parse_action(e["action"]).op
        totals[op] = totals.get(op, 0.0) + e["end"] - e["start"]
    busy = sum(totals.values()) or 1.0
    return {op: 100 * t / busy for op, t in sorted(totals.items())}


def format_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g} ms"
