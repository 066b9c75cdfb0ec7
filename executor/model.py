"""Build a torch model (or the stages of a plan) from a :class:`pipeline.arch.Architecture`.

Every layer is initialised from its own seed (``seed`` and its global index), so a rank that
builds only its stages gets exactly the weights the whole model would have. Parameter names
are ``layers.{global index}.…`` in the whole model and in every stage, which makes gradients
comparable name by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from executor.layers import build_layer
from pipeline.arch import Architecture
from pipeline.errors import ConfigError

__all__ = ["scale_architecture", "LayerModel", "StageModule", "build_layers", "build_model", "build_stage",
           "make_batch", "check_architecture", "named_grads", "shared_origin", "canonical_name",
           "tiny_hybrid_architecture", "resolve_architecture", "default_seq_len"]


def _scaled(value: int, factor: float, minimum: int) -> int:
    return max(minimum, int(round(value * factor)))


def scale_architecture(arch: Architecture, scale: float) -> Architecture:
    """A narrower copy of ``arch``: widths and vocabulary times ``scale``; head counts and head
    sizes times ``sqrt(scale)`` each (so their product scales by ``scale``). Depth is kept."""
    if scale == 1.0:
        return arch
    if not 0 < scale <= 1:
        raise ConfigError(f"must be in (0, 1], got {scale}", field="scale")
    root = math.sqrt(scale)
    heads = _scaled(arch.num_attention_heads, root, 1)
    kv = min(heads, _scaled(arch.num_key_value_heads, root, 1))
    while heads % kv:
        kv -= 1
    experts = _scaled(arch.num_experts, root, 1) if arch.num_experts else 0
    return replace(
        arch,
        name=f"{arch.name}@{scale:g}",
        hidden_size=_scaled(arch.hidden_size, scale, 8),
        vocab_size=_scaled(arch.vocab_size, scale, 64),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=_scaled(arch.attn_head_dim, root, 4),
        intermediate_size=_scaled(arch.intermediate_size, scale, 8) if arch.intermediate_size else 0,
        num_experts=experts,
        num_experts_per_tok=min(arch.num_experts_per_tok, experts) if experts else 0,
        moe_intermediate_size=_scaled(arch.moe_intermediate_size, scale, 8) if arch.moe_intermediate_size else 0,
        shared_expert_intermediate_size=(_scaled(arch.shared_expert_intermediate_size, scale, 8)
                                         if arch.shared_expert_intermediate_size else None),
        kv_lora_rank=_scaled(arch.kv_lora_rank, scale, 4),
        mamba_num_heads=_scaled(arch.mamba_num_heads, root, 1) if arch.mamba_num_heads else 0,
        mamba_head_dim=_scaled(arch.mamba_head_dim, root, 4),
        ssm_state_size=_scaled(arch.ssm_state_size, root, 4),
        linear_num_key_heads=_scaled(arch.linear_num_key_heads, root, 1),
        linear_num_value_heads=_scaled(arch.linear_num_value_heads, root, 1),
        linear_key_head_dim=_scaled(arch.linear_key_head_dim, root, 4),
        linear_value_head_dim=_scaled(arch.linear_value_head_dim, root, 4),
    )


def check_architecture(arch: Architecture) -> None:
    """The executor needs the embedding first and the head last (it returns the loss)."""
    kinds = [layer.kind for layer in arch.layers if layer.kind != "head" or layer.shard == 0]
    if kinds[0] != "embedding" or arch.layers[-1].kind != "head" or kinds.count("head") != 1:
        raise ConfigError(f"the executor needs an embedding first and one head last; got {kinds[0]!r} ... "
                          f"{kinds[-1]!r}", source=arch.name, field="layers")


def shared_origin(arch: Architecture, index: int) -> int:
    """The unit whose weights unit ``index`` holds: the first shard for a head shard, else itself."""
    spec = arch.layers[index]
    return index - spec.shard if spec.kind == "head" and spec.shards > 1 else index


def canonical_name(arch: Architecture, name: str) -> str:
    """``layers.{i}.…`` with ``i`` replaced by :func:`shared_origin` (one name per shared weight)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        parts[1] = str(shared_origin(arch, int(parts[1])))
    return ".".join(parts)


def build_layers(arch: Architecture, indices: Iterable[int], *, seed: int = 0) -> dict[int, nn.Module]:
    """Layers ``indices`` of ``arch``, each initialised from ``(seed, index)`` alone (head shards
    from their first shard's index: they hold the same weights)."""
    out: dict[int, nn.Module] = {}
    for i in indices:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + shared_origin(arch, i))
            out[i] = build_layer(arch, arch.layers[i])
    return out


