"""Architectures: the layer list of a model, independent of any hardware.

An :class:`Architecture` is what ``pipeline.hf`` builds from a Hugging Face
``config.json``, what ``pipeline.costs`` turns into a profile for a GPU, and what
``executor`` turns into real torch modules. One :class:`LayerSpec` is one
pipeline-partitionable layer: a token mixer (attention, Mamba, ...) followed by a
feed-forward block (dense MLP or MoE), or a special layer (embedding, head, MTP,
vision block).

:func:`refine_architecture` makes the units finer (see docs/cost-model.md, "Granularity"):

* ``granularity="sublayer"`` cuts every block that has both a mixer and an FFN into two units,
  the mixer (``x + mixer(norm(x))``) and the FFN (``x + ffn(norm(x))``). In a pre-norm block the
  residual stream *is* the hidden state after the first residual add, so only that one tensor
  crosses the cut: the mixer unit sends exactly what a whole block sends. (A parallel block,
  GPT-J style, would need both x and the mixer output; no model of ours has one.)
* ``head_shards=k`` cuts the head (final norm + LM head + cross-entropy) into ``k`` units over
  the micro-batch's tokens: shard ``j`` computes the loss of its share of the tokens, passes the
  hidden states of the remaining tokens and the carried partial loss on; every shard holds the
  head's weights, and their gradients are summed across shards after the step, as for tied
  embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["MIXERS", "FFNS", "SPECIAL_KINDS", "GRANULARITIES", "LayerSpec", "Architecture", "refine_architecture",
           "head_shard_tokens"]

#: Token mixers of a layer.
MIXERS = ("attention", "sliding_attention", "mla", "mamba", "linear_attention", "none")
#: Feed-forward blocks of a layer.
FFNS = ("mlp", "moe", "none")
#: Layers that are neither mixer nor FFN: ``embedding`` (token embedding), ``head`` (final norm +
#: LM head + cross-entropy), ``mtp`` (multi-token-prediction module), ``vision`` (ViT block).
SPECIAL_KINDS = ("embedding", "head", "mtp", "vision")
#: Unit sizes a model can be cut into: whole layers, or blocks cut between mixer and FFN.
GRANULARITIES = ("layer", "sublayer")


@dataclass(frozen=True)
class LayerSpec:
    """One layer. ``kind`` is ``"block"`` (mixer + ffn) or one of SPECIAL_KINDS."""

    kind: str = "block"
    mixer: str = "attention"
    ffn: str = "mlp"
    window: int | None = None
    """Sliding-window length for ``sliding_attention``."""
    block: int | None = None
    """For a unit cut from a block (``part`` set): the index of that block among the blocks."""
    part: str | None = None
    """``"mixer"`` or ``"ffn"`` for a unit cut from a block; ``None`` for a whole layer."""
    shard: int = 0
    """For a head cut over tokens: which shard this is (0-based)."""
    shards: int = 1
    """For a head: how many shards it is cut into (1: the whole head)."""

    def __post_init__(self) -> None:
        if self.kind != "block" and self.kind not in SPECIAL_KINDS:
            raise ConfigError(f"unknown layer kind {self.kind!r}; use 'block' or one of {SPECIAL_KINDS}",
                              field="kind")
        if self.mixer not in MIXERS:
            raise ConfigError(f"unknown mixer {self.mixer!r}; use one of {MIXERS}", field="mixer")
        if self.ffn not in FFNS:
            raise ConfigError(f"unknown ffn {self.ffn!r}; use one of {FFNS}", field="ffn")
        if self.part not in (None, "mixer", "ffn"):
            raise ConfigError(f"unknown part {self.part!r}; use 'mixer', 'ffn' or None", field="part")
        if not 0 <= self.shard < self.shards or (self.shards > 1 and self.kind != "head"):
            raise ConfigError(f"shard {self.shard} of {self.shards}: only a head is cut into shards, "
                              "0 <= shard < shards", field="shards")

    @property
    def label(self) -> str:
        """Short name used in profiles: ``attention+moe``, ``mamba``, ``head``..."""
        if self.kind != "block":
            return self.kind
        parts = [p for p in (self.mixer, self.ffn) if p != "none"]
        return "+".join(parts) or "identity"


@dataclass(frozen=True)
class Architecture:
    """Sizes of a model and its layer list (embedding first, head last)."""

    name: str
    model_type: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    intermediate_size: int = 0
    """Dense MLP hidden size."""
    gated_mlp: bool = True
    """SwiGLU-style gated MLP (3 matrices) rather than a plain 2-matrix MLP."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    """Defaults to ``moe_intermediate_size`` per shared expert."""
    # MLA (DeepSeek)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # Mamba-2
    mamba_num_heads: int = 0
    mamba_head_dim: int = 64
    ssm_state_size: int = 128
    mamba_n_groups: int = 1
    mamba_conv_kernel: int = 4
    # Gated DeltaNet-style linear attention
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    # vision
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    vision_num_heads: int = 16
    vision_tokens: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    # Added for the cost model and HF import (issue 3); all optional.
    seq_len: int | None = None
    """Default training sequence length from the config (zoo entries carry one), else None."""
    attn_output_gate: bool = False
    """Attention output gated by a sigmoid of a second query-sized projection (Qwen3-Next)."""
    mamba_version: int = 2
    """1: Mamba-1 selective scan (Jamba), inner size ``mamba_expand * hidden_size``; 2: Mamba-2 SSD,
    inner size ``mamba_num_heads * mamba_head_dim``."""
    mamba_expand: int = 2
    mamba_dt_rank: int | None = None
    """Mamba-1 rank of the dt projection (default ceil(hidden_size / 16))."""
    mamba_chunk_size: int = 256
    """Chunk length of the Mamba-2 SSD algorithm."""
    linear_conv_kernel: int = 4
    linear_chunk_size: int = 64
    """Chunk length of the chunkwise (gated) delta rule."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        for key in ("hidden_size", "vocab_size", "num_attention_heads"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"must be a whole number >= 1, got {value!r}", source=self.name, field=key)
        if not self.layers:
            raise ConfigError("the model has no layers", source=self.name, field="layers")

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_blocks(self) -> int:
        return sum(1 for layer in self.layers if layer.kind == "block")

    def with_layers(self, layers: tuple[LayerSpec, ...]) -> Architecture:
        return replace(self, layers=tuple(layers))


