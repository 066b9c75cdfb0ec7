"""The machine's drift between rounds of a round-robin job, taken out of each plan's step times.

A job times its plans round-robin (:func:`executor.launch._run_plans`: step k of every plan, then
step k + 1), so every plan of a round ran at the same moment. On shared cores the machine's speed
moves from round to round, and by 10-30% within one job; every plan of a round moves with it. The
median of a plan's own steps keeps that drift as noise, and two replays of one plan then measure
up to 12% apart in one job.

:func:`round_factors` fits the two-way model ``log t[plan, round] = a[plan] + b[round] + noise``
robustly (Tukey's median polish) and returns ``exp(b)``: how much slower than the job's median
round each round ran, read off every plan at once. :func:`adjust_runs` divides each plan's steps by
its round's factor. A plan's time is then the median of its adjusted steps: its time at the job's
median speed. Even and odd rounds are fitted apart (each at the speed of its own median round), so
the choice by measurement (even steps) and the figure it reports (odd steps,
:func:`pipeline.calibration.selection.choose_measured`) stay independent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import MutableMapping, Sequence
from typing import Any

__all__ = ["MIN_PLANS", "round_factors", "adjust_runs", "restore_raw"]

#: Fewest plans in a job for the round factors: with fewer, each plan's own step weighs too much in
#: its round's factor, and the steps are left as measured.
MIN_PLANS = 4
_SWEEPS = 20


def round_factors(step_times: Sequence[Sequence[float]]) -> list[float] | None:
    """Per round k, how much slower than the median round of its parity it ran (1.0 = that median),
    from ``step_times[plan][k]`` (every plan with the same number of positive steps); even and odd
    rounds are fitted apart (:func:`_polish`). None where the job has fewer than :data:`MIN_PLANS`
    plans, fewer than 4 rounds, or steps that do not line up."""
    if len(step_times) < MIN_PLANS:
        return None
    rounds = len(step_times[0])
    if rounds < 4 or any(len(t) != rounds for t in step_times) or any(x <= 0 for t in step_times for x in t):
        return None
    factors = [1.0] * rounds
    for parity in (0, 1):
        for k, f in zip(range(parity, rounds, 2), _polish([t[parity::2] for t in step_times])):
            factors[k] = f
    return factors


def _polish(step_times: Sequence[Sequence[float]]) -> list[float]:
    """Tukey's median polish of ``log step_times`` (plans x rounds): the rounds' effects, as factors."""
    rounds = len(step_times[0])
    logs = [[math.log(x) for x in t] for t in step_times]
    plan_level = [statistics.median(row) for row in logs]
    round_level = [0.0] * rounds
    for _ in range(_SWEEPS):
        round_level = [statistics.median(row[k] - a for row, a in zip(logs, plan_level)) for k in range(rounds)]
        centre = statistics.median(round_level)
        round_level = [b - centre for b in round_level]
        plan_level = [statistics.median(x - b for x, b in zip(row, round_level)) for row in logs]
    return [math.exp(b) for b in round_level]


def adjust_runs(runs: Sequence[MutableMapping[str, Any]]) -> list[float] | None:
    """Take the rounds' drift (:func:`round_factors`) out of the runs of one job, in place: each run's
    ``measured_iteration_times`` become its steps over their rounds' factors and
    ``measured_iteration_time`` their median; the steps as measured stay in
    ``raw_iteration_times`` and their median in ``raw_iteration_time``. Returns the factors, or None
    (runs unchanged) where :func:`round_factors` gives none or the runs were adjusted before."""
    if not runs or any("raw_iteration_times" in r for r in runs):
        return None
    steps = [r.get("measured_iteration_times") or [] for r in runs]
    factors = round_factors(steps)
    if factors is None:
        return None
    for run, times in zip(runs, steps):
        adjusted = [t / f for t, f in zip(times, factors)]
        run["raw_iteration_times"] = list(times)
        run["raw_iteration_time"] = run.get("measured_iteration_time", statistics.median(times))
        run["measured_iteration_times"] = adjusted
        run["measured_iteration_time"] = statistics.median(adjusted)
    return factors


def restore_raw(runs: Sequence[MutableMapping[str, Any]]) -> None:
    """Undo :func:`adjust_runs` in place: the steps and their median as measured (to compare the two)."""
    for run in runs:
        if "raw_iteration_times" in run:
            run["measured_iteration_times"] = run.pop("raw_iteration_times")
            run["measured_iteration_time"] = run.pop("raw_iteration_time")
