"""The plan space's helpers: memory-filling activation budgets, the evaluator's cached partitions."""

from __future__ import annotations

import pytest

from pipeline.balance import device_balanced_sizes
from pipeline.budgets import memory_budgets, microbatch_bytes, roomy_budgets
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.evaluator import Evaluator
from pipeline.hardware import build_cluster
from pipeline.spec import TrainingConfig
from pipeline.zoo import zoo_profile


@pytest.mark.parametrize("keeps_graph", [True, False])
@pytest.mark.parametrize(("kind", "chunks"), [("sequential", 1), ("interleaved", 2), ("v", 2), ("wave", 3)])
def test_memory_budgets_fill_memory_and_fit(kind: str, chunks: int, keeps_graph: bool) -> None:
    profile = zoo_profile("gemma-small", seq_len=4096)
    cluster = build_cluster("h100", devices=4, gpus_per_node=8).with_memory(40)
    scenario = Scenario(profile, cluster, 32, TrainingConfig(input_backward_keeps_graph=keeps_graph))
    ev = Evaluator(scenario)
    placement = make_placement(kind, 4, chunks)
    sizes = ev.balanced_sizes(placement)
    costs = ev.costs(sizes, placement)
    budgets = memory_budgets(costs, placement, 4)
    # one micro-batch holds at most its activations or, after I, what it keeps for W
    held = [sum(max(a, k) for a, k, d in zip(costs.act, costs.w_keep, placement) if d == dev) for dev in range(4)]
    assert held == pytest.approx(microbatch_bytes(costs, placement, 4))
    for d in range(4):  # static memory plus the budget's bytes is exactly the limit
        assert costs.static_bytes[d] + budgets[d] * held[d] == pytest.approx(costs.memory_limit[d])
    result = ev.result(Candidate(sizes, placement, "list", budgets, cap_counts_w=True))
    assert result.feasible
    deeper = ev.result(Candidate(sizes, placement, "list", tuple(2 * b for b in budgets), cap_counts_w=True))
    assert max(p / m for p, m in zip(deeper.peak_memory, deeper.memory_limit)) > \
        max(p / m for p, m in zip(result.peak_memory, result.memory_limit))


def _gemma_small_interleaved_at_40_gib():
    """(evaluator, placement, sizes, stage costs) of gemma-small 4k, 2 chunks on 4 devices at 40 GiB,
    where PyTorch's I keeps more than F added."""
    profile = zoo_profile("gemma-small", seq_len=4096)
    cluster = build_cluster("h100", devices=4, gpus_per_node=8).with_memory(40)
    ev = Evaluator(Scenario(profile, cluster, 32))
    placement = make_placement("interleaved", 4, 2)
    sizes = ev.balanced_sizes(placement)
    return ev, placement, sizes, ev.costs(sizes, placement)


def test_memory_budgets_count_what_pytorchs_input_backward_keeps() -> None:
    """PyTorch's I keeps more than F added (``w_keep > act``): budgets sized by the activations
    alone let I lift the device over its limit; sized by what a micro-batch holds, it fits."""
    ev, placement, sizes, costs = _gemma_small_interleaved_at_40_gib()
    assert any(k > a for k, a in zip(costs.w_keep, costs.act))
    by_act = memory_budgets(costs, placement, 4, split_backward=False)
    assert not ev.result(Candidate(sizes, placement, "list", by_act, cap_counts_w=True)).feasible
    ours = ev.memory_budgets(Candidate(sizes, placement, "list"))
    assert ours == memory_budgets(costs, placement, 4) and all(a < b for a, b in zip(ours, by_act))
    assert ev.result(Candidate(sizes, placement, "list", ours, cap_counts_w=True)).feasible
    # with a fused backward nothing is kept after the backward: the activations size a micro-batch
    assert ev.memory_budgets(Candidate(sizes, placement, "list", split_backward=False)) == by_act


