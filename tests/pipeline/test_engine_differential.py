"""The compiled engine against the Python reference: identical orders, times, peaks and errors.

Generated cases (hypothesis, a fixed seed so CI is repeatable) cover placements beyond loop and V
(wave and arbitrary mappings), multi-node links with latency, memory caps that bind (and caps so
tight that every device waits), tied starts and zero-time actions, fused-B times, per-action
overhead, all-distinct costs, every list-scheduler knob, and broken plans (deadlocks, missing,
repeated and misplaced actions). ``ADAPTIS_DIFF_EXAMPLES`` sets the total
number of cases (default 10,000).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import engine
from pipeline.engine import list_schedule
from pipeline.errors import PlanError
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps, list_schedule_python
from pipeline.plan import Action, Plan, partition_from_sizes, v_placement, wave_placement
from pipeline.simulator import Result, StageCosts, simulate, stage_costs
from pipeline.spec import Cluster, Device, LayerCost, ModelProfile

if not engine.compiled() and os.environ.get("CI"):
    raise RuntimeError("CI must build the compiled engine (make engine): the differential tests need it")
pytestmark = pytest.mark.skipif(not engine.compiled(), reason="the compiled engine is not built (make engine)")

TOTAL = int(os.environ.get("ADAPTIS_DIFF_EXAMPLES", "10000"))
SHARES = {"schedule": 0.3, "ties": 0.075, "simulate": 0.35, "profile": 0.2}  # "ties": each of two tests


def examples(kind: str) -> settings:
    return settings(max_examples=max(10, int(TOTAL * SHARES[kind])), deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)


def placement_of(kind: str, devices: int, chunks: int, rng: random.Random) -> tuple[int, ...]:
    if kind == "sequential":
        return tuple(range(devices))
    if kind == "interleaved":
        return tuple(s % devices for s in range(devices * chunks))
    if kind == "v":
        return v_placement(devices)
    if kind == "wave":
        return wave_placement(devices, chunks)
    # Any mapping that uses every device (the list scheduler needs each device to hold a stage).
    stages = list(range(devices)) + [rng.randrange(devices) for _ in range(rng.randrange(0, 2 * devices))]
    rng.shuffle(stages)
    return tuple(stages)


PLACEMENTS = st.sampled_from(["sequential", "interleaved", "v", "wave", "random", "random"])


def random_costs(S: int, devices: int, rng: random.Random, *, fused: bool) -> StageCosts:
    def vals(lo: float, hi: float) -> tuple[float, ...]:
        return tuple(rng.uniform(lo, hi) for _ in range(S))

    act = tuple(float(rng.randrange(1, 10**6)) for _ in range(S))
    # keep > act: PyTorch's I also keeps the gradients W needs (the level rises at I)
    keep = tuple(a * rng.choice((0.0, 0.25, r := rng.random(), 1.0, 1.0 + r)) for a in act)
    comm = tuple(rng.choice((0.0, rng.uniform(0.0, 0.5))) for _ in range(S - 1)) + (0.0,)
    return StageCosts(vals(0.1, 3.0), vals(0.1, 3.0), vals(0.0, 2.0), act, keep, comm,
                      tuple(0.0 for _ in range(devices)), tuple(float("inf") for _ in range(devices)),
                      vals(0.1, 4.0) if fused else None)


def random_config(devices: int, costs: StageCosts, placement: tuple[int, ...], rng: random.Random
                  ) -> ListSchedulerConfig:
    caps = None
    if rng.random() < 0.7:
        budgets = [rng.choice((1.0, 1.5, 2.0, float(devices), rng.uniform(1, 2 * devices))) for _ in range(devices)]
        caps = budget_caps(costs, placement, devices, microbatches_per_device=budgets)
    return ListSchedulerConfig(caps=caps, split_backward=rng.random() < 0.75, eager_w=rng.random() < 0.2,
                               depth_first=rng.random() < 0.6,
                               max_pending_w=rng.choice((None, None, 1, 2, devices)),
                               cap_counts_w=rng.random() < 0.7)


def both_orders(costs: StageCosts, placement: tuple[int, ...], devices: int, M: int,
                config: ListSchedulerConfig) -> tuple[object, object]:
    def run(fn):
        try:
            return fn(costs, placement, devices, microbatches=M, config=config)
        except PlanError as exc:
            return ("error", str(exc))

    return run(list_schedule_python), run(list_schedule)


def same_result(a: Result, b: Result) -> None:
    assert (a.valid, a.error) == (b.valid, b.error)
    assert a.iteration_time == b.iteration_time  # exact: the same float operations in the same order
    assert a.busy == b.busy
    assert a.peak_memory == b.peak_memory
    assert a.timeline == b.timeline


def simulate_both(plan: Plan, profile: ModelProfile, cluster: Cluster, **kw: object) -> tuple[Result, Result]:
    native = simulate(plan, profile, cluster, **kw)
    with engine.python_reference():
        reference = simulate(plan, profile, cluster, **kw)
    return reference, native


def _order_plan(order: tuple[tuple[Action, ...], ...], costs: StageCosts, placement: tuple[int, ...],
                devices: int, M: int) -> tuple[Plan, ModelProfile]:
    S = len(placement)
    profile = ModelProfile("diff", tuple(LayerCost(f"l{s}", "attention+mlp", 0, 0, 0, 0, 0, 0) for s in range(S)))
    return Plan(devices, M, partition_from_sizes([1] * S), placement, order), profile


def _orders_agree(devices: int, chunks: int, M: int, kind: str, make_costs: Callable[..., StageCosts], *,
                  fused: bool, seed: int) -> tuple:
    """(placement, costs, config, order) of a random case whose list-scheduled order the compiled
    engine and the Python reference agree on (asserted)."""
    rng = random.Random(seed)
    placement = placement_of(kind, devices, chunks, rng)
    costs = make_costs(len(placement), devices, rng, fused=fused)
    config = random_config(devices, costs, placement, rng)
    reference, native = both_orders(costs, placement, devices, M, config)
    assert reference == native
    return placement, costs, config, native


@examples("schedule")
@given(devices=st.integers(1, 5), chunks=st.integers(1, 3), M=st.integers(1, 10), kind=PLACEMENTS,
       fused=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_list_schedule_and_simulation_agree(devices: int, chunks: int, M: int, kind: str, fused: bool,
                                            seed: int) -> None:
    placement, costs, config, native = _orders_agree(devices, chunks, M, kind, random_costs, fused=fused, seed=seed)
    if isinstance(native, tuple) and native and native[0] == "error":
        return
    plan, profile = _order_plan(native, costs, placement, devices, M)  # type: ignore[arg-type]
    r_py, r_native = simulate_both(plan, profile, Cluster(devices=devices), costs=costs, validate=False)
    same_result(r_py, r_native)
    assert r_native.valid
    # The search's path (one compiled call, one batch; no order crosses back) against the order
    # simulated above, which matched the reference.
    ran = engine.simulate_schedule(costs, native, devices=devices, microbatches=M)  # type: ignore[arg-type]
    two_pass = engine.Outcome(ran.ok, ran.makespan, ran.busy, ran.peak)
    assert engine.schedule_and_simulate(costs, placement, devices, microbatches=M, config=config) == two_pass
    job = engine.ScheduleJob(costs, placement, devices, M, config)
    assert engine.schedule_and_simulate_many([job, job], threads=1) == [two_pass, two_pass]


def grid_costs(S: int, devices: int, rng: random.Random, *, fused: bool) -> StageCosts:
    """Costs from a few round values, zero included: devices reach the same start time at once, and a
    zero-time action makes work ready at the very time it starts (the pick's tie rule decides)."""
    def vals(*choices: float) -> tuple[float, ...]:
        return tuple(rng.choice(choices) for _ in range(S))

    act = vals(1.0, 2.0, 4.0)
    return StageCosts(vals(0.0, 1.0, 2.0), vals(0.0, 1.0, 2.0), vals(0.0, 1.0), act,
                      tuple(a * rng.choice((0.0, 0.5, 1.0)) for a in act), vals(0.0, 0.0, 1.0)[:-1] + (0.0,),
                      tuple(0.0 for _ in range(devices)), tuple(float("inf") for _ in range(devices)),
                      vals(0.0, 1.0, 3.0) if fused else None)


@examples("ties")
@given(devices=st.integers(1, 6), chunks=st.integers(1, 3), M=st.integers(1, 8), kind=PLACEMENTS,
       fused=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_tied_starts_and_zero_time_actions_agree(devices: int, chunks: int, M: int, kind: str, fused: bool,
                                                 seed: int) -> None:
    """The compiled scheduler's tournament tree breaks ties between devices as the reference's heap."""
    _orders_agree(devices, chunks, M, kind, grid_costs, fused=fused, seed=seed)


@examples("ties")
@given(devices=st.integers(1, 6), chunks=st.integers(1, 3), M=st.integers(1, 10),
       kind=st.sampled_from(["interleaved", "v", "wave", "random"]), grid=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_caps_that_stop_every_device_agree(devices: int, chunks: int, M: int, kind: str, grid: bool, seed: int) -> None:
    """Caps below a micro-batch's activations: every device waits on its cap, and the scheduler lets
    the earliest forward through (budget caps never get there; most of these cases do)."""
    rng = random.Random(seed)
    placement = placement_of(kind, devices, chunks, rng)
    costs = (grid_costs if grid else random_costs)(len(placement), devices, rng, fused=rng.random() < 0.3)
    config = replace(random_config(devices, costs, placement, rng),
                     caps=tuple(rng.uniform(0.3, 3.0) * max(costs.act) for _ in range(devices)))
    reference, native = both_orders(costs, placement, devices, M, config)
    assert reference == native


def _break(order: list[list[Action]], rng: random.Random, how: str, S: int, M: int) -> None:
    rows = [r for r in order if r]
    row = rng.choice(rows)
    k = rng.randrange(len(row))
    if how == "shuffle":
        rng.shuffle(row)
    elif how == "swap":
        j = rng.randrange(len(row))
        row[k], row[j] = row[j], row[k]
    elif how == "drop":
        del row[k]
    elif how == "repeat":
        row.insert(rng.randrange(len(row) + 1), row[k])
    elif how == "move":
        other = rng.choice(order)
        other.append(row.pop(k))
    elif how == "stage":
        row[k] = Action(S + rng.randrange(3), row[k].op, row[k].mb)
    elif how == "mb":
        row[k] = Action(row[k].stage, row[k].op, M + rng.randrange(3))
    elif how == "fuse":
        a = row[k]
        row.append(Action(a.stage, "B" if a.op in "IW" else "I", a.mb))


@examples("simulate")
@given(devices=st.integers(1, 4), chunks=st.integers(1, 2), M=st.integers(1, 6), kind=PLACEMENTS,
       how=st.sampled_from(["none", "shuffle", "swap", "drop", "repeat", "move", "stage", "mb", "fuse"]),
       timeline=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_broken_plans_fail_the_same_way(devices: int, chunks: int, M: int, kind: str, how: str, timeline: bool,
                                        seed: int) -> None:
    rng = random.Random(seed)
    placement = placement_of(kind, devices, chunks, rng)
    costs = random_costs(len(placement), devices, rng, fused=rng.random() < 0.5)
    config = replace(random_config(devices, costs, placement, rng), caps=None)
    order = [list(r) for r in list_schedule_python(costs, placement, devices, microbatches=M, config=config)]
    if how != "none":
        _break(order, rng, how, len(placement), M)
    plan, profile = _order_plan(tuple(tuple(r) for r in order), costs, placement, devices, M)
    r_py, r_native = simulate_both(plan, profile, Cluster(devices=devices), costs=costs, validate=True,
                                   record_timeline=timeline)
    same_result(r_py, r_native)
    if how in ("stage", "mb", "drop", "repeat", "fuse"):
        assert not r_native.valid


def random_profile(layers: int, rng: random.Random, *, fused: bool, overhead: float) -> ModelProfile:
    """All-distinct layer costs, as a measured profile has."""
    out = []
    for i in range(layers):
        extra = {"b_full": rng.uniform(0.2, 3.0)} if fused else {}
        act = rng.randrange(10**6, 10**8)
        graph = rng.choice((None, int(act * rng.uniform(0.2, 2.0))))
        out.append(LayerCost(f"l{i}", rng.choice(["attention+mlp", "moe", "mamba", "head"]), rng.uniform(0.1, 2),
                             rng.uniform(0.1, 2), rng.uniform(0.0, 1.5), rng.randrange(10**6, 10**8),
                             act, rng.randrange(10**5, 10**7), w_graph_bytes=graph, extra=extra))
    return ModelProfile("random", tuple(out), action_overhead=overhead)


@examples("profile")
@given(devices=st.integers(1, 6), chunks=st.integers(1, 3), M=st.integers(1, 12), kind=PLACEMENTS,
       nodes=st.sampled_from([None, 1, 2]), fused=st.booleans(), overhead=st.sampled_from([0.0, 0.01, 0.3]),
       mixed=st.booleans(), memory_gb=st.sampled_from([0.05, 0.5, 1e6]), seed=st.integers(0, 2**32 - 1))
def test_profiles_and_clusters_agree(devices: int, chunks: int, M: int, kind: str, nodes: int | None, fused: bool,
                                     overhead: float, mixed: bool, memory_gb: float, seed: int) -> None:
    rng = random.Random(seed)
    placement = placement_of(kind, devices, chunks, rng)
    S = len(placement)
    layers = S + rng.randrange(0, 3 * S)
    profile = random_profile(layers, rng, fused=fused, overhead=overhead)
    cluster = Cluster(devices=devices, memory_gb=memory_gb, gpus_per_node=nodes, latency_us=rng.uniform(0, 50),
                      inter_node_gbps=rng.uniform(5, 100), inter_node_latency_us=rng.uniform(0, 100),
                      device_list=tuple(Device(speed=rng.uniform(0.5, 2.0), memory_gb=memory_gb)
                                        for _ in range(devices)) if mixed else None)
    cuts = sorted(rng.sample(range(1, layers), S - 1))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, layers])]
    partition = partition_from_sizes(sizes)
    costs = stage_costs(profile, cluster, partition, placement=placement)
    config = random_config(devices, costs, placement, rng)
    reference, native = both_orders(costs, placement, devices, M, config)
    assert reference == native
    if isinstance(native, tuple) and native and native[0] == "error":
        return
    plan = Plan(devices, M, partition, placement, native)  # type: ignore[arg-type]
    r_py, r_native = simulate_both(plan, profile, cluster)
    same_result(r_py, r_native)
    assert r_py.feasible == r_native.feasible


def test_the_differential_tests_can_fail() -> None:
    """A one-ulp change in one stage's cost changes the simulated time: the comparison is exact."""
    rng = random.Random(1)
    placement = (0, 1, 1, 0)
    costs = random_costs(4, 2, rng, fused=False)
    order = list_schedule(costs, placement, 2, microbatches=6)
    plan, profile = _order_plan(order, costs, placement, 2, 6)
    nudged = replace(costs, f=(costs.f[0] * (1 + 2**-50),) + costs.f[1:])
    a = simulate(plan, profile, Cluster(devices=2), costs=costs)
    with engine.python_reference():
        b = simulate(plan, profile, Cluster(devices=2), costs=nudged)
    assert a.iteration_time != b.iteration_time


def test_engine_choice_is_reported() -> None:
    assert engine.ENGINE in ("native", "python")
    assert (engine.compiled()) == (engine.ENGINE == "native")


@pytest.mark.parametrize("model,devices,microbatches", [("gemma-small", 4, 16), ("nemotronh-small", 4, 8)])
def test_the_tuner_finds_the_same_plan_on_either_engine(model: str, devices: int, microbatches: int) -> None:
    """Batched native evaluation (several threads) ends where one-by-one Python evaluation ends."""
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.candidates import Scenario
    from pipeline.hardware import build_cluster
    from pipeline.zoo import zoo_profile

    scenario = Scenario(zoo_profile(model, gpu="h100", seq_len=2048), build_cluster("h100", devices=devices),
                        microbatches)
    native = AdaptisTuner().search(scenario, budget=Budget(sim_calls=150), seed=3)
    with engine.python_reference():
        reference = AdaptisTuner().search(scenario, budget=Budget(sim_calls=150), seed=3)
    assert native.iteration_time == reference.iteration_time
    assert native.history == reference.history
    assert native.plan == reference.plan and native.sim_calls == reference.sim_calls == 150


@pytest.mark.parametrize("placement", [(0, 2), (0, -1), (0, 1, 1)])
def test_a_placement_the_engines_cannot_index_is_one_plan_error_on_both(placement: tuple[int, ...]) -> None:
    from pipeline.engine import ScheduleJob, python_reference, schedule_and_simulate, schedule_and_simulate_many

    costs = StageCosts((1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0),
                       (1e9, 1e9))
    for context in (contextlib.nullcontext(), python_reference()):
        with context:
            for call in (list_schedule, schedule_and_simulate):
                with pytest.raises(PlanError) as err:
                    call(costs, placement, 2, microbatches=2)  # the compiled engine crashed on (0, 2)
                assert err.value.field == "placement"
            good, bad = ScheduleJob(costs, (0, 1), 2, 2, ListSchedulerConfig()), \
                ScheduleJob(costs, placement, 2, 2, ListSchedulerConfig())
            out = schedule_and_simulate_many([good, bad, good])
            assert isinstance(out[1], str) and "placement" in out[1]
            assert out[0] == out[2] and out[0].ok
