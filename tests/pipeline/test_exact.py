"""pipeline.exact: the CP-SAT schedule solver, checked against brute force and the list scheduler."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from agents.base import Budget
from agents.registry import make_searcher
from agents.zb_opt import ZbOptSearcher
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError, PlanError
from pipeline.exact import device_load_bound, plan_caps, prove
from pipeline.plan import Action, Plan
from pipeline.schedules import build_plan
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import GIB, Cluster, LayerCost, ModelProfile, TrainingConfig
from tests.conftest import ROOT

IDEAL = TrainingConfig(runtime="ideal")


def _profile(costs: list[tuple[float, float, float]], act_gib: float = 1.0) -> ModelProfile:
    layers = tuple(LayerCost(f"l{k}", "block", f, b, w, 0, int(act_gib * GIB), 1 << 20)
                   for k, (f, b, w) in enumerate(costs))
    return ModelProfile("tiny", layers, time_unit="ms")


def _extensions(chains: list[list[Action]]) -> list[tuple[Action, ...]]:
    """Every interleaving of the chains that keeps each chain's order (a device's valid orders)."""
    if all(not c for c in chains):
        return [()]
    out = []
    for k, c in enumerate(chains):
        if c:
            rest = [x[1:] if j == k else x for j, x in enumerate(chains)]
            out += [(c[0], *tail) for tail in _extensions(rest)]
    return out


def _brute_force(plan: Plan, profile: ModelProfile, cluster: Cluster, caps: tuple[float, ...], *,
                 training: TrainingConfig = IDEAL) -> float:
    """The fastest order of the plan's actions (split backward) that keeps every device within ``caps``."""
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training)
    per_device = []
    for d in range(plan.devices):
        chains = [[Action(s, op, m) for op in "FIW"] for s in plan.stages_of(d) for m in range(plan.microbatches)]
        per_device.append(_extensions(chains))
    best = math.inf
    for order in itertools.product(*per_device):
        cand = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, order)
        res = simulate(cand, profile, cluster, training=training, validate=False, record_timeline=False)
        if res.valid and all(p - st <= c * (1 + 1e-9) for p, st, c in zip(res.peak_memory, costs.static_bytes, caps)):
            best = min(best, res.iteration_time)
    return best


def _tiny(devices: int, microbatches: int) -> tuple[Plan, ModelProfile, Cluster]:
    profile = _profile([(1.0, 1.7, 0.6), (1.3, 1.1, 0.9), (0.8, 2.1, 0.4)][:devices])
    cluster = Cluster(devices=devices, memory_gb=100, memory_reserve_gb=0, latency_us=150, p2p_gbps=100)
    plan = build_plan("zb-h1", profile, cluster, microbatches=microbatches, training=IDEAL)
    return plan, profile, cluster


@pytest.mark.parametrize("devices,microbatches,cap_mb", [(2, 2, None), (2, 2, 1.0), (3, 2, None), (3, 2, 1.0)])
def test_the_optimum_equals_brute_force(devices: int, microbatches: int, cap_mb: float | None) -> None:
    plan, profile, cluster = _tiny(devices, microbatches)
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=IDEAL)
    caps = plan_caps(costs) if cap_mb is None else tuple(cap_mb * GIB for _ in range(devices))
    brute = _brute_force(plan, profile, cluster, caps)
    proof = prove(plan, profile, cluster, training=IDEAL, seconds=10, caps=caps, workers=2)
    assert proof.status == "OPTIMAL"
    assert proof.best_time == pytest.approx(brute, rel=1e-9)
    assert proof.bound <= brute * (1 + 1e-12)
    # the bound is the optimum up to the rounding of each action and transfer down to 0.1 us (1e-4 ms)
    assert brute - proof.bound <= 2 * proof.actions * 1e-4
    peaks = [p - st for p, st in zip(proof.result.peak_memory, costs.static_bytes)]
    assert all(p <= c * (1 + 1e-9) for p, c in zip(peaks, caps))


def test_a_binding_cap_changes_the_brute_force_optimum() -> None:
    """The capped cases above are not the uncapped ones in disguise."""
    plan, profile, cluster = _tiny(2, 2)
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=IDEAL)
    assert _brute_force(plan, profile, cluster, (GIB, GIB)) > _brute_force(plan, profile, cluster, plan_caps(costs))


@pytest.mark.parametrize("runtime", ["ideal", "pytorch", "megatron"])
def test_bound_below_best_below_the_list_scheduler(runtime: str) -> None:
    profile = ModelProfile.load(ROOT / "experiments/configs/profiles/hetero-head-16.json")
    cluster = Cluster.load(ROOT / "experiments/configs/clusters/h100x4.json")
    training = TrainingConfig(runtime=runtime)
    plan = build_plan("zb-h1", profile, cluster, microbatches=8, training=training)
    proof = prove(plan, profile, cluster, training=training, seconds=5, workers=2)
    listed = [t for name, t in proof.candidates.items() if name.startswith("list scheduler")]
    assert listed and proof.best_time <= min(listed) * (1 + 1e-12)
    assert proof.best_time <= proof.plan_time * (1 + 1e-12)
    assert proof.bound <= proof.best_time
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training)
    assert proof.bound >= device_load_bound(costs, plan)
    again = simulate(proof.plan, profile, cluster, training=training)
    assert again.valid and again.feasible and again.iteration_time == proof.best_time
    if proof.solver_makespan is not None and proof.solver_order_time is not None:
        # durations are rounded down in the model: its makespan never exceeds the simulated time
        assert proof.solver_makespan <= proof.solver_order_time * (1 + 1e-12)