def test_roomy_budgets_size_a_microbatch_by_its_activations_and_hold_back_one_kept_share() -> None:
    """Deeper than the budgets that surely fit (PyTorch's I keeps more than F added): the
    activations alone fill what the limit leaves after static memory and one stage's kept bytes."""
    ev, placement, sizes, costs = _gemma_small_interleaved_at_40_gib()
    roomy = roomy_budgets(costs, placement, 4)
    assert roomy == ev.roomy_budgets(Candidate(sizes, placement, "list"))
    for d in range(4):
        mine = [s for s, dev in enumerate(placement) if dev == d]
        act = sum(costs.act[s] for s in mine)
        kept = max(costs.w_keep[s] for s in mine)
        assert costs.static_bytes[d] + kept + roomy[d] * act == pytest.approx(costs.memory_limit[d])
    assert all(r > b for r, b in zip(roomy, memory_budgets(costs, placement, 4)))


def test_evaluator_device_balanced_sizes_is_cached_and_matches() -> None:
    profile = zoo_profile("gemma-small", seq_len=2048, granularity="sublayer")
    scenario = Scenario(profile, build_cluster("h100", devices=4, gpus_per_node=8), 16)
    ev = Evaluator(scenario)
    placement = make_placement("interleaved", 4, 3)
    got = ev.device_balanced_sizes(placement)
    assert got is ev.device_balanced_sizes(placement)
    assert got == device_balanced_sizes(profile, placement, scenario.cluster, start=ev.balanced_sizes(placement))
    assert ev.calls == 0  # no simulator calls


def test_recompute_flags_follow_a_new_layout():
    """A placement move keeps 'recompute every stage' and drops per-stage flags (they name other stages)."""
    from pipeline.candidates import Candidate, recompute_for

    everywhere = Candidate((2, 2, 2, 2), (0, 1, 1, 0), "list", recompute=(True,) * 4)
    some = Candidate((2, 2, 2, 2), (0, 1, 1, 0), "list", recompute=(True, False, False, False))
    assert recompute_for(everywhere, 2) == (True, True) and recompute_for(everywhere, 4) == (True,) * 4
    assert recompute_for(some, 2) is None and recompute_for(some, 4) == some.recompute
    assert recompute_for(Candidate((4, 4), (0, 1), "list"), 4) is None


def test_cut_budgets_keep_whole_microbatches_that_fit():
    """Budgets are cut to the whole micro-batches memory holds after the static share; None when one does not fit."""
    import numpy as np

    from env.scenarios import ScenarioConfig, sample_scenario
    from pipeline.budgets import cut_budgets, microbatch_bytes
    from pipeline.evaluator import Evaluator

    config = ScenarioConfig(min_devices=4, max_devices=4, microbatches=(16,))
    scenario = sample_scenario(np.random.default_rng(3), config)
    placement = (0, 1, 2, 3)
    costs = Evaluator(scenario).costs(Evaluator(scenario).balanced_sizes(placement), placement)
    held = microbatch_bytes(costs, placement, 4)
    room = [lim - st for lim, st in zip(costs.memory_limit, costs.static_bytes)]
    cut = cut_budgets(costs, placement, (1000.0,) * 4)
    assert cut == tuple(max(1.0, float(int(r / h))) for r, h in zip(room, held))
    small = (2.0, 1.0, 3.0, 1.0)
    assert cut_budgets(costs, placement, small) == tuple(min(b, c) for b, c in zip(small, cut))
    half = tuple(st + 0.5 * h for st, h in zip(costs.static_bytes, held))
    tight = type(costs)(**{**costs.__dict__, "memory_limit": half})
    assert cut_budgets(tight, placement, (4.0,) * 4) is None


def test_slow_first_orders_devices_by_speed_and_budgets_follow_their_position():
    """Fastest device last (ties in index order), none on a uniform cluster; budgets given by
    pipeline position move to the devices that hold those positions."""
    from pipeline.candidates import by_position, slow_first

    assert slow_first((1.0, 1.0, 1.0)) is None
    order = slow_first((1.0, 0.5, 2.0, 0.5))
    assert order == (1, 3, 0, 2)
    assert by_position((4.0, 3.0, 2.0, 1.0), order) == (2.0, 4.0, 1.0, 3.0)


