"""The AdaPtis tuner: never worse than the named schedules, memory-aware, deterministic."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

import agents.base
from agents.base import Budget
from agents.baselines import NamedSearcher, RandomSearcher
from agents.registry import all_methods, make_searcher
from agents.tuner import AdaptisTuner, seed_candidates
from pipeline.balance import balanced_sizes
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.errors import ConfigError
from pipeline.evaluator import Evaluator
from pipeline.plan import validate_plan
from pipeline.schedules import NAMED_METHODS
from pipeline.spec import Cluster
from pipeline.zoo import zoo_profile
from tests.conftest import ideal_cluster, uniform_profile

BUDGET = Budget(sim_calls=150)


def _best_named(scenario: Scenario) -> float:
    """The best named schedule, at Megatron's split or the DP-balanced one."""
    times = [NamedSearcher(m, balanced=b).search(scenario).iteration_time for m in NAMED_METHODS
             for b in (False, True)]
    return min(times)


@pytest.mark.parametrize("case", ["hetero", "gemma-small", "deepseek-small", "nemotronh-small", "uniform"])
def test_tuner_never_worse_than_best_named(case: str, hetero_profile, h100x4) -> None:
    if case == "hetero":
        scenario = Scenario(hetero_profile, h100x4, 16)
    elif case == "uniform":
        scenario = Scenario(uniform_profile(16), ideal_cluster(4), 16)
    else:
        scenario = Scenario(zoo_profile(case, seq_len=2048), Cluster(devices=4), 16)
    result = AdaptisTuner().search(scenario, budget=BUDGET)
    assert result.ok and result.result.feasible
    validate_plan(result.plan, num_layers=scenario.profile.num_layers, devices=scenario.devices)
    assert result.iteration_time <= _best_named(scenario) * (1 + 1e-9)
    assert result.sim_calls <= BUDGET.sim_calls + 1


def test_tuner_beats_megatron_on_a_heavy_head(hetero_profile, h100x4) -> None:
    scenario = Scenario(hetero_profile, h100x4, 32)
    mega = NamedSearcher("megatron").search(scenario).iteration_time
    tuned = AdaptisTuner().search(scenario, budget=BUDGET).iteration_time
    assert mega / tuned > 1.25


def test_tuner_loses_nothing_on_a_homogeneous_model() -> None:
    scenario = Scenario(uniform_profile(32), ideal_cluster(4), 16)
    mega = NamedSearcher("megatron").search(scenario).iteration_time
    tuned = AdaptisTuner().search(scenario, budget=BUDGET).iteration_time
    assert tuned <= mega


def test_same_seed_same_plan(hetero_profile, h100x4) -> None:
    scenario = Scenario(hetero_profile, h100x4, 16)
    a = AdaptisTuner().search(scenario, budget=BUDGET, seed=7)
    b = AdaptisTuner().search(scenario, budget=BUDGET, seed=7)
    assert a.plan == b.plan and a.iteration_time == b.iteration_time and a.history == b.history


def test_tight_memory_changes_the_answer(hetero_profile, h100x4) -> None:
    free = AdaptisTuner().search(Scenario(hetero_profile, h100x4, 32), budget=BUDGET)
    limit_gb = 0.8 * max(free.result.peak_memory_gb)
    # usable memory: 80% of the free plan's peak (the capacity less the reserve)
    tight_cluster = h100x4.with_memory(limit_gb + h100x4.memory_reserve_gb)
    tight = AdaptisTuner().search(Scenario(hetero_profile, tight_cluster, 32), budget=BUDGET)
    assert tight.result.feasible
    assert max(tight.result.peak_memory_gb) <= limit_gb
    assert tight.plan != free.plan
    # the free plan does not fit the tight limit. (Not asserted: tight slower than free. Both are
    # budgeted heuristic searches on different memory, so the tight one may find a plan the free
    # one did not reach in its budget: 465.1 against 467.1 here since the memory-filling budgets.)
    from pipeline.simulator import simulate

    assert not simulate(free.plan, hetero_profile, tight_cluster).feasible


def test_random_search_spends_its_budget(hetero_profile, h100x4) -> None:
    res = RandomSearcher().search(Scenario(hetero_profile, h100x4, 16), budget=Budget(sim_calls=40), seed=1)
    assert res.ok and 35 <= res.sim_calls <= 40


