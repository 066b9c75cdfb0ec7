"""pipeline.parallelism at scale: collectives' latency at many ranks, MoE imbalance, expert data
parallelism and activation checkpointing modes (docs/whole-job.md)."""

from __future__ import annotations

import math

import pytest

from pipeline.errors import ConfigError
from pipeline.hardware import get_gpu
from pipeline.parallelism import (
    GRAD_BYTES,
    Parallelism,
    collective_seconds,
    dp_tail,
    estimate_job,
    expert_rank_imbalance,
    job_cluster,
    job_profile,
    megatron_job_plan,
    validate_job,
)
from pipeline.zoo import load_zoo_architecture

H100 = get_gpu("h100")
A_IB = H100.inter_node_latency_us * 1e-6


def test_ring_latency_grows_with_the_ranks_and_the_tree_with_their_log() -> None:
    # one rank per node (stride 8): every step crosses the NIC
    tiny = 1.0
    ring_only = collective_seconds(tiny, 256, 8, gpu=H100, gpus_per_node=8, kind="reduce_scatter")
    assert ring_only == pytest.approx(min(255 * A_IB, 8 * A_IB), rel=1e-3)  # PAT at one rank per node
    ar = collective_seconds(tiny, 256, 8, gpu=H100, gpus_per_node=8, kind="all_reduce")
    assert ar == pytest.approx(2 * 8 * A_IB, rel=1e-3)  # the tree: 2 * log2(256) steps
    # the faster of the two: the ring moves (n-1)/n of the data per phase, the tree all of it
    bw = H100.inter_node_gbps * 1e9
    for size, nbytes in ((4, 4e9), (256, 4e9), (256, 1e6)):
        ring = 2 * (size - 1) / size * nbytes / bw + 2 * (size - 1) * A_IB
        tree = 2 * nbytes / bw + 2 * math.ceil(math.log2(size)) * A_IB
        got = collective_seconds(nbytes, size, 8, gpu=H100, gpus_per_node=8)
        assert got == pytest.approx(min(ring, tree), rel=1e-9)
    assert collective_seconds(4e9, 4, 8, gpu=H100, gpus_per_node=8) < 2 * 4e9 / bw  # the ring at few ranks
    # with several ranks per node (stride 1) PAT does not apply: the ring's latency counts every step
    rs = collective_seconds(tiny, 64, 1, gpu=H100, gpus_per_node=8, kind="reduce_scatter")
    assert rs == pytest.approx(7 * H100.nvlink_latency_us * 1e-6 + 7 * A_IB, rel=1e-3)


def test_each_bucket_pays_the_latency_again() -> None:
    one = collective_seconds(1e8, 128, 8, gpu=H100, gpus_per_node=8, kind="reduce_scatter", buckets=1)
    ten = collective_seconds(1e8, 128, 8, gpu=H100, gpus_per_node=8, kind="reduce_scatter", buckets=10)
    assert ten - one == pytest.approx(9 * math.ceil(math.log2(128)) * A_IB, rel=1e-6)


def test_expert_rank_imbalance_follows_from_the_busiest_expert() -> None:
    assert expert_rank_imbalance(1.25, 64, 1) == 1.0  # one rank holds every expert: the mean
    assert expert_rank_imbalance(1.25, 64, 64) == pytest.approx(1.25)  # one expert per rank
    mid = expert_rank_imbalance(1.25, 64, 8)  # 8 experts per rank, one of them hot
    assert mid == pytest.approx((1.25 + 7 * (64 - 1.25) / 63) / 8)
    assert 1.0 < mid < expert_rank_imbalance(1.25, 64, 16) < 1.25
    assert expert_rank_imbalance(1.0, 64, 64) == 1.0