def test_overlapping_iterations_use_no_solver_bound() -> None:
    plan, profile, cluster = _tiny(2, 3)
    training = TrainingConfig(runtime="zb")
    proof = prove(plan, profile, cluster, training=training, seconds=3, workers=2)
    assert proof.solver_bound is None and proof.formulation.startswith("proxy")
    assert proof.bound == proof.analytic_bound
    assert proof.best_time <= proof.plan_time


def test_too_large_is_said_and_bounded_analytically() -> None:
    plan, profile, cluster = _tiny(3, 4)
    proof = prove(plan, profile, cluster, training=IDEAL, seconds=3, max_actions=10)
    assert proof.status == "not run" and "limit of 10" in proof.formulation
    assert proof.bound == max(proof.analytic_bound, proof.load_bound) and proof.bound <= proof.best_time


@pytest.mark.parametrize("seconds", [0, -1, math.inf, math.nan])
def test_seconds_must_be_positive(seconds: float) -> None:
    plan, profile, cluster = _tiny(2, 2)
    with pytest.raises(ConfigError, match="--seconds"):
        prove(plan, profile, cluster, training=IDEAL, seconds=seconds)


def test_zb_opt_is_never_slower_than_zb_h2_at_its_memory() -> None:
    profile = _profile([(1.0, 1.0, 0.5)] * 4)
    cluster = Cluster(devices=4, memory_gb=100, memory_reserve_gb=0, latency_us=300, p2p_gbps=100)
    scenario = Scenario(profile, cluster, 8, IDEAL)
    h2 = make_searcher("zb-h2").search(scenario, budget=Budget(sim_calls=10))
    opt = ZbOptSearcher().search(scenario, budget=Budget(sim_calls=None, seconds=5))
    assert opt.ok and opt.feasible and "gap" in opt.note
    assert opt.iteration_time <= h2.iteration_time * (1 + 1e-12)
    assert max(opt.result.peak_memory) <= max(h2.result.peak_memory) * (1 + 1e-9)
    small = ZbOptSearcher(max_actions=10).search(scenario, budget=Budget(sim_calls=10))
    assert "limit of 10" in small.note and small.iteration_time == h2.iteration_time


def test_a_plan_no_order_can_fit_is_one_plan_error() -> None:
    plan, profile, cluster = _tiny(2, 2)
    with pytest.raises(PlanError, match="device 0's memory.*--memory-gb"):
        prove(plan, profile, cluster, training=IDEAL, seconds=2, caps=(0.5 * GIB, 10 * GIB))


def test_memory_no_order_can_meet_is_proven_by_the_solver() -> None:
    """V placement on 2 devices: a micro-batch's stages 0 and 3 both sit on device 0, and F(3) runs while
    F(0)'s activations wait for their backward, so 1 GiB (one stage's activations) is too little."""
    profile = _profile([(1.0, 1.0, 0.5)] * 4)
    cluster = Cluster(devices=2, memory_gb=100, memory_reserve_gb=0)
    plan = build_plan("zbv", profile, cluster, microbatches=2, training=IDEAL)
    with pytest.raises(PlanError, match="proven by the solver"):
        prove(plan, profile, cluster, training=IDEAL, seconds=5, caps=(GIB, GIB), workers=2)
    roomy = prove(plan, profile, cluster, training=IDEAL, seconds=5, caps=(2 * GIB, 2 * GIB), workers=2)
    assert roomy.result.valid and roomy.bound <= roomy.best_time


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_random_tiny_instances_match_brute_force(seed: int) -> None:
    """Random costs, activations, what I keeps (above or below F's activations), latencies, per-action
    overheads, runtimes and memory caps from one micro-batch to roomy: optimum == brute force, bound <= it."""
    rng = random.Random(seed)
    devices = rng.choice([2, 3])
    layers = tuple(LayerCost(f"l{k}", "block", rng.uniform(0.3, 2), rng.uniform(0.3, 2), rng.uniform(0.0, 1.5), 0,
                             int(rng.uniform(0.5, 2) * GIB), 1 << 20, w_graph_bytes=int(rng.uniform(0.3, 2.5) * GIB))
                   for k in range(devices))
    profile = ModelProfile("random", layers, time_unit="ms", action_overhead=rng.choice([0.0, 0.01]))
    cluster = Cluster(devices=devices, memory_gb=100, memory_reserve_gb=0, latency_us=rng.choice([0, 50, 400]),
                      p2p_gbps=100)
    training = TrainingConfig(runtime=rng.choice(["ideal", "pytorch", "megatron"]))
    plan = build_plan("zb-h1", profile, cluster, microbatches=2, training=training)
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training)
    caps = tuple(max(costs.act[s], costs.w_keep[s]) * rng.choice([1.0, 1.3, 2.0, 10.0]) for s in range(devices))
    brute = _brute_force(plan, profile, cluster, caps, training=training)
    proof = prove(plan, profile, cluster, training=training, seconds=10, caps=caps)
    assert proof.status == "OPTIMAL"
    assert proof.best_time == pytest.approx(brute, rel=1e-9)
    assert proof.bound <= brute * (1 + 1e-12)
