"""pipeline.parallelism: the whole job's degrees around the pipeline, and ZeRO memory in TrainingConfig."""

from __future__ import annotations

import pytest

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import CostOptions, layer_work, profile_from_architecture
from pipeline.errors import ConfigError
from pipeline.hardware import get_gpu
from pipeline.parallelism import (
    Parallelism,
    dp_tail,
    estimate_job,
    group_link,
    job_cluster,
    job_profile,
    megatron_job_plan,
    validate_job,
)
from pipeline.plan import Plan
from pipeline.spec import TrainingConfig


def gpt(h: int = 1024, a: int = 16, *, layers: int = 8, vocab: int = 32000, g: int | None = None) -> Architecture:
    specs = (LayerSpec("embedding"),) + (LayerSpec(),) * layers + (LayerSpec("head"),)
    return Architecture("gpt", "gpt", h, vocab, specs, num_attention_heads=a, num_key_value_heads=g or a,
                        intermediate_size=4 * h, gated_mlp=False)


def moe(experts: int = 8) -> Architecture:
    specs = (LayerSpec("embedding"),) + (LayerSpec(ffn="moe"),) * 4 + (LayerSpec("head"),)
    return Architecture("moe", "moe", 1024, 32000, specs, num_attention_heads=16, num_key_value_heads=16,
                        num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=1024)


def test_training_config_shards_the_state_by_zero_stage_and_defaults_to_18_bytes() -> None:
    assert TrainingConfig().param_bytes == 18.0
    assert TrainingConfig(data_parallel=8).param_bytes == 18.0  # ZeRO off: nothing sharded
    assert TrainingConfig(data_parallel=8, zero_stage=1).param_bytes == pytest.approx(6 + 12 / 8)
    assert TrainingConfig(data_parallel=8, zero_stage=2).param_bytes == pytest.approx(2 + 16 / 8)
    assert TrainingConfig(data_parallel=8, zero_stage=3).param_bytes == pytest.approx(18 / 8)
    with pytest.raises(ConfigError, match="zero_stage"):
        TrainingConfig(zero_stage=4)
    with pytest.raises(ConfigError, match="data_parallel"):
        TrainingConfig(data_parallel=0)


def test_parallelism_derives_gpus_and_microbatches() -> None:
    par = Parallelism(tp=2, pp=4, dp=8, cp=2, microbatch_size=2, global_batch=256)
    assert par.gpus == 128 and par.replicas == 16 and par.microbatches == 16
    assert par.training().data_parallel == 16 and par.training().zero_stage == 1


@pytest.mark.parametrize("par,gpus,field", [
    (Parallelism(tp=2, pp=2, dp=2), 16, "gpus"),
    (Parallelism(tp=3), None, "tp"),
    (Parallelism(dp=4, microbatch_size=2, global_batch=12), None, "global_batch"),
    (Parallelism(pp=20), None, "pp"),
    (Parallelism(ep=2, dp=2), None, "ep"),
    (Parallelism(cp=3), None, "cp"),
    (Parallelism(tp=0), None, "tp"),
])
def test_bad_degrees_name_the_field(par: Parallelism, gpus: int | None, field: str) -> None:
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        validate_job(gpt(), par, seq_len=2048, gpus=gpus)


def test_expert_degree_must_divide_the_experts_and_the_replicas() -> None:
    validate_job(moe(8), Parallelism(dp=4, ep=4), seq_len=1024)
    with pytest.raises(ConfigError, match="experts do not split"):
        validate_job(moe(6), Parallelism(dp=4, ep=4), seq_len=1024)
    with pytest.raises(ConfigError, match="must divide dp"):
        validate_job(moe(8), Parallelism(dp=2, ep=4), seq_len=1024)


