"""The performance model's rules: dependencies, communication, memory, speed, invalid plans."""

from __future__ import annotations

import contextlib

import pytest

from pipeline import engine
from pipeline.errors import PlanError
from pipeline.plan import Action, Plan, parse_action
from pipeline.schedules import build_plan
from pipeline.simulator import simulate, simulate_checked, stage_costs
from pipeline.spec import GIB, Cluster, Device, LayerCost, ModelProfile, TrainingConfig
from tests.conftest import ideal_cluster, uniform_profile


def _plan(rows: list[list[str]], *, devices: int = 2, mbs: int = 2, partition=((0, 1), (1, 2)),
          placement=(0, 1)) -> Plan:
    return Plan(devices, mbs, partition, placement, [[parse_action(a) for a in r] for r in rows])


ONE_F_ONE_B_2x2 = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_two_stage_timeline_by_hand() -> None:
    prof = ModelProfile("p", (LayerCost("a", "x", 1, 2, 1, 0, 0, 0), LayerCost("b", "x", 1, 2, 1, 0, 0, 0)))
    r = simulate(_plan(ONE_F_ONE_B_2x2), prof, ideal_cluster(2))
    assert r.valid
    times = {(e.device, str(e.action)): (e.start, e.end) for e in r.timeline}
    assert times[(0, "0F0")] == (0, 1)
    assert times[(1, "1F0")] == (1, 2)
    assert times[(1, "1B0")] == (2, 5)
    assert times[(0, "0B0")] == (5, 8)  # waits for 1B0's gradient
    assert times[(1, "1F1")] == (5, 6)
    assert r.iteration_time == 12  # 0B1 waits for 1B1 (6..9), runs 9..12
    assert r.busy == (8, 8)
    assert r.bubble == pytest.approx((1 - 8 / 12, 1 - 8 / 12))


def test_communication_delays_dependent_actions() -> None:
    # 1 GB sent over 1 GB/s with 1000 us latency: 1.001 s = 1001 ms.
    prof = ModelProfile("p", (LayerCost("a", "x", 1, 1, 1, 0, 0, 10**9), LayerCost("b", "x", 1, 1, 1, 0, 0, 0)))
    cluster = Cluster(devices=2, memory_gb=80, p2p_gbps=1.0, latency_us=1000)
    r = simulate(_plan(ONE_F_ONE_B_2x2), prof, cluster)
    start_1f0 = next(e.start for e in r.timeline if str(e.action) == "1F0")
    assert start_1f0 == pytest.approx(1 + 1001)


def test_inter_node_link_is_slower() -> None:
    prof = ModelProfile("p", (LayerCost("a", "x", 1, 1, 1, 0, 0, 10**9), LayerCost("b", "x", 1, 1, 1, 0, 0, 0)))
    intra = Cluster(devices=2, p2p_gbps=100, latency_us=0, gpus_per_node=2, inter_node_gbps=10)
    inter = Cluster(devices=2, p2p_gbps=100, latency_us=0, gpus_per_node=1, inter_node_gbps=10,
                    inter_node_latency_us=0)
    t_intra = simulate(_plan(ONE_F_ONE_B_2x2), prof, intra).iteration_time
    t_inter = simulate(_plan(ONE_F_ONE_B_2x2), prof, inter).iteration_time
    # 100 ms vs 10 ms per transfer; two transfers sit on the critical path (1F0 in, 0B1 back), the rest overlap.
    assert t_inter - t_intra == pytest.approx(2 * (100 - 10))


def test_device_speed_scales_compute() -> None:
    prof = uniform_profile(2)
    slow = Cluster(devices=2, p2p_gbps=1e12, latency_us=0, device_list=(Device(1.0, 80), Device(0.5, 80)))
    r = simulate(_plan(ONE_F_ONE_B_2x2), prof, slow)
    durations = {str(e.action): e.end - e.start for e in r.timeline}
    assert durations["0F0"] == 1 and durations["1F0"] == 2 and durations["1B0"] == 4


