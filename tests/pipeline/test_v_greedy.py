"""The Zero Bubble fork's V-Half / V-Min orders: valid V plans, the paper's memory fractions of 1F1B,
its throughput claim at equal F = B = W, and the fork's eager estimate against our simulator."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.errors import PlanError
from pipeline.orders import one_f_one_b_order
from pipeline.plan import Plan, even_partition, sequential_placement, v_placement
from pipeline.simulator import simulate
from pipeline.spec import Cluster, LayerCost, ModelProfile
from pipeline.v_greedy import activation_peak, building_block, put_weight_passes, v_greedy, v_greedy_plan
from tests.conftest import ROOT

DEV = ROOT.parent / "shared/data/published/zero_bubble_qi2024_dev.json"

SETTINGS = [(2, 4), (3, 6), (4, 1), (4, 4), (4, 8), (4, 24), (6, 12), (8, 16), (8, 24)]


def _simulate(orders, P: int, M: int, *, f: float, b: float, w: float, v: bool = True) -> float:
    """Iteration time of ``orders`` with zero communication (no bytes, no latency)."""
    placement = v_placement(P) if v else sequential_placement(P)
    S = len(placement)
    stages = tuple(LayerCost(f"s{k}", "stage", f, b, w, 0, 1, 0) for k in range(S))
    plan = Plan(P, M, even_partition(S, S), placement, orders)
    res = simulate(plan, ModelProfile("t", stages, time_unit="ms"), Cluster(devices=P, memory_gb=1e9, latency_us=0.0),
                   record_timeline=False)
    assert res.valid, res.error
    return res.iteration_time


def _peak_units(order, *, fused: bool = False) -> int:
    """Peak chunk activations held in order: F adds one, W frees it (B frees it with a fused backward)."""
    held = peak = 0
    for a in order:
        held += 1 if a.op == "F" else (-1 if a.op == ("B" if fused else "W") else 0)
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("P, M", SETTINGS)
@pytest.mark.parametrize("kind", ["half", "min"])
def test_orders_are_valid_v_plans(kind, P, M) -> None:
    got = v_greedy(kind, P, M)
    placement = v_placement(P)
    for d, order in enumerate(got.orders):
        assert {a.stage for a in order} == {d, 2 * P - 1 - d}
        assert all(placement[a.stage] == d for a in order)
        assert sorted(order) == sorted({(s, op, mb) for s in (d, 2 * P - 1 - d) for op in "FIW" for mb in range(M)})
        pos = {(a.stage, a.op, a.mb): k for k, a in enumerate(order)}
        for s in (d, 2 * P - 1 - d):
            for mb in range(M):
                assert pos[(s, "F", mb)] < pos[(s, "I", mb)] < pos[(s, "W", mb)]
                if mb:
                    assert pos[(s, "F", mb - 1)] < pos[(s, "F", mb)]
    _simulate(got.orders, P, M, f=1.0, b=1.0, w=1.0)


@pytest.mark.parametrize("P, M", SETTINGS)
@pytest.mark.parametrize("kind", ["half", "min"])
@pytest.mark.parametrize("times", [(1.0, 1.0, 1.0), (1.0, 2.0, 0.7), (1.3, 1.0, 1.6)])
def test_the_forks_eager_makespan_is_the_simulators_iteration_time(kind, P, M, times) -> None:
    """Same order, same dependencies, zero comm: the fork's eager replay and our simulator agree."""
    f, b, w = times
    got = v_greedy(kind, P, M, f=f, b=b, w=w)
    assert _simulate(got.orders, P, M, f=f, b=b, w=w) == pytest.approx(got.makespan, rel=1e-9)
    assert got.longest_stage <= got.makespan + 1e-9