def test_the_evaluator_counts_every_call_made_through_it() -> None:
    from pipeline.candidates import Candidate, Scenario
    from pipeline.evaluator import Evaluator
    from pipeline.schedules import build_plan
    from pipeline.simulator import simulate
    from pipeline.spec import Cluster, LayerCost, ModelProfile

    profile = ModelProfile("t", tuple(LayerCost(f"l{k}", "block", 1.0, 1.0, 0.5, 10, 100, 100) for k in range(8)))
    cluster = Cluster(devices=4)
    ev = Evaluator(Scenario(profile, cluster, 8))
    plan = build_plan("1f1b", profile, cluster, microbatches=8)
    assert ev.simulate_plan(plan).iteration_time == simulate(plan, profile, cluster).iteration_time
    assert ev.calls == 1
    c = Candidate((2, 2, 2, 2), (0, 1, 2, 3))
    other = Evaluator(ev.scenario)
    found = other.result(c)
    assert ev.cached(c) is None and ev.adopt(c, found) is found
    assert ev.calls == 2 and ev.known(c) and ev.call_number(c) == 2 and ev.result(c) is found and ev.calls == 2


def test_a_candidates_hash_is_the_dataclass_hash_kept_once() -> None:
    """Candidate keeps the hash of its fields (what the dataclass would give) beside them; a
    pickle or a copy leaves it out."""
    import copy
    import pickle
    from dataclasses import fields

    c = Candidate((2, 3), (0, 1), budgets=(1.0, 2.0), recompute=(False, True))
    assert hash(c) == hash(tuple(getattr(c, f.name) for f in fields(c))) and "_hash" in c.__dict__
    for other in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c), copy.copy(c)):
        assert other == c and "_hash" not in other.__dict__ and hash(other) == hash(c)


def test_the_evaluators_splits_are_shared_by_placements_of_the_same_stage_speeds(monkeypatch) -> None:
    """The DP-balanced split depends on the stages' speeds only: on a cluster of one speed the
    evaluator runs it once for V and interleaved (as many stages), on mixed speeds once each; every
    answer is balanced_sizes' own."""
    from dataclasses import replace

    import pipeline.evaluator as evaluator
    from pipeline.balance import balanced_sizes
    from pipeline.spec import Device

    calls = []
    monkeypatch.setattr(evaluator, "balanced_sizes", lambda *a, **k: calls.append(a[1]) or balanced_sizes(*a, **k))
    profile = zoo_profile("gemma-small", seq_len=4096)
    even = build_cluster("h100", devices=4)
    mixed = replace(even, device_list=tuple(Device(speed=s, memory_gb=80.0) for s in (1.0, 0.5, 1.0, 0.8)))
    for cluster, runs in ((even, 2), (mixed, 3)):
        calls.clear()
        ev = Evaluator(Scenario(profile, cluster, 16))
        for kind, chunks in (("v", 2), ("interleaved", 2), ("v", 2), ("sequential", 1)):
            placement = make_placement(kind, 4, chunks)
            assert ev.balanced_sizes(placement) == balanced_sizes(profile, placement, cluster)
        assert len(calls) == runs


def test_move_layers_shifts_every_boundary_between_and_never_empties_a_stage():
    from pipeline.candidates import move_layers

    assert move_layers((3, 2, 4), 0, 2) == (2, 2, 5)  # the middle stage keeps its 2: both boundaries shift
    assert move_layers((3, 2, 4), 2, 1, n=2) == (3, 4, 2)
    assert move_layers((1, 5), 0, 1) is None  # stage 0 would be empty
    assert move_layers((3, 5), 0, 1, n=3) is None
    assert move_layers((3, 5), 1, 1) is None
