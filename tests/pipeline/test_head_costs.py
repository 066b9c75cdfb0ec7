"""The cost model where the head is heavy: the memory-bound loss, GEMM shape efficiency, attention kernels.

A synthetic head-heavy table (no measured rows): a GPT of hidden 3072 and 32 layers on 8 A100s,
PP 8, 1F1B, 128 micro-batches of one 2048-token sequence, vocabulary 32k to 256k."""

from __future__ import annotations

import pytest

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import CostOptions, Op, PassWork, layer_work, runtime_cost_options
from pipeline.errors import ConfigError
from pipeline.hardware import GPUS, get_gpu
from pipeline.parallelism import Parallelism, estimate_job, job_cluster, job_profile, megatron_job_plan
from pipeline.runtime import RUNTIMES
from pipeline.spec import TrainingConfig

H, LAYERS, HEADS, S = 3072, 32, 24, 2048
VOCABS = (32000, 64000, 128000, 256000)


def gpt(vocab: int, *, layers: int = LAYERS) -> Architecture:
    specs = (LayerSpec("embedding"),) + (LayerSpec(),) * layers + (LayerSpec("head"),)
    return Architecture("gpt", "gpt", H, vocab, specs, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                        intermediate_size=4 * H, gated_mlp=False, seq_len=S)


def pp8(vocab: int, options: CostOptions):
    """(MFU, peak GiB per device, the head's LayerWork) of the synthetic row on the megatron runtime."""
    par = Parallelism(pp=8, microbatch_size=1, global_batch=128)
    arch = gpt(vocab)
    profile = job_profile(arch, par, gpu="a100", seq_len=S, options=options)
    cluster = job_cluster(par, gpu="a100")
    training = TrainingConfig(runtime=RUNTIMES["megatron"])
    plan = megatron_job_plan(profile, cluster, par, training=training, chunks=[1])
    est = estimate_job(profile, cluster, plan, par=par, training=training, gpu="a100", seq_len=S)
    head = layer_work(arch, len(arch.layers) - 1, seq_len=S, options=options)
    return est.mfu, [x / 2**30 for x in est.result.peak_memory], head


@pytest.fixture(scope="module")
def table() -> dict[tuple[int, bool], tuple]:
    return {(v, fused): pp8(v, CostOptions(fused_cross_entropy=fused)) for v in VOCABS for fused in (True, False)}


def test_mfu_falls_as_the_vocabulary_grows_and_the_fp32_loss_deepens_the_fall(table) -> None:
    unfused = [table[(v, False)][0] for v in VOCABS]
    fused = [table[(v, True)][0] for v in VOCABS]
    assert unfused == sorted(unfused, reverse=True) and fused == sorted(fused, reverse=True)
    # the op-by-op fp32 loss costs ~50 bytes per logit: its share grows with V, so the
    # penalty over a fused loss is several times larger at 256k than at 32k
    penalty = [1 - u / f for u, f in zip(unfused, fused)]
    assert penalty == sorted(penalty)
    assert penalty[-1] > 3 * penalty[0] and penalty[-1] > 0.1
    assert unfused[-1] < 0.6 * unfused[0]


def test_the_256k_head_holds_fp32_logits_and_their_gradient_at_the_last_stage_peak(table) -> None:
    T, V = S, 256000
    _, peak_unfused, head = table[(V, False)]
    _, peak_fused, fused_head = table[(V, True)]
    assert head.loss_bytes == 4 * T * V  # the fp32 softmax, kept from F for the backward
    assert head.workspace_bytes == (2 + 4) * T * V  # F's bf16 logits and the fp32 copy beside it
    assert fused_head.loss_bytes == 2 * T * V and fused_head.workspace_bytes == 0
    # on the last stage (one micro-batch in flight under 1F1B) the peak rises by exactly that
    extra = (4 * T * V - 2 * T * V + 6 * T * V) / 2**30
    assert peak_unfused[-1] - peak_fused[-1] == pytest.approx(extra, rel=1e-3)
    assert peak_unfused[-1] > peak_unfused[1]  # the head makes the last stage heavier than a middle one


