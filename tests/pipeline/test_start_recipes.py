"""The start recipes: what each builds, that its plans run, and that the searches share them."""

from __future__ import annotations

import pytest

from pipeline.budgets import preset_budgets
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.hardware import build_cluster
from pipeline.schedules import method_placement
from pipeline.start_recipes import (
    PLACEMENT_CHOICES,
    SEED_PRESETS,
    SPLITS,
    fit_candidate,
    fixed_order_candidate,
    named_schedule_plan,
    preset_candidate,
    recompute_candidate,
    split_sizes,
)
from pipeline.zoo import zoo_profile

P = 4


def _scenario(memory_gb: float | None = None) -> Scenario:
    cluster = build_cluster("h100", devices=P, gpus_per_node=8)
    if memory_gb is not None:
        cluster = cluster.with_memory(memory_gb)
    return Scenario(zoo_profile("gemma-small", seq_len=4096), cluster, 16)


@pytest.mark.parametrize(("kind", "chunks"), PLACEMENT_CHOICES)
def test_every_split_covers_the_model(kind: str, chunks: int) -> None:
    scenario = _scenario()
    ev = Evaluator(scenario)
    placement = make_placement(kind, P, chunks)
    layers = scenario.profile.num_layers
    for split in SPLITS:
        sizes = split_sizes(ev, placement, split)
        if split == "devbal" and chunks == 1:
            assert sizes is None  # one stage per device: the DP-balanced split is the device-balanced one
            continue
        assert sizes is not None and len(sizes) == len(placement) and sum(sizes) == layers and min(sizes) >= 1
    assert split_sizes(ev, placement, "dp") == ev.balanced_sizes(placement)
    with pytest.raises(PlanError, match="split"):
        split_sizes(ev, placement, "even")


def test_preset_budgets_count_w_as_their_schedule_does() -> None:
    sizes, placement = (5, 5, 4, 4), make_placement("sequential", P, 1)
    for preset in SEED_PRESETS:
        c = preset_candidate(sizes, placement, preset, devices=P)
        assert (c.order, c.budgets) == ("list", preset_budgets(preset, P))
        zb = preset in ("zb-h1", "zb-h2")  # ZB-H1/H2 hold W back: their budgets leave W out
        assert c.cap_counts_w is not zb and c.max_pending_w == (P if zb else None)
    assert preset_candidate(sizes, placement, None, devices=P).budgets is None
    order = (2, 0, 3, 1)  # pipeline position -> device: each position's budget moves to its device
    moved = preset_candidate(sizes, tuple(order), "zb-h1", devices=P, device_order=order).budgets
    assert moved is not None
    assert [moved[d] for d in order] == list(preset_budgets("zb-h1", P))


@pytest.mark.parametrize(("kind", "chunks", "order"),
                         [("sequential", 1, "1f1b"), ("interleaved", 2, "interleaved"),
                          ("interleaved", 3, "interleaved"), ("v", 2, "zbv")])
def test_fixed_orders_are_the_placements_own(kind: str, chunks: int, order: str) -> None:
    scenario = _scenario()
    ev = Evaluator(scenario)
    placement = make_placement(kind, P, chunks)
    c = fixed_order_candidate(ev.balanced_sizes(placement), placement, devices=P)
    assert c.order == order
    assert ev.result(c).valid  # the hand-built order accepts the placement


def test_a_placement_without_a_fixed_order_is_refused() -> None:
    placement = make_placement("wave", P, 3)
    with pytest.raises(PlanError, match="placement"):
        fixed_order_candidate((2,) * len(placement), placement, devices=P)