def test_improvements_are_reported_as_they_happen(hetero_profile, h100x4) -> None:
    seen = []
    res = AdaptisTuner().search(Scenario(hetero_profile, h100x4, 16), budget=Budget(sim_calls=80),
                                on_improve=lambda plan, result: seen.append(result.iteration_time))
    assert seen == sorted(seen, reverse=True)
    assert seen[-1] == pytest.approx(res.iteration_time)


def test_seconds_budget_is_honoured(hetero_profile, h100x4, monkeypatch) -> None:
    """A seconds budget ends the search within a few clock readings of running out. The budget's clock
    is a fake one that ticks 1 ms a reading, so the test counts readings instead of timing the search."""
    calls = {}
    for seconds in (0.05, 0.5):
        reads = itertools.count(1)
        monkeypatch.setattr(agents.base, "time", SimpleNamespace(perf_counter=lambda r=reads: next(r) * 1e-3))
        res = AdaptisTuner().search(Scenario(hetero_profile, h100x4, 16),
                                    budget=Budget(sim_calls=None, seconds=seconds))
        assert res.ok and next(reads) <= seconds / 1e-3 + 5
        calls[seconds] = res.sim_calls
    assert 0 < calls[0.05] < calls[0.5]


def test_balanced_sizes_is_optimal_by_brute_force() -> None:
    prof = uniform_profile(7)
    costs = [1.0, 5.0, 1.0, 1.0, 3.0, 2.0, 1.0]
    placement = (0, 1, 2)
    sizes = balanced_sizes(prof, placement, Cluster(devices=3), weights=costs)
    def worst(sz):
        out, start = [], 0
        for n in sz:
            out.append(sum(costs[start:start + n]))
            start += n
        return max(out)
    best = min(worst(c) for c in itertools.product(range(1, 6), repeat=3) if sum(c) == 7)
    assert sum(sizes) == 7 and worst(sizes) == best


def test_registry_names() -> None:
    assert "adaptis" in all_methods() and "zbv+dp" in all_methods()
    assert make_searcher("zbv+dp").name == "zbv+dp"
    with pytest.raises(ConfigError, match="unknown method 'zz'"):
        make_searcher("zz")


def test_evaluator_caches_and_counts(hetero_profile, h100x4) -> None:
    ev = Evaluator(Scenario(hetero_profile, h100x4, 8))
    c = Candidate((4, 4, 4, 4), (0, 1, 2, 3))
    ev.evaluate(c)
    ev.evaluate(c)
    assert ev.calls == 1
    bad = Candidate((4, 4, 4, 4), (0, 1, 2, 3), order="zbv")
    _, res = ev.evaluate(bad)
    assert not res.valid and "V placement" in res.error


def test_tuner_recomputes_where_memory_binds() -> None:
    """One micro-batch's activations (4 x 6 GiB) fit on no pair of 10 GiB devices: only plans that
    recompute fit, and the tuner finds one."""
    from pipeline.spec import GIB

    profile = uniform_profile(4, act=6 * GIB, out=1 << 20)
    cluster = Cluster(devices=2, memory_gb=10, p2p_gbps=1e12, latency_us=0.0)
    scenario = Scenario(profile, cluster, 8)
    r = AdaptisTuner().search(scenario, budget=Budget(sim_calls=200), seed=0)
    assert r.ok and r.result.feasible
    assert r.plan.recompute is not None and any(r.plan.recompute)
    kept = Candidate(tuple(b - a for a, b in r.plan.partition), r.plan.placement)
    assert not Evaluator(scenario).evaluate(kept)[1].feasible  # the same split without recompute does not fit


def test_placement_moves_drop_recompute_of_another_stage_count() -> None:
    """A recomputing plan's placement moves offer other families (other stage counts): the per-stage
    recompute list cannot carry over (it made the merged tuner stop with a PlanError on
    deepseek-large 4k with finer units); moves that keep the stages keep it."""
    import random

    scenario = Scenario(uniform_profile(16), ideal_cluster(4), 8)
    ev = Evaluator(scenario)
    placement = make_placement("sequential", 4, 1)
    c = Candidate(ev.balanced_sizes(placement), placement, "list", (2.0,) * 4, recompute=(True, False, False, False))
    moves = list(AdaptisTuner._placement_moves(c, ev.result(c), scenario, random.Random(0), ev))
    assert any(len(m.placement) != len(placement) for m in moves)
    for m in moves:
        assert m.recompute is None if len(m.sizes) != c.num_stages else m.recompute == c.recompute
        assert ev.result(m).valid


