"""Analytic layer costs: FLOPs against published formulas, memory conventions, roofline timing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipeline.arch import MIXERS, Architecture, LayerSpec
from pipeline.costs import (
    CostOptions,
    Op,
    PassWork,
    architecture_work,
    layer_work,
    profile_from_architecture,
)
from pipeline.errors import ConfigError
from pipeline.hardware import get_gpu
from pipeline.spec import ModelProfile
from pipeline.zoo import load_zoo_architecture

EMBED = LayerSpec(kind="embedding", mixer="none", ffn="none")
HEAD = LayerSpec(kind="head", mixer="none", ffn="none")


def gpt(h: int, heads: int, *, vocab: int = 50304, **kw) -> Architecture:
    """A GPT-3-style model: MHA and a plain (non-gated) 4h MLP, as the Megatron formula assumes."""
    fields = dict(name="gpt", model_type="adaptis", hidden_size=h, vocab_size=vocab, num_attention_heads=heads,
                  num_key_value_heads=heads, intermediate_size=4 * h, gated_mlp=False,
                  layers=(EMBED, LayerSpec(), HEAD))
    fields.update(kw)
    return Architecture(**fields)


def block_flops(arch: Architecture, index: int = 1, **kw) -> tuple[float, float, float]:
    work = layer_work(arch, index, **kw)
    return work.f.matmul_flops, work.i.matmul_flops, work.w.matmul_flops


@pytest.mark.parametrize("b,s,h,a", [(1, 2048, 1024, 16), (2, 4096, 4096, 32), (4, 512, 768, 12), (1, 8192, 2560, 20)])
def test_dense_layer_matches_megatron_formula(b: int, s: int, h: int, a: int) -> None:
    f, i, w = block_flops(gpt(h, a), seq_len=s, microbatch_size=b)
    assert f == pytest.approx(24 * b * s * h**2 + 4 * b * s**2 * h, rel=1e-12)
    # Narayanan et al. 2021: 72 b s h^2 (1 + s / 6h) per layer for forward + backward
    assert f + i + w == pytest.approx(72 * b * s * h**2 * (1 + s / (6 * h)), rel=1e-12)


@pytest.mark.parametrize("b,s,h,a", [(1, 2048, 1024, 16), (2, 4096, 4096, 32)])
def test_activation_bytes_match_korthikanti(b: int, s: int, h: int, a: int) -> None:
    arch = gpt(h, a)
    paper = CostOptions(dropout=True, flash_attention=False)
    work = layer_work(arch, 1, seq_len=s, microbatch_size=b, options=paper)
    assert work.act_bytes == s * b * h * (34 + 5 * a * s / h)
    # default (no dropout, FlashAttention): two masks gone, the a*s^2 scores replaced by an fp32 log-sum-exp
    default = layer_work(arch, 1, seq_len=s, microbatch_size=b)
    assert default.act_bytes == s * b * h * 32 + 4 * b * a * s
    assert 0 < default.w_act_bytes < default.act_bytes


@pytest.mark.parametrize("tp", [1, 2])
def test_w_graph_bytes_are_what_pytorch_keeps_from_i_until_w(tp: int) -> None:
    """PyTorch's ``stage_backward_input`` keeps the whole graph (every saved tensor) and the gradient
    at each weight operation's output; above the weights (the head's logits) it frees."""
    b, s, h, a, V = 2, 1024, 1024, 16, 32000
    arch = gpt(h, a, vocab=V)
    T = b * s
    block = layer_work(arch, 1, seq_len=s, microbatch_size=b, tp=tp)
    # BF16 gradients at the outputs of QKV (3h), the out-projection (h), fc1 (4h), fc2 (h), divided
    # by tensor parallelism like the matmuls (the model's simplification: a row-parallel output's
    # gradient is whole on every rank), and of the two norms (h each, replicated)
    sharded = 3 * h + h + 4 * h + h
    assert block.w_grad_bytes == 2 * T * (sharded / tp + 2 * h)
    assert block.loss_bytes == 0
    head = layer_work(arch, 2, seq_len=s, microbatch_size=b, tp=tp)
    assert head.loss_bytes == 4 * T * V / tp  # the fp32 softmax kept for the loss backward
    fused = layer_work(arch, 2, seq_len=s, microbatch_size=b, tp=tp, options=CostOptions(fused_cross_entropy=True))
    assert fused.loss_bytes == 2 * T * V / tp  # a fused loss keeps the bf16 logits
    assert head.w_grad_bytes == 2 * T * (V / tp + h)  # d(logits) and the final norm's output gradient
    profile = profile_from_architecture(arch, seq_len=s, microbatch_size=b, tp=tp)
    for layer, work in zip(profile.layers, (None, block, head)):
        if work is not None:
            assert layer.w_graph_bytes == round(work.act_bytes - work.loss_bytes + work.w_grad_bytes)
    assert profile.layers[1].w_graph_bytes > profile.layers[1].act_bytes > profile.layers[1].w_act_bytes


def test_head_flops_scale_with_vocabulary() -> None:
    s, h = 4096, 1536
    small = layer_work(gpt(h, 12, vocab=32000), 2, seq_len=s)
    large = layer_work(gpt(h, 12, vocab=256000), 2, seq_len=s)
    assert small.f.matmul_flops == 2 * s * h * 32000
    assert large.f.matmul_flops / small.f.matmul_flops == pytest.approx(8.0)
    assert large.w.matmul_flops / small.w.matmul_flops == pytest.approx(8.0)
    assert large.act_bytes > small.act_bytes  # the logits are kept for the loss backward
    assert large.out_bytes == 0


def moe_arch(experts: int, top_k: int, **kw) -> Architecture:
    fields = dict(name="moe", model_type="adaptis", hidden_size=1024, vocab_size=32000, num_attention_heads=8,
                  num_key_value_heads=8, num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=512,
                  layers=(EMBED, LayerSpec(mixer="none", ffn="moe"), HEAD))
    fields.update(kw)
    return Architecture(**fields)


def test_moe_costs_by_active_experts_and_holds_all_experts() -> None:
    s, h, f = 2048, 1024, 512
    few, many = (layer_work(moe_arch(e, 2), 1, seq_len=s) for e in (8, 64))
    router = 2 * s * h * (64 - 8)
    assert many.f.matmul_flops - few.f.matmul_flops == pytest.approx(router)  # only the router grows
    expert = 3 * h * f  # gated expert: gate, up, down
    assert many.params - few.params == 56 * expert + h * 56
    k2, k4 = (layer_work(moe_arch(64, k), 1, seq_len=s) for k in (2, 4))
    expert_flops = 2 * s * expert  # one expert per token, forward
    assert k4.f.matmul_flops - k2.f.matmul_flops == pytest.approx(2 * expert_flops)
    assert k4.params == k2.params
    assert many.f.bytes > few.f.bytes  # every expert's weights are streamed


def test_shared_experts_add_their_mlp() -> None:
    s, h = 1024, 1024
    plain = layer_work(moe_arch(16, 2), 1, seq_len=s)
    shared = layer_work(moe_arch(16, 2, num_shared_experts=2), 1, seq_len=s)
    assert shared.params - plain.params == 2 * 3 * h * 512
    assert shared.f.matmul_flops - plain.f.matmul_flops == pytest.approx(2 * s * 2 * 3 * h * 512)


def test_weight_gradients_exclude_the_attention_core() -> None:
    s, h, a = 2048, 1024, 16
    work = layer_work(gpt(h, a), 1, seq_len=s)
    matrices = 12 * h * h  # QKV 3h^2, out h^2, MLP 8h^2
    assert work.w.matmul_flops == 2 * s * matrices
    core = 4 * s * s * h
    assert work.i.matmul_flops == pytest.approx(2 * s * matrices + 2 * core)
    recompute = layer_work(gpt(h, a), 1, seq_len=s, options=CostOptions(attention_backward_factor=2.5))
    assert recompute.i.matmul_flops == pytest.approx(2 * s * matrices + 2.5 * core)


def test_gqa_and_mqa_shrink_kv_projections() -> None:
    s, h, a = 1024, 2048, 16
    mha, gqa, mqa = (layer_work(gpt(h, a, num_key_value_heads=g), 1, seq_len=s) for g in (16, 4, 1))
    d = h // a
    assert mha.params - gqa.params == 2 * h * (16 - 4) * d
    assert mha.params - mqa.params == 2 * h * 15 * d
    assert mha.f.matmul_flops > gqa.f.matmul_flops > mqa.f.matmul_flops


def test_sliding_window_and_causal_pairs() -> None:
    s, h, a = 4096, 1024, 16
    full = gpt(h, a, layers=(EMBED, LayerSpec(), LayerSpec(mixer="sliding_attention", window=128), HEAD))
    f_full, _, _ = block_flops(full, 1, seq_len=s)
    f_slide, _, _ = block_flops(full, 2, seq_len=s)
    proj = 24 * s * h * h
    assert (f_slide - proj) / (f_full - proj) == pytest.approx(128 / s)
    f_causal, _, _ = block_flops(full, 1, seq_len=s, options=CostOptions(causal=True))
    assert (f_causal - proj) / (f_full - proj) == pytest.approx((s + 1) / (2 * s))
    wide = gpt(h, a, layers=(EMBED, LayerSpec(mixer="sliding_attention", window=8192), HEAD))
    assert block_flops(wide, 1, seq_len=s)[0] == f_full  # a window longer than the sequence is full attention


def test_recurrent_mixers_are_linear_in_sequence_length() -> None:
    arch = load_zoo_architecture("tiny-hybrid")
    kinds = {spec.label: i for i, spec in enumerate(arch.layers)}
    for label in ("mamba", "linear_attention+mlp"):
        short = layer_work(arch, kinds[label], seq_len=1024).f.matmul_flops
        long = layer_work(arch, kinds[label], seq_len=2048).f.matmul_flops
        assert long / short == pytest.approx(2.0), label
    short = layer_work(arch, kinds["attention+mlp"], seq_len=1024).f.matmul_flops
    long = layer_work(arch, kinds["attention+mlp"], seq_len=2048).f.matmul_flops
    assert long / short > 2.5  # quadratic attention core dominates at hidden 64


def test_mamba2_ssd_flops_follow_the_chunked_algorithm() -> None:
    h, H, P, N, G, Q, s = 1024, 32, 64, 128, 8, 128, 4096
    arch = Architecture(name="m", model_type="adaptis", hidden_size=h, vocab_size=1000, num_attention_heads=8,
                        mamba_num_heads=H, mamba_head_dim=P, ssm_state_size=N, mamba_n_groups=G,
                        mamba_chunk_size=Q, layers=(EMBED, LayerSpec(mixer="mamba", ffn="none"), HEAD))
    d_in = H * P
    proj = 2 * s * (h * (2 * d_in + 2 * G * N + H) + d_in * h)
    ssd = 2 * s * (H * (Q * P + 2 * N * P) + G * Q * N)
    work = layer_work(arch, 1, seq_len=s)
    assert work.f.matmul_flops == pytest.approx(proj + ssd)
    assert work.i.matmul_flops == pytest.approx(proj + 2 * ssd)
    assert work.w.matmul_flops == pytest.approx(proj)


def test_embedding_is_a_gather_with_a_scatter_add_weight_gradient() -> None:
    s, h, V = 4096, 1536, 256000
    arch = gpt(h, 12, vocab=V)
    embed, block = layer_work(arch, 0, seq_len=s), layer_work(arch, 1, seq_len=s)
    assert embed.f.matmul_flops == 0 and embed.i.ops == []
    assert embed.w.bytes >= 2 * 2 * V * h  # the dense vocab x h gradient is written and accumulated
    gpu = get_gpu("h100")
    assert embed.f.seconds(gpu) < 0.05 * block.f.seconds(gpu)
    assert embed.params == V * h and embed.out_bytes == 2 * s * h


def test_gemma_head_costs_four_dense_layers_fused_and_twice_that_in_fp32() -> None:
    """At h = 1536 the fp32 loss's ~52 bytes per logit outweigh the head GEMMs' 6h FLOPs per
    logit on an H100 (ridge ~240 FLOP/byte): the unfused head costs about twice the fused one."""
    arch = load_zoo_architecture("gemma-medium")
    for seq_len in (2048, 4096):
        ratios = {}
        for fused in (True, False):
            profile = profile_from_architecture(arch, gpu="h100", seq_len=seq_len,
                                                options=CostOptions(fused_cross_entropy=fused))
            dense, head = profile.layers[1], profile.layers[-1]
            assert head.kind == "head" and dense.kind.endswith("attention+mlp")
            ratios[fused] = (head.f + head.b + head.w) / (dense.f + dense.b + dense.w)
        assert 3.5 <= ratios[True] <= 6.0, (seq_len, ratios)
        assert 1.6 <= ratios[False] / ratios[True] <= 2.6, (seq_len, ratios)


def test_tensor_parallelism_splits_work_and_adds_all_reduces() -> None:
    arch = gpt(4096, 32, vocab=128256)
    one, two = (layer_work(arch, 1, seq_len=4096, tp=t) for t in (1, 2))
    assert two.f.matmul_flops == pytest.approx(one.f.matmul_flops / 2)
    assert two.params == pytest.approx(one.params / 2, rel=1e-3)
    assert one.f.comm_bytes == 0 and two.f.comm_bytes == 2 * (2 * 4096 * 4096)  # two all-reduces of b*s*h bf16
    # Korthikanti et al. with t-way TP: s*b*h*(10 + 24/t + 5*a*s/(h*t)) (dropout, no FlashAttention)
    paper = CostOptions(dropout=True, flash_attention=False)
    s, h, a, t = 2048, 4096, 32, 4
    work = layer_work(arch, 1, seq_len=s, tp=t, options=paper)
    assert work.act_bytes == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    gpu = get_gpu("h100")
    assert two.f.seconds(gpu) < one.f.seconds(gpu)


def test_roofline_takes_the_slower_of_compute_and_memory() -> None:
    gpu = get_gpu("h100")
    overhead = gpu.kernel_overhead_us * 1e-6
    compute = PassWork([Op("matmul", 1e12, 1e6)])
    assert compute.seconds(gpu) == pytest.approx(1e12 / gpu.matmul_flops_per_s + overhead)
    memory = PassWork([Op("matmul", 1e9, 1e10)])
    assert memory.seconds(gpu) == pytest.approx(1e10 / gpu.memory_bytes_per_s + overhead)
    both = PassWork([*compute.ops, *memory.ops])
    assert both.seconds(gpu) == pytest.approx(compute.seconds(gpu) + memory.seconds(gpu))


def test_the_fast_op_constructor_builds_what_op_builds() -> None:
    """The builders' ``_op`` skips the frozen constructor: the same fields, in the same order, of the same types."""
    from pipeline.costs import _op

    for args, kw in ((("vector", 1.0, 2.0), {}), (("matmul", 3, 4.5), {"tag": "core", "mn": 6, "k": 7.0, "fp8": True})):
        made, fast = Op(*args, **kw), _op(*args, **kw)
        assert type(fast) is Op and fast == made
        assert [(k, v, type(v)) for k, v in vars(fast).items()] == [(k, v, type(v)) for k, v in vars(made).items()]