def test_fit_cuts_budgets_to_memory_and_the_plan_fits() -> None:
    roomy, tight = _scenario(), _scenario(memory_gb=32)
    for scenario in (roomy, tight):
        ev = Evaluator(scenario)
        placement = make_placement("interleaved", P, 2)
        sizes = ev.balanced_sizes(placement)
        c = fit_candidate(sizes, placement, ev, preset="zbv")
        if scenario is roomy:
            assert c is None  # the named budgets fit already: nothing to cut
            continue
        full = preset_budgets("zbv", P)
        assert c is not None and c.cap_counts_w and c.budgets is not None
        assert all(1 <= b <= f for b, f in zip(c.budgets, full)) and c.budgets != full
        assert ev.result(c).feasible
        assert not ev.result(preset_candidate(sizes, placement, "zbv", devices=P)).feasible
    with pytest.raises(PlanError, match="preset"):
        fit_candidate(sizes, placement, Evaluator(tight), preset="unlimited")


def test_recompute_keeps_only_stage_inputs_and_fits_where_less_does() -> None:
    scenario = _scenario(memory_gb=24)
    ev = Evaluator(scenario)
    placement = make_placement("interleaved", P, 2)
    sizes = ev.balanced_sizes(placement)
    c = recompute_candidate(sizes, placement, ev)
    assert c is not None and c.recompute == (True,) * len(placement) and not c.split_backward
    assert c.budgets is not None and all(1 <= b <= f for b, f in zip(c.budgets, preset_budgets("zbv", P)))
    assert ev.result(c).feasible
    # keeping every activation, one micro-batch does not fit
    assert fit_candidate(sizes, placement, ev, preset="zbv") is None
    assert recompute_candidate(sizes, placement, Evaluator(_scenario(memory_gb=10))) is None


def test_named_schedule_plans_at_each_split() -> None:
    scenario = _scenario()
    ev = Evaluator(scenario)
    even = named_schedule_plan(ev, "zbv")
    balanced = named_schedule_plan(ev, "zbv", balanced=True)
    assert balanced.stage_sizes == ev.balanced_sizes(method_placement("zbv", P)) != even.stage_sizes
    megatron = named_schedule_plan(ev, "megatron", chunks=2)
    assert megatron.meta == {"method": "megatron", "chunks": 2} and megatron.num_stages == 2 * P
    with pytest.raises(PlanError):
        named_schedule_plan(ev, "no-such-schedule")


def test_the_searches_start_from_the_same_recipes() -> None:
    """The tuner's seeds and the start ranker's arms are built by these functions: each plain arm
    of the ranker is one of the tuner's seeds, and the named baselines build the named plans."""
    from agents.baselines import NamedSearcher
    from agents.rl.starts import build_arm
    from agents.tuner import seed_candidates

    scenario = _scenario()
    ev = Evaluator(scenario)
    seeds = set(seed_candidates(scenario, ev))
    for name in ("list:v2:dp:zbv", "list:sequential1:megatron:zb-h1", "list:interleaved2:devbal:unlimited",
                 "fixed:interleaved2:dp", "list:wave3:dp:filled"):
        arm = build_arm(name, scenario, ev)
        assert arm is not None and isinstance(arm.candidate, Candidate) and arm.candidate in seeds, name
    plan = NamedSearcher("zbv", balanced=True).search(scenario).plan
    assert plan is not None and plan.stage_sizes == named_schedule_plan(ev, "zbv", balanced=True).stage_sizes


def test_preset_candidate_budgets_are_the_presets() -> None:
    """preset_candidate's cached budgets are preset_budgets' (by preset and device count; a count that
    is not an int gets its own answer, here range()'s error)."""
    for devices in (1, 2, 3, 8, 2, 3):
        for preset in (*SEED_PRESETS, "zb-h2", "v-half", "unlimited", None):
            c = preset_candidate((1,) * devices, tuple(range(devices)), preset, devices=devices)
            assert c.budgets == (preset_budgets(preset, devices) if preset else None)
    preset_candidate((1, 1, 1, 1), (0, 1, 2, 3), "zb-h1", devices=4)
    with pytest.raises(TypeError):
        preset_candidate((1, 1, 1, 1), (0, 1, 2, 3), "zb-h1", devices=4.0)