def test_memory_rules_f_adds_i_frees_part_w_frees_rest() -> None:
    layer = LayerCost("a", "x", 1, 1, 1, params=10, act_bytes=1000, out_bytes=0, w_act_bytes=300)
    prof = ModelProfile("p", (layer,))
    cluster = Cluster(devices=1, p2p_gbps=1e12, latency_us=0)
    # the split rules, for a runtime that splits stage 0's backward like any other stage's and
    # frees at I what W does not need
    training = TrainingConfig(bytes_per_param=2, first_stage_defers_backward=False, input_backward_keeps_graph=False)
    plan = Plan(1, 2, ((0, 1),), (0,), [[Action(0, "F", 0), Action(0, "F", 1), Action(0, "I", 0),
                                         Action(0, "I", 1), Action(0, "W", 0), Action(0, "W", 1)]])
    r = simulate(plan, prof, cluster, training=training)
    assert r.peak_memory == (20 + 2000,)
    # I keeps 300 per micro-batch: with W deferred, F after both I's would start from 600.
    plan2 = Plan(1, 2, ((0, 1),), (0,), [[Action(0, "F", 0), Action(0, "I", 0), Action(0, "F", 1),
                                          Action(0, "I", 1), Action(0, "W", 0), Action(0, "W", 1)]])
    assert simulate(plan2, prof, cluster, training=training).peak_memory == (20 + 1300,)
    # PyTorch's runtime (the default): the first stage's I is a no-op, its W frees everything
    torch_rt = TrainingConfig(bytes_per_param=2)
    assert simulate(plan2, prof, cluster, training=torch_rt).peak_memory == (20 + 2000,)
    fused = Plan(1, 2, ((0, 1),), (0,), [[Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1),
                                          Action(0, "B", 1)]])
    assert simulate(fused, prof, cluster, training=training).peak_memory == (20 + 1000,)


@pytest.mark.parametrize(("keeps_graph", "w_graph", "peak"), [
    (False, 1400, 1000 + 300),  # a runtime that frees at I: w_act_bytes stays until W
    (True, 1400, 1400 + 1400),  # PyTorch: I keeps the graph and W's gradients, the level rises at I
    (True, None, 2000),  # no w_graph_bytes: the graph (all of act_bytes) stays until W
])
def test_input_backward_keeps_graph_on_later_stages(keeps_graph: bool, w_graph: int | None, peak: int) -> None:
    """Stage 1 (not the first) with W deferred: what its I leaves follows the runtime."""
    first = LayerCost("e", "embedding", 1, 0, 1, params=0, act_bytes=0, out_bytes=0)
    layer = LayerCost("a", "x", 1, 1, 1, params=0, act_bytes=1000, out_bytes=0, w_act_bytes=300,
                      w_graph_bytes=w_graph)
    prof = ModelProfile("p", (first, layer))
    order = [Action(1, "F", 0), Action(1, "I", 0), Action(1, "F", 1), Action(1, "I", 1), Action(1, "W", 0),
             Action(1, "W", 1)]
    plan = Plan(2, 2, ((0, 1), (1, 2)), (0, 1), [[Action(0, "F", 0), Action(0, "F", 1), Action(0, "I", 0),
                                                  Action(0, "I", 1), Action(0, "W", 0), Action(0, "W", 1)], order])
    training = TrainingConfig(bytes_per_param=0, input_backward_keeps_graph=keeps_graph)
    costs = stage_costs(prof, Cluster(devices=2), plan.partition, placement=plan.placement, training=training)
    assert costs.w_keep[1] == (w_graph if keeps_graph and w_graph is not None else 1000 if keeps_graph else 300)
    for reference in (False, True):
        with engine.python_reference() if reference else contextlib.nullcontext():
            r = simulate(plan, prof, Cluster(devices=2, p2p_gbps=1e12, latency_us=0), training=training)
        assert r.peak_memory[1] == peak


def test_default_w_share_is_a_quarter() -> None:
    assert LayerCost("a", "x", 1, 1, 1, 0, 1000, 0).w_retained == 250


