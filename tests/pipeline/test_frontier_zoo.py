"""The zoo's frontier models (issue 44): real published configs that load, count their published
parameters, and have their published layer layouts (docs/frontier-zoo.md)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pipeline.costs import count_params
from pipeline.zoo import list_models, load_zoo_architecture, zoo_config_path

#: zoo name: published parameter count (total, unique weights)
PUBLISHED_PARAMS = {
    "llama3.1-405b": 405e9,
    "llama3.1-70b": 70.6e9,
    "deepseek-v3": 671e9 + 11.5e9,  # main model + the MTP module's unique weights (DeepSeek-V3 README_WEIGHTS)
    "qwen3-235b-a22b": 235e9,
    "nemotron-h-56b": 56e9,
    "gemma3-27b": 27e9,  # the language model; the ~0.4B SigLIP vision tower is not modelled
}
#: zoo name: (hidden size, block counts by label)
LAYOUTS = {
    "llama3.1-405b": (16384, {"attention+mlp": 126}),
    "llama3.1-70b": (8192, {"attention+mlp": 80}),
    "deepseek-v3": (7168, {"mla+mlp": 3, "mla+moe": 58}),
    "qwen3-235b-a22b": (4096, {"attention+moe": 94}),
    "nemotron-h-56b": (8192, {"mamba": 54, "attention": 10, "mlp": 54}),
    "gemma3-27b": (5376, {"sliding_attention+mlp": 52, "attention+mlp": 10}),
}
FRONTIER = sorted(PUBLISHED_PARAMS)


def _blocks(name: str) -> list:
    return [layer for layer in load_zoo_architecture(name).layers if layer.kind == "block"]


def test_the_frontier_models_are_in_the_zoo() -> None:
    assert set(FRONTIER) <= set(list_models())


@pytest.mark.parametrize("name", FRONTIER)
def test_frontier_model_loads_with_its_source(name: str) -> None:
    raw = json.loads(zoo_config_path(name).read_text())
    assert "Source" in raw["_comment"] or "source" in raw["_comment"]
    arch = load_zoo_architecture(name)
    assert arch.name == name and arch.seq_len == 4096
    assert arch.layers[0].kind == "embedding" and arch.layers[-1].kind == "head"


@pytest.mark.parametrize("name", FRONTIER)
def test_frontier_parameter_count_matches_the_published_size(name: str) -> None:
    assert count_params(load_zoo_architecture(name)) == pytest.approx(PUBLISHED_PARAMS[name], rel=0.03)


@pytest.mark.parametrize("name", FRONTIER)
def test_frontier_layer_kinds_are_as_published(name: str) -> None:
    arch = load_zoo_architecture(name)
    hidden, counts = LAYOUTS[name]
    assert arch.hidden_size == hidden
    assert Counter(layer.label for layer in _blocks(name)) == counts
    assert sum(layer.kind == "mtp" for layer in arch.layers) == (1 if name == "deepseek-v3" else 0)


def test_llama31_is_dense_gqa_with_untied_128k_vocabulary() -> None:
    for name, heads in (("llama3.1-405b", 128), ("llama3.1-70b", 64)):
        arch = load_zoo_architecture(name)
        assert (arch.num_attention_heads, arch.num_key_value_heads, arch.vocab_size) == (heads, 8, 128256)
        assert not arch.tie_word_embeddings and arch.num_experts == 0


def test_deepseek_v3_is_mla_with_3_dense_layers_then_256_experts_top8_and_a_shared_one() -> None:
    arch = load_zoo_architecture("deepseek-v3")
    labels = [layer.label for layer in _blocks("deepseek-v3")]
    assert labels[:3] == ["mla+mlp"] * 3 and labels[3:] == ["mla+moe"] * 58
    assert (arch.num_experts, arch.num_experts_per_tok, arch.num_shared_experts) == (256, 8, 1)
    assert (arch.q_lora_rank, arch.kv_lora_rank, arch.vocab_size) == (1536, 512, 129280)
    assert arch.layers[-2].kind == "mtp"  # the MTP module sits between the last block and the head
    main = arch.with_layers(tuple(x for x in arch.layers if x.kind != "mtp"))
    assert count_params(main) == pytest.approx(671e9, rel=0.01)


def test_qwen3_moe_has_128_experts_top8_in_every_layer() -> None:
    arch = load_zoo_architecture("qwen3-235b-a22b")
    assert (arch.num_experts, arch.num_experts_per_tok, arch.num_shared_experts) == (128, 8, 0)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.attn_head_dim) == (64, 4, 128)


def test_nemotron_h_follows_its_hybrid_override_pattern() -> None:
    raw = json.loads(zoo_config_path("nemotron-h-56b").read_text())
    pattern = raw["hybrid_override_pattern"]
    assert len(pattern) == 118 == raw["num_hidden_layers"]
    assert Counter(pattern) == {"M": 54, "*": 10, "-": 54}
    symbol = {"mamba": "M", "attention": "*", "mlp": "-"}
    assert "".join(symbol[layer.label] for layer in _blocks("nemotron-h-56b")) == pattern
    arch = load_zoo_architecture("nemotron-h-56b")
    assert not arch.gated_mlp  # squared ReLU, two matrices
    assert (arch.mamba_num_heads, arch.mamba_head_dim, arch.ssm_state_size, arch.mamba_n_groups) == (256, 64, 256, 8)


def test_gemma3_has_5_local_to_1_global_attention_and_a_tied_262k_vocabulary() -> None:
    arch = load_zoo_architecture("gemma3-27b")
    blocks = _blocks("gemma3-27b")
    kinds = "".join("G" if b.mixer == "attention" else "L" for b in blocks)
    assert kinds == ("L" * 5 + "G") * 10 + "LL"  # 62 layers: a global layer after every five local ones
    assert {b.window for b in blocks if b.mixer == "sliding_attention"} == {1024}
    assert arch.vocab_size == 262208 and arch.tie_word_embeddings
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.attn_head_dim) == (32, 16, 128)