def _alternating_scenario(memory_gb: float = 1e9) -> Scenario:
    """Light and heavy units in turn (a block's attention and MLP, cut apart), two devices in two
    chunks: balanced by stage, one device gets 6 of 10 per micro-batch; balanced by device, 5."""
    from pipeline.spec import LayerCost, ModelProfile

    costs = [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]
    profile = ModelProfile("alt", tuple(LayerCost(f"u{i}", "mlp", c / 3, c / 3, c / 3, 1000, 1 << 20, 1 << 10)
                                        for i, c in enumerate(costs)))
    return Scenario(profile, Cluster(devices=2, memory_gb=memory_gb, p2p_gbps=1e12, latency_us=0.0), 16)


def test_seeds_hold_the_device_balanced_split_under_memory_filling_budgets() -> None:
    scenario = _alternating_scenario()
    ev = Evaluator(scenario)
    seeds = seed_candidates(scenario, ev)
    placement = make_placement("interleaved", 2, 2)
    balanced = ev.device_balanced_sizes(placement)
    assert balanced != ev.balanced_sizes(placement)
    ours = [c for c in seeds if c.placement == placement and c.sizes == balanced]
    assert ours, "no seed with the device-balanced split"
    filled = [c for c in ours if c.budgets == tuple(math.floor(b * 100) / 100 for b in ev.memory_budgets(c))]
    assert filled and all(c.cap_counts_w for c in filled)


def test_tuner_balances_devices_not_stages() -> None:
    """26 light and heavy units in turn on 3 devices: every device can get 13 per micro-batch (the
    work bound, 208 for 16 micro-batches), and the tuner gets within 1% of it (before it balanced
    devices it stopped at 216.7, 4% above)."""
    from pipeline.spec import LayerCost, ModelProfile

    costs = [1.0, 2.0] * 13
    profile = ModelProfile("alt", tuple(LayerCost(f"u{i}", "mlp", c / 3, c / 3, c / 3, 1000, 1 << 20, 1 << 10)
                                        for i, c in enumerate(costs)))
    scenario = Scenario(profile, Cluster(devices=3, memory_gb=1e9, p2p_gbps=1e12, latency_us=0.0), 16)
    r = AdaptisTuner().search(scenario, budget=Budget(sim_calls=300), seed=0)
    bound = sum(costs) / 3 * scenario.microbatches
    assert r.ok and r.result.feasible
    assert max(r.result.busy) == pytest.approx(bound)
    assert r.iteration_time <= 1.01 * bound


def testlighten_first_stage_keeps_the_device_loads_and_finds_the_issue_plan() -> None:
    """gemma-large with sub-block units and 8 head shards, 16 devices, 4k, 64 micro-batches (issue
    15): device 0 is memory-full; moving units from its first stage (embedding + blocks, whose
    activations stage 0 keeps until its W) to its later stages keeps every device's load and
    gives the list scheduler room: one such plan under memory-filling budgets beats the
    device-balanced plan it came from, and the tuner's seeds hold it. On 78 GB of memory (74 usable):
    since 6 Dec the embedding's dense gradient counts only beyond what its stage's backward frees,
    which leaves a full H100 enough room that the device-balanced plan no longer needs the move."""
    from agents.tuner import lighten_first_stage
    from pipeline.balance import device_loads
    from pipeline.hardware import build_cluster
    from pipeline.start_recipes import with_filled_budgets

    profile = zoo_profile("gemma-large", seq_len=4096, granularity="sublayer", head_shards=8)
    scenario = Scenario(profile, build_cluster("h100", devices=16, gpus_per_node=8).with_memory(78.0), 64)
    ev = Evaluator(scenario)
    placement = make_placement("interleaved", 16, 3)
    base = Candidate(ev.device_balanced_sizes(placement), placement)
    costs = [x.f + x.b + x.w for x in profile.layers]
    top = device_loads(costs, base.sizes, placement, devices=16).max()
    variants = lighten_first_stage(base, 0, scenario)
    assert variants
    for v in variants:
        assert v.sizes[0] < base.sizes[0] and sum(v.sizes) == sum(base.sizes)
        assert device_loads(costs, v.sizes, placement, devices=16).max() <= top + 1e-9
    before = ev.result(with_filled_budgets(base, ev))
    best = min(variants, key=lambda v: ev.result(with_filled_budgets(v, ev)).iteration_time)
    after = ev.result(with_filled_budgets(best, ev))
    assert before.feasible and after.feasible
    assert after.iteration_time < before.iteration_time
    assert with_filled_budgets(best, ev) in seed_candidates(scenario, ev)


