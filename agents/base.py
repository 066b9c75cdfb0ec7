"""The interface every search method implements, and what a search returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.plan import Plan
from pipeline.simulator import Result, simulate
from pipeline.space import Evaluator, Problem

__all__ = ["Budget", "SearchResult", "Searcher", "ImproveCallback", "BudgetClock", "finish"]

#: Called with (plan, result) whenever a search finds a better plan (e.g. to save it as it goes).
ImproveCallback = Callable[[Plan, Result], None]


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: simulator calls, seconds, or both (whichever ends first)."""

    sim_calls: int | None = 400
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``"500"`` = 500 simulator calls, ``"30s"`` = 30 seconds."""
        text = text.strip().lower()
        try:
            if text.endswith("s"):
                return cls(sim_calls=None, seconds=float(text[:-1]))
            return cls(sim_calls=int(text), seconds=None)
        except ValueError:
            raise ValueError(f"bad budget {text!r}; write a number of simulator calls (500) or seconds (30s)") \
                from None


class BudgetClock:
    """Tells a search when its budget is spent."""

    def __init__(self, budget: Budget, evaluator: Evaluator) -> None:
        self.budget = budget
        self.evaluator = evaluator
        self.t0 = time.perf_counter()

    def spent(self) -> bool:
        b = self.budget
        if b.sim_calls is not None and self.evaluator.calls >= b.sim_calls:
            return True
        return b.seconds is not None and time.perf_counter() - self.t0 >= b.seconds


@dataclass
class SearchResult:
    """The best plan a method found and what it cost to find it."""

    method: str
    plan: Plan | None
    result: Result | None
    sim_calls: int = 0
    seconds: float = 0.0
    history: list[tuple[int, float]] = field(default_factory=list)
    """(simulator calls so far, best iteration time) at each improvement."""
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.valid

    @property
    def iteration_time(self) -> float:
        return self.result.iteration_time if self.ok else float("inf")


class Searcher(Protocol):
    """A search method: given a problem, return its best plan within a budget."""

    name: str

    def search(self, problem: Problem, *, budget: Budget, seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult: ...


def finish(method: str, problem: Problem, plan: Plan | None, evaluator: Evaluator,
           history: list[tuple[int, float]], note: str = "") -> SearchResult:
    """Re-simulate the winner with validation and its timeline, and package the result."""
    result = None
    if plan is not None:
        plan = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                    {**plan.meta, "method": method}, recompute=plan.recompute)
        result = simulate(plan, problem.profile, problem.cluster, problem.training)
    return SearchResult(method, plan, result, evaluator.calls, evaluator.seconds, history, note)