def test_faster_hardware_gives_faster_layers() -> None:
    arch = load_zoo_architecture("llama-control")
    times = {gpu: profile_from_architecture(arch, gpu=gpu, seq_len=2048).layers[1] for gpu in ("a100", "h100", "h200")}
    assert times["a100"].f > times["h100"].f >= times["h200"].f
    assert times["a100"].params == times["h100"].params


ALL_KINDS = Architecture(
    name="all", model_type="adaptis", hidden_size=256, vocab_size=4096, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, intermediate_size=512, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=256, num_shared_experts=1, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
    qk_rope_head_dim=16, v_head_dim=32, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    vision_hidden_size=128, vision_intermediate_size=512, vision_num_heads=4, vision_tokens=64,
    layers=(LayerSpec(kind="vision", mixer="none", ffn="none"), EMBED, LayerSpec(),
            LayerSpec(mixer="sliding_attention", window=64), LayerSpec(mixer="mla", ffn="moe"),
            LayerSpec(mixer="mamba", ffn="none"), LayerSpec(mixer="linear_attention", ffn="none"),
            LayerSpec(mixer="none", ffn="mlp"), LayerSpec(mixer="none", ffn="moe"),
            LayerSpec(kind="mtp", mixer="none", ffn="none"), HEAD),
)