def test_schedule_moves_refill_budgets_after_recomputing_the_fullest_device() -> None:
    """A held-out scenario whose memory binds every device (13 devices, 128 micro-batches, 16 GiB):
    recomputing the fullest device's stage lightens it, and only with budgets refilled for what is
    left (``with_roomy_budgets``) does that pay: >10% faster than the memory-filling budgets it started
    from (15.5% on the fp32-head cost model), while recomputing on the old budgets is slower."""
    import random
    from dataclasses import replace

    import numpy as np

    from env.scenarios import HELDOUT_SCENARIO, sample_scenario
    from pipeline.start_recipes import with_filled_budgets, with_roomy_budgets

    scenario = sample_scenario(np.random.default_rng(20010), HELDOUT_SCENARIO)
    ev = Evaluator(scenario)
    placement = make_placement("sequential", scenario.devices, 1)
    base = with_filled_budgets(Candidate(ev.balanced_sizes(placement), placement, "list"), ev)
    before = ev.result(base)
    assert before.feasible
    moves = list(AdaptisTuner._schedule_moves(base, before, scenario, random.Random(0), ev))
    recomputing = [m for m in moves if m.recompute is not None and any(m.recompute)]
    plain = replace(base, recompute=recomputing[0].recompute)
    assert recomputing and with_roomy_budgets(plain, ev) in moves
    assert ev.result(plain).iteration_time > before.iteration_time
    best = min((ev.result(m) for m in moves if ev.result(m).feasible), key=lambda r: r.iteration_time)
    assert best.iteration_time < 0.9 * before.iteration_time


def _mixed_speed_head_scenario() -> Scenario:
    """Twelve layers and a head as heavy as four of them on four devices, the first and the last
    at half speed: every placement family in index order ends on a slow device (sequential,
    interleaved and wave-3 on device 3, V and wave-4 on device 0), so the head lands on one."""
    from pipeline.spec import Device, LayerCost, ModelProfile

    layers = [LayerCost(f"l{i}", "attention+mlp", 1.0, 1.0, 1.0, 1000, 1000, 0) for i in range(12)]
    layers.append(LayerCost("head", "head", 4.0, 4.0, 4.0, 1000, 1000, 0))
    cluster = Cluster(devices=4, p2p_gbps=1e12, latency_us=0.0,
                      device_list=(Device(0.5, 1e6), Device(1.0, 1e6), Device(1.0, 1e6), Device(0.5, 1e6)))
    return Scenario(ModelProfile("head-heavy", tuple(layers)), cluster, 16)


def test_slow_first_seeds_put_the_head_on_the_fastest_device() -> None:
    """On mixed speeds the tuner also seeds every family with the fastest devices last; there
    the head leaves the slow device, which beats every seed in index order. A uniform cluster
    gets no such seeds."""
    from agents.tuner import slow_first_seeds

    scenario = _mixed_speed_head_scenario()
    ev = Evaluator(scenario)
    ordered = slow_first_seeds(scenario, ev)
    plain = [c for c in seed_candidates(scenario, ev) if c not in ordered]
    assert ordered and all(c.placement[-1] in (0, 3) for c in plain)

    def best(cands: list[Candidate]) -> tuple[float, Candidate]:
        return min(((r.iteration_time, c) for c, r in zip(cands, ev.results(cands)) if r.feasible),
                   key=lambda x: x[0])

    (t_ordered, c_ordered), (t_plain, _) = best(ordered), best(plain)
    assert t_ordered < 0.9 * t_plain and c_ordered.placement[-1] in (1, 2)
    uniform = Scenario(scenario.profile, ideal_cluster(4), 16)
    assert slow_first_seeds(uniform, Evaluator(uniform)) == []
    found = AdaptisTuner().search(scenario, budget=Budget(200), seed=0)
    assert found.plan is not None and found.plan.placement[-1] in (1, 2)


def test_named_plans_false_skips_the_named_schedules(hetero_profile, h100x4) -> None:
    """``AdaptisTuner(named_plans=False)``: no named schedule is simulated, so its first calls are
    its own seeds and its best plan is always an editable candidate; the default simulates them
    first (one call each)."""
    scenario = Scenario(hetero_profile, h100x4, 16)
    skip = AdaptisTuner(named_plans=False)
    res = skip.search(scenario, budget=BUDGET)
    assert res.ok and res.result.feasible and skip.best_candidate is not None
    assert res.sim_calls <= BUDGET.sim_calls + 1
    short = Budget(sim_calls=2 * len(NAMED_METHODS) - 1)  # each at Megatron's and the DP split
    assert AdaptisTuner().search(scenario, budget=short).note in set(NAMED_METHODS) | {
        f"{m}+dp" for m in NAMED_METHODS}
    assert AdaptisTuner(named_plans=False).search(scenario, budget=short).note.startswith("list ")


