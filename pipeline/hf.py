"""Hugging Face ``config.json`` -> :class:`~pipeline.arch.Architecture` (local files only, never the network).

Supported ``model_type``: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, qwen3_next, gemma2,
gemma3_text, deepseek_v2, deepseek_v3, nemotron_h, jamba, gpt_oss, and the native ``adaptis`` type
whose config lists its layers explicitly, e.g.::

    {"model_type": "adaptis", "hidden_size": 64, "vocab_size": 8192, "num_attention_heads": 4,
     "intermediate_size": 256, "layers": ["embedding", "attention+mlp", "mamba", "head"]}

A layer entry is ``embedding``, ``head``, ``mtp``, ``vision``, a mixer (``attention``,
``sliding_attention``, ``mla``, ``mamba``, ``linear_attention``), an FFN (``mlp``, ``moe``), or
``mixer+ffn``; or an object ``{"mixer": ..., "ffn": ..., "window": ...}``. Layer patterns follow the
transformers modelling code: DeepSeek's ``first_k_dense_replace``/``moe_layer_freq`` and
``num_nextn_predict_layers`` MTP modules, Nemotron-H's ``hybrid_override_pattern`` (M mamba, *
attention, - MLP, E MoE), Jamba's ``attn_layer_period/offset`` and ``expert_layer_period/offset``,
Qwen3-Next's ``layer_types`` or ``full_attention_interval``, gpt-oss and Gemma's ``layer_types`` or
their sliding/full alternation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.arch import FFNS, MIXERS, SPECIAL_KINDS, Architecture, LayerSpec, refine_architecture
from pipeline.errors import ConfigError

__all__ = ["SUPPORTED_MODEL_TYPES", "load_hf_config", "architecture_from_config", "parse_layer"]

_MISSING = object()
#: Upper limits on sizes that decide how much we allocate: a typo must not exhaust memory.
_MAXIMA = {"num_hidden_layers": 10_000, "num_nextn_predict_layers": 64, "vision_num_hidden_layers": 10_000}


class _Config:
    """A config dict with typed, error-reporting accessors."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def __contains__(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, field=key)

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1, alias: tuple[str, ...] = ()) -> Any:
        for name in (key, *alias):
            if self.raw.get(name) is not None:
                key = name
                break
        else:
            if default is _MISSING:
                raise self.error(key, "missing; this model type needs it (a whole number)")
            return default
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or int(value) != value:
            raise self.error(key, f"expected a whole number, got {value!r}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value!r}")
        if key in _MAXIMA and value > _MAXIMA[key]:
            raise self.error(key, f"{value!r} is more than this tool handles ({_MAXIMA[key]}); check the config")
        return int(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "missing; this model type needs it (a string)")
            return default
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value

    def list(self, key: str, length: int | None = None) -> list[Any]:
        value = self.raw.get(key)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {value!r}")
        if length is not None and len(value) != length:
            raise self.error(key, f"has {len(value)} entries but num_hidden_layers is {length}; make them agree")
        return value


