"""The model zoo: every entry loads and profiles; the paper's families have the paper's sizes."""

from __future__ import annotations

import argparse

import pytest

from experiments.common import DEFAULT_MODEL, resolve_profile
from pipeline.errors import ConfigError
from pipeline.zoo import ZOO_DIR, list_models, load_zoo_architecture, zoo_config_path, zoo_profile

PAPER_MODEL_SIZES = {  # name: (hidden, blocks)
    "gemma-small": (1536, 32), "gemma-medium": (1536, 64), "gemma-large": (1536, 128),
    "deepseek-small": (2048, 16), "deepseek-medium": (2048, 32), "deepseek-large": (2048, 64),
    "nemotronh-small": (1024, 28), "nemotronh-medium": (1024, 56), "nemotronh-large": (1024, 112),
}


def test_the_zoo_lists_the_papers_models_and_the_controls() -> None:
    assert ZOO_DIR.is_dir()
    assert set(PAPER_MODEL_SIZES) | {"llama-control", "tiny-hybrid"} <= set(list_models())
    assert DEFAULT_MODEL in list_models()


@pytest.mark.parametrize("name", list_models())
def test_every_zoo_model_loads_and_builds_a_profile(name: str) -> None:
    arch = load_zoo_architecture(name)
    assert arch.name == name
    profile = zoo_profile(name)
    assert profile.name == name and profile.num_layers == len(arch.layers)
    assert profile.seq_len == (128 if name == "tiny-hybrid" else 4096)
    assert all(layer.f > 0 and layer.params > 0 for layer in profile.layers)
    assert profile.layers[0].kind == "embedding" and profile.layers[-1].kind == "head"


@pytest.mark.parametrize("name,sizes", PAPER_MODEL_SIZES.items())
def test_paper_families_have_the_papers_sizes(name: str, sizes: tuple[int, int]) -> None:
    arch = load_zoo_architecture(name)
    assert (arch.hidden_size, arch.num_blocks) == sizes
    labels = [layer.label for layer in arch.layers if layer.kind == "block"]
    if name.startswith("gemma"):
        assert arch.vocab_size == 256000 and arch.tie_word_embeddings
    elif name.startswith("deepseek"):
        assert labels[0] == "mla+mlp" and labels[-1] == "mla+moe"  # dense first layers, then MoE
        assert labels.index("mla+moe") >= 1
    else:
        assert {"mamba", "attention", "mlp"} == set(labels)


def test_sequence_length_and_microbatch_override() -> None:
    default = zoo_profile("gemma-small")
    short = zoo_profile("gemma-small", seq_len=2048, microbatch_size=2, gpu="a100")
    assert (short.seq_len, short.microbatch_size, short.extra["gpu"]) == (2048, 2, "a100")
    assert short.layers[0].out_bytes == default.layers[0].out_bytes  # same tokens per micro-batch
    assert zoo_profile("gemma-small", tp=2).layers[1].params < default.layers[1].params


def test_tiny_hybrid_has_every_layer_kind_the_executor_builds() -> None:
    arch = load_zoo_architecture("tiny-hybrid")
    labels = {layer.label for layer in arch.layers}
    assert {"embedding", "attention+mlp", "attention+moe", "mamba", "linear_attention+mlp", "head"} <= labels
    assert arch.num_key_value_heads < arch.num_attention_heads  # GQA
    assert arch.num_shared_experts >= 1 and arch.num_experts_per_tok < arch.num_experts
    assert arch.vocab_size >= 64 * arch.hidden_size and arch.seq_len == 128
    assert len(arch.layers) <= 10


def test_unknown_model_lists_the_zoo() -> None:
    with pytest.raises(ConfigError) as info:
        zoo_config_path("gemma-huge")
    assert info.value.field == "model"
    assert "gemma-small" in str(info.value) and "tiny-hybrid" in str(info.value)
    with pytest.raises(ConfigError):
        zoo_profile("../pyproject")


def test_commands_default_to_the_zoos_default_model() -> None:
    args = argparse.Namespace(profile=None, hf_config=None, model=None, seq_len=None, microbatch_size=1, gpu="h100")
    profile = resolve_profile(args)
    assert profile.name == DEFAULT_MODEL and profile.num_layers == 66
