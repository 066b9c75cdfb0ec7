"""Lower bounds: valid for every plan the simulator accepts, whatever cost fields it reads (a
measured fused backward, per-action overhead, device speeds), and prompt on all-distinct costs."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import bounds
from pipeline.bounds import lower_bound, packing_load
from pipeline.errors import PlanError
from pipeline.plan import Action, Plan
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, Device, LayerCost, ModelProfile
from tests.conftest import ideal_cluster, uniform_profile

#: Named schedules the property tests simulate: fused B (gpipe, 1f1b, interleaved, megatron) and
#: the list scheduler's I/W split (zb-h1, zbv).
METHODS = ("megatron", "gpipe", "1f1b", "i1f1b-v2", "zb-h1", "zbv")


def _fused(profile: ModelProfile, b_full: float) -> ModelProfile:
    """``profile`` with a measured fused-backward time on every layer."""
    return replace(profile, layers=tuple(replace(x, extra={"b_full": b_full}) for x in profile.layers))


@st.composite
def scenarios(draw) -> tuple[ModelProfile, Cluster, int]:
    """Small profiles whose layer costs all differ, with or without a measured fused backward
    (below, between or above ``b`` and ``b + w``), a per-action overhead, and devices of mixed
    speeds on links that cost time."""
    L = draw(st.integers(1, 9))
    cost = st.floats(0.05, 4.0, allow_nan=False)
    fused = draw(st.booleans())
    layers = []
    for i in range(L):
        f, b, w = draw(cost), draw(cost), draw(cost)
        extra = {"b_full": draw(st.floats(0.02, 10.0))} if fused else {}
        layers.append(LayerCost(f"l{i}", "attention+mlp", f, b, w, 1000, 1000, draw(st.sampled_from([0, 10**6])),
                                extra=extra))
    overhead = draw(st.sampled_from([0.0, 0.05, 0.4]))
    P = draw(st.integers(1, 4))
    speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=P, max_size=P))
    cluster = Cluster(devices=P, memory_gb=1e6, p2p_gbps=10.0, latency_us=draw(st.sampled_from([0.0, 50.0])),
                      device_list=tuple(Device(speed=s, memory_gb=1e6) for s in speeds))
    profile = ModelProfile("prop", tuple(layers), action_overhead=overhead)
    return profile, cluster, draw(st.integers(1, 6))


def _random_plan(profile: ModelProfile, P: int, M: int, rng: random.Random) -> Plan:
    """Any contiguous partition, any placement, any dependency-respecting order, each backward
    fused (B) or split (I then W) at random."""
    L = profile.num_layers
    cuts = sorted(rng.sample(range(1, L), rng.randint(0, L - 1)))
    edges = [0, *cuts, L]
    partition = tuple(zip(edges[:-1], edges[1:]))
    S = len(partition)
    placement = tuple(rng.randrange(P) for _ in range(S))
    back = {(s, m): "B" if rng.random() < 0.5 else "I" for s in range(S) for m in range(M)}
    needs: dict[tuple[int, str, int], list[tuple[int, str, int]]] = {}
    for (s, m), op in back.items():
        needs[(s, "F", m)] = [(s - 1, "F", m)] if s else []
        needs[(s, op, m)] = [(s, "F", m)] + ([(s + 1, back[(s + 1, m)], m)] if s + 1 < S else [])
        if op == "I":
            needs[(s, "W", m)] = [(s, "I", m)]
    done: set[tuple[int, str, int]] = set()
    order: list[tuple[int, str, int]] = []
    while len(order) < len(needs):
        ready = [a for a, deps in needs.items() if a not in done and all(d in done for d in deps)]
        a = ready[rng.randrange(len(ready))]
        order.append(a)
        done.add(a)
    schedule = [[] for _ in range(P)]
    for s, op, m in order:
        schedule[placement[s]].append(Action(s, op, m))
    return Plan(P, M, partition, placement, tuple(tuple(x) for x in schedule))


@settings(max_examples=150, deadline=None)
@given(case=scenarios(), seed=st.integers(0, 2**31))
def test_no_plan_beats_the_bound(case, seed: int) -> None:
    profile, cluster, M = case
    lb = lower_bound(profile, cluster, M)
    times = []
    for method in METHODS:
        try:
            plan = build_plan(method, profile, cluster, microbatches=M)
        except PlanError:  # more stages than layers
            continue
        times.append(simulate(plan, profile, cluster, record_timeline=False))
    rng = random.Random(seed)
    times += [simulate(_random_plan(profile, cluster.devices, M, rng), profile, cluster, record_timeline=False)
              for _ in range(3)]
    for r in times:
        assert r.valid, r.error
        assert r.iteration_time >= lb.value * (1 - 1e-9), (lb, r.iteration_time)
    assert lower_bound(profile, cluster, M, packing=False).value <= lb.value


@pytest.mark.parametrize("method", ["megatron", "1f1b", "gpipe", "zb-h1"])
def test_a_measured_fused_backward_stays_above_the_bound(method: str) -> None:
    # The case: f=b=w=1 and a fused backward of 1 (below b + w = 2); 1F1B ran at 0.672x the bound.
    prof, cluster = _fused(uniform_profile(4), 1.0), ideal_cluster(2)
    r = simulate(build_plan(method, prof, cluster, microbatches=64), prof, cluster)
    lb = lower_bound(prof, cluster, 64)
    assert r.iteration_time >= lb.value - 1e-9
    assert lb.work == pytest.approx(64 * 4 * (1 + 1) / 2)  # F plus the fused backward, on two devices


def test_bounds_by_hand() -> None:
    lb = lower_bound(uniform_profile(8), ideal_cluster(4), 16)
    assert lb.work == pytest.approx(16 * 8 * 3 / 4)
    assert lb.heaviest_layer == pytest.approx(16 * 3)
    assert lb.chain == pytest.approx(8 * 2 + 1)
    assert lb.value == lb.work and lb.binding == "work"


def test_overhead_counts_three_times_per_micro_batch() -> None:
    # F, then I and W (or a B priced with two overheads): 1F1B takes (m + p - 1)(F + B + 3o).
    o, p, m = 0.5, 4, 8
    prof, cluster = replace(uniform_profile(4 * p), action_overhead=o), ideal_cluster(p)
    lb = lower_bound(prof, cluster, m)
    assert lb.work == pytest.approx(m * 4 * p * 3 / p + 3 * o * m)
    assert lb.chain == pytest.approx(4 * p * 2 + 1 + 3 * o)
    assert simulate(build_plan("1f1b", prof, cluster, microbatches=m), prof, cluster).iteration_time >= lb.value


def test_the_rl_environment_sees_the_first_three_bounds_unchanged(hetero_profile, h100x4) -> None:
    """Without ``b_full`` or overhead (the environment's analytic profiles) the bounds its
    observation was trained on keep their formulas."""
    layers, M, speeds = hetero_profile.layers, 8, h100x4.speeds
    lb = lower_bound(hetero_profile, h100x4, M, packing=False)
    assert lb.work == pytest.approx(M * sum(x.f + x.b + x.w for x in layers) / sum(speeds))
    assert lb.heaviest_layer == pytest.approx(M * max(x.f + x.b + x.w for x in layers) / max(speeds))
    assert lb.chain == pytest.approx((sum(x.f + x.b for x in layers) + min(x.w for x in layers)) / max(speeds))
    assert lb.critical_layer == 0.0 and lb.packing == 0.0


def test_critical_layer_by_hand() -> None:
    # uniform layers f=1, b=1, w=1 (tests.conftest): the last of 8 layers waits 7 forwards, runs
    # 16 x (F+I), then max(16 W, 7 I's back) = 7 + 32 + 16 on one device.
    lb = lower_bound(uniform_profile(8), ideal_cluster(4), 16)
    assert lb.critical_layer == pytest.approx(7 + 32 + 16)
    assert lower_bound(uniform_profile(8), ideal_cluster(4), 16, packing=False).critical_layer == 0.0


@pytest.mark.parametrize("method", ["1f1b", "zb-h1", "zbv", "gpipe", "i1f1b-v2"])
def test_no_schedule_beats_the_bound(hetero_profile, h100x4, method: str) -> None:
    r = simulate(build_plan(method, hetero_profile, h100x4, microbatches=8), hetero_profile, h100x4)
    assert r.iteration_time >= lower_bound(hetero_profile, h100x4, 8).value - 1e-9


def test_heavy_layer_bound_binds_for_a_heavy_head(hetero_profile, h100x4) -> None:
    lb = lower_bound(hetero_profile, h100x4, 64)
    assert lb.binding in ("work", "heaviest_layer", "critical_layer", "packing")
    assert lb.packing >= max(lb.work, lb.heaviest_layer) - 1e-9
    assert lb.heaviest_layer == pytest.approx(64 * (4.0 + 4.0 + 3.6))


def _brute_force_load(costs: list[float], speeds: list[float]) -> float:
    best = float("inf")
    P = len(speeds)
    for code in itertools.product(range(P), repeat=len(costs)):
        load = [0.0] * P
        for c, d in zip(costs, code):
            load[d] += c / speeds[d]
        best = min(best, max(load))
    return best


def test_packing_by_hand() -> None:
    # 3,3,3,2,2,2 on two devices: {3,3,2} and {3,2,2} -> 8, above the average 7.5.
    assert packing_load([3, 3, 3, 2, 2, 2], [1.0, 1.0]) == pytest.approx(8.0, rel=1e-5)
    # The heavy layer alone on a device when it outweighs the rest.
    assert packing_load([10, 1, 1, 1], [1.0, 1.0]) == pytest.approx(10.0, rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(costs=st.one_of(st.lists(st.sampled_from([0.5, 1.0, 2.5, 4.0]), min_size=1, max_size=7),
                       st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7)),
       speeds=st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=1, max_size=3))
def test_packing_is_exact_on_small_cases(costs: list[float], speeds: list[float]) -> None:
    assert packing_load(costs, speeds) == pytest.approx(_brute_force_load(costs, speeds), rel=1e-5)


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7),
       speeds=st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=1, max_size=3),
       states=st.sampled_from([1, 4, 16]), work=st.sampled_from([0, 10, 100]))
def test_packing_stays_a_bound_when_its_program_is_cut_short(costs: list[float], speeds: list[float], states: int,
                                                              work: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bounds, "MAX_PACKING_STATES", states)
        mp.setattr(bounds, "MAX_PACKING_WORK", work)
        load = packing_load(costs, speeds)
    assert load <= _brute_force_load(costs, speeds) * (1 + 1e-9)
    assert load >= max(sum(costs) / sum(speeds), max(costs) / max(speeds)) * (1 - 1e-12)


def test_packing_is_prompt_and_between_its_ends_on_all_distinct_costs() -> None:
    """256 layers that all cost differently (a measured profile): the program merges costs instead
    of enumerating, and the result lies between the closed-form bounds and a real assignment."""
    rng = np.random.default_rng(0)
    costs = np.concatenate(([0.4], rng.uniform(0.97, 1.03, 254), [6.0])).tolist()
    speeds = [1.0] * 16
    load = packing_load(costs, speeds)
    greedy = bounds._greedy_load(np.sort(costs)[::-1], np.ones(16))
    assert max(sum(costs) / 16, 6.0) <= load <= greedy


def test_packing_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="costs"):
        packing_load([], [1.0])
    with pytest.raises(ValueError, match="speeds"):
        packing_load([1.0], [0.0])


def test_no_searched_plan_beats_the_packing_bound(hetero_profile, h100x4) -> None:
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.candidates import Scenario

    lb = lower_bound(hetero_profile, h100x4, 8)
    r = AdaptisTuner().search(Scenario(hetero_profile, h100x4, 8), budget=Budget(sim_calls=60), seed=0)
    assert lb.packing > 0 and r.iteration_time >= lb.value - 1e-9


@pytest.mark.parametrize("granularity,shards", [("sublayer", 1), ("layer", 3), ("sublayer", 4)])
def test_bounds_hold_over_finer_units(granularity: str, shards: int) -> None:
    """Units are plain layers to the bounds: no plan over them beats the bound of their profile,
    and cutting blocks only lowers the ceiling's bound (the costs add up)."""
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.candidates import Scenario
    from pipeline.hardware import build_cluster
    from pipeline.zoo import zoo_profile

    cluster = build_cluster("h100", devices=4)
    fine = zoo_profile("gemma-small", seq_len=2048, granularity=granularity, head_shards=shards)
    lb = lower_bound(fine, cluster, 16)
    r = AdaptisTuner().search(Scenario(fine, cluster, 16), budget=Budget(sim_calls=40), seed=0)
    assert r.iteration_time >= lb.value - 1e-9
    if shards == 1:
        assert lb.value <= lower_bound(zoo_profile("gemma-small", seq_len=2048), cluster, 16).value + 1e-9
