"""GPUSpec.elementwise_traffic: it scales the bytes of a block's element-wise kernels, nothing else."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import ELEMENTWISE, layer_cost, layer_work
from pipeline.hardware import get_gpu


def _gpt(h: int = 2048) -> Architecture:
    specs = (LayerSpec("embedding"), LayerSpec(), LayerSpec("head"))
    return Architecture("gpt", "gpt", h, 32000, specs, num_attention_heads=16, num_key_value_heads=16,
                        intermediate_size=4 * h, gated_mlp=False, seq_len=1024)


def test_a_block_tags_its_norms_residuals_rope_and_activation() -> None:
    work = layer_work(_gpt(), 1, seq_len=1024, microbatch_size=2)
    tagged = [op for op in work.f.ops if op.tag == ELEMENTWISE]
    # two norms, two residual adds, RoPE, the MLP activation
    assert len(tagged) == 6 and all(op.kind == "vector" for op in tagged)
    assert not any(op.tag == ELEMENTWISE for op in work.w.ops)  # W is weight-gradient GEMMs only


def test_the_factor_adds_exactly_the_tagged_bytes_again() -> None:
    gpu = replace(get_gpu("h100"), elementwise_traffic=1.0)
    doubled = replace(gpu, elementwise_traffic=2.0)
    work = layer_work(_gpt(), 1, seq_len=1024, microbatch_size=2)
    base, more = layer_cost(work, gpu), layer_cost(work, doubled)
    # every tagged kernel is memory-bound, so doubling its bytes adds its bandwidth time once more
    extra_f = sum(op.bytes for op in work.f.ops if op.tag == ELEMENTWISE) / gpu.memory_bytes_per_s * 1e3
    extra_i = sum(op.bytes for op in work.i.ops if op.tag == ELEMENTWISE) / gpu.memory_bytes_per_s * 1e3
    assert more.f - base.f == pytest.approx(extra_f, rel=1e-9) and extra_f > 0
    assert more.b - base.b == pytest.approx(extra_i, rel=1e-9) and extra_i > 0
    assert more.w == base.w


@pytest.mark.parametrize("index", [0, 2], ids=["embedding", "head"])
def test_the_embedding_and_the_loss_keep_their_counted_bytes(index: int) -> None:
    gpu = get_gpu("a100")
    work = layer_work(_gpt(), index, seq_len=1024, microbatch_size=2)
    a = layer_cost(work, replace(gpu, elementwise_traffic=1.0))
    b = layer_cost(work, replace(gpu, elementwise_traffic=3.0))
    # the head's final norm is a block-style norm; its logits and loss are exact counts
    if index == 0:
        assert (a.f, a.b, a.w) == (b.f, b.b, b.w)
    else:
        norm_ms = sum(op.bytes for op in work.f.ops if op.tag == ELEMENTWISE) / gpu.memory_bytes_per_s * 1e3
        assert b.f - a.f == pytest.approx(2 * norm_ms, rel=1e-9) and b.w == a.w


def test_only_the_a100_preset_carries_a_fitted_factor() -> None:
    assert get_gpu("a100").elementwise_traffic > 1.0
    for name in ("h100", "h200", "h800", "b200", "cpu"):
        assert get_gpu(name).elementwise_traffic == 1.0
