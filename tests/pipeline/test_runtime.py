"""The runtime models (pipeline.runtime) as the simulator applies them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline import engine
from pipeline.candidates import Candidate, Scenario
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.plan import Action, Plan, even_partition, sequential_placement
from pipeline.runtime import IDEAL, RUNTIMES, Runtime, runtime_named
from pipeline.schedules import build_plan
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import Cluster, LayerCost, ModelProfile, TrainingConfig

PLAIN_BLOCKING = Runtime("blocking", "test", blocking_p2p=True)
PLAIN_OVERLAP = Runtime("overlap", "test", overlap_iterations=True)


def _profile(stages: int = 8) -> ModelProfile:
    return ModelProfile("t", tuple(LayerCost(f"l{k}", "block", 2.0 + 0.1 * k, 2.0, 1.0, 1000, 1 << 20, 1 << 20)
                                   for k in range(stages)))


def _cluster(devices: int = 4) -> Cluster:
    return Cluster(devices=devices, latency_us=300.0, p2p_gbps=100.0)


def test_ideal_and_pytorch_leave_the_stage_costs_as_they_were() -> None:
    profile, cluster = _profile(), _cluster()
    part, place = even_partition(8, 4), sequential_placement(4)
    base = stage_costs(profile, cluster, part, placement=place)
    for name in ("ideal", "pytorch"):
        assert stage_costs(profile, cluster, part, placement=place, training=TrainingConfig(runtime=name)) == base


def test_a_blocking_runtime_moves_each_transfer_onto_its_sender() -> None:
    profile, cluster = _profile(), _cluster()
    part, place = even_partition(8, 4), sequential_placement(4)
    ideal = stage_costs(profile, cluster, part, placement=place)
    held = stage_costs(profile, cluster, part, placement=place, training=TrainingConfig(runtime=PLAIN_BLOCKING))
    assert all(c > 0 for c in ideal.comm[:-1]) and held.comm == (0.0,) * 4
    assert held.f == tuple(f + c for f, c in zip(ideal.f, ideal.comm))
    assert held.i == (ideal.i[0],) + tuple(i + c for i, c in zip(ideal.i[1:], ideal.comm))
    plan = build_plan("1f1b", profile, cluster, microbatches=8)
    slow = simulate(plan, profile, cluster, training=TrainingConfig(runtime=PLAIN_BLOCKING)).iteration_time
    assert slow > simulate(plan, profile, cluster).iteration_time


def test_scale_overhead_and_step_add_what_they_say() -> None:
    profile, cluster = _profile(), _cluster()
    part, place = even_partition(8, 4), sequential_placement(4)
    ideal = stage_costs(profile, cluster, part, placement=place)
    rt = Runtime("r", "test", compute_scale=2.0, action_overhead_s=0.5e-3, step_s=7e-3)
    got = stage_costs(profile, cluster, part, placement=place, training=TrainingConfig(runtime=rt))
    assert got.f == pytest.approx([2 * f + 0.5 for f in ideal.f])
    assert got.w == pytest.approx([2 * w + 0.5 for w in ideal.w])
    assert got.post_step == pytest.approx(ideal.post_step + 7.0)


def test_overlapped_iterations_take_their_steady_period() -> None:
    # Device 1 defers its W's to the end: device 0 starts the next iteration while they run.
    profile, cluster = _profile(2), _cluster(2)
    dev1 = [a for m in range(4) for a in (Action(1, "F", m), Action(1, "I", m))] + [Action(1, "W", m) for m in range(4)]
    dev0 = [Action(0, "F", m) for m in range(4)] + [a for m in range(4) for a in (Action(0, "I", m), Action(0, "W", m))]
    plan = Plan(2, 4, ((0, 1), (1, 2)), (0, 1), (tuple(dev0), tuple(dev1)))
    one = simulate(plan, profile, cluster)
    steady = simulate(plan, profile, cluster, training=TrainingConfig(runtime=PLAIN_OVERLAP))
    assert one.valid and steady.valid
    assert max(one.busy) - 1e-9 <= steady.iteration_time < one.iteration_time
    order = build_plan("1f1b", profile, cluster, microbatches=4)  # device 0 ends last: nothing to overlap
    assert simulate(order, profile, cluster, training=TrainingConfig(runtime=PLAIN_OVERLAP)).iteration_time == \
        pytest.approx(simulate(order, profile, cluster).iteration_time)


def test_the_search_sees_the_same_time_as_simulate_under_an_overlapping_runtime() -> None:
    profile, cluster = _profile(), _cluster()
    scenario = Scenario(profile, cluster, 8, TrainingConfig(runtime="zb"))
    ev = Evaluator(scenario)
    c = Candidate((2, 2, 2, 2), (0, 1, 2, 3))
    plan, result = ev.evaluate(c)
    assert result.iteration_time == simulate(plan, profile, cluster, training=scenario.training).iteration_time


@pytest.mark.skipif(not engine.compiled(), reason="the compiled engine is not built (make engine)")
@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_both_engines_agree_under_every_runtime(name: str) -> None:
    profile, cluster = _profile(), _cluster()
    training = TrainingConfig(runtime=name)
    for method in ("1f1b", "zb-h1", "zbv"):
        plan = build_plan(method, profile, cluster, microbatches=6, training=training)
        native = simulate(plan, profile, cluster, training=training)
        with engine.python_reference():
            reference = simulate(plan, profile, cluster, training=training)
        assert (native.iteration_time, native.busy, native.peak_memory) == \
            (reference.iteration_time, reference.busy, reference.peak_memory)


def test_an_unknown_runtime_is_named_with_the_choices() -> None:
    with pytest.raises(PlanError, match="unknown runtime 'megatorn'.*ideal") as info:
        runtime_named("megatorn")
    assert info.value.field == "runtime"
    assert runtime_named(IDEAL) is IDEAL


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_the_lower_bound_holds_under_every_runtime(name: str) -> None:
    from pipeline.bounds import lower_bound

    profile, cluster = _profile(), _cluster()
    training = TrainingConfig(runtime=name)
    bound = lower_bound(profile, cluster, 8, runtime=name).value
    assert bound >= lower_bound(profile, cluster, 8).value * (1 - 1e-12) or runtime_named(name).overlap_iterations
    for method in ("1f1b", "zb-h1", "zbv", "i1f1b-v2"):
        plan = build_plan(method, profile, cluster, microbatches=8, training=training)
        assert simulate(plan, profile, cluster, training=training).iteration_time >= bound * (1 - 1e-12)


def test_the_optimizer_step_is_priced_from_the_busiest_devices_parameters() -> None:
    from pipeline.bounds import lower_bound
    from pipeline.hardware import build_cluster, get_gpu

    uneven = ModelProfile("t", tuple(LayerCost(f"l{k}", "block", 2.0, 2.0, 1.0, 10**8 * (4 if k == 7 else 1),
                                               1 << 20, 1 << 20) for k in range(8)), time_unit="ms")
    gpu = build_cluster("h100", devices=4)
    part, place = even_partition(8, 4), sequential_placement(4)
    adam = Runtime("adam", "test", optimizer_bytes_per_param=34.0)
    got = stage_costs(uneven, gpu, part, placement=place, training=TrainingConfig(runtime=adam))
    busiest = 10**8 + 4 * 10**8  # the last device holds layers 6 and 7
    assert got.post_step == pytest.approx(34.0 * busiest / get_gpu("h100").memory_bytes_per_s / 1e-3)
    # no GPU named (a measured or hand-written cluster): nothing to price it with
    plain = Cluster(devices=4, latency_us=300.0, p2p_gbps=100.0)
    assert stage_costs(uneven, plain, part, placement=place, training=TrainingConfig(runtime=adam)).post_step == 0.0
    # Megatron's runtime counts it; the bound counts the least any plan can have, and still holds
    megatron = TrainingConfig(runtime="megatron")
    bound = lower_bound(uneven, gpu, 8, runtime="megatron").value
    assert bound > lower_bound(uneven, gpu, 8, runtime=replace(RUNTIMES["megatron"], optimizer_bytes_per_param=0)).value
    for method in ("1f1b", "zb-h1", "zbv", "i1f1b-v2"):
        plan = build_plan(method, uneven, gpu, microbatches=8, training=megatron)
        assert simulate(plan, uneven, gpu, training=megatron).iteration_time >= bound * (1 - 1e-12)


def test_a_tied_heads_gradient_is_summed_with_the_embeddings_device_on_megatron() -> None:
    from pipeline.simulator import _ring_all_reduce

    layers = [LayerCost("embed", "embedding", 0.1, 0.0, 0.1, 5 * 10**7, 1 << 20, 1 << 20)]
    layers += [LayerCost(f"l{k}", "block", 2.0, 2.0, 1.0, 1000, 1 << 20, 1 << 20) for k in range(6)]
    layers += [LayerCost("head", "head", 3.0, 3.0, 2.0, 5 * 10**7, 1 << 20, 1 << 20, extra={"unique_params": 0})]
    tied, cluster = ModelProfile("tied", tuple(layers)), _cluster()
    part = even_partition(8, 4)
    megatron, ideal = TrainingConfig(runtime="megatron"), TrainingConfig()
    apart = stage_costs(tied, cluster, part, placement=sequential_placement(4), training=megatron)
    together = stage_costs(tied, cluster, part, placement=(0, 1, 2, 0), training=megatron)  # head back on device 0
    expected = _ring_all_reduce(cluster, [0, 3], 4 * 5 * 10**7) / tied.seconds_per_unit
    assert apart.post_step == pytest.approx(together.post_step + expected) and expected > 0
    assert stage_costs(tied, cluster, part, placement=sequential_placement(4), training=ideal).post_step == 0.0
    untied = ModelProfile("untied", tuple(layers[:-1]) + (replace(layers[-1], extra={}),))
    assert stage_costs(untied, cluster, part, placement=sequential_placement(4), training=megatron).post_step == \
        pytest.approx(together.post_step)


def test_megatron_family_prices_analytic_h100_class_profiles_at_the_h100_fit_and_profiled_times_at_the_a100_fit():
    """One number per codebase and GPU: the Megatron-family runtimes price a cost-model profile of an
    H100-class GPU at the whole-job model's fit on Megatron-Core's H100 rows, in the pipeline search
    and the job search alike; profiled times and other GPUs keep the A100 fit."""
    from experiments.benchmarks.published_job import SOURCES, source_of
    from pipeline.costs import profile_from_architecture
    from pipeline.runtime import H100_CLASS, MEGATRON_H100_COMPUTE_SCALE
    from pipeline.zoo import load_zoo_architecture

    assert SOURCES["h100"].compute_scale == MEGATRON_H100_COMPUTE_SCALE  # one number, fitted once
    arch = load_zoo_architecture("tiny-hybrid")
    for name in ("megatron", "zb", "zb-sync"):
        rt = RUNTIMES[name]
        for gpu in H100_CLASS:
            assert source_of({"gpu_type": gpu.upper()}).compute_scale == MEGATRON_H100_COMPUTE_SCALE
            assert rt.compute_scale_for(profile_from_architecture(arch, gpu=gpu)) == MEGATRON_H100_COMPUTE_SCALE
        assert rt.compute_scale_for(profile_from_architecture(arch, gpu="a100")) == rt.compute_scale == 1.05
        layers = tuple(LayerCost(f"l{i}", "block", 1.0, 1.0, 1.0, 1, 1, 1) for i in range(4))
        profiled = ModelProfile("measured", layers, extra={"gpu": "h100"})
        assert rt.compute_scale_for(profiled) == rt.compute_scale
    assert RUNTIMES["pytorch"].compute_scale_for(profile_from_architecture(arch, gpu="h100")) == 1.0


def test_an_h100_megatron_plan_is_simulated_slower_than_the_a100_fit_would_price_it():
    from pipeline.costs import profile_from_architecture
    from pipeline.zoo import load_zoo_architecture

    profile = profile_from_architecture(load_zoo_architecture("tiny-hybrid"), gpu="h100")
    cluster = Cluster(devices=2)
    plan = build_plan("1f1b", profile, cluster, microbatches=4)
    fitted = simulate(plan, profile, cluster, training=TrainingConfig(runtime="megatron")).iteration_time
    a100 = replace(RUNTIMES["megatron"], analytic_compute_scales=())
    plain = simulate(plan, profile, cluster, training=TrainingConfig(runtime=a100)).iteration_time
    assert fitted > plain