def test_a_seconds_budget_is_kept_at_a_large_size(monkeypatch) -> None:
    """issue 30: `--budget 1s` took 4.1 s at gemma-large, 32 devices, 256 micro-batches, sub-layer units
    (the named schedules, the seeds' splits and one batch of every seed, none of them checking the
    clock). The budget's clock is a fake one that reads the simulator calls so far, 10 ms each (nothing
    else takes time), so the test counts calls: no call starts once the budget is spent, and the search
    ends within one batch of it, a batch no larger than the calls left (bar the first
    probe). experiments.benchmarks.budget_keeping measures the wall time."""
    from agents.tuner.clock import PROBE_BATCH
    from pipeline.hardware import build_cluster
    from pipeline.spec import TrainingConfig

    scenario = Scenario(zoo_profile("gemma-large", gpu="h100", granularity="sublayer"),
                        build_cluster("h100", devices=32),
                        256, TrainingConfig(runtime="pytorch"))
    per_call = 0.01
    tuner = AdaptisTuner()
    monkeypatch.setattr(agents.base, "time", SimpleNamespace(
        perf_counter=lambda: (tuner.evaluator.calls if tuner.evaluator is not None else 0) * per_call))
    starts: list[tuple[int, int]] = []  # (calls before, new calls) of each batch and named plan
    results, simulate_plan = Evaluator.results, Evaluator.simulate_plan

    def counted_results(self, candidates):
        starts.append((self.calls, sum(not self.known(c) for c in dict.fromkeys(candidates))))
        return results(self, candidates)

    def counted_simulate_plan(self, plan):
        starts.append((self.calls, 1))
        return simulate_plan(self, plan)

    monkeypatch.setattr(Evaluator, "results", counted_results)
    monkeypatch.setattr(Evaluator, "simulate_plan", counted_simulate_plan)
    for calls in (10, 40):
        starts.clear()
        res = tuner.search(scenario, budget=Budget(sim_calls=None, seconds=calls * per_call))
        assert res.feasible
        assert all(before < calls for before, new in starts if new), starts
        assert all(new <= max(PROBE_BATCH, calls - before) for before, new in starts), starts
        assert res.sim_calls <= calls + max(new for _, new in starts), starts


def test_a_seconds_budget_probes_before_it_batches(hetero_profile, h100x4) -> None:
    """Under a budget in seconds the first batch of new candidates is small (the time per call is not
    known yet) and the next at most twice the last; under a budget in calls, one batch holds them all."""
    import agents.tuner.clock as tuner_clock

    sizes: list[int] = []
    original = Evaluator.results

    def results(self, candidates):
        sizes.append(sum(not self.known(c) for c in dict.fromkeys(candidates)))
        return original(self, candidates)

    scenario = Scenario(hetero_profile, h100x4, 16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Evaluator, "results", results)
        AdaptisTuner().search(scenario, budget=Budget(sim_calls=None, seconds=0.3))
    assert sizes[0] <= tuner_clock.PROBE_BATCH, sizes
    assert all(b <= 2 * max([*sizes[:k], tuner_clock.PROBE_BATCH]) for k, b in enumerate(sizes) if k), sizes


def test_on_progress_sees_every_improvement_without_building_plans(hetero_profile, h100x4, monkeypatch) -> None:
    """``on_progress`` gets (calls, result) at each improvement, the same steps as the history, with
    whether each fits; unlike ``on_improve`` it builds no plan (the search's plans are the same)."""
    scenario = Scenario(hetero_profile, h100x4, 16)
    plain = AdaptisTuner().search(scenario, budget=BUDGET, seed=1)
    seen: list[tuple[int, float, bool]] = []
    built = []
    plan = Evaluator.plan
    monkeypatch.setattr(Evaluator, "plan", lambda self, c: built.append(c) or plan(self, c))
    res = AdaptisTuner(on_progress=lambda calls, r: seen.append((calls, r.iteration_time, bool(r.feasible)))).search(
        scenario, budget=BUDGET, seed=1)
    assert res.history == plain.history and len(seen) == len(res.history) > 1
    assert [(c, t) for c, t, _ in seen] == res.history and seen[-1][2]
    assert len(built) <= 1  # the winner's plan at the end, not one a step
