"""A measured-style profile (256 layers, every cost different, a measured fused backward and a
per-action overhead) through what baselines, search and simulate compute: no plan comes out faster
than the lower bound. (The commands once took minutes on such a profile; pytest's timeout is the
hang guard.)"""

from __future__ import annotations

import random

import pytest

from agents.base import Budget
from agents.registry import make_searcher
from experiments.commands.baselines import compare
from experiments.results import method_rows
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.hardware import build_cluster
from pipeline.schedules import NAMED_METHODS
from pipeline.simulator import simulate
from pipeline.spec import LayerCost, ModelProfile

CLUSTER = build_cluster("h100", devices=8)


@pytest.fixture(scope="module")
def measured_profile(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    rng = random.Random(7)
    layers = [LayerCost("embed", "embedding", 0.05, 0.0, 0.08, 400_000_000, 10_000_000, 8_000_000,
                        extra={"b_full": 0.07})]
    for i in range(254):
        f = rng.uniform(0.9, 1.1)
        b, w = f * rng.uniform(0.95, 1.05), f * rng.uniform(0.8, 1.0)
        layers.append(LayerCost(f"layer{i}", "attention+mlp", f, b, w, rng.randrange(40_000_000, 60_000_000),
                                rng.randrange(150_000_000, 250_000_000), 8_000_000,
                                extra={"b_full": (b + w) * rng.uniform(0.7, 0.95)}))
    layers.append(LayerCost("head", "head", 4.1, 4.0, 3.7, 400_000_000, 1 << 30, 0, extra={"b_full": 6.9}))
    path = tmp_path_factory.mktemp("measured") / "profile.json"
    ModelProfile("measured-256", tuple(layers), action_overhead=0.02).save(path)
    return ModelProfile.load(path)  # as --profile reads it


def _bound(profile: ModelProfile) -> float:
    return lower_bound(profile, CLUSTER, 16, runtime="pytorch").value


def test_baselines_never_beat_the_bound(measured_profile: ModelProfile) -> None:
    rows, _ = compare(Scenario(measured_profile, CLUSTER, 16), NAMED_METHODS)
    assert len(rows) >= 8
    assert all(r.vs_lower_bound >= 1.0 for r in rows if r.vs_lower_bound is not None), rows
    assert any(r.vs_lower_bound is not None for r in rows)


def test_search_and_simulate_never_beat_the_bound(measured_profile: ModelProfile) -> None:
    scenario = Scenario(measured_profile, CLUSTER, 16)
    results = [make_searcher(m).search(scenario, budget=Budget(60), seed=0) for m in ("megatron", "zbv", "adaptis")]
    rows = method_rows(results, _bound(measured_profile))
    assert all(r.vs_lower_bound >= 1.0 for r in rows if r.vs_lower_bound is not None), rows
    plans = [r.plan for r in results if r.ok]
    assert plans
    for plan in plans:  # as `simulate --plan` prices the plan a search wrote
        result = simulate(plan, measured_profile, CLUSTER)
        assert result.valid and result.iteration_time / _bound(measured_profile) >= 1.0
