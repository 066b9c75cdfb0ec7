"""The rounds' drift taken out of a round-robin job's step times (pipeline.calibration.drift)."""

from __future__ import annotations

import copy
import math
import random
import statistics

import pytest

from pipeline.calibration.drift import MIN_PLANS, adjust_runs, restore_raw, round_factors


def _job(levels: list[float], drift: list[float], *, noise: float, seed: int) -> list[list[float]]:
    """Step times of plans (``levels``) timed round-robin on a machine whose speed is ``drift[k]`` in
    round k, each step with its own multiplicative noise."""
    rng = random.Random(seed)
    return [[level * d * rng.lognormvariate(0.0, noise) for d in drift] for level in levels]


def test_without_noise_every_plan_is_its_level_in_every_round() -> None:
    levels = [100.0, 120.0, 90.0, 150.0, 110.0]
    drift = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 1.0, 0.7]
    factors = round_factors(_job(levels, drift, noise=0.0, seed=0))
    assert factors is not None
    for parity in (0, 1):  # each parity is centred on its own median round (the median of the logs)
        centre = math.exp(statistics.median(math.log(d) for d in drift[parity::2]))
        assert factors[parity::2] == pytest.approx([d / centre for d in drift[parity::2]])
    runs = [{"measured_iteration_times": t, "measured_iteration_time": statistics.median(t)}
            for t in _job(levels, drift, noise=0.0, seed=0)]
    adjust_runs(runs)
    for run in runs:  # constant within a parity (each parity at the speed of its own median round)
        for parity in (0, 1):
            half = run["measured_iteration_times"][parity::2]
            assert max(half) == pytest.approx(min(half))


def test_two_replays_of_one_plan_measure_closer_with_the_drift_out() -> None:
    """On a machine that drifts by 20% between rounds, with 5% noise a step, two copies of a plan
    timed by the medians of their raw steps differ more than after the adjustment (40 seeded jobs)."""
    raw_gaps, adjusted_gaps = [], []
    for seed in range(40):
        rng = random.Random(1000 + seed)
        drift = [rng.lognormvariate(0.0, 0.2) for _ in range(30)]
        levels = [100.0, 100.0, 130.0, 85.0, 160.0, 110.0, 95.0, 140.0]  # the first two: one plan twice
        runs = [{"measured_iteration_times": t, "measured_iteration_time": statistics.median(t)}
                for t in _job(levels, drift, noise=0.05, seed=seed)]
        raw_gaps.append(abs(runs[0]["measured_iteration_time"] / runs[1]["measured_iteration_time"] - 1))
        assert adjust_runs(runs) is not None
        adjusted_gaps.append(abs(runs[0]["measured_iteration_time"] / runs[1]["measured_iteration_time"] - 1))
    assert statistics.mean(adjusted_gaps) < 0.6 * statistics.mean(raw_gaps), (raw_gaps, adjusted_gaps)


def test_even_rounds_never_inform_the_odd_rounds_factors() -> None:
    """The choice by measurement reads the even steps and the figure it reports the odd ones."""
    steps = _job([100.0, 120.0, 90.0, 150.0], [1.0, 1.2, 0.9, 1.1, 1.3, 0.8, 1.0, 1.05], noise=0.05, seed=3)
    changed = copy.deepcopy(steps)
    for row in changed:
        for k in range(0, len(row), 2):
            row[k] *= 1.5 if k % 4 else 0.7
    before, after = round_factors(steps), round_factors(changed)
    assert before is not None and after is not None
    assert before[1::2] == after[1::2]
    assert before[0::2] != after[0::2]


def test_too_few_plans_or_ragged_steps_are_left_as_measured() -> None:
    few = _job([100.0] * (MIN_PLANS - 1), [1.0, 1.2, 0.9, 1.1], noise=0.05, seed=1)
    assert round_factors(few) is None
    ragged = _job([100.0] * MIN_PLANS, [1.0, 1.2, 0.9, 1.1], noise=0.05, seed=1)
    ragged[2] = ragged[2][:3]
    assert round_factors(ragged) is None
    assert round_factors(_job([100.0] * MIN_PLANS, [1.0, 1.2, 0.9], noise=0.05, seed=1)) is None  # 3 rounds
    runs = [{"measured_iteration_times": t, "measured_iteration_time": statistics.median(t)} for t in few]
    kept = copy.deepcopy(runs)
    assert adjust_runs(runs) is None and runs == kept


def test_the_raw_steps_are_kept_and_come_back_and_a_second_adjustment_changes_nothing() -> None:
    steps = _job([100.0, 120.0, 90.0, 150.0, 80.0], [1.0, 1.2, 0.9, 1.1, 1.3, 0.8], noise=0.05, seed=2)
    runs = [{"measured_iteration_times": list(t), "measured_iteration_time": statistics.median(t)} for t in steps]
    original = copy.deepcopy(runs)
    factors = adjust_runs(runs)
    assert factors is not None and len(factors) == 6
    for run, t in zip(runs, steps):
        assert run["raw_iteration_times"] == t
        assert [a * f for a, f in zip(run["measured_iteration_times"], factors)] == pytest.approx(t)
        assert run["measured_iteration_time"] == statistics.median(run["measured_iteration_times"])
    adjusted = copy.deepcopy(runs)
    assert adjust_runs(runs) is None and runs == adjusted
    restore_raw(runs)
    assert runs == original
