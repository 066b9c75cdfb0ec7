"""How the AdaPtis tuner (:mod:`agents.tuner`) keeps a budget in seconds.

A search under ``--budget Ns`` ends within about 10% of N at every size
(``python -m experiments.benchmarks.budget_keeping``). Before (issue 30), ``1s`` took 4.1 s at
gemma-large, 32 devices, 256 micro-batches and sub-layer units: the named schedules (megatron's
alone 0.7 s), the seeds' splits and one batch of every seed ran without a look at the clock.
Now the named schedules stop at :data:`NAMED_SHARE` of the budget, candidates are evaluated in
batches that start small and grow only as the time left allows (each kind timed on its own), a
step that would end past the budget ends the search, and the time the end takes is kept back.
Budgets in simulator calls are not affected.
"""

from __future__ import annotations

import math

from agents import base as _base
from agents.base import Budget, BudgetClock
from pipeline.candidates import Candidate, Scenario
from pipeline.evaluator import Evaluator
from pipeline.megatron import megatron_chunk_counts

__all__ = ["PROBE_BATCH", "TIME_SHARE", "READ_MARGIN", "NAMED_SHARE", "TunerClock", "calls_room", "candidate_kind",
           "would_overrun", "NamedTimer"]

#: New candidates in the first batch under a budget in seconds, before the time per call is known.
PROBE_BATCH = 4
#: Share of the time left that one batch may plan to take (the batches shrink towards the deadline).
TIME_SHARE = 0.5
#: How many times the dearest candidate so far the time left must hold before another is made (a
#: loaded machine makes the same one slower from one moment to the next).
READ_MARGIN = 2.0
#: Share of a budget in seconds the named schedules may take before the seeds and the local search.
NAMED_SHARE = 0.25


class TunerClock(BudgetClock):
    """A :class:`BudgetClock` that keeps back, from a budget in seconds, the time the end of the search
    takes (the winner's plan and its validated simulation, about one named plan's), and that a
    search can stop when its next step would end past the budget."""

    def __init__(self, budget: Budget, evaluator: Evaluator) -> None:
        super().__init__(budget, evaluator)
        self.reserve = 0.0
        self.stopped = False

    @staticmethod
    def now() -> float:
        """The clock :class:`BudgetClock` reads (``agents.base.time``: a test may replace it)."""
        return _base.time.perf_counter()

    def keep_back(self, seconds: float) -> None:
        if self.budget.seconds is not None:
            self.reserve = min(seconds, NAMED_SHARE * self.budget.seconds)

    def stop(self) -> None:
        self.stopped = True

    def left(self) -> float:
        """Seconds left of a budget in seconds, less the reserve (``inf`` for a budget in calls)."""
        if self.budget.seconds is None:
            return math.inf
        return self.budget.seconds - self.reserve - (self.now() - self.t0)

    def spent(self) -> bool:
        if self.stopped:
            return True
        if self.budget.sim_calls is not None and self.evaluator.calls >= self.budget.sim_calls:
            return True
        return self.budget.seconds is not None and self.left() <= 0


def calls_room(clock: TunerClock, seconds_per_call: float | None, last_batch: int = 0) -> int | None:
    """The new simulator calls the next batch may make: the budget's calls left and, for a budget in
    seconds, as many as :data:`TIME_SHARE` of the time left holds at the last batch's seconds per call,
    and at most twice the last batch (:data:`PROBE_BATCH` first): candidates differ in cost (a fixed
    order built in Python costs 20 times a list-scheduled one), so batches grow only as the clock
    allows and shrink towards its end. One huge batch, unchecked, overran a 1 s budget four times
    (issue 30)."""
    calls = clock.calls_left()
    if clock.budget.seconds is None:
        return calls
    left = clock.left()
    if seconds_per_call is None:
        room = PROBE_BATCH
    else:
        room = max(1, min(2 * max(last_batch, PROBE_BATCH // 2), int(TIME_SHARE * left / max(seconds_per_call, 1e-6))))
    return room if calls is None else min(calls, room)


def candidate_kind(c: Candidate) -> str:
    """``list`` (list-scheduled in the compiled engine) or ``fixed`` (an order built in Python, e.g.
    interleaved 1F1B: 50-100 ms each at 32 devices and 256 micro-batches, 10-20 times a list one)."""
    return "list" if c.order == "list" else "fixed"


def would_overrun(clock: TunerClock, seconds_per_call: float | None) -> bool:
    """Whether one more new candidate, at ``seconds_per_call``, would end past a budget in seconds."""
    return seconds_per_call is not None and seconds_per_call > clock.left()


class NamedTimer:
    """Under a budget in seconds, the named schedules stop when the next would end past
    :data:`NAMED_SHARE` of it (at the dearest one's time so far); megatron's chunk counts are then
    built one by one (as ``build_plan("megatron")`` does, each checked), since all together they were
    0.7 s at 32 devices and 256 micro-batches. Under a budget in calls nothing changes."""

    def __init__(self, clock: TunerClock) -> None:
        self.clock = clock
        self.dearest = 0.0
        self.first = 0.0
        """Seconds the first named plan took (built and simulated)."""

    def megatron_chunks(self, scenario: Scenario) -> list[int | None]:
        if self.clock.budget.seconds is None:
            return [None]
        return list(megatron_chunk_counts(scenario.profile, scenario.devices, scenario.microbatches))

    def room(self) -> bool:
        seconds = self.clock.budget.seconds
        if seconds is None:
            return True
        return self.clock.now() - self.clock.t0 + self.dearest <= NAMED_SHARE * seconds

    def took(self, seconds: float) -> None:
        self.first = self.first or seconds
        self.dearest = max(self.dearest, seconds)