def test_moe_imbalance_slows_the_expert_layers_only() -> None:
    arch = load_zoo_architecture("deepseek-small")
    base = dict(dp=8, ep=8, microbatch_size=1, global_batch=8)
    even = job_profile(arch, Parallelism(**base, moe_imbalance=1.0), gpu="h100", seq_len=2048)
    hot = job_profile(arch, Parallelism(**base, moe_imbalance=2.0), gpu="h100", seq_len=2048)
    kinds = [layer.extra.get("expert") for layer in even.layers]
    for a, b, moe in zip(even.layers, hot.layers, kinds, strict=True):
        if moe:
            assert b.f > a.f and b.b > a.b
        else:
            assert (b.f, b.b, b.w) == pytest.approx((a.f, a.b, a.w))
    # ep=1: the rank runs every expert, the imbalance evens out
    flat = job_profile(arch, Parallelism(dp=8, global_batch=8, moe_imbalance=2.0), gpu="h100", seq_len=2048)
    flat_even = job_profile(arch, Parallelism(dp=8, global_batch=8, moe_imbalance=1.0), gpu="h100", seq_len=2048)
    assert [x.f for x in flat.layers] == pytest.approx([x.f for x in flat_even.layers])
    with pytest.raises(ConfigError, match="field 'moe_imbalance'"):
        validate_job(arch, Parallelism(moe_imbalance=0.9), seq_len=2048)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group() -> None:
    arch = load_zoo_architecture("deepseek-small")
    # dp*cp = 8 replicas, ep = 8: each expert lives on one rank, its gradient is reduced by no one
    par = Parallelism(dp=8, ep=8, global_batch=8, overlap_grad_reduce=False, overlap_param_gather=False,
                      moe_imbalance=1.0)
    assert par.expert_data_parallel == 1
    profile = job_profile(arch, par, gpu="h100", seq_len=2048)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h100"), par)
    dense = sum(float(x.extra.get("dense_params", x.params)) for x in profile.layers)
    buckets = math.ceil(dense / 40e6)  # Megatron's max(40M, 1M * 8) parameters a bucket
    expected = (collective_seconds(GRAD_BYTES * dense, 8, 1, gpu=H100, gpus_per_node=8, kind="reduce_scatter",
                                   buckets=buckets)
                + collective_seconds(2.0 * dense, 8, 1, gpu=H100, gpus_per_node=8, kind="all_gather",
                                     buckets=buckets))
    assert dp_tail(profile, plan, par, gpu="h100").comm_s[0] == pytest.approx(expected)
    # ep = 2: the experts' gradients go over dp*cp/ep = 4 ranks as well
    par2 = Parallelism(dp=8, ep=2, global_batch=8, overlap_grad_reduce=False, overlap_param_gather=False)
    prof2 = job_profile(arch, par2, gpu="h100", seq_len=2048)
    plan2 = megatron_job_plan(prof2, job_cluster(par2, gpu="h100"), par2)
    assert dp_tail(prof2, plan2, par2, gpu="h100").comm_s[0] > expected
    # the experts' optimizer state is sharded over fewer ranks: more bytes per expert parameter
    moe_layer = next(x for x in profile.layers if x.extra.get("expert"))
    assert moe_layer.params > moe_layer.extra["dense_params"] + moe_layer.extra["expert_params"]


def _job(arch, par, *, seq_len: int = 4096):
    profile = job_profile(arch, par, gpu="h100", seq_len=seq_len)
    cluster = job_cluster(par, gpu="h100")
    plan = megatron_job_plan(profile, cluster, par)
    return profile, estimate_job(profile, cluster, plan, par=par, gpu="h100", seq_len=seq_len)


def test_activation_checkpointing_modes_trade_time_for_memory() -> None:
    arch = load_zoo_architecture("llama-control")
    base = Parallelism(tp=2, pp=2, dp=2, microbatch_size=2, global_batch=32)
    (p_none, none), (p_sel, sel), (_, full) = (_job(arch, base.with_ac(m)) for m in ("none", "selective", "full"))
    assert none.peak_memory_gb > sel.peak_memory_gb > full.peak_memory_gb
    assert none.iteration_s < sel.iteration_s < full.iteration_s
    assert (none.par.ac, sel.par.ac, full.par.ac) == ("none", "selective", "full")
    # selective: each block drops its two norm outputs (T*h bf16, split tp ways by SP)
    tokens, h = 2 * 4096, arch.hidden_size
    block = next(i for i, x in enumerate(p_none.layers) if x.kind not in ("embedding", "head"))
    drop = p_none.layers[block].act_bytes - p_sel.layers[block].act_bytes
    assert drop == pytest.approx(2 * 2 * tokens * h / 2, abs=2)
    assert p_sel.layers[block].b > p_none.layers[block].b and p_sel.layers[block].f == p_none.layers[block].f
    with pytest.raises(ConfigError, match="field 'ac'"):
        base.with_ac("partial")