class StageModule(nn.Module):
    """Consecutive layers ``[start, end)``. ``forward(x, labels=None)`` returns hidden states, or
    the loss if the stage holds the head (every stage receives ``labels``; only the head uses them).
    After a head shard that is not the last, the stage passes ``(hidden rows, carried loss)``, so a
    stage may receive two tensors: ``forward(x, carried, labels=...)``. With ``recompute`` the
    stage keeps only its inputs from the forward and re-runs it in the backward
    (``torch.utils.checkpoint``)."""

    def __init__(self, layers: dict[int, nn.Module], *, start: int, end: int, recompute: bool = False) -> None:
        super().__init__()
        self.start, self.end, self.recompute = start, end, recompute
        self.layers = nn.ModuleDict({str(i): layers[i] for i in range(start, end)})

    def forward(self, x: torch.Tensor, *more: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        if len(more) == 1 and labels is None and not more[0].is_floating_point():
            labels, more = more[0], ()  # the positional form forward(tokens, labels)
        if self.recompute and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._run, x, *more, labels=labels, use_reentrant=False)
        return self._run(x, *more, labels=labels)

    def _run(self, x: torch.Tensor, *more: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        from executor.layers import Head, HeadShard

        carried = more[0] if more else None
        for layer in self.layers.values():
            if isinstance(layer, HeadShard):
                out = layer(x, labels, carried)
                x, carried = out if isinstance(out, tuple) else (out, None)
            elif isinstance(layer, Head):
                x = layer(x, labels)
            else:
                x = layer(x)
        return x if carried is None else (x, carried)


class LayerModel(StageModule):
    """The whole model: ``forward(tokens, labels) -> loss``. Head shards share one set of weights
    (the first shard's modules), as the unpipelined model has one head."""

    def __init__(self, arch: Architecture, *, seed: int = 0) -> None:
        check_architecture(arch)
        n = len(arch.layers)
        layers = build_layers(arch, range(n), seed=seed)
        for i in range(n):
            origin = shared_origin(arch, i)
            if origin != i:
                layers[i].norm, layers[i].proj = layers[origin].norm, layers[origin].proj
        super().__init__(layers, start=0, end=n)
        self.arch = arch


def build_model(arch: Architecture, *, seed: int = 0, device: torch.device | str = "cpu") -> LayerModel:
    """The whole model, unpipelined (the reference for gradient checks)."""
    return LayerModel(arch, seed=seed).to(device)


def build_stage(arch: Architecture, start: int, end: int, *, seed: int = 0,
                device: torch.device | str = "cpu", recompute: bool = False) -> StageModule:
    """Layers ``[start, end)`` of ``arch`` with the weights the whole model would have."""
    check_architecture(arch)
    if not 0 <= start < end <= len(arch.layers):
        raise ConfigError(f"stage [{start}, {end}) is outside the model's {len(arch.layers)} layers",
                          source=arch.name, field="partition")
    return StageModule(build_layers(arch, range(start, end), seed=seed), start=start, end=end,
                       recompute=recompute).to(device)


def make_batch(arch: Architecture, *, batch: int, seq_len: int, seed: int = 0,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token labels, ``(batch, seq_len)`` each, from ``seed``."""
    gen = torch.Generator().manual_seed(10_007 + seed)
    tokens = torch.randint(0, arch.vocab_size, (batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def named_grads(modules: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """``{parameter name: gradient}`` over modules (zeros where a parameter got no gradient)."""
    out: dict[str, torch.Tensor] = {}
    for module in modules:
        for name, p in module.named_parameters():
            out[name] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    return out


def tiny_hybrid_architecture() -> Architecture:
    """A small model with every layer kind (used when the zoo has no ``tiny-hybrid``)."""
    from pipeline.arch import LayerSpec

    layers = (
        LayerSpec(kind="embedding"),
        LayerSpec(mixer="attention", ffn="mlp"),
        LayerSpec(mixer="mamba", ffn="none"),
        LayerSpec(mixer="attention", ffn="moe"),
        LayerSpec(mixer="linear_attention", ffn="mlp"),
        LayerSpec(mixer="mamba", ffn="none"),
        LayerSpec(mixer="attention", ffn="moe"),
        LayerSpec(kind="head"),
    )
    return Architecture(
        name="tiny-hybrid", model_type="hybrid", hidden_size=64, vocab_size=8192, layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, num_shared_experts=1,
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, linear_num_key_heads=4,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        max_position_embeddings=128,
    )


def resolve_architecture(name: str, *, scale: float = 1.0, granularity: str = "layer",
                         head_shards: int = 1) -> Architecture:
    """The zoo's architecture ``name`` (``pipeline.zoo``), narrowed by ``scale`` and cut into units
    (:func:`pipeline.arch.refine_architecture`); ``tiny-hybrid`` falls back to
    :func:`tiny_hybrid_architecture` when the zoo is not installed."""
    try:
        from pipeline.zoo import load_zoo_architecture
    except ImportError:
        load_zoo_architecture = None
    if load_zoo_architecture is not None:
        arch = load_zoo_architecture(name)
    elif name == "tiny-hybrid":
        arch = tiny_hybrid_architecture()
    else:
        raise ConfigError(f"unknown model {name!r} (the zoo is not installed; only 'tiny-hybrid' is built in)",
                          field="--model")
    from pipeline.arch import refine_architecture

    return refine_architecture(scale_architecture(arch, scale), granularity=granularity, head_shards=head_shards)


def default_seq_len(arch: Architecture, fallback: int = 128) -> int:
    """The zoo entry's ``seq_len`` when it has one, else ``fallback``."""
    value = arch.extra.get("seq_len") if isinstance(arch.extra, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else fallback