@pytest.mark.parametrize("gpu", ["a100", "h800"])
def test_every_layer_kind_has_finite_positive_costs(gpu: str) -> None:
    s, b = 256, 2
    profile = profile_from_architecture(ALL_KINDS, gpu=gpu, seq_len=s, microbatch_size=b)
    assert [x.kind for x in profile.layers] == [
        "vision", "embedding", "attention+mlp", "sliding_attention+mlp", "mla+moe", "mamba", "linear_attention",
        "mlp", "moe", "mtp", "head"]
    for layer in profile.layers:
        for value in (layer.f, layer.w, layer.params, layer.act_bytes):
            assert math.isfinite(value) and value > 0, layer
        assert layer.b > 0 or layer.kind == "embedding"
        assert layer.extra["flops_f"] >= 0 and layer.extra["bytes_f"] > 0
        assert 0 < layer.w_retained <= layer.act_bytes
    out = {x.kind: x.out_bytes for x in profile.layers}
    assert out["head"] == 0 and out["vision"] == 2 * b * 64 * 128 and out["mamba"] == 2 * b * s * 256
    mtp = profile.layers[-2]
    assert mtp.f > profile.layers[4].f  # an MTP module is a block plus a second LM head
    assert mtp.extra["unique_params"] < mtp.params  # it holds copies of the embedding and head