def test_the_loss_is_priced_as_memory_traffic() -> None:
    T, V = S, 256000
    work = layer_work(gpt(V, layers=1), 2, seq_len=S)
    gpu = get_gpu("a100")
    loss_f = [op for op in work.f.ops if op.kind == "vector" and op.bytes >= T * V]
    loss_i = [op for op in work.i.ops if op.kind == "vector" and op.bytes >= T * V]
    # F: cast (2+4), max (4), subtract (8), exp (8), sum (4), divide (8); I: scale (8), cast back (4+2)
    assert sum(op.bytes for op in loss_f) == 38 * T * V and sum(op.bytes for op in loss_i) == 14 * T * V
    seconds = PassWork(loss_f + loss_i).seconds(gpu)
    assert seconds == pytest.approx(52 * T * V / gpu.memory_bytes_per_s, rel=0.01)  # bandwidth-bound
    bf16 = layer_work(gpt(V, layers=1), 2, seq_len=S, options=CostOptions(loss_dtype="bf16"))
    assert bf16.loss_bytes == 2 * T * V and bf16.f.bytes < work.f.bytes


def test_gemm_efficiency_falls_with_small_shapes() -> None:
    a100 = get_gpu("a100")
    assert a100.gemm_efficiency(8192 * 8192, 8192) > 0.97
    square = [a100.gemm_efficiency(n * n, n) for n in (256, 512, 1024, 2048, 4096)]
    assert square == sorted(square) and square[0] < 0.1 and 0.4 < square[2] < 0.6
    assert a100.gemm_efficiency(4096 * 4096, 16) < 0.25 * a100.gemm_efficiency(4096 * 4096, 4096)
    assert get_gpu("cpu").gemm_efficiency(16, 16) == 1.0  # no curve without an SM count
    for name, spec in GPUS.items():
        if name != "cpu":
            assert spec.sm_count > 0 and spec.gemm_half_mn == spec.sm_count * 8192


def test_small_microbatches_and_small_hidden_run_below_the_roofline() -> None:
    gpu = get_gpu("h100")

    def rate(h: int, tokens: int) -> float:
        """Achieved matmul FLOP/s of one block's forward GEMMs over the preset's matmul rate."""
        arch = Architecture("g", "gpt", h, 32000, (LayerSpec(),), num_attention_heads=max(1, h // 128),
                            num_key_value_heads=max(1, h // 128), intermediate_size=4 * h, gated_mlp=False)
        work = layer_work(arch, 0, seq_len=tokens)
        gemms = PassWork([Op("matmul", op.flops, 0.0, mn=op.mn, k=op.k) for op in work.f.ops
                          if op.kind == "matmul" and op.tag != "core"])
        seconds = gemms.seconds(gpu) - len(gemms.ops) * gpu.kernel_overhead_us * 1e-6
        return gemms.matmul_flops / seconds / gpu.matmul_flops_per_s

    assert rate(8192, 8192) > 0.95  # large shapes: the preset's rate
    assert rate(1024, 512) < 0.55  # small hidden and few tokens: well below it
    tokens = [rate(2048, t) for t in (256, 1024, 4096, 16384)]
    assert tokens == sorted(tokens) and tokens[0] < 0.75 * tokens[-1]


def test_attention_kernels_flash_or_materialised_scores() -> None:
    arch = gpt(32000, layers=1)
    flash = layer_work(arch, 1, seq_len=4096, options=runtime_cost_options("megatron"))
    plain = layer_work(arch, 1, seq_len=4096, options=runtime_cost_options("megatron", flash_attention=False))
    scores = HEADS * 4096 * 4096
    assert plain.act_bytes - flash.act_bytes == pytest.approx(2 * scores - 4 * 4096 * HEADS)
    gpu = get_gpu("a100")
    assert plain.f.seconds(gpu) > flash.f.seconds(gpu) * 1.1 and plain.i.seconds(gpu) > flash.i.seconds(gpu)
    for name in ("megatron", "zb", "zb-sync", "pytorch"):
        options = runtime_cost_options(name)
        assert options.flash_attention and options.loss_dtype == "fp32" and not options.fused_cross_entropy
    assert runtime_cost_options("not-a-runtime") == CostOptions()


def test_bad_cost_options_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        CostOptions(loss_dtype="fp8")
    assert info.value.field == "loss_dtype" and "fp32" in str(info.value)
    with pytest.raises(ConfigError) as info:
        runtime_cost_options("megatron", flash=True)
    assert info.value.field == "options" and "flash_attention" in str(info.value)
