"""agents.tuner.start_prior: the learned order of the tuner's starting plans (part of ``learned``)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.base import Budget
from agents.tuner import AdaptisTuner, iter_seed_candidates
from agents.tuner.learned import learned_tuner, random_prior_tuner
from agents.tuner.start_prior import (
    DEFAULT_START_PRIOR,
    START_FEATURES,
    NamedStart,
    StartPrior,
    load_start_prior,
    named_starts,
    start_features,
)
from pipeline.candidates import Scenario
from pipeline.evaluator import Evaluator
from pipeline.spec import Cluster
from pipeline.zoo import zoo_profile
from tests.agents.tuner.prior_files import refuses_corrupt_files


@pytest.fixture(scope="module")
def gemma4() -> Scenario:
    return Scenario(zoo_profile("gemma-small", seq_len=2048), Cluster(devices=4), 16)


def _start_calls(scenario: Scenario) -> int:
    ev = Evaluator(scenario)
    return len(named_starts(scenario)) + len(set(iter_seed_candidates(scenario, ev)))


@pytest.mark.parametrize("prior", ["shipped", "random"])
def test_same_starts_same_local_search_only_the_first_calls_reordered(gemma4: Scenario, prior: str) -> None:
    """Under a budget in calls the ordered start phase simulates the same starts and hands the local
    search the same plan: every improvement after the start phase is the plain tuner's, call for call."""
    starts = load_start_prior() if prior == "shipped" else StartPrior.random(7)
    plain = AdaptisTuner().search(gemma4, budget=Budget(sim_calls=400), seed=5)
    ordered = AdaptisTuner(start_prior=starts).search(gemma4, budget=Budget(sim_calls=400), seed=5)
    n = _start_calls(gemma4)
    assert [h for h in plain.history if h[0] > n] == [h for h in ordered.history if h[0] > n]
    assert ordered.iteration_time == plain.iteration_time and ordered.sim_calls == plain.sim_calls
    assert ordered.plan.to_json() == plain.plan.to_json()
    best_start = min(t for c, t in plain.history if c <= n)
    assert min(t for c, t in ordered.history if c <= n) == pytest.approx(best_start, rel=1e-12)


def test_features_need_no_simulation(gemma4: Scenario) -> None:
    ev = Evaluator(gemma4)
    seeds = list(iter_seed_candidates(gemma4, ev))
    X = start_features(gemma4, ev, [*named_starts(gemma4), *seeds])
    assert ev.calls == 0 and X.shape == (len(named_starts(gemma4)) + len(seeds), len(START_FEATURES))
    assert np.isfinite(X).all()
    named = X[:, START_FEATURES.index("is_named")]
    assert named.sum() == len(named_starts(gemma4)) and named[: len(named_starts(gemma4))].all()


def test_named_starts_are_the_tuners() -> None:
    scenario = Scenario(zoo_profile("gemma-small", seq_len=2048), Cluster(devices=4), 16)
    starts = named_starts(scenario)
    assert starts[0] == NamedStart("gpipe", False) and NamedStart("megatron", True) not in starts
    assert NamedStart("zb-h1", True).describe() == "zb-h1+dp"


def test_learned_uses_the_shipped_prior_and_the_ablations_swap_it() -> None:
    assert isinstance(learned_tuner().start_prior, StartPrior)
    assert learned_tuner(starts=None).start_prior is None
    rand = random_prior_tuner(seed=2).start_prior
    assert rand.weights.tolist() == StartPrior.random(2).weights.tolist()
    assert AdaptisTuner().start_prior is None


def test_small_budget_still_ends_with_a_plan_that_fits(gemma4: Scenario) -> None:
    res = AdaptisTuner(start_prior=load_start_prior()).search(gemma4, budget=Budget(sim_calls=5), seed=0)
    assert res.feasible and res.sim_calls <= 6


def test_a_corrupt_prior_is_one_clear_error(tmp_path) -> None:
    prior = load_start_prior()
    assert prior.weights.shape == (len(START_FEATURES),) and "command" in prior.meta
    refuses_corrupt_files(tmp_path, DEFAULT_START_PRIOR, load_start_prior,
                          match="field 'starts'.*start prior .* cannot be read")


def test_under_a_budget_in_seconds_the_named_plans_come_best_scored_first(gemma4: Scenario) -> None:
    """In seconds the seeds keep the tuner's order (listing them all first would spend the time on their
    splits); the named plans, the dear starts, are reordered."""
    budget = Budget(sim_calls=None, seconds=2.0)
    plain = AdaptisTuner().search(gemma4, budget=budget, seed=0)
    ordered = AdaptisTuner(start_prior=load_start_prior()).search(gemma4, budget=budget, seed=0)
    assert plain.history[0][0] == ordered.history[0][0] == 1
    assert ordered.history[0][1] < 0.75 * plain.history[0][1] and ordered.feasible
