"""What the end-to-end workflow reports: a comparison per method and where the time went.

Pure functions over profiles, plans, simulator results and measured timelines (no torch, no
W&B), so the summary can be tested and reused by other commands.

* :func:`method_rows` — one row per searched method: predicted iteration time, speedup over the
  Megatron baseline, bubble, peak memory and, for replayed plans, the measured figures.
* :func:`device_rows` — per device of a plan: predicted (and measured) busy time and bubble,
  peak memory against the limit, and the layer kind that takes most of its time.
* :func:`kind_rows` — per layer kind: how many layers, their share of the compute, and on which
  devices they sit.
* :func:`timeline_busy` — busy time per device and makespan of a timeline (simulated or measured).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.plan import Plan, parse_action
from pipeline.simulator import Result
from pipeline.spec import GIB, Cluster, ModelProfile

__all__ = ["MethodOutcome", "timeline_busy", "method_rows", "device_rows", "kind_rows", "op_share",
           "format_ms"]


@dataclass
class MethodOutcome:
    """One method's plan and what is known about it: the prediction, and a measurement if replayed."""

    method: str
    plan: Plan | None
    result: Result | None
    """The simulator's prediction at search time (the profile's time unit)."""
    sim_calls: int = 0
    seconds: float = 0.0
    note: str = ""
    """Why the method has no plan (e.g. the RL policy is not available)."""
    measured_ms: float | None = None
    """Median measured iteration time of the replay (ms)."""
    predicted_runtime_ms: float | None = None
    """The prediction for the replay: same plan, the profile adapted to PyTorch's runtime (ms)."""
    measured_timeline: dict[str, Any] | None = None
    predicted_timeline: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """A valid plan that fits in memory."""
        return self.result is not None and self.result.valid and self.result.feasible

    @property
    def predicted(self) -> float:
        return self.result.iteration_time if self.result is not None and self.result.valid else float("inf")


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


def method_rows(outcomes: Sequence[MethodOutcome], *, time_unit: str) -> list[dict[str, Any]]:
    """The comparison table, fastest predicted first; speedups are over the ``megatron`` outcome.

    ``predicted`` is in ``time_unit`` (the search's prediction); the replay columns are in ms.
    """
    mega = next((o for o in outcomes if o.method == "megatron"), None)
    ref = mega.predicted if mega is not None and mega.result is not None and mega.result.valid else None
    ref_measured = mega.measured_ms if mega is not None else None
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {"method": o.method, "sim_calls": o.sim_calls, "seconds": round(o.seconds, 3)}
        if o.result is None or not o.result.valid:
            row.update({"predicted": None, "feasible": False, "note": o.note or (o.result.error if o.result else "")})
            rows.append(row)
            continue
        r = o.result
        row.update({
            "predicted": r.iteration_time, "time_unit": time_unit, "feasible": r.feasible,
            "speedup": ref / r.iteration_time if ref else None,
            "bubble_pct": 100 * r.mean_bubble, "peak_mem_gb": max(r.peak_memory_gb),
            "stages": o.plan.num_stages if o.plan else None, "note": o.note,
        })
        if o.measured_ms is not None:
            busy, span = timeline_busy(o.measured_timeline or {})
            bubbles = _bubble(busy, span)
            row.update({
                "predicted_ms": o.predicted_runtime_ms, "measured_ms": o.measured_ms,
                "error_pct": 100 * (o.predicted_runtime_ms - o.measured_ms) / o.measured_ms
                if o.predicted_runtime_ms else None,
                "measured_speedup": ref_measured / o.measured_ms if ref_measured else None,
                "measured_bubble_pct": 100 * sum(bubbles) / len(bubbles) if bubbles else None,
            })
        rows.append(row)
    rows.sort(key=lambda r: (not r.get("feasible"), r["predicted"] if r.get("predicted") is not None else 1e300))
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


def device_rows(profile: ModelProfile, plan: Plan, cluster: Cluster, result: Result,
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