def test_profile_round_trips_through_json() -> None:
    profile = profile_from_architecture(ALL_KINDS, seq_len=128)
    again = ModelProfile.from_dict(profile.to_dict())
    assert again == profile
    assert again.layers[2].extra["flops_f"] == profile.layers[2].extra["flops_f"]
    assert again.extra["gpu"] == "h100" and again.time_unit == "ms"


def _uncached(arch: Architecture, **kw) -> list[tuple]:
    """Every layer of ``arch`` priced one by one, without the profile's cache of repeated layers."""
    from pipeline.costs import layer_cost

    gpu = kw.pop("gpu", "h100")
    return [(c.to_dict(), c.extra) for c in (layer_cost(w, gpu) for w in architecture_work(arch, **kw))]


@pytest.mark.parametrize("kw", [{}, {"gpu": "a100", "tp": 2, "microbatch_size": 2},
                                {"options": CostOptions(dropout=True, flash_attention=False)}])
def test_repeated_layers_are_priced_once_and_exactly_as_alone(kw: dict) -> None:
    """The profile prices each distinct layer once (the models repeat a few blocks; the
    environments repeat sizes across scenarios; a block's cost does not depend on the vocabulary):
    every figure as the layer priced alone, renamed, each layer with its own ``extra``; a model of
    the same sizes with another name or vocabulary, and the same layers in another order, too."""
    from dataclasses import replace

    import pipeline.costs as costs
    from pipeline.arch import refine_architecture

    base = load_zoo_architecture("tiny-hybrid")
    other_vocab = replace(base, vocab_size=2 * base.vocab_size, tie_word_embeddings=not base.tie_word_embeddings)
    for arch in (base, refine_architecture(base, granularity="sublayer", head_shards=2), ALL_KINDS, other_vocab,
                 base.with_layers(base.layers[:1] + tuple(reversed(base.layers[1:-1])) + base.layers[-1:])):
        for cold in (True, False):
            if cold:
                costs._UNIT_COSTS.clear()
            profile = profile_from_architecture(arch, seq_len=128, **kw)
            assert [(c.to_dict(), c.extra) for c in profile.layers] == _uncached(arch, seq_len=128, **kw)
            assert len({id(c.extra) for c in profile.layers}) == profile.num_layers
            assert profile.extra["params_total"] == sum(w.unique_params for w in architecture_work(arch, seq_len=1))
    renamed = profile_from_architecture(replace(base, name="other"), seq_len=128, **kw)
    assert renamed.layers == profile_from_architecture(base, seq_len=128, **kw).layers
    with pytest.raises(ConfigError, match="microbatch_size"):  # True == 1 as a key, not as a size
        profile_from_architecture(base, seq_len=128, microbatch_size=True)