@pytest.mark.parametrize("P, M", [(4, 8), (4, 24), (6, 24), (8, 24), (8, 32)])
def test_activation_peaks_are_a_half_and_a_third_of_1f1b(P, M) -> None:
    """In the fork's units (one per chunk forward, freed by its W), 1F1B's device 0 holds ``2p``;
    the paper/fork state V-Half needs ``(p+2)//2`` micro-batches (``p+2`` units) and V-Min ``(p+4)//3``."""
    one_f = max(_peak_units(o, fused=True) for o in one_f_one_b_order(P, M)) * 2  # one stage = two chunks
    assert one_f == 2 * P
    half = max(_peak_units(o) for o in v_greedy("half", P, M).orders)
    third = max(_peak_units(o) for o in v_greedy("min", P, M).orders)
    assert half <= 2 * ((P + 2) // 2), (half, one_f)
    assert third <= 2 * ((P + 4) // 3), (third, one_f)
    assert third < half < one_f


@pytest.mark.parametrize("P, M", [(4, 8), (4, 24), (8, 24), (8, 32), (16, 64)])
def test_v_half_is_not_slower_than_1f1b_at_equal_times(P, M) -> None:
    """The fork's description (bubble rate at T_F = T_B = T_W): 1F1B ~ p/m, V-Half ~ p/2m, V-Min ~ 2p/3m.
    A V chunk is half a 1F1B stage, so both run the same work; V-Half must not lose to 1F1B, and both
    must keep within their stated bubble rates (at p = 8, m = 24: 0.106 <= 0.167 and 0.158 <= 0.222)."""
    t = 1.0
    one_f = _simulate(one_f_one_b_order(P, M), P, M, f=t, b=t, w=t, v=False)
    work = M * 3 * t
    half = v_greedy("half", P, M, f=t / 2, b=t / 2, w=t / 2)
    low = v_greedy("min", P, M, f=t / 2, b=t / 2, w=t / 2)
    t_half = _simulate(half.orders, P, M, f=t / 2, b=t / 2, w=t / 2)
    t_min = _simulate(low.orders, P, M, f=t / 2, b=t / 2, w=t / 2)
    assert t_half <= one_f * (1 + 1e-9)
    assert 1 - work / t_half <= P / (2 * M)
    assert 1 - work / t_min <= 2 * P / (3 * M)
    assert 1 - work / one_f == pytest.approx((P - 1) / (M + P - 1))


def test_weight_passes_fill_free_slots_oldest_first() -> None:
    got = put_weight_passes([[0], [1], [3], [4]], split=True)
    assert got[4] == [5] and got[5] == [6]  # no free slot after the backwards: after the last pass, kind 4 first
    got = put_weight_passes([[0, 6], [1, 7], [2, 9], [3, 10]], split=False)
    assert got[4] == [4, 5, 11, 12]  # slot 8 is free but no backward is pending there
    assert activation_peak(got) == 2
    assert activation_peak([[0, 6], [1, 7], [2, 9], [3, 10]]) == 2  # pending weight passes free at free slots
    assert activation_peak([[0, 4], [1, 5], [2, 6], [3, 7]]) == 4  # no free slot until the end


def test_building_blocks_are_one_slot_each() -> None:
    for kind in ("half", "min"):
        for P in range(1, 10):
            block = building_block(kind, P)
            for slots in block:
                assert len(set(slots)) == 4
            assert [len({s[k] for s in block}) for k in range(4)] == [P] * 4


def test_bad_input_is_refused() -> None:
    with pytest.raises(PlanError, match="unknown V schedule"):
        v_greedy("zb", 4, 8)
    with pytest.raises(PlanError, match="microbatches"):
        v_greedy("half", 4, 0)


def test_v_greedy_plan_checks_its_input() -> None:
    plan = v_greedy_plan("v-min", 4, 8, partition=even_partition(8, 8))
    assert plan.placement == v_placement(4) and plan.method == "v-min"
    assert plan.schedule == v_greedy("min", 4, 8).orders
    with pytest.raises(PlanError, match="partition"):
        v_greedy_plan("v-half", 4, 8, partition=even_partition(4, 4))
    with pytest.raises(PlanError, match="v-half or v-min"):
        v_greedy_plan("zbv", 4, 8, partition=even_partition(8, 8))


@pytest.mark.skipif(not DEV.exists(), reason="shared published data not present")
def test_a_published_v_row_runs_the_forks_order_and_ranks_as_its_estimate() -> None:
    """A ZB dev row (p = 8, m = 24) re-labelled V-Half / V-Min: predicted with the fork's order, and
    ranked against 1F1B as the fork's own estimate on the row's profiled times ranks them."""
    from experiments.benchmarks.published import predict_row

    rows = json.loads(DEV.read_text())["rows"]
    base = next(r for r in rows if r["id"] == "zb_t4_1.5B_m24_1F1B")
    P, M = base["parallel"]["pp"], base["batch"]["num_microbatches"]
    t = base["profiled_inputs"]
    F, B, W, C = t["T_F"], t["T_B"], t["T_W"], t["T_comm"]
    one_f_estimate = (M + P - 1) * (F + B + W) + 2 * (P - 1) * C
    one_f = predict_row(base, rows).predicted
    for name, kind in (("V-Half", "half"), ("V-Min", "min")):
        row = copy.deepcopy(base)
        row["schedule"], row["parallel"]["vpp"] = name, 2
        got = predict_row(row, rows)
        assert got.plan is not None and got.plan.schedule == v_greedy(kind, P, M).orders
        estimate = v_greedy(kind, P, M, f=F / 2, b=B / 2, w=W / 2, comm=C).longest_stage
        assert (got.predicted > one_f) == (estimate < one_f_estimate), name