def _common(cfg: _Config, name: str, model_type: str, **overrides: Any) -> dict[str, Any]:
    """Fields every decoder shares: sizes, heads, vocabulary, tying, default sequence length."""
    heads = cfg.int("num_attention_heads")
    fields: dict[str, Any] = {
        "name": name,
        "model_type": model_type,
        "hidden_size": cfg.int("hidden_size"),
        "vocab_size": cfg.int("vocab_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": _kv_heads(cfg, heads),
        "head_dim": cfg.int("head_dim", None),
        "intermediate_size": cfg.int("intermediate_size", 0, minimum=0),
        "tie_word_embeddings": cfg.bool("tie_word_embeddings", False),
        "max_position_embeddings": cfg.int("max_position_embeddings", 4096),
        "seq_len": cfg.int("seq_len", None),
    }
    fields.update(overrides)
    return fields


def _wrap(blocks: list[LayerSpec], *, mtp: int = 0, vision: int = 0) -> tuple[LayerSpec, ...]:
    return (*(LayerSpec(kind="vision", mixer="none", ffn="none") for _ in range(vision)),
            LayerSpec(kind="embedding", mixer="none", ffn="none"), *blocks,
            *(LayerSpec(kind="mtp", mixer="none", ffn="none") for _ in range(mtp)),
            LayerSpec(kind="head", mixer="none", ffn="none"))


_LAYER_TYPE_MIXER = {"full_attention": "attention", "attention": "attention",
                     "sliding_attention": "sliding_attention", "linear_attention": "linear_attention"}


def _mixers(cfg: _Config, n: int, default: Callable[[int], str]) -> list[tuple[str, int | None]]:
    """Per-layer (mixer, window) from ``layer_types`` if present, else from ``default(i)``."""
    if "layer_types" in cfg:
        kinds = []
        for i, entry in enumerate(cfg.list("layer_types", n)):
            if entry not in _LAYER_TYPE_MIXER:
                raise cfg.error("layer_types", f"entry {i} is {entry!r}; expected one of {sorted(_LAYER_TYPE_MIXER)}")
            kinds.append(_LAYER_TYPE_MIXER[entry])
    else:
        kinds = [default(i) for i in range(n)]
    window = cfg.int("sliding_window", None) if "sliding_attention" in kinds else None
    if "sliding_attention" in kinds and window is None:
        raise cfg.error("sliding_window", "missing; sliding-attention layers need a window length")
    return [(kind, window if kind == "sliding_attention" else None) for kind in kinds]


def _moe_fields(cfg: _Config, *, experts: str, topk: str = "num_experts_per_tok",
                size: str = "moe_intermediate_size") -> dict[str, Any]:
    return {"num_experts": cfg.int(experts), "num_experts_per_tok": cfg.int(topk), "moe_intermediate_size":
            cfg.int(size)}


# -------------------------------------------------------------------------------------- model types

def _dense(cfg: _Config, name: str, model_type: str) -> Architecture:
    """llama, mistral, qwen2, qwen3: attention + gated MLP in every layer (Mistral/Qwen2 may slide)."""
    n = cfg.int("num_hidden_layers")
    cfg.int("intermediate_size")

    def default(i: int) -> str:
        if model_type == "mistral" and "sliding_window" in cfg:
            return "sliding_attention"
        if model_type == "qwen2" and cfg.bool("use_sliding_window", False) and "sliding_window" in cfg:
            return "sliding_attention" if i >= cfg.int("max_window_layers", 0, minimum=0) else "attention"
        return "attention"

    blocks = [LayerSpec(mixer=m, ffn="mlp", window=w) for m, w in _mixers(cfg, n, default)]
    return Architecture(**_common(cfg, name, model_type), layers=_wrap(blocks))


def _mixtral(cfg: _Config, name: str, model_type: str) -> Architecture:
    n = cfg.int("num_hidden_layers")
    moe = _moe_fields(cfg, experts="num_local_experts", size="intermediate_size")
    window = cfg.int("sliding_window", None)
    mixer = "sliding_attention" if window else "attention"
    blocks = [LayerSpec(mixer=mixer, ffn="moe", window=window) for _ in range(n)]
    return Architecture(**_common(cfg, name, model_type, intermediate_size=0, **moe), layers=_wrap(blocks))


def _qwen_moe_ffns(cfg: _Config, n: int) -> list[str]:
    """Qwen3-MoE/Next: MoE where ``(i+1) % decoder_sparse_step == 0`` and i is not in ``mlp_only_layers``."""
    step = cfg.int("decoder_sparse_step", 1)
    dense = set(cfg.list("mlp_only_layers")) if "mlp_only_layers" in cfg else set()
    ffns = ["mlp" if i in dense or (i + 1) % step else "moe" for i in range(n)]
    if "mlp" in ffns:
        cfg.int("intermediate_size")
    return ffns


def _qwen3_moe(cfg: _Config, name: str, model_type: str) -> Architecture:
    n = cfg.int("num_hidden_layers")
    moe = _moe_fields(cfg, experts="num_experts")
    ffns = _qwen_moe_ffns(cfg, n)
    blocks = [LayerSpec(mixer=m, ffn=f, window=w) for (m, w), f in zip(_mixers(cfg, n, lambda i: "attention"), ffns)]
    return Architecture(**_common(cfg, name, model_type, **moe), layers=_wrap(blocks))


def _qwen2_moe(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Qwen3-MoE's layout (attention, MoE every ``decoder_sparse_step``) plus one gated shared expert
    of ``shared_expert_intermediate_size`` in every MoE layer."""
    arch = _qwen3_moe(cfg, name, model_type)
    shared = cfg.int("shared_expert_intermediate_size", 0, minimum=0)
    return replace(arch, num_shared_experts=1 if shared else 0, shared_expert_intermediate_size=shared or None)


def _qwen3_next(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Gated DeltaNet layers with a full (output-gated) attention layer every ``full_attention_interval``."""
    n = cfg.int("num_hidden_layers")
    interval = cfg.int("full_attention_interval", None) if "layer_types" not in cfg else None
    if "layer_types" not in cfg and interval is None:
        raise cfg.error("full_attention_interval", "missing; give it or 'layer_types' to place the full-attention "
                        "layers")
    mixers = _mixers(cfg, n, lambda i: "attention" if (i + 1) % interval == 0 else "linear_attention")
    moe = _moe_fields(cfg, experts="num_experts")
    shared = cfg.int("shared_expert_intermediate_size", 0, minimum=0)
    blocks = [LayerSpec(mixer=m, ffn=f, window=w) for (m, w), f in zip(mixers, _qwen_moe_ffns(cfg, n))]
    linear = {}
    if any(m == "linear_attention" for m, _ in mixers):
        linear = {"linear_num_key_heads": cfg.int("linear_num_key_heads"),
                  "linear_num_value_heads": cfg.int("linear_num_value_heads"),
                  "linear_key_head_dim": cfg.int("linear_key_head_dim"),
                  "linear_value_head_dim": cfg.int("linear_value_head_dim"),
                  "linear_conv_kernel": cfg.int("linear_conv_kernel_dim", 4)}
    return Architecture(**_common(cfg, name, model_type, **moe, **linear, num_shared_experts=1 if shared else 0,
                                  shared_expert_intermediate_size=shared or None, attn_output_gate=True),
                        layers=_wrap(blocks))


def _gemma(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Gemma 2 alternates sliding (even layers) and global attention; Gemma 3 puts a global layer every
    ``sliding_window_pattern`` layers. Both tie the (256k) embedding and the LM head."""
    n = cfg.int("num_hidden_layers")
    cfg.int("intermediate_size")
    if model_type == "gemma2":
        def default(i: int) -> str:
            return "sliding_attention" if i % 2 == 0 else "attention"
    else:
        period = cfg.int("sliding_window_pattern", 6)

        def default(i: int) -> str:
            return "attention" if (i + 1) % period == 0 else "sliding_attention"
    blocks = [LayerSpec(mixer=m, ffn="mlp", window=w) for m, w in _mixers(cfg, n, default)]
    return Architecture(**_common(cfg, name, model_type, tie_word_embeddings=cfg.bool("tie_word_embeddings", True),
                                  head_dim=cfg.int("head_dim", 256)), layers=_wrap(blocks))


def _deepseek(cfg: _Config, name: str, model_type: str) -> Architecture:
    """MLA in every layer; dense MLP in the first ``first_k_dense_replace`` layers, then MoE every
    ``moe_layer_freq``; ``num_nextn_predict_layers`` MTP modules after the last block (V3)."""
    n = cfg.int("num_hidden_layers")
    experts = cfg.int("n_routed_experts", 0, minimum=0)
    first_dense = cfg.int("first_k_dense_replace", 0, minimum=0)
    freq = cfg.int("moe_layer_freq", 1)
    ffns = ["moe" if experts and i >= first_dense and i % freq == 0 else "mlp" for i in range(n)]
    moe: dict[str, Any] = {}
    if "moe" in ffns:
        moe = {"num_experts": experts, "num_experts_per_tok": cfg.int("num_experts_per_tok"),
               "moe_intermediate_size": cfg.int("moe_intermediate_size"),
               "num_shared_experts": cfg.int("n_shared_experts", 0, minimum=0)}
    if "mlp" in ffns:
        cfg.int("intermediate_size")
    mla = {"q_lora_rank": cfg.int("q_lora_rank", None), "kv_lora_rank": cfg.int("kv_lora_rank"),
           "qk_nope_head_dim": cfg.int("qk_nope_head_dim"), "qk_rope_head_dim": cfg.int("qk_rope_head_dim"),
           "v_head_dim": cfg.int("v_head_dim")}
    mtp = cfg.int("num_nextn_predict_layers", 0, minimum=0)
    blocks = [LayerSpec(mixer="mla", ffn=f) for f in ffns]
    return Architecture(**_common(cfg, name, model_type, **moe, **mla), layers=_wrap(blocks, mtp=mtp))


_NEMOTRON_CHARS = {"M": ("mamba", "none"), "*": ("attention", "none"), "-": ("none", "mlp"), "E": ("none", "moe")}


def _nemotron_h(cfg: _Config, name: str, model_type: str) -> Architecture:
    """One layer per character of ``hybrid_override_pattern``: M Mamba-2, * attention, - MLP, E MoE."""
    pattern = cfg.str("hybrid_override_pattern")
    n = cfg.int("num_hidden_layers", len(pattern))
    if len(pattern) != n:
        raise cfg.error("hybrid_override_pattern", f"has {len(pattern)} characters but num_hidden_layers is {n}")
    bad = sorted(set(pattern) - set(_NEMOTRON_CHARS))
    if bad:
        raise cfg.error("hybrid_override_pattern", f"unknown layer characters {bad}; use M, *, - or E")
    blocks = [LayerSpec(mixer=_NEMOTRON_CHARS[c][0], ffn=_NEMOTRON_CHARS[c][1]) for c in pattern]
    fields: dict[str, Any] = {"gated_mlp": cfg.str("mlp_hidden_act", "relu2") not in ("relu2", "relu", "gelu")}
    if "M" in pattern:
        fields.update(mamba_num_heads=cfg.int("mamba_num_heads"), mamba_head_dim=cfg.int("mamba_head_dim"),
                      ssm_state_size=cfg.int("ssm_state_size"), mamba_n_groups=cfg.int("n_groups", 1),
                      mamba_conv_kernel=cfg.int("conv_kernel", 4), mamba_chunk_size=cfg.int("chunk_size", 256))
    if "-" in pattern:
        cfg.int("intermediate_size")
    if "E" in pattern:
        fields.update(_moe_fields(cfg, experts="n_routed_experts"))
        shared = cfg.int("moe_shared_expert_intermediate_size", 0, minimum=0)
        fields.update(num_shared_experts=cfg.int("n_shared_experts", 1 if shared else 0, minimum=0),
                      shared_expert_intermediate_size=shared or None)
    if "*" in pattern:
        fields["head_dim"] = cfg.int("head_dim", None, alias=("attention_head_dim",))
    return Architecture(**_common(cfg, name, model_type, **fields), layers=_wrap(blocks))


def _jamba(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Attention where ``i % attn_layer_period == attn_layer_offset`` (else Mamba-1); MoE where
    ``i % expert_layer_period == expert_layer_offset`` (else a dense MLP of the same size)."""
    n = cfg.int("num_hidden_layers")
    a_period, a_offset = cfg.int("attn_layer_period"), cfg.int("attn_layer_offset", minimum=0)
    e_period, e_offset = cfg.int("expert_layer_period"), cfg.int("expert_layer_offset", minimum=0)
    blocks = [LayerSpec(mixer="attention" if i % a_period == a_offset else "mamba",
                        ffn="moe" if i % e_period == e_offset else "mlp") for i in range(n)]
    experts = cfg.int("num_experts", 1)
    moe = {}
    if experts > 1 and any(b.ffn == "moe" for b in blocks):
        moe = _moe_fields(cfg, experts="num_experts", size="intermediate_size")
    else:
        blocks = [LayerSpec(mixer=b.mixer, ffn="mlp") for b in blocks]
    cfg.int("intermediate_size")
    dt_rank = cfg.raw.get("mamba_dt_rank", "auto")
    hidden = cfg.int("hidden_size")
    if dt_rank == "auto":
        dt_rank = math.ceil(hidden / 16)
    elif isinstance(dt_rank, bool) or not isinstance(dt_rank, int) or dt_rank < 1:
        raise cfg.error("mamba_dt_rank", f"expected a whole number or 'auto', got {dt_rank!r}")
    mamba = {"mamba_version": 1, "mamba_expand": cfg.int("mamba_expand", 2), "mamba_dt_rank": dt_rank,
             "ssm_state_size": cfg.int("mamba_d_state", 16), "mamba_conv_kernel": cfg.int("mamba_d_conv", 4)}
    return Architecture(**_common(cfg, name, model_type, **moe, **mamba), layers=_wrap(blocks))


def _gpt_oss(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Sliding (128-token) and full attention alternating per ``layer_types`` (sliding first); MoE everywhere."""
    n = cfg.int("num_hidden_layers")
    moe = _moe_fields(cfg, experts="num_local_experts", topk="num_experts_per_tok", size="intermediate_size")
    mixers = _mixers(cfg, n, lambda i: "sliding_attention" if i % 2 == 0 else "attention")
    blocks = [LayerSpec(mixer=m, ffn="moe", window=w) for m, w in mixers]
    return Architecture(**_common(cfg, name, model_type, intermediate_size=0, **moe), layers=_wrap(blocks))


def parse_layer(entry: Any, *, source: str = "config", index: int = 0, window: int | None = None) -> LayerSpec:
    """One ``layers`` entry of an ``adaptis`` config: ``"mamba"``, ``"attention+moe"``, ``"head"``, or an object."""
    where = f"layers[{index}]"
    if isinstance(entry, dict):
        unknown = set(entry) - {"kind", "mixer", "ffn", "window"}
        if unknown:
            raise ConfigError(f"{where} has unknown keys {sorted(unknown)}", source=source, field="layers")
        try:
            spec = LayerSpec(kind=entry.get("kind", "block"), mixer=entry.get("mixer", "none"),
                             ffn=entry.get("ffn", "none"), window=entry.get("window", window))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}", source=source, field="layers") from None
    elif isinstance(entry, str):
        if entry in SPECIAL_KINDS:
            return LayerSpec(kind=entry, mixer="none", ffn="none")
        parts = entry.split("+")
        mixer = next((p for p in parts if p in MIXERS), "none")
        ffn = next((p for p in parts if p in FFNS), "none")
        if len(parts) > 2 or any(p not in MIXERS and p not in FFNS for p in parts) or (len(parts) == 2 and (
                parts[0] not in MIXERS or parts[1] not in FFNS)):
            raise ConfigError(f"{where} is {entry!r}; use one of {SPECIAL_KINDS}, a mixer {MIXERS[:-1]}, an ffn "
                              f"{FFNS[:-1]}, or 'mixer+ffn'", source=source, field="layers")
        spec = LayerSpec(kind="block", mixer=mixer, ffn=ffn, window=window if mixer == "sliding_attention" else None)
    else:
        raise ConfigError(f"{where} must be a string or an object, got {entry!r}", source=source, field="layers")
    if spec.mixer == "sliding_attention" and not spec.window:
        raise ConfigError(f"{where} is sliding attention without a window", source=source, field="sliding_window")
    return spec


_ADAPTIS_FIELDS = {
    "num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0, "num_shared_experts": 0,
    "shared_expert_intermediate_size": None, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mamba_num_heads": 0, "mamba_head_dim": 64, "ssm_state_size": 128,
    "mamba_n_groups": 1, "mamba_conv_kernel": 4, "mamba_chunk_size": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel": 4, "linear_chunk_size": 64, "vision_hidden_size": 0, "vision_intermediate_size": 0,
    "vision_num_heads": 16, "vision_tokens": 0,
}


def _adaptis(cfg: _Config, name: str, model_type: str) -> Architecture:
    """Native type: the layer list is explicit; the sizes each layer kind needs are checked by kind."""
    window = cfg.int("sliding_window", None)
    entries = cfg.list("layers")
    if not entries:
        raise cfg.error("layers", "is empty; list the layers, e.g. ['embedding', 'attention+mlp', 'head']")
    layers = tuple(parse_layer(e, source=cfg.source, index=i, window=window) for i, e in enumerate(entries))
    fields = {key: (cfg.int(key, default, minimum=0) if default is not None else cfg.int(key, None))
              for key, default in _ADAPTIS_FIELDS.items()}
    fields["gated_mlp"] = cfg.bool("gated_mlp", True)
    need: dict[str, set[str]] = {
        "mlp": {"intermediate_size"},
        "moe": {"num_experts", "num_experts_per_tok", "moe_intermediate_size"},
        "mamba": {"mamba_num_heads"},
        "vision": {"vision_hidden_size", "vision_intermediate_size", "vision_tokens"},
    }
    used = {x for layer in layers for x in (layer.mixer, layer.ffn, layer.kind)}
    if "mtp" in used:
        used.add("moe" if fields["num_experts"] else "mlp")
    for part, keys in need.items():
        if part in used:
            for key in sorted(keys):
                cfg.int(key)  # raises naming the field when missing or zero
    return Architecture(**_common(cfg, name, model_type, **fields), layers=layers)


_BUILDERS: dict[str, Callable[[_Config, str, str], Architecture]] = {
    "llama": _dense, "mistral": _dense, "qwen2": _dense, "qwen3": _dense,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "qwen3_next": _qwen3_next,
    "gemma2": _gemma, "gemma3_text": _gemma,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "gpt_oss": _gpt_oss,
    "adaptis": _adaptis,
}
#: The ``model_type`` values :func:`load_hf_config` understands.
SUPPORTED_MODEL_TYPES = tuple(sorted(_BUILDERS))


def architecture_from_config(raw: dict[str, Any], *, source: str = "config", name: str | None = None,
                             granularity: str = "layer", head_shards: int = 1) -> Architecture:
    """Build the architecture a parsed ``config.json`` describes, cut into units of ``granularity``
    (``sublayer``: each block as its mixer and its FFN) with the head in ``head_shards`` shards
    (see :func:`pipeline.arch.refine_architecture`)."""
    arch = _architecture(raw, source=source, name=name)
    try:
        return refine_architecture(arch, granularity=granularity, head_shards=head_shards)
    except ConfigError as exc:
        message = str(exc).removeprefix(f"field '{exc.field}': ") if exc.source is None else str(exc)
        raise ConfigError(message, source=source, field=exc.field) from None


def _kv_heads(cfg: Any, heads: int) -> int:
    """``num_key_value_heads`` (default ``heads``): grouped-query attention shares each key/value head
    among an equal group of query heads, so it must divide ``num_attention_heads``."""
    kv = cfg.int("num_key_value_heads", heads)
    if kv and heads % kv:
        raise ConfigError(f"{kv} key/value heads do not divide {heads} attention heads (grouped-query attention "
                          f"needs equal groups); use a divisor of {heads}", source=cfg.source,
                          field="num_key_value_heads")
    return kv


def _architecture(raw: dict[str, Any], *, source: str, name: str | None) -> Architecture:
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a JSON object", source=source)
    cfg = _Config(raw, source)
    model_type = cfg.str("model_type")
    if model_type not in _BUILDERS and isinstance(raw.get("text_config"), dict):
        return _architecture(raw["text_config"], source=f"{source} text_config", name=name)
    if model_type not in _BUILDERS:
        raise cfg.error("model_type", f"unsupported model_type {model_type!r}; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    label = name or (raw.get("name") if isinstance(raw.get("name"), str) else None) or _name_from_source(source)
    try:
        return _BUILDERS[model_type](cfg, label, model_type)
    except ConfigError as exc:
        if exc.source:
            raise
        raise ConfigError(str(exc), source=source, field=exc.field) from None


def _name_from_source(source: str) -> str:
    path = Path(source)
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return path.stem or "model"


def load_hf_config(path: str | Path, *, name: str | None = None, granularity: str = "layer",
                   head_shards: int = 1) -> Architecture:
    """Read a local ``config.json`` (or a folder holding one) and build its :class:`Architecture`
    (units as :func:`architecture_from_config` cuts them)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read file ({exc.strerror}); give the path of a local config.json",
                          source=str(path)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                          source=str(path)) from None
    return architecture_from_config(raw, source=str(path), name=name, granularity=granularity,
                                    head_shards=head_shards)
