"""The interface every search method implements, and what a search returns."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.candidates import Scenario
from pipeline.evaluator import Evaluator
from pipeline.plan import Plan
from pipeline.simulator import Result, simulate

__all__ = ["DEFAULT_CALLS", "Budget", "SearchResult", "Searcher", "ImproveCallback", "BudgetClock", "finish",
           "history_marks"]

#: Called with (plan, result) whenever a search finds a better plan (e.g. to save it as it goes).
ImproveCallback = Callable[[Plan, Result], None]


#: The default search budget in simulator calls: with the compiled engine, 3,000 calls of the tuner take
#: less wall time than 400 took on the Python engine (docs/engine.md), and find better plans.
DEFAULT_CALLS = 3000


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: simulator calls, seconds, or both (whichever ends first)."""

    sim_calls: int | None = DEFAULT_CALLS
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``"500"`` = 500 simulator calls, ``"30s"`` = 30 seconds; at least 1 call or more than 0 seconds."""
        text = text.strip().lower()
        try:
            budget = cls(sim_calls=None, seconds=float(text[:-1])) if text.endswith("s") else \
                cls(sim_calls=int(text), seconds=None)
        except ValueError:
            raise ValueError(f"bad budget {text!r}; write a number of simulator calls (500) or seconds (30s)") \
                from None
        calls, seconds = budget.sim_calls, budget.seconds
        if (calls is not None and calls < 1) or (seconds is not None and not 0 < seconds < math.inf):
            raise ValueError(f"budget {text!r} is out of range; give at least 1 simulator call (500) or a finite "
                             "number of seconds above 0 (30s)")
        return budget


class BudgetClock:
    """Tells a search when its budget is spent."""

    def __init__(self, budget: Budget, evaluator: Evaluator) -> None:
        self.budget = budget
        self.evaluator = evaluator
        self.t0 = time.perf_counter()

    def calls_left(self) -> int | None:
        """Simulator calls left in the budget (``None`` when it counts seconds only)."""
        if self.budget.sim_calls is None:
            return None
        return max(0, self.budget.sim_calls - self.evaluator.calls)

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
    """Why there is no plan, or what the method wants to say about it."""
    history_seconds: list[float] = field(default_factory=list)
    """Seconds since the search began at each entry of :attr:`history` (empty where not recorded)."""
    history_fits: list[bool | None] = field(default_factory=list)
    """Whether each entry of :attr:`history` is a plan that fits in memory (empty where not recorded)."""

    def anytime(self) -> list[list[float | None]]:
        """``[[calls, seconds, best_time], ...]`` at each improvement to a plan that fits in memory (the
        first entries of a search under tight memory may be plans that do not, which any plan that fits
        beats): the search's anytime curve, as JSON rows carry it. Seconds are None where not recorded."""
        secs, fits = self.history_marks()
        return [[c, None if s is None else round(s, 4), t] for (c, t), s, f in zip(self.history, secs, fits)
                if f is not False]

    def history_marks(self) -> tuple[list[float | None], list[bool | None]]:
        """(seconds, fits) of each :attr:`history` entry, None where not recorded."""
        n = len(self.history)
        return (self.history_seconds if len(self.history_seconds) == n else [None] * n,
                self.history_fits if len(self.history_fits) == n else [None] * n)

    @property
    def ok(self) -> bool:
        """The plan is valid (it may still not fit in memory: see :attr:`feasible`)."""
        return self.result is not None and self.result.valid

    @property
    def feasible(self) -> bool:
        """A valid plan that fits in memory."""
        return self.ok and self.result.feasible

    @property
    def iteration_time(self) -> float:
        """The predicted iteration time (the profile's time unit); ``inf`` without a valid plan."""
        return self.result.iteration_time if self.ok else float("inf")


class Searcher(Protocol):
    """A search method: given a scenario, return its best plan within a budget."""

    name: str

    def search(self, scenario: Scenario, *, budget: Budget, seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult: ...


def finish(method: str, scenario: Scenario, plan: Plan | None, *, evaluator: Evaluator,
           history: list[tuple[int, float]], note: str = "") -> SearchResult:
    """Re-simulate the winner with validation and its timeline, and package the result."""
    result = None
    if plan is not None:
        plan = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                    {**plan.meta, "method": method}, recompute=plan.recompute)
        result = simulate(plan, scenario.profile, scenario.cluster, training=scenario.training)
    return SearchResult(method, plan, result, evaluator.calls, evaluator.seconds, history, note,
                        *history_marks(evaluator, history))


def history_marks(evaluator: Evaluator, history: list[tuple[int, float]]) -> tuple[list[float], list[bool | None]]:
    """(seconds, fits) of each history entry, from the evaluator whose calls it counts."""
    return [evaluator.seconds_at(c) for c, _ in history], [evaluator.fits_of(c, t) for c, t in history]