def test_layers_sharing_one_spec_object_price_as_distinct_ones() -> None:
    """A spec object that recurs (``env.scenarios`` shares them; head shards included) prices as
    equal specs that are distinct objects, each layer named and with its own ``extra``."""
    import pipeline.costs as costs

    block = LayerSpec(mixer="mla", ffn="moe")
    shard = LayerSpec(kind="head", mixer="none", ffn="none", shard=1, shards=2)  # head.1, then head1.1
    shared = ALL_KINDS.with_layers((EMBED, block, LayerSpec(), block, block, shard, shard))
    distinct = shared.with_layers(tuple(replace(x) for x in shared.layers))
    assert shared.layers[1] is shared.layers[3] and distinct.layers[1] is not distinct.layers[3]
    for arch in (shared, distinct, shared):
        costs._UNIT_COSTS.clear()
        profile = profile_from_architecture(arch, seq_len=128)
        assert [(c.to_dict(), c.extra) for c in profile.layers] == _uncached(distinct, seq_len=128)
        assert len({id(c.extra) for c in profile.layers}) == profile.num_layers


def test_ends_shared_across_models_of_other_block_sizes_and_a_full_cache_price_exactly(monkeypatch) -> None:
    """The embedding and the head are keyed by their own sizes only, so models that differ in
    everything else (families, MLP widths, experts, windows, KV heads) share them; a cache that
    evicts its least recently used entries still prices every layer as alone."""
    from dataclasses import replace

    import numpy as np

    import pipeline.costs as costs
    from env.scenarios import MODEL_FAMILIES, sample_architecture

    rng = np.random.default_rng(7)
    archs = [replace(sample_architecture(rng, blocks=6, families=MODEL_FAMILIES), hidden_size=1024, vocab_size=32000)
             for _ in range(24)]
    archs += [replace(a, num_attention_heads=8, num_key_value_heads=8) for a in archs[:4]]
    archs += [replace(a, tie_word_embeddings=not a.tie_word_embeddings) for a in archs[:4]]
    # a vision tower's projector sits in the embedding: other tower sizes or token counts, other costs
    archs += [ALL_KINDS, replace(ALL_KINDS, vision_tokens=32), replace(ALL_KINDS, vision_hidden_size=64)]
    for size in (costs._UNIT_COSTS_MAX, 5):
        monkeypatch.setattr(costs, "_UNIT_COSTS_MAX", size)
        costs._UNIT_COSTS.clear()
        for arch in archs + archs[::-1]:
            profile = profile_from_architecture(arch, seq_len=256, gpu="a100")
            assert [(c.to_dict(), c.extra) for c in profile.layers] == _uncached(arch, seq_len=256, gpu="a100")
        assert len(costs._UNIT_COSTS) <= size


