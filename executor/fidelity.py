"""Compare the performance model's prediction with a measured replay, plan by plan.

Used by ``python -m experiments replay`` (one plan) and by the fidelity benchmark (several):
profile the model on this device, measure the link, predict each plan with
:func:`pipeline.simulator.simulate`, run every plan in one ``torchrun`` job, and report the
relative error and whether the model orders the plans as the measurements do.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.plan import Plan
from pipeline.spec import Cluster, ModelProfile

__all__ = ["PlanComparison", "measured_cluster", "runtime_profile", "compare_plans", "rank_agreement",
           "fidelity_summary"]


def runtime_profile(profile: ModelProfile, plan: Plan) -> ModelProfile:
    """The profile as PyTorch's pipeline runtime spends it on ``plan``'s stages.

    Two facts of ``_PipelineScheduleRuntime`` that per-layer ``b``/``w`` cannot express:

    * a fused ``B`` runs one autograd pass, cheaper than ``I`` then ``W`` (which walk the graph
      twice); a measured profile carries that time as ``b_full`` per layer, so for a stage whose
      backward is ``B``, ``b`` becomes ``b_full - w`` (B then costs ``b_full``);
    * on the first stage ``I`` does nothing (no input gradient to send) and ``W`` runs the whole
      backward, so that stage's ``b`` moves into ``w``.

    Profiles without ``b_full`` (analytic ones) keep their ``b`` for ``B`` stages.
    """
    from dataclasses import replace

    layers = list(profile.layers)
    fused = {a.stage for acts in plan.schedule for a in acts if a.op == "B"}
    for s, (start, end) in enumerate(plan.partition):
        for i in range(start, end):
            layer = layers[i]
            if s in fused and "b_full" in layer.extra:
                layer = replace(layer, b=max(0.0, float(layer.extra["b_full"]) - layer.w))
            if s == 0 and s not in fused:
                layer = replace(layer, b=0.0, w=layer.b + layer.w)
            layers[i] = layer
    return replace(profile, layers=tuple(layers))


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


def measured_cluster(devices: int, bench: dict[str, Any], *, memory_gb: float = 64.0,
                     name: str = "local") -> Cluster:
    """A cluster JSON from :func:`executor.replay.p2p_bench`'s latency and bandwidth."""
    return Cluster(devices=devices, memory_gb=memory_gb, p2p_gbps=max(bench["p2p_gbps"], 1e-6),
                   latency_us=bench["latency_us"], name=name,
                   extra={"measured": True, "backend": bench.get("backend", "gloo")})


def compare_plans(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster,
                  runs: Sequence[dict[str, Any]]) -> list[PlanComparison]:
    """Pair each plan's simulation with its measured run (same order as ``named_plans``)."""
    from pipeline.simulator import simulate

    out = []
    for (name, plan), run in zip(named_plans, runs):
        result = simulate(plan, runtime_profile(profile, plan), cluster)
        if not result.valid:
            raise ValueError(f"plan {name}: {result.error}")
        out.append(PlanComparison(name, result.iteration_time, run["measured_iteration_time"],
                                  result.timeline_dict(), run["timeline"], run))
    return out


def rank_agreement(comparisons: Sequence[PlanComparison], *, tie: float = 0.02) -> dict[str, Any]:
    """Whether the model ranks the plans in the measured order. Pairs whose measured times are
    within ``tie`` (relative) of each other count as ties and are not held against the model."""
    pairs = agree = 0
    for i, a in enumerate(comparisons):
        for b in comparisons[i + 1:]:
            if abs(a.measured - b.measured) <= tie * min(a.measured, b.measured):
                continue
            pairs += 1
            agree += (a.predicted < b.predicted) == (a.measured < b.measured)
    measured_order = [c.name for c in sorted(comparisons, key=lambda c: c.measured)]
    predicted_order = [c.name for c in sorted(comparisons, key=lambda c: c.predicted)]
    return {"measured_order": measured_order, "predicted_order": predicted_order,
            "same_order": measured_order == predicted_order, "pairs": pairs, "concordant_pairs": agree}


def fidelity_summary(comparisons: Sequence[PlanComparison]) -> dict[str, Any]:
    errs = [abs(c.error) for c in comparisons]
    return {"median_abs_error_pct": 100 * statistics.median(errs) if errs else None,
            "max_abs_error_pct": 100 * max(errs) if errs else None, **rank_agreement(comparisons)}