def test_context_parallelism_is_refused_for_mamba() -> None:
    arch = Architecture("m", "m", 1024, 32000, (LayerSpec("embedding"), LayerSpec(mixer="mamba"), LayerSpec("head")),
                        mamba_num_heads=16)
    with pytest.raises(ConfigError, match="field 'cp'"):
        validate_job(arch, Parallelism(cp=2, dp=1), seq_len=2048)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_job_profile_reuses_the_per_layer_cost_model(tp: int) -> None:
    """Without CP/EP/SP, inside a node, the job's per-layer times are the cost model's own."""
    arch = gpt()
    par = Parallelism(tp=tp, sequence_parallel=False)
    job = job_profile(arch, par, gpu="h100", seq_len=2048)
    ref = profile_from_architecture(arch, gpu="h100", seq_len=2048, tp=tp)
    for a, b in zip(job.layers, ref.layers, strict=True):
        assert (a.f, a.b, a.w, a.params, a.act_bytes) == pytest.approx((b.f, b.b, b.w, b.params, b.act_bytes))
        assert a.out_bytes == b.out_bytes // tp  # each TP rank sends its share (scatter/gather)


def test_tp_across_nodes_is_priced_on_the_nic() -> None:
    arch = gpt(a=16)
    inside = job_profile(arch, Parallelism(tp=16, sequence_parallel=False), gpu="h100", seq_len=2048,
                         gpus_per_node=16)
    across = job_profile(arch, Parallelism(tp=16, sequence_parallel=False), gpu="h100", seq_len=2048,
                         gpus_per_node=8)
    assert across.layers[1].f > inside.layers[1].f
    gpu = get_gpu("h100")
    assert group_link(8, 1, gpu=gpu, gpus_per_node=8)[0] == gpu.nvlink_gbps * 1e9
    assert group_link(4, 4, gpu=gpu, gpus_per_node=8)[0] == gpu.inter_node_gbps * 1e9


def test_sequence_parallelism_shards_every_activation_korthikanti() -> None:
    """Korthikanti et al. 2022 with sequence parallelism: s*b*h*(34/t + 5*a*s/(h*t))."""
    arch = gpt(4096, 32)
    s, h, a, t = 2048, 4096, 32, 4
    work = layer_work(arch, 1, seq_len=s, tp=t, sequence_parallel=True,
                      options=CostOptions(dropout=True, flash_attention=False))
    assert work.act_bytes == pytest.approx(s * h * (34 / t + 5 * a * s / (h * t)))


def test_context_parallelism_splits_tokens_and_attention_pairs() -> None:
    arch = gpt(2048, 16)
    one = layer_work(arch, 1, seq_len=4096)
    half = layer_work(arch, 1, seq_len=2048, cp=2)  # the rank's half of a 4096-token sequence
    assert half.f.matmul_flops == pytest.approx(one.f.matmul_flops / 2)
    core = [op for op in one.f.ops if op.tag == "core"]
    core_half = [op for op in half.f.ops if op.tag == "core"]
    assert sum(op.flops for op in core_half) == pytest.approx(sum(op.flops for op in core) / 2)
    # the ring's K/V exchange is hidden behind the core here; the job's F is about half
    p1 = job_profile(arch, Parallelism(), gpu="h100", seq_len=4096)
    p2 = job_profile(arch, Parallelism(cp=2), gpu="h100", seq_len=4096)
    # a little over half: the rank's GEMMs have half the rows and run less efficiently
    assert p1.layers[1].f / 2 < p2.layers[1].f < 1.12 * p1.layers[1].f / 2


def test_expert_parallelism_holds_fewer_experts_and_pays_an_all_to_all() -> None:
    arch = moe(8)
    one = job_profile(arch, Parallelism(dp=4), gpu="h100", seq_len=1024)
    four = job_profile(arch, Parallelism(dp=4, ep=4), gpu="h100", seq_len=1024)
    held_one, held_four = (x.layers[1].extra["expert_params"] for x in (one, four))
    assert held_four == held_one // 4 and one.layers[1].extra["dense_params"] == four.layers[1].extra["dense_params"]
    assert four.layers[0].params == one.layers[0].params  # the embedding is not an expert
    dense = profile_from_architecture(arch, gpu="h100", seq_len=1024)
    assert one.layers[1].f == pytest.approx(dense.layers[1].f)


def _plan(profile, par: Parallelism) -> Plan:
    return megatron_job_plan(profile, job_cluster(par, gpu="h100"), par)