def test_degrees_numbers_are_never_reused(monkeypatch) -> None:
    """A profile's degrees (GPU, options, sequence length, ...) stand for a number in the cache's
    keys; when that table is emptied the old numbers are not given out again, so entries keyed by
    them are never read for other degrees."""
    import pipeline.costs as costs

    monkeypatch.setattr(costs, "_DEGREES_MAX", 1)
    arch = load_zoo_architecture("tiny-hybrid")
    runs = [{"gpu": "a100", "seq_len": 128}, {"gpu": "h100", "seq_len": 128}, {"gpu": "a100", "seq_len": 256}]
    for kw in runs + runs[::-1]:
        profile = profile_from_architecture(arch, **kw)
        assert [(c.to_dict(), c.extra) for c in profile.layers] == _uncached(arch, **kw)
        assert len(costs._DEGREES) == 1


class _ReadRecorder:
    """An architecture that records which attributes the cost model reads (and whether any is a method,
    whose own reads it could not see)."""

    def __init__(self, real: Architecture) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str):
        value = getattr(self._real, name)
        self.read.add(name + ("()" if callable(value) else ""))
        return value


def test_the_cache_keys_name_every_field_a_layer_reads() -> None:
    """Each layer kind reads no field of the architecture beyond what its cache key holds
    (``layers`` and ``name`` only label it), over every kind of layer and sampled models: a field
    read but not keyed would let two models share a cost they do not have."""
    import numpy as np

    import pipeline.costs as costs
    from env.scenarios import MODEL_FAMILIES, sample_architecture

    rng = np.random.default_rng(3)
    archs = [ALL_KINDS, replace(ALL_KINDS, mamba_version=1), load_zoo_architecture("tiny-hybrid")]
    archs += [sample_architecture(rng, blocks=8, families=MODEL_FAMILIES) for _ in range(60)]
    mtp = LayerSpec(kind="mtp", mixer="none", ffn="none")
    archs += [replace(ALL_KINDS, layers=(EMBED, LayerSpec(mixer=mixer), mtp, HEAD), num_experts=experts,
                      mamba_version=version)  # an MTP module's block of each mixer, dense and MoE
              for mixer in MIXERS for experts in (0, 4) for version in (1, 2)]
    checked = set()
    for arch in archs:
        for index, layer in enumerate(arch.layers):
            rec = _ReadRecorder(arch)
            costs.layer_work(rec, index, seq_len=128, name="x")  # type: ignore[arg-type]
            read = rec.read - {"layers", "name"}
            if layer.kind == "block":
                keyed = set(costs._block_fields(layer) or ())
            elif layer.kind in ("embedding", "head"):
                keyed = set(costs._EMBED_HEAD_FIELDS)
            elif layer.kind == "mtp":
                keyed = set(costs._mtp_fields(costs._dominant_mixer(arch)) or ())
            else:
                continue  # vision layers are keyed by every size
            assert read <= keyed, f"{layer} reads {sorted(read - keyed)} beyond its cache key"
            checked.add((layer.kind, layer.mixer, layer.ffn))
    assert len(checked) >= 14


