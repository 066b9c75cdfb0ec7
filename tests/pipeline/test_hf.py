"""HF config.json import: every supported model_type, layer patterns, published sizes, clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.arch import Architecture
from pipeline.costs import architecture_work, count_params
from pipeline.errors import ConfigError
from pipeline.hf import SUPPORTED_MODEL_TYPES, architecture_from_config, load_hf_config

# Published configs (the fields the cost model reads), from the models' config.json on the Hugging Face Hub.
LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
                "num_experts_per_tok": 2, "sliding_window": None}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
               "tie_word_embeddings": False}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
                    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "vocab_size": 102400, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                    "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "q_lora_rank": None,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "tie_word_embeddings": False}
QWEN3_NEXT_80B = {"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 151936,
                  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "full_attention_interval": 4, "linear_num_key_heads": 16,
                  "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "linear_conv_kernel_dim": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "tie_word_embeddings": False}
GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18, "tie_word_embeddings": False}
NEMOTRON_H_8B = {"model_type": "nemotron_h", "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 52,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
                 "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                 "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
                 "chunk_size": 128, "mlp_hidden_act": "relu2", "tie_word_embeddings": False}
JAMBA_V01 = {"model_type": "jamba", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 65536, "num_experts": 16,
             "num_experts_per_tok": 2, "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
             "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
             "mamba_dt_rank": 256, "tie_word_embeddings": False}
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
             "sliding_window": 4096}
GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
             "sliding_window": 512, "sliding_window_pattern": 6}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 4096}
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
            "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28}
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "tie_word_embeddings": False}
ADAPTIS = {"model_type": "adaptis", "hidden_size": 64, "vocab_size": 8192, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 256, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 128, "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16,
           "layers": ["embedding", "attention+mlp", "attention+moe", "mamba", "linear_attention+mlp", "head"]}

# Qwen1.5-MoE-A2.7B's config.json (its shared expert: shared_expert_intermediate_size)
QWEN15_MOE_A27B = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                   "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
                   "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "vocab_size": 151936, "decoder_sparse_step": 1,
                   "max_position_embeddings": 8192, "tie_word_embeddings": False}

EXAMPLES: dict[str, dict[str, Any]] = {
    "llama": LLAMA3_8B, "mistral": MISTRAL_7B, "mixtral": MIXTRAL_8X7B, "qwen2": QWEN2_7B, "qwen3": QWEN3_8B,
    "qwen2_moe": QWEN15_MOE_A27B, "qwen3_moe": QWEN3_30B_A3B, "qwen3_next": QWEN3_NEXT_80B, "gemma2": GEMMA2_9B,
    "gemma3_text": GEMMA3_1B,
    "deepseek_v2": DEEPSEEK_V2_LITE, "deepseek_v3": DEEPSEEK_V3, "nemotron_h": NEMOTRON_H_8B, "jamba": JAMBA_V01,
    "gpt_oss": GPT_OSS_120B, "adaptis": ADAPTIS,
}


def write(tmp_path: Path, cfg: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def blocks(arch: Architecture) -> list[str]:
    return [layer.label for layer in arch.layers if layer.kind == "block"]


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_supported_model_type_imports_from_a_file(tmp_path: Path, model_type: str) -> None:
    arch = load_hf_config(write(tmp_path, EXAMPLES[model_type]))
    assert arch.model_type == model_type
    assert arch.layers[0].kind == "embedding" and arch.layers[-1].kind == "head"
    assert arch.name == tmp_path.name  # config.json is named after its folder
    assert len(architecture_work(arch, seq_len=8)) == len(arch.layers)


PUBLISHED = [  # (config, published parameter count)
    pytest.param(LLAMA3_8B, 8.03e9, id="llama-3-8b"),
    pytest.param(MIXTRAL_8X7B, 46.7e9, id="mixtral-8x7b"),
    pytest.param(QWEN3_30B_A3B, 30.5e9, id="qwen3-30b-a3b"),
    pytest.param(GPT_OSS_120B, 116.8e9, id="gpt-oss-120b"),
    pytest.param(NEMOTRON_H_8B, 8.0e9, id="nemotron-h-8b"),
    pytest.param(QWEN3_NEXT_80B, 80e9, id="qwen3-next-80b-a3b"),
    pytest.param(JAMBA_V01, 52e9, id="jamba-v0.1"),
    pytest.param(GEMMA2_9B, 9.24e9, id="gemma-2-9b"),
    pytest.param(DEEPSEEK_V2_LITE, 15.7e9, id="deepseek-v2-lite"),
]


@pytest.mark.parametrize("cfg,published", PUBLISHED)
def test_parameter_counts_match_published_sizes(tmp_path: Path, cfg: dict[str, Any], published: float) -> None:
    arch = load_hf_config(write(tmp_path, cfg))
    assert count_params(arch) == pytest.approx(published, rel=0.03)


def test_deepseek_v3_main_model_and_mtp_module(tmp_path: Path) -> None:
    arch = load_hf_config(write(tmp_path, DEEPSEEK_V3))
    works = architecture_work(arch, seq_len=1)
    main = sum(w.unique_params for w in works if w.kind != "mtp")
    mtp = [w for w in works if w.kind == "mtp"]
    assert main == pytest.approx(671e9, rel=0.03)
    assert len(mtp) == 1 and arch.layers[-2].kind == "mtp"
    # the checkpoint's MTP module (14B) includes its copies of the embedding and output head
    assert mtp[0].params == pytest.approx(14e9, rel=0.05)
    assert main + mtp[0].params == pytest.approx(685e9, rel=0.03)
    assert blocks(arch)[:4] == ["mla+mlp"] * 3 + ["mla+moe"]
    assert blocks(arch).count("mla+moe") == 58


def test_layer_patterns() -> None:
    nemotron = architecture_from_config(NEMOTRON_H_8B)
    labels = blocks(nemotron)
    assert labels[:9] == ["mamba", "mlp", "mamba", "mlp", "mamba", "mlp", "mamba", "attention", "mlp"]
    assert (labels.count("mamba"), labels.count("attention"), labels.count("mlp")) == (24, 4, 24)
    assert not nemotron.gated_mlp
    moe_pattern = dict(NEMOTRON_H_8B, hybrid_override_pattern="ME*E", num_hidden_layers=4, n_routed_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024)
    assert blocks(architecture_from_config(moe_pattern)) == ["mamba", "moe", "attention", "moe"]

    jamba = blocks(architecture_from_config(JAMBA_V01))
    assert [i for i, x in enumerate(jamba) if x.startswith("attention")] == [4, 12, 20, 28]
    assert all(x.endswith("moe") == (i % 2 == 1) for i, x in enumerate(jamba))
    assert architecture_from_config(JAMBA_V01).mamba_version == 1

    qnext = blocks(architecture_from_config(QWEN3_NEXT_80B))
    assert qnext[:4] == ["linear_attention+moe"] * 3 + ["attention+moe"] and qnext.count("attention+moe") == 12
    assert architecture_from_config(QWEN3_NEXT_80B).attn_output_gate
    explicit = dict(QWEN3_NEXT_80B, layer_types=["full_attention", "linear_attention"] * 24)
    del explicit["full_attention_interval"]
    assert blocks(architecture_from_config(explicit))[:2] == ["attention+moe", "linear_attention+moe"]

    oss = architecture_from_config(GPT_OSS_120B)
    assert blocks(oss)[:2] == ["sliding_attention+moe", "attention+moe"]
    assert oss.layers[1].window == 128 and oss.layers[2].window is None

    gemma2 = architecture_from_config(GEMMA2_9B)
    assert gemma2.tie_word_embeddings and gemma2.vocab_size == 256000
    assert blocks(gemma2)[:2] == ["sliding_attention+mlp", "attention+mlp"]
    gemma3 = blocks(architecture_from_config(GEMMA3_1B))
    assert [i for i, x in enumerate(gemma3) if x == "attention+mlp"] == [5, 11, 17, 23]

    qwen_moe = dict(QWEN3_30B_A3B, mlp_only_layers=[3], decoder_sparse_step=2)
    assert [x.split("+")[1] for x in blocks(architecture_from_config(qwen_moe))[:6]] == [
        "mlp", "moe", "mlp", "mlp", "mlp", "moe"]
    assert set(blocks(architecture_from_config(MISTRAL_7B))) == {"sliding_attention+mlp"}
    assert set(blocks(architecture_from_config(QWEN2_7B))) == {"attention+mlp"}


def test_tied_embeddings_are_counted_once() -> None:
    tied = architecture_from_config(GEMMA2_9B)
    untied = architecture_from_config(dict(GEMMA2_9B, tie_word_embeddings=False))
    assert count_params(untied) - count_params(tied) == 256000 * 3584
    head = architecture_work(tied, seq_len=1)[-1]
    assert head.params > 256000 * 3584 > head.unique_params  # the head stage still holds its copy


BROKEN = [
    ("llama", "hidden_size"),
    ("mixtral", "num_local_experts"),
    ("qwen3_moe", "moe_intermediate_size"),
    ("deepseek_v3", "kv_lora_rank"),
    ("nemotron_h", "hybrid_override_pattern"),
    ("nemotron_h", "mamba_num_heads"),
    ("jamba", "attn_layer_period"),
    ("gpt_oss", "num_local_experts"),
    ("gemma2", "intermediate_size"),
    ("adaptis", "layers"),
    ("adaptis", "moe_intermediate_size"),
]


@pytest.mark.parametrize("model_type,field", BROKEN)
def test_a_missing_field_is_named(tmp_path: Path, model_type: str, field: str) -> None:
    cfg = copy.deepcopy(EXAMPLES[model_type])
    del cfg[field]
    path = write(tmp_path, cfg)
    with pytest.raises(ConfigError) as info:
        load_hf_config(path)
    assert info.value.field == field
    assert f"field '{field}'" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("cfg,field,message", [
    (dict(QWEN3_NEXT_80B, full_attention_interval=None), "full_attention_interval", "layer_types"),
    (dict(NEMOTRON_H_8B, num_hidden_layers=50), "hybrid_override_pattern", "52 characters"),
    (dict(NEMOTRON_H_8B, hybrid_override_pattern="MX" * 26), "hybrid_override_pattern", "'X'"),
    (dict(GPT_OSS_120B, layer_types=["full_attention"] * 3), "layer_types", "3 entries"),
    (dict(GPT_OSS_120B, sliding_window=None), "sliding_window", "window"),
    (dict(LLAMA3_8B, hidden_size="4096"), "hidden_size", "whole number"),
    (dict(LLAMA3_8B, model_type="bert"), "model_type", "deepseek_v3"),
    (dict(ADAPTIS, layers=["embedding", "attention+banana", "head"]), "layers", "layers[1]"),
    ({"hidden_size": 64}, "model_type", "missing"),
])
def test_broken_configs_fail_clearly(tmp_path: Path, cfg: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_hf_config(write(tmp_path, cfg))
    assert info.value.field == field
    assert message in str(info.value)


def test_unreadable_files_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(bad)


def test_native_layer_entries_and_nested_text_config(tmp_path: Path) -> None:
    cfg = dict(ADAPTIS, sliding_window=32, layers=[
        "embedding", "sliding_attention+mlp", {"mixer": "mla", "ffn": "moe"}, "moe", "mamba", "head"])
    arch = load_hf_config(write(tmp_path, cfg, "native.json"))
    assert arch.name == "native"
    assert [layer.label for layer in arch.layers] == ["embedding", "sliding_attention+mlp", "mla+moe", "moe",
                                                     "mamba", "head"]
    assert arch.layers[1].window == 32
    wrapped = {"model_type": "gemma3", "text_config": dict(GEMMA3_1B)}
    assert architecture_from_config(wrapped).model_type == "gemma3_text"
    assert load_hf_config(write(tmp_path, LLAMA3_8B, "x.json"), name="mine").name == "mine"