def test_dp_tail_overlaps_the_gradient_reduction_with_the_last_backward() -> None:
    arch = gpt(2048, 16, layers=8)
    base = Parallelism(dp=16, microbatch_size=4, global_batch=64)
    profile = job_profile(arch, base, gpu="h100", seq_len=4096)
    plan = _plan(profile, base)
    overlapped = dp_tail(profile, plan, base, gpu="h100")
    plain = dp_tail(profile, plan, Parallelism(dp=16, microbatch_size=4, global_batch=64, overlap_grad_reduce=False,
                                               overlap_param_gather=False), gpu="h100")
    assert 0 < overlapped.seconds < plain.seconds
    assert plain.exposed_s == pytest.approx(plain.comm_s)
    zero0 = dp_tail(profile, plan, Parallelism(dp=16, microbatch_size=4, global_batch=64, zero_stage=0,
                                               overlap_grad_reduce=False), gpu="h100")
    assert zero0.comm_s[0] == pytest.approx(plain.comm_s[0], rel=0.05)  # AR = RS + AG in bytes
    single = dp_tail(profile, plan, Parallelism(microbatch_size=4, global_batch=4), gpu="h100")
    assert single.seconds == 0.0


def test_estimate_job_counts_tokens_mfu_and_sharded_memory() -> None:
    arch = gpt(2048, 16, layers=8)
    par = Parallelism(pp=2, dp=4, microbatch_size=1, global_batch=32)
    profile = job_profile(arch, par, gpu="h100", seq_len=2048)
    cluster = job_cluster(par, gpu="h100")
    plan = _plan(profile, par)
    est = estimate_job(profile, cluster, plan, par=par, gpu="h100", seq_len=2048)
    assert est.iteration_s >= est.pipeline_s > 0
    assert est.tokens_per_s_per_gpu == pytest.approx(32 * 2048 / est.iteration_s / 8)
    assert 0 < est.mfu < 1 and est.fits
    unsharded = estimate_job(profile, cluster, plan, par=Parallelism(pp=2, dp=4, global_batch=32, zero_stage=0),
                             gpu="h100", seq_len=2048)
    assert unsharded.peak_memory_gb > est.peak_memory_gb
    row = est.row()
    assert {"tp", "pp", "dp", "cp", "ep", "microbatch_size", "microbatches", "tokens_per_s_per_gpu", "mfu",
            "peak_memory_gb"} <= set(row)


def test_stages_share_a_node_only_when_the_stride_allows() -> None:
    assert job_cluster(Parallelism(pp=4, dp=2), gpu="h100").gpus_per_node == 4
    assert job_cluster(Parallelism(tp=8, pp=4), gpu="h100").gpus_per_node == 1


def test_fsdp_hides_its_gathers_behind_the_step_and_megatron_refuses_chunks_it_cannot_run() -> None:
    arch = gpt(2048, 16, layers=8)
    par = Parallelism(dp=16, microbatch_size=4, global_batch=256, zero_stage=3)
    profile = job_profile(arch, par, gpu="h100", seq_len=4096)
    plan = _plan(profile, par)
    fsdp = dp_tail(profile, plan, par, gpu="h100")
    assert fsdp.comm_s[0] > 0 and fsdp.exposed_s[0] < fsdp.comm_s[0]
    odd = Parallelism(pp=4, dp=1, global_batch=6)
    prof = job_profile(arch, odd, gpu="h100", seq_len=2048)
    with pytest.raises(ConfigError, match="field 'chunks'"):
        megatron_job_plan(prof, job_cluster(odd, gpu="h100"), odd, chunks=[2])  # 6 micro-batches on 4 devices


def test_megatrons_plan_is_the_fastest_chunk_count_that_fits() -> None:
    from pipeline.zoo import load_zoo_architecture
    arch = load_zoo_architecture("gemma-large")
    par = Parallelism(pp=8, dp=1, microbatch_size=1, global_batch=256)
    profile = job_profile(arch, par, gpu="h100", seq_len=4096)
    cluster = job_cluster(par, gpu="h100", memory_gb=90)  # 86 GiB usable: one chunk fits, two do not
    from pipeline.simulator import simulate
    train = par.training(TrainingConfig(runtime="megatron"))
    results = {v: simulate(megatron_job_plan(profile, cluster, par, chunks=[v]), profile, cluster, training=train,
                           record_timeline=False) for v in (1, 2)}
    assert results[2].iteration_time < results[1].iteration_time and not results[2].feasible  # faster, too big
    chosen = megatron_job_plan(profile, cluster, par, chunks=[1, 2])
    assert chosen.meta["chunks"] == 1 and results[1].feasible
