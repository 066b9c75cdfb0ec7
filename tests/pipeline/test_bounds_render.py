"""Lower bounds hold for every named schedule; the Gantt chart and text rendering draw the timeline."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import bounds
from pipeline.bounds import lower_bound, packing_load
from pipeline.render import gantt_png, gantt_text
from pipeline.schedules import NAMED_METHODS, build_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile


def test_bounds_by_hand() -> None:
    lb = lower_bound(uniform_profile(8), ideal_cluster(4), 16)
    assert lb.work == pytest.approx(16 * 8 * 3 / 4)
    assert lb.heaviest_layer == pytest.approx(16 * 3)
    assert lb.chain == pytest.approx(8 * 2 + 1)
    assert lb.value == lb.work and lb.binding == "work"


@pytest.mark.parametrize("method", NAMED_METHODS)
def test_no_schedule_beats_the_bound(hetero_profile, h100x4, method: str) -> None:
    r = simulate(build_plan(method, hetero_profile, h100x4, 8), hetero_profile, h100x4)
    assert r.iteration_time >= lower_bound(hetero_profile, h100x4, 8).value - 1e-9


def test_heavy_layer_bound_binds_for_a_heavy_head(hetero_profile, h100x4) -> None:
    lb = lower_bound(hetero_profile, h100x4, 64)
    assert lb.binding in ("work", "heaviest_layer", "critical_layer", "packing")
    assert lb.packing >= max(lb.work, lb.heaviest_layer) - 1e-9
    assert lb.heaviest_layer == pytest.approx(64 * (4.0 + 4.0 + 3.6))


def test_gantt_png_and_text(tmp_path, hetero_profile, h100x4) -> None:
    r = simulate(build_plan("zb-h1", hetero_profile, h100x4, 4), hetero_profile, h100x4)
    path = gantt_png(r.timeline_dict(), tmp_path / "g.png", title="zb-h1")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = gantt_text(r.timeline_dict(), width=60)
    lines = text.splitlines()
    assert len(lines) == 5 and all(len(line) == len(lines[0]) for line in lines[:4])
    assert {"F", "I", "W"} <= set(text) and "." in lines[0]


def test_critical_layer_by_hand() -> None:
    # uniform layers f=1, b=1, w=1 (tests.conftest): the last of 8 layers waits 7 forwards, runs
    # 16 x (F+I), then max(16 W, 7 I's back) = 7 + 32 + 16 on one device.
    lb = lower_bound(uniform_profile(8), ideal_cluster(4), 16)
    assert lb.critical_layer == pytest.approx(7 + 32 + 16)
    assert lower_bound(uniform_profile(8), ideal_cluster(4), 16, packing=False).critical_layer == 0.0


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


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.sampled_from([0.5, 1.0, 2.5, 4.0]), min_size=1, max_size=7),
       speeds=st.lists(st.sampled_from([1.0, 2.0]), min_size=1, max_size=3))
def test_packing_is_exact_on_small_cases(costs: list[float], speeds: list[float]) -> None:
    assert packing_load(costs, speeds) == pytest.approx(_brute_force_load(costs, speeds), rel=1e-5)


def test_packing_stays_a_bound_when_costs_are_merged(monkeypatch) -> None:
    costs = [1.0, 1.1, 1.2, 1.3, 5.0, 0.9, 1.05, 1.15]
    exact = packing_load(costs, [1.0, 1.0, 1.0])
    monkeypatch.setattr(bounds, "MAX_PACKING_STATES", 1)
    merged = packing_load(costs, [1.0, 1.0, 1.0])
    assert merged <= exact + 1e-9
    assert merged >= max(sum(costs) / 3, 5.0) - 1e-9


def test_no_searched_plan_beats_the_packing_bound(hetero_profile, h100x4) -> None:
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.space import Problem

    lb = lower_bound(hetero_profile, h100x4, 8)
    r = AdaptisTuner().search(Problem(hetero_profile, h100x4, 8), budget=Budget(sim_calls=60), seed=0)
    assert lb.packing > 0 and r.iteration_time >= lb.value - 1e-9


@pytest.mark.parametrize("granularity,shards", [("sublayer", 1), ("layer", 3), ("sublayer", 4)])
def test_bounds_hold_over_finer_units(granularity: str, shards: int) -> None:
    """Units are plain layers to the bounds: no plan over them beats the bound of their profile,
    and cutting blocks only lowers the ceiling's bound (the costs add up)."""
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.hardware import build_cluster
    from pipeline.space import Problem
    from pipeline.zoo import zoo_profile

    cluster = build_cluster("h100", devices=4)
    fine = zoo_profile("gemma-small", seq_len=2048, granularity=granularity, head_shards=shards)
    lb = lower_bound(fine, cluster, 16)
    r = AdaptisTuner().search(Problem(fine, cluster, 16), budget=Budget(sim_calls=40), seed=0)
    assert r.iteration_time >= lb.value - 1e-9
    if shards == 1:
        assert lb.value <= lower_bound(zoo_profile("gemma-small", seq_len=2048), cluster, 16).value + 1e-9
