"""Baselines behind the Searcher interface: named schedules (even or DP-balanced split) and random search."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents.base import Budget, BudgetClock, ImproveCallback, SearchResult, finish
from pipeline.balance import balanced_sizes
from pipeline.candidates import Candidate, Scenario, make_placement, move_layers, objective_key
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.start_recipes import PLACEMENT_CHOICES, named_schedule_plan

__all__ = ["NamedSearcher", "RandomSearcher", "random_candidate"]


@dataclass
class NamedSearcher:
    """One named schedule; ``balanced=True`` replaces Megatron's even split by the cost-aware DP split."""

    method: str
    balanced: bool = False

    @property
    def name(self) -> str:
        return f"{self.method}+dp" if self.balanced else self.method

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        ev = Evaluator(scenario)
        try:
            plan = named_schedule_plan(ev, self.method, balanced=self.balanced and self.method != "megatron")
        except PlanError as exc:
            return SearchResult(self.name, None, None, 0, ev.seconds, note=str(exc))
        result = ev.simulate_plan(plan)
        if on_improve is not None and result.valid:
            on_improve(plan, result)
        return finish(self.name, scenario, plan, evaluator=ev, history=[(1, result.iteration_time)])


def random_candidate(scenario: Scenario, rng: random.Random, *, evaluator: Evaluator | None = None) -> Candidate:
    """A random point of the plan space: placement family, partition near balanced, list-scheduler knobs
    (``evaluator``: reuse its cached balanced splits)."""
    P, L = scenario.devices, scenario.profile.num_layers
    choices = [(k, c) for k, c in PLACEMENT_CHOICES if P * c <= L]
    kind, chunks = rng.choice(choices)
    placement = make_placement(kind, P, chunks)
    sizes = list(evaluator.balanced_sizes(placement) if evaluator is not None else
                 balanced_sizes(scenario.profile, placement, scenario.cluster))
    for _ in range(rng.randint(0, 2 * len(sizes))):
        s = rng.randrange(len(sizes) - 1) if len(sizes) > 1 else 0
        if len(sizes) > 1:
            a, b = (s, s + 1) if rng.random() < 0.5 else (s + 1, s)
            sizes = list(move_layers(sizes, a, b) or sizes)
    budgets = None if rng.random() < 0.2 else tuple(float(rng.randint(1, 2 * P)) for _ in range(P))
    return Candidate(tuple(sizes), placement, "list", budgets, split_backward=rng.random() < 0.8,
                     eager_w=rng.random() < 0.2, depth_first=rng.random() < 0.7,
                     max_pending_w=rng.choice([None, 2, P]))


@dataclass
class RandomSearcher:
    """Random candidates, the same number of simulator calls as the method it is compared with."""

    name: str = "random"

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        rng = random.Random(seed)
        ev = Evaluator(scenario)
        clock = BudgetClock(budget, ev)
        best, best_key, history = None, None, []
        tries = 0
        while not clock.spent() and tries < 50 * (budget.sim_calls or 1000):
            tries += 1
            c = random_candidate(scenario, rng, evaluator=ev)
            result = ev.result(c)
            key = objective_key(result)
            if result.valid and (best_key is None or key < best_key):
                best, best_key = c, key
                history.append((ev.calls, result.iteration_time))
                if on_improve is not None:
                    on_improve(ev.plan(c), result)
        return finish(self.name, scenario, ev.plan(best) if best is not None else None, evaluator=ev,
                      history=history)