def test_sequence_length_default_and_errors() -> None:
    arch = load_zoo_architecture("tiny-hybrid")
    assert profile_from_architecture(arch).seq_len == 128
    assert profile_from_architecture(arch, seq_len=64).seq_len == 64
    with pytest.raises(ConfigError, match="seq_len"):
        profile_from_architecture(arch, seq_len=0)
    broken = Architecture(name="x", model_type="adaptis", hidden_size=64, vocab_size=100, num_attention_heads=4,
                          layers=(EMBED, LayerSpec(mixer="none", ffn="moe"), HEAD))
    with pytest.raises(ConfigError, match="num_experts"):
        architecture_work(broken, seq_len=16)


# ------------------------------------------------------------------------ finer units (issue 15)

@pytest.mark.parametrize("model", ["gemma-small", "deepseek-small", "nemotronh-small", "tiny-hybrid"])
def test_sublayer_units_add_up_to_their_blocks(model: str) -> None:
    from pipeline.zoo import zoo_profile

    whole = zoo_profile(model, seq_len=2048)
    fine = zoo_profile(model, seq_len=2048, granularity="sublayer")
    by_block: dict[str, list] = {}
    for x in fine.layers:
        by_block.setdefault(x.extra.get("block", x.name), []).append(x)
    assert list(by_block) == [x.name for x in whole.layers]
    for layer in whole.layers:
        parts = by_block[layer.name]
        for key in ("f", "b", "w"):
            assert sum(getattr(p, key) for p in parts) == pytest.approx(getattr(layer, key), rel=1e-9)
        assert sum(p.params for p in parts) == layer.params
        assert sum(p.act_bytes for p in parts) == pytest.approx(layer.act_bytes, abs=len(parts))
        # pre-norm blocks: only the hidden state crosses the cut, as between whole blocks
        assert all(p.out_bytes == layer.out_bytes for p in parts)
        if len(parts) == 2:
            assert [p.extra["part"] for p in parts] == ["mixer", "ffn"]
    assert fine.extra["params_total"] == whole.extra["params_total"]


@pytest.mark.parametrize("shards", [2, 4, 7])
def test_head_shards_split_the_tokens_and_share_the_weights(shards: int) -> None:
    from pipeline.zoo import zoo_profile

    whole = zoo_profile("gemma-small", seq_len=4096)
    fine = zoo_profile("gemma-small", seq_len=4096, head_shards=shards)
    head = whole.layers[-1]
    parts = fine.layers[-shards:]
    assert [p.name for p in parts] == [f"head.{j}" for j in range(shards)]
    assert all(p.params == head.params for p in parts)  # every shard holds the whole head
    assert fine.extra["params_total"] == whole.extra["params_total"]  # ... counted once
    assert sum(p.extra["flops_f"] for p in parts) == pytest.approx(head.extra["flops_f"])
    # each shard re-reads the weights: never cheaper than the whole head, a little dearer
    total = sum(p.f + p.b + p.w for p in parts)
    assert head.f + head.b + head.w <= total <= 1.2 * (head.f + head.b + head.w)
    hidden = load_zoo_architecture("gemma-small").hidden_size
    outs = [p.out_bytes for p in parts]
    assert outs[-1] == 0
    for j, out in enumerate(outs[:-1]):  # the remaining tokens' bf16 hidden rows + the fp32 carried loss
        assert out == 2 * hidden * (4096 - 4096 * (j + 1) // shards) + 4
    assert {p.extra["shared_group"] for p in parts} == {"head"}
    assert all(p.extra["grad_sync_bytes"] == 4 * head.params for p in parts)


def test_finer_profile_round_trips_through_json(tmp_path) -> None:
    from pipeline.zoo import zoo_profile

    fine = zoo_profile("tiny-hybrid", granularity="sublayer", head_shards=2)
    fine.save(tmp_path / "p.json")
    back = ModelProfile.load(tmp_path / "p.json")
    assert [x.name for x in back.layers] == [x.name for x in fine.layers]
    assert [x.extra.get("block") for x in back.layers] == [x.extra.get("block") for x in fine.layers]
    assert back.layers[-1].extra["shared_group"] == "head"