def test_feasibility_against_memory_limit() -> None:
    prof = uniform_profile(8, act=GIB, params=0)
    plan = build_plan("gpipe", prof, ideal_cluster(2), microbatches=8)
    assert simulate(plan, prof, ideal_cluster(2, memory_gb=1000)).feasible
    tight = simulate(plan, prof, ideal_cluster(2, memory_gb=10))
    assert tight.valid and not tight.feasible
    assert max(tight.peak_memory_gb) == pytest.approx(32)  # 8 micro-batches x 4 layers x 1 GiB


@pytest.mark.parametrize("rows,needle", [
    ([["0B0", "0F0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "deadlock"),
    ([["0F0", "0F1", "0B0", "0B1"], ["1B0", "1F0", "1F1", "1B1"]], "device 1 waits at 1B0"),
    ([["0F0", "0F1", "0B0"], ["1F0", "1B0", "1F1", "1B1"]], "missing actions 0B1"),
    ([["0F0", "0F1", "0B0", "0B1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "0B1 appears twice"),
    ([["0F0", "0F1", "0B0", "0B1", "1F0"], ["1B0", "1F1", "1B1"]], "stage 1 is placed on device 1"),
    ([["0F0", "0F1", "0I0", "0W0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], None),
    ([["0F0", "0F1", "0W0", "0I0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "device 0 waits at 0W0"),
    ([["0F0", "0F1", "0I0", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "both a fused"),
    ([["0F0", "0F2", "0B0"], ["1F0", "1B0"]], "micro-batch 2"),
])
def test_bad_plans_are_reported_with_the_actions(rows, needle) -> None:
    r = simulate(_plan(rows), uniform_profile(2), ideal_cluster(2))
    if needle is None:
        assert r.valid, r.error
        return
    assert not r.valid
    assert needle in r.error
    with pytest.raises(PlanError, match=needle.split()[0]):
        simulate_checked(_plan(rows), uniform_profile(2), ideal_cluster(2))


def test_plan_for_another_cluster_or_model_is_refused() -> None:
    plan = _plan(ONE_F_ONE_B_2x2)
    r = simulate(plan, uniform_profile(2), ideal_cluster(4))
    assert not r.valid and "cluster has 4" in r.error
    r = simulate(plan, uniform_profile(3), ideal_cluster(2))
    assert not r.valid and "model has 3" in r.error


def test_same_plan_same_result(hetero_profile, h100x4) -> None:
    plan = build_plan("zbv", hetero_profile, h100x4, microbatches=16)
    a = simulate(plan, hetero_profile, h100x4)
    b = simulate(plan, hetero_profile, h100x4)
    assert a.summary() == b.summary() and a.timeline == b.timeline


def test_free_communication_and_no_memory_limit() -> None:
    prof = uniform_profile(8, out=0)
    huge = Cluster(devices=4, memory_gb=1e12, p2p_gbps=1e15, latency_us=0)
    r = simulate(build_plan("1f1b", prof, huge, microbatches=8), prof, huge)
    assert r.iteration_time == pytest.approx((8 + 3) * 6)
    assert r.feasible


def test_throughput_counts_tokens(hetero_profile, h100x4) -> None:
    r = simulate(build_plan("1f1b", hetero_profile, h100x4, microbatches=8), hetero_profile, h100x4)
    tokens = 8 * hetero_profile.seq_len * hetero_profile.microbatch_size
    assert r.throughput == pytest.approx(tokens / (r.iteration_time * 1e-3))


def test_a_huge_count_is_refused_fast() -> None:
    """A typo such as ``"microbatches": 1e9`` gives an answer at once, not a billion-step loop: the
    check stops after a few missing actions (both engines), and nothing is simulated."""
    from pipeline.plan import schedule_defect

    plan = Plan(2, 10**9, ((0, 1), (1, 2)), (0, 1), [[parse_action("0F0"), parse_action("0B0")],
                                                     [parse_action("1F0"), parse_action("1B0")]])
    kind, missing = schedule_defect(plan)
    assert kind == "missing" and len(missing) // 3 <= 10
    assert engine.check_schedule(plan) == (kind, missing)
    r = simulate(plan, uniform_profile(2), ideal_cluster(2))
    assert not r.valid and "missing actions 0F1" in r.error and "and more" in r.error
    assert r.timeline == []


def test_huge_layer_count_in_a_config_is_refused() -> None:
    from pipeline.errors import ConfigError
    from pipeline.hf import architecture_from_config

    raw = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 10**10, "vocab_size": 100,
           "num_attention_heads": 4, "intermediate_size": 128}
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        architecture_from_config(raw, source="typo.json")


# ------------------------------------------------------------------------ finer units (issue 15)

def _sharded_head_profile() -> ModelProfile:
    """Two blocks and a head in two shards (one weight copy each, 1000 params, 4000 grad bytes)."""
    block = LayerCost("l", "block", 1.0, 1.0, 1.0, 10, 100, 8)
    shard = [LayerCost(f"head.{j}", "head", 2.0, 2.0, 2.0, 1000, 50, 4 if j == 0 else 0,
                       extra={"shared_group": "head", "grad_sync_bytes": 4000}) for j in range(2)]
    return ModelProfile("sharded", (block, block, *shard))


def test_head_shards_on_one_device_share_weights_and_need_no_all_reduce() -> None:
    from pipeline.simulator import stage_costs

    prof, cluster = _sharded_head_profile(), Cluster(devices=2, p2p_gbps=1.0, latency_us=0.0)
    tr = TrainingConfig(bytes_per_param=1.0)
    together = stage_costs(prof, cluster, ((0, 2), (2, 3), (3, 4)), placement=(0, 1, 1), training=tr)
    assert together.static_bytes == (20.0, 1000.0) and together.post_step == 0.0
    apart = stage_costs(prof, cluster, ((0, 2), (2, 3), (3, 4)), placement=(0, 1, 0), training=tr)
    assert apart.static_bytes == (1020.0, 1000.0)
    # ring all-reduce over 2 devices: 2 steps of 2000 bytes at 1 GB/s, in ms
    assert apart.post_step == pytest.approx(2 * 2000 / 1e9 * 1e3)


def test_post_step_all_reduce_is_added_to_the_iteration() -> None:
    prof, cluster = _sharded_head_profile(), Cluster(devices=2, p2p_gbps=1.0, latency_us=0.0)
    schedule = build_plan("1f1b", uniform_profile(2), Cluster(devices=2), microbatches=4).schedule
    apart = Plan(2, 4, ((0, 3), (3, 4)), (0, 1), schedule)
    together = Plan(2, 4, ((0, 2), (2, 4)), (0, 1), schedule)
    r_apart, r_together = simulate(apart, prof, cluster), simulate(together, prof, cluster)
    from pipeline.simulator import stage_costs

    post = stage_costs(prof, cluster, apart.partition, placement=apart.placement).post_step
    assert post > 0
    last = max(e.end for e in r_apart.timeline)
    assert r_apart.iteration_time == pytest.approx(last + post)
    assert r_together.iteration_time == pytest.approx(max(e.end for e in r_together.timeline))


def test_recompute_trades_memory_for_a_second_forward() -> None:
    from pipeline.simulator import stage_costs

    prof = uniform_profile(4, f=1.0, b=1.0, w=1.0, act=1000, out=64)
    cluster = ideal_cluster(2)
    part, place = ((0, 2), (2, 4)), (0, 1)
    keep = stage_costs(prof, cluster, part, placement=place)
    redo = stage_costs(prof, cluster, part, placement=place, recompute=(False, True))
    # I re-runs F and computes the weight gradients too; W is empty
    assert redo.i[1] == pytest.approx(keep.f[1] + keep.i[1] + keep.w[1]) and redo.w[1] == 0.0
    assert redo.i[0] == keep.i[0] and redo.w[0] == keep.w[0] and redo.f == keep.f
    assert redo.backward[1] == pytest.approx(keep.f[1] + keep.backward[1])
    assert redo.act[1] == prof.layers[1].out_bytes < keep.act[1]  # only the stage's input is kept
    assert redo.w_keep[1] == 0.0  # nothing waits for W
    assert redo.static_bytes[1] == keep.static_bytes[1] + keep.act[1]  # one micro-batch re-run at a time
    first = stage_costs(prof, cluster, part, placement=place, recompute=(True, False))
    assert first.act[0] == 8 * prof.tokens_per_microbatch  # the first stage keeps the token ids
    with pytest.raises(PlanError, match="one per stage"):
        stage_costs(prof, cluster, part, placement=place, recompute=(True,))


def test_recomputing_plan_is_slower_and_lighter() -> None:
    prof = uniform_profile(4, f=1.0, b=1.0, w=1.0, act=10 * GIB, out=64)
    cluster = ideal_cluster(2)
    plan = build_plan("1f1b", prof, cluster, microbatches=8)
    redo = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                recompute=(True, True))
    a, b = simulate(plan, prof, cluster), simulate(redo, prof, cluster)
    assert b.iteration_time > a.iteration_time
    assert max(b.peak_memory) < max(a.peak_memory)


def test_stage_costs_are_the_same_with_the_range_sums_warm() -> None:
    """Stage costs read each layer range's sums and each stage's figures once per profile (and
    cluster and training); a partition priced after others (its ranges and stages known already)
    gets exactly what a fresh copy of the profile gives, recomputation, measured fused backward,
    head shards and two trainings in turn included."""
    from dataclasses import replace

    from pipeline.plan import partition_from_sizes
    from pipeline.zoo import zoo_profile

    base = zoo_profile("tiny-hybrid", head_shards=2)
    measured = replace(base, layers=tuple(replace(x, extra={**x.extra, "b_full": 0.9 * (x.b + x.w)})
                                          for x in base.layers))
    cluster = Cluster(devices=2, device_list=(Device(speed=1.0, memory_gb=80.0), Device(speed=0.5, memory_gb=80.0)))
    L = base.num_layers
    parts = [(1, L - 1), (2, L - 2), (L - 2, 2), (1, 1, L - 2), (2, 1, L - 3)]
    for profile in (base, measured):
        warm = replace(profile)
        for sizes in parts:
            placement = tuple(k % 2 for k in range(len(sizes)))
            for recompute in (None, tuple(k == 0 for k in range(len(sizes)))):
                for training in (TrainingConfig(), TrainingConfig(first_stage_defers_backward=False)):
                    kw = {"placement": placement, "recompute": recompute, "training": training}
                    hot = stage_costs(warm, cluster, partition_from_sizes(sizes), **kw)
                    assert hot == stage_costs(replace(profile), cluster, partition_from_sizes(sizes), **kw)


def test_a_weight_pass_workspace_counts_beyond_what_its_backward_freed() -> None:
    """The embedding's dense gradient (``w_workspace_bytes``) comes last in its stage's backward, after the stage
    has freed at least ``min(act, keep)``: only what exceeds that raises the device's static memory; a pass
    workspace (``workspace_bytes``, the head's logits in F) counts whole, as before."""
    def profile(extra: dict) -> ModelProfile:
        emb = LayerCost("emb", "embedding", 1, 1, 1, 10, 0, 0, extra=extra)
        return ModelProfile("p", (emb, LayerCost("l", "attention+mlp", 1, 1, 1, 10, 1000, 0)))

    def static(extra: dict) -> tuple[float, ...]:
        costs = stage_costs(profile(extra), ideal_cluster(1), ((0, 2),), placement=(0,),
                            training=TrainingConfig(bytes_per_param=1))
        return costs.static_bytes

    # params 20 bytes; the stage's backward frees its 1000 bytes of activations first
    assert static({"w_workspace_bytes": 600}) == (20.0,) and static({"w_workspace_bytes": 1500}) == (520.0,)
    assert static({"workspace_bytes": 600}) == (620.0,)