def head_shard_tokens(tokens: int, shard: int, shards: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of a micro-batch's ``tokens`` (flattened) that head shard ``shard``
    of ``shards`` computes the loss of: near-equal contiguous shares."""
    return tokens * shard // shards, tokens * (shard + 1) // shards


#: The finest head cut :func:`refine_architecture` makes: each shard is one more unit for every
#: search to place (a search at 256 shards takes seconds; 100,000 never ends).
MAX_HEAD_SHARDS = 256


def refine_architecture(arch: Architecture, *, granularity: str = "layer", head_shards: int = 1) -> Architecture:
    """``arch`` cut into finer units (see the module docstring); ``("layer", 1)`` returns it unchanged."""
    if granularity not in GRANULARITIES:
        raise ConfigError(f"unknown granularity {granularity!r}; use one of {GRANULARITIES}", field="granularity")
    if isinstance(head_shards, bool) or not isinstance(head_shards, int) or head_shards < 1:
        raise ConfigError(f"must be a whole number >= 1, got {head_shards!r}", field="head_shards")
    if head_shards > MAX_HEAD_SHARDS:
        raise ConfigError(f"at most {MAX_HEAD_SHARDS} head shards (each is a unit every search prices), got "
                          f"{head_shards}; a few (e.g. 4-16) already split the head's time", field="head_shards")
    if granularity == "layer" and head_shards == 1:
        return arch
    units: list[LayerSpec] = []
    block = 0
    for spec in arch.layers:
        if spec.part is not None or spec.shards > 1:
            raise ConfigError("the architecture is already refined; refine the original", source=arch.name,
                              field="layers")
        if spec.kind == "block":
            if granularity == "sublayer" and spec.mixer != "none" and spec.ffn != "none":
                units.append(replace(spec, ffn="none", block=block, part="mixer"))
                units.append(replace(spec, mixer="none", window=None, block=block, part="ffn"))
            else:
                units.append(spec)
            block += 1
        elif spec.kind == "head" and head_shards > 1:
            units.extend(replace(spec, shard=j, shards=head_shards) for j in range(head_shards))
        else:
            units.append(spec)
    return replace(arch, layers=tuple(units),
                   extra={**arch.extra, "granularity": granularity, "head_shards": head_shards})
