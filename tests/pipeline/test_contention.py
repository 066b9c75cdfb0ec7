"""Compute contention between devices of one host: the iteration time stretches where devices compute at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.candidates import Candidate, Scenario
from pipeline.errors import ConfigError, ProfileError
from pipeline.evaluator import Evaluator
from pipeline.event_sim import StageCosts, iteration_time
from pipeline.exact import prove
from pipeline.plan import Plan, parse_action
from pipeline.simulator import simulate
from pipeline.spec import LayerCost, ModelProfile
from tests.conftest import ideal_cluster

ONE_F_ONE_B_2x2 = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def _costs(contention: float, post: float = 0.0) -> StageCosts:
    return StageCosts((1.0,), (1.0,), (1.0,), (0.0,), (0.0,), (0.0,), (0.0, 0.0), (1.0, 1.0), None, post, contention)


def test_the_stretch_is_the_contention_times_the_time_devices_compute_together() -> None:
    assert iteration_time(_costs(0.0, post=1.0), 10.0, (8.0, 6.0)) == 11.0
    assert iteration_time(_costs(0.5, post=1.0), 10.0, (8.0, 6.0)) == pytest.approx(10 + 1 + 0.5 * 4)
    assert iteration_time(_costs(0.5), 10.0, (5.0, 4.0)) == 10.0  # never together: nothing to stretch
    assert iteration_time(_costs(0.5), 10.0, (9.0,)) == 10.0  # one device shares with no one
    # three devices: the busy time beyond the makespan, shared out over the others
    assert iteration_time(_costs(0.3), 10.0, (9.0, 9.0, 8.0)) == pytest.approx(10 + 0.3 * 16 / 2)


def test_simulate_and_the_evaluator_add_the_profiles_contention() -> None:
    layers = (LayerCost("a", "x", 1, 2, 1, 0, 0, 0), LayerCost("b", "x", 1, 2, 1, 0, 0, 0))
    plain = ModelProfile("p", layers)
    shared = replace(plain, compute_contention=0.25)
    plan = Plan(2, 2, ((0, 1), (1, 2)), (0, 1), [[parse_action(a) for a in r] for r in ONE_F_ONE_B_2x2])
    base = simulate(plan, plain, ideal_cluster(2))
    assert base.iteration_time == 12 and base.busy == (8, 8)  # tests/pipeline/test_simulator.py, by hand
    assert simulate(plan, shared, ideal_cluster(2)).iteration_time == pytest.approx(12 + 0.25 * (16 - 12))
    ev = Evaluator(Scenario(shared, ideal_cluster(2), 2))
    again = ev.result(Candidate((1, 1), (0, 1), "1f1b", split_backward=False))
    alone = Evaluator(Scenario(plain, ideal_cluster(2), 2)).result(Candidate((1, 1), (0, 1), "1f1b",
                                                                               split_backward=False))
    assert again.iteration_time == pytest.approx(alone.iteration_time + 0.25 * (sum(alone.busy) - alone.iteration_time))


def test_the_profile_keeps_its_contention_and_refuses_a_negative_one() -> None:
    layers = (LayerCost("a", "x", 1, 2, 1, 0, 0, 0),)
    prof = ModelProfile("p", layers, compute_contention=0.3)
    assert ModelProfile.from_dict(prof.to_dict()).compute_contention == 0.3
    assert "compute_contention" not in ModelProfile("p", layers).to_dict()  # GPU profiles: the field is absent
    with pytest.raises(ProfileError, match="compute_contention"):
        ModelProfile("p", layers, compute_contention=-0.1)


def test_prove_refuses_a_profile_with_contention() -> None:
    layers = (LayerCost("a", "x", 1, 2, 1, 0, 0, 0), LayerCost("b", "x", 1, 2, 1, 0, 0, 0))
    plan = Plan(2, 2, ((0, 1), (1, 2)), (0, 1), [[parse_action(a) for a in r] for r in ONE_F_ONE_B_2x2])
    with pytest.raises(ConfigError, match="compute contention"):
        prove(plan, ModelProfile("p", layers, compute_contention=0.2), ideal_cluster(2), seconds=1)
