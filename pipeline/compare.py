"""Evaluate named methods side by side: the rows of ``baselines`` and ``search`` tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.bounds import lower_bound
from pipeline.errors import PlanError
from pipeline.plan import Plan
from pipeline.schedules import build_plan
from pipeline.simulator import Result, simulate
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = ["Evaluation", "evaluate_plan", "evaluate_named", "table_rows"]


@dataclass
class Evaluation:
    """A method's plan and what the performance model says of it."""

    method: str
    plan: Plan | None
    result: Result | None
    error: str | None = None
    sim_calls: int = 1
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.valid

    @property
    def iteration_time(self) -> float:
        return self.result.iteration_time if self.ok else float("inf")


def evaluate_plan(method: str, plan: Plan, profile: ModelProfile, cluster: Cluster,
                  training: TrainingConfig = TrainingConfig()) -> Evaluation:
    return Evaluation(method, plan, simulate(plan, profile, cluster, training))


def evaluate_named(methods: Sequence[str], profile: ModelProfile, cluster: Cluster, microbatches: int,
                   training: TrainingConfig = TrainingConfig()) -> list[Evaluation]:
    """Build and simulate each named method; a method that cannot apply gets its error, not a crash."""
    import time

    out = []
    for method in methods:
        t0 = time.perf_counter()
        try:
            plan = build_plan(method, profile, cluster, microbatches, training=training)
        except PlanError as exc:
            out.append(Evaluation(method, None, None, error=str(exc), sim_calls=0))
            continue
        ev = evaluate_plan(method, plan, profile, cluster, training)
        ev.seconds = time.perf_counter() - t0
        out.append(ev)
    return out


def table_rows(evals: Sequence[Evaluation], profile: ModelProfile, cluster: Cluster, microbatches: int,
               *, reference: str = "megatron") -> list[dict[str, Any]]:
    """One JSON-able row per evaluation, sorted fastest first, with the speedup over ``reference``
    and the distance to the lower bound."""
    ref = next((e for e in evals if e.method == reference and e.ok), None)
    bound = lower_bound(profile, cluster, microbatches).value
    rows = []
    for e in evals:
        row: dict[str, Any] = {"method": e.method}
        if e.ok:
            assert e.result is not None
            row.update(e.result.summary())
            row["peak_memory_max_gb"] = max(row["peak_memory_gb"])
            row["speedup"] = ref.iteration_time / e.iteration_time if ref else None
            row["vs_lower_bound"] = e.iteration_time / bound if bound > 0 else None
            if e.plan is not None and "chunks" in e.plan.meta:
                row["chunks"] = e.plan.meta["chunks"]
        else:
            row.update({"valid": False, "feasible": False, "iteration_time": None, "bubble": None,
                        "peak_memory_gb": None, "error": e.error or (e.result.error if e.result else None)})
        row["sim_calls"] = e.sim_calls
        row["seconds"] = round(e.seconds, 4)
        rows.append(row)
    rows.sort(key=lambda r: (not r.get("feasible"), r["iteration_time"] if r.get("iteration_time") else float("inf")))
    return rows
