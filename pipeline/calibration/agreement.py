"""How well the performance model's predictions agree with measured replays, plan by plan.

:func:`compare_plans` pairs each plan's simulation (priced by :func:`pipeline.calibration.fidelity.runtime_profile`)
with its measured run; :func:`cross_validated` does so with a calibration that never saw the
predicted plan; :func:`rank_agreement` and :func:`fidelity_summary` say how far off the predictions
are and whether they order the plans as measured, beyond the noise floor of a plan replayed twice
(:func:`copy_gap`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.calibration.fidelity import calibrate, runtime_profile
from pipeline.plan import Plan
from pipeline.spec import Cluster, ModelProfile

__all__ = ["BLOCKS", "PlanComparison", "block_medians", "compare_plans", "cross_validated", "plan_identity",
           "copy_gap", "rank_agreement", "fidelity_summary"]


@dataclass
class PlanComparison:
    """Prediction and measurement of one plan."""

    name: str
    predicted: float
    """Predicted iteration time (the profile's unit, ms)."""
    measured: float
    """Median measured iteration time (ms)."""
    predicted_timeline: dict[str, Any]
    measured_timeline: dict[str, Any]
    run: dict[str, Any]
    """The worker's full result (losses, errors with --check, every step's time)."""

    @property
    def error(self) -> float:
        """Relative error of the prediction, ``(predicted - measured) / measured``."""
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else float("inf")

    def row(self) -> dict[str, Any]:
        return {"plan": self.name, "predicted_ms": self.predicted, "measured_ms": self.measured,
                "error_pct": 100 * self.error}


def compare_plans(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster, *,
                  runs: Sequence[dict[str, Any]], scales: Mapping[str, float] | None = None) -> list[PlanComparison]:
    """Pair each plan's simulation with its measured run (same order as ``named_plans``)."""
    from pipeline.simulator import simulate

    out = []
    for (name, plan), run in zip(named_plans, runs):
        result = simulate(plan, runtime_profile(profile, plan, scales), cluster)
        if not result.valid:
            raise ValueError(f"plan {name}: {result.error}")
        out.append(PlanComparison(name, result.iteration_time, run["measured_iteration_time"],
                                  result.timeline_dict(), run["timeline"], run))
    return out


def cross_validated(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster, *,
                    runs: Sequence[dict[str, Any]],
                    calibration: tuple[Sequence[tuple[str, Plan]], Sequence[dict[str, Any]]] | None = None,
                    kinds: bool = False, contention: bool = False, layers: bool = False) -> list[PlanComparison]:
    """Predictions whose calibration never saw the predicted plan. With ``calibration`` (other
    plans and their runs), :func:`calibrate` fits on those and predicts every plan; without,
    leave one plan out (each plan predicted from the others; needs at least two plans)."""
    if calibration is not None:
        scales = calibrate(calibration[0], profile, cluster, runs=calibration[1], kinds=kinds, contention=contention,
                           layers=layers)
        return compare_plans(named_plans, profile, cluster, runs=runs, scales=scales)
    if len(named_plans) < 2:
        raise ValueError("cross-validation needs at least two replayed plans")
    out = []
    for k, item in enumerate(named_plans):
        others = [j for j in range(len(named_plans)) if j != k]
        scales = calibrate([named_plans[j] for j in others], profile, cluster, runs=[runs[j] for j in others],
                           kinds=kinds, contention=contention, layers=layers)
        out += compare_plans([item], profile, cluster, runs=[runs[k]], scales=scales)
    return out


#: Interleaved subsamples of a plan's timed steps (steps k, k + BLOCKS, ...) that must all order a
#: pair alike for the pair's measured order to count as resolved (see :func:`rank_agreement`).
BLOCKS = 3


def block_medians(c: PlanComparison) -> list[float] | None:
    """The median of each of :data:`BLOCKS` interleaved subsamples of a plan's timed steps (None: too few)."""
    times = c.run.get("measured_iteration_times") or []
    if len(times) < BLOCKS:
        return None
    return [statistics.median(times[k::BLOCKS]) for k in range(BLOCKS)]


def plan_identity(c: PlanComparison) -> str | None:
    """What makes two replayed plans the same plan (partition, placement, schedule, recomputation;
    not the name), from the plan the worker ran; None where the run does not carry it."""
    raw = c.run.get("plan") if isinstance(c.run, dict) else None
    if not isinstance(raw, dict):
        return None
    import json

    return json.dumps({k: v for k, v in raw.items() if k not in ("meta", "version")}, sort_keys=True)


def copy_gap(comparisons: Sequence[PlanComparison]) -> float | None:
    """The largest relative gap between the measured times of two replays of the same plan in one job
    (:func:`plan_identity`; e.g. the tuner's and the RL policy's plan, or a copy the benchmark adds):
    what this job's measurement cannot tell apart. None without copies."""
    ids = [plan_identity(c) for c in comparisons]
    gaps = [abs(a.measured - b.measured) / min(a.measured, b.measured)
            for i, a in enumerate(comparisons) for j, b in enumerate(comparisons[i + 1:], i + 1)
            if ids[i] is not None and ids[i] == ids[j]]
    return max(gaps) if gaps else None


def rank_agreement(comparisons: Sequence[PlanComparison], *, tie: float = 0.02) -> dict[str, Any]:
    """Whether the model ranks the plans in the measured order. Pairs whose measured times are
    within ``tie`` (relative) of each other count as ties and are not held against the model, and
    two replays of one plan (:func:`plan_identity`) are not a pair: the model prices them alike by
    construction.

    ``resolved_pairs`` / ``concordant_resolved``: the same count over the pairs whose measured order
    the measurement itself repeats: beyond ``tie``, and the same in each of :data:`BLOCKS`
    interleaved subsamples of the timed steps (a pair the same job orders both ways is noise, not a
    ranking the model can miss). Plans timed round-robin share the machine's drift, so the
    subsamples compare like with like.

    ``copy_gap_pct`` (:func:`copy_gap`) and ``pairs_beyond_copies`` / ``concordant_beyond_copies``:
    where the job replayed a plan twice, the pairs further apart than those two replays (and than
    ``tie``); without copies, the same as ``pairs``."""
    gap = copy_gap(comparisons)
    floor = max(tie, gap or 0.0)
    pairs = agree = resolved = agree_resolved = beyond = agree_beyond = 0
    ids = [plan_identity(c) for c in comparisons]
    for i, a in enumerate(comparisons):
        for j, b in enumerate(comparisons[i + 1:], i + 1):
            if ids[i] is not None and ids[i] == ids[j]:
                continue
            if abs(a.measured - b.measured) <= tie * min(a.measured, b.measured):
                continue
            pairs += 1
            hit = (a.predicted < b.predicted) == (a.measured < b.measured)
            agree += hit
            if abs(a.measured - b.measured) > floor * min(a.measured, b.measured):
                beyond += 1
                agree_beyond += hit
            ma, mb = block_medians(a), block_medians(b)
            if ma is not None and mb is not None and len({x < y for x, y in zip(ma, mb)}) == 1:
                resolved += 1
                agree_resolved += hit
    measured_order = [c.name for c in sorted(comparisons, key=lambda c: c.measured)]
    predicted_order = [c.name for c in sorted(comparisons, key=lambda c: c.predicted)]
    return {"measured_order": measured_order, "predicted_order": predicted_order,
            "same_order": measured_order == predicted_order, "pairs": pairs, "concordant_pairs": agree,
            "resolved_pairs": resolved, "concordant_resolved": agree_resolved,
            "copy_gap_pct": None if gap is None else 100 * gap, "pairs_beyond_copies": beyond,
            "concordant_beyond_copies": agree_beyond}


def fidelity_summary(comparisons: Sequence[PlanComparison]) -> dict[str, Any]:
    errs = [abs(c.error) for c in comparisons]
    return {"median_abs_error_pct": 100 * statistics.median(errs) if errs else None,
            "max_abs_error_pct": 100 * max(errs) if errs else None, **rank_agreement(comparisons)}
