"""``zb-opt``: the exact zero-bubble schedule at ZB-H2's memory (the Zero Bubble paper's ZB-2p idea).

The paper searched its ZB-2p schedules with an ILP under an activation budget; ``zb-opt`` does the
same with the CP-SAT model of :mod:`pipeline.exact`: ZB-H2's partition (Megatron's even split) and
sequential placement, I/W split backward, and on every device the activation memory of ZB-H2's
fullest device (the memory a GPU needs to run ZB-H2; never more than the memory limit allows), as
ZB-2p gives every device the same limit. ZB-H2's order is the warm start and the
fallback, so ``zb-opt`` is never slower than ``zb-h2`` at the same memory; its note carries the
proven gap.

Budget: the solver's time, ``budget.seconds`` or one second per 300 simulator calls (10 s at the
default 3,000), from 0.5 to 60 s. Plans above :data:`MAX_ACTIONS` actions are not solved: the
result is ZB-H2's plan and the note names the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.base import Budget, ImproveCallback, SearchResult, finish
from pipeline.candidates import Scenario
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.exact import plan_caps, prove
from pipeline.simulator import stage_costs
from pipeline.start_recipes import named_schedule_plan

__all__ = ["MAX_ACTIONS", "ZbOptSearcher", "solver_seconds"]

#: The largest plan (F, I and W actions of every stage and micro-batch) zb-opt solves.
MAX_ACTIONS = 3000


def solver_seconds(budget: Budget) -> float:
    """The solver time a budget buys (see the module docstring)."""
    if budget.seconds is not None:
        return max(0.5, min(60.0, budget.seconds))
    return max(0.5, min(60.0, (budget.sim_calls or 3000) / 300))


@dataclass
class ZbOptSearcher:
    """The exact schedule of ZB-H2's partition and placement at ZB-H2's peak activation memory."""

    name: str = "zb-opt"
    max_actions: int = MAX_ACTIONS

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        ev = Evaluator(scenario)
        p = scenario
        try:
            base = named_schedule_plan(ev, "zb-h2")
        except PlanError as exc:
            return SearchResult(self.name, None, None, 0, ev.seconds, note=str(exc))
        result = ev.simulate_plan(base)
        actions = sum(len(a) for a in base.schedule)
        if actions > self.max_actions:
            return finish(self.name, scenario, base, evaluator=ev, history=[(1, result.iteration_time)],
                          note=f"{actions} actions is above zb-opt's limit of {self.max_actions}; "
                               "kept zb-h2's schedule")
        costs = stage_costs(p.profile, p.cluster, base.partition, placement=base.placement, training=p.training)
        limit = plan_caps(costs)
        peak = max(p - st for p, st in zip(result.peak_memory, costs.static_bytes))
        caps = tuple(min(peak, room) for room in limit)
        try:
            proof = prove(base, p.profile, p.cluster, training=p.training, seconds=solver_seconds(budget),
                          caps=caps, seed=seed)
        except PlanError as exc:
            return finish(self.name, scenario, base, evaluator=ev, history=[(1, result.iteration_time)],
                          note=f"kept zb-h2's schedule: {exc}")
        if on_improve is not None and proof.result.valid:
            on_improve(proof.plan, proof.result)
        note = (f"gap {100 * proof.gap:.2f}% to the proven bound ({proof.status}); zb-h2 "
                f"{100 * (proof.plan_time / proof.best_time - 1):.2f}% slower at the same memory")
        return finish(self.name, scenario, proof.plan, evaluator=ev,
                      history=[(1, result.iteration_time), (2, proof.best_time)], note=note)
