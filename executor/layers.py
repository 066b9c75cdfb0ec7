"""Real torch layers for every layer kind of :mod:`pipeline.arch`, in plain torch.

One module per pipeline-partitionable layer, each mapping hidden states ``(batch, seq, hidden)``
to hidden states of the same shape, except the ends: :class:`Embedding` maps token ids to hidden
states and :class:`Head` maps hidden states *and labels* to the scalar loss (mean cross-entropy
over the micro-batch's tokens).

The kernels are written for clarity and determinism, not speed: the Mamba-2 mixer and the gated
linear attention use the exact quadratic ("attention-like") form of their scalar-decay recurrence
within chunks of ``chunk`` tokens and carry the state between chunks, which is what the SSD
paper's chunked algorithm does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from pipeline.arch import Architecture, LayerSpec
from pipeline.errors import ConfigError

__all__ = [
    "STAND_IN_KINDS",
    "RMSNorm",
    "Embedding",
    "Attention",
    "MLP",
    "MoE",
    "Mamba2",
    "GatedLinearAttention",
    "Block",
    "Head",
    "HeadShard",
    "build_layer",
]


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Embedding(nn.Module):
    """Token ids ``(batch, seq)`` -> hidden states ``(batch, seq, hidden)``."""

    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)


class Head(nn.Module):
    """Final RMSNorm + LM head + cross-entropy: ``(hidden, labels) -> loss`` (mean over tokens)."""

    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.proj = nn.Linear(hidden, vocab_size, bias=False)
        nn.init.normal_(self.proj.weight, std=0.02)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.norm(x))
        return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


class HeadShard(Head):
    """Shard ``shard`` of ``shards`` of the head, over the micro-batch's tokens (flattened rows).

    Input: the hidden states of the rows not yet consumed (``(batch, seq, hidden)`` for the first
    shard, ``(rows, hidden)`` after it) and, after the first shard, the carried loss. It computes
    the cross-entropy of its rows ``pipeline.arch.head_shard_tokens`` (summed, over the micro-batch's
    token count, so the shards' partial losses add up to the mean), adds it to the carried loss and
    returns ``(remaining rows, carried loss)``, or the total loss if it is the last shard. Every
    shard holds the head's weights (the executor sums their gradients after the step)."""

    def __init__(self, vocab_size: int, hidden: int, *, shard: int, shards: int) -> None:
        super().__init__(vocab_size, hidden)
        self.shard, self.shards = shard, shards

    def forward(self, x: torch.Tensor, labels: torch.Tensor,  # type: ignore[override]
                carried: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from pipeline.arch import head_shard_tokens

        flat_labels = labels.flatten()
        total = flat_labels.numel()
        start, end = head_shard_tokens(total, self.shard, self.shards)
        rows = x.reshape(-1, x.shape[-1])
        own, rest = rows[:end - start], rows[end - start:]
        logits = self.proj(self.norm(own))
        part = F.cross_entropy(logits.float(), flat_labels[start:end], reduction="sum") / total
        loss = part if carried is None else carried + part
        # a copy: the pipeline runtime detaches stage outputs in place, which a view forbids
        return loss if self.shard == self.shards - 1 else (rest.clone(), loss)


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on ``(batch, heads, seq, dim)`` (``dim`` even)."""
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([out, x[..., 2 * half:]], dim=-1) if dim % 2 else out


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE; optional sliding window and MLA-style low-rank KV."""

    def __init__(self, hidden: int, heads: int, *, kv_heads: int, head_dim: int, window: int | None = None,
                 kv_rank: int | None = None) -> None:
        super().__init__()
        if heads % kv_heads:
            raise ConfigError(f"{heads} attention heads are not a multiple of {kv_heads} KV heads",
                              field="num_key_value_heads")
        self.heads, self.kv_heads, self.head_dim, self.window = heads, kv_heads, head_dim, window
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        kv_out = 2 * kv_heads * head_dim
        if kv_rank:
            self.kv = nn.Sequential(nn.Linear(hidden, kv_rank, bias=False), RMSNorm(kv_rank),
                                    nn.Linear(kv_rank, kv_out, bias=False))
        else:
            self.kv = nn.Linear(hidden, kv_out, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rope(q), _rope(k)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.window is not None and self.window < s:
            idx = torch.arange(s, device=x.device)
            dist_ = idx[:, None] - idx[None, :]
            mask = (dist_ >= 0) & (dist_ < self.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU (``gated``) or GELU feed-forward block."""

    def __init__(self, hidden: int, inner: int, *, gated: bool = True) -> None:
        super().__init__()
        self.gated = gated
        self.up = nn.Linear(hidden, inner * (2 if gated else 1), bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x)))


class MoE(nn.Module):
    """Softmax router, top-k routed SwiGLU experts (weights renormalised) and shared experts."""

    def __init__(self, hidden: int, experts: int, *, top_k: int, inner: int, shared: int = 0,
                 shared_inner: int | None = None) -> None:
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ConfigError(f"top-k {top_k} must be within 1..{experts} experts", field="num_experts_per_tok")
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, inner) for _ in range(experts))
        self.shared = MLP(hidden, (shared_inner or inner) * shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = self.router(flat).softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                # keep every expert in the autograd graph so each parameter gets a gradient
                out = out + 0.0 * expert(flat[:1]).sum()
                continue
            out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(shape)


def _decay_mix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
               chunk: int) -> torch.Tensor:
    """Causal scalar-decay linear recurrence, chunked.

    ``S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T`` and ``y_t = q_t S_t`` per head, for
    ``q, k: (b, h, s, dk)``, ``v: (b, h, s, dv)``, ``log_decay: (b, h, s)`` (<= 0). Within a
    chunk the quadratic form ``y = (L * q k^T) v`` is exact; the state crosses chunk boundaries.
    """
    b, h, s, dk = k.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dk, dv)
    outs = []
    for c0 in range(0, s, chunk):
        qc, kc, vc = q[:, :, c0:c0 + chunk], k[:, :, c0:c0 + chunk], v[:, :, c0:c0 + chunk]
        cum = log_decay[:, :, c0:c0 + chunk].cumsum(-1)  # (b, h, c)
        n = cum.shape[-1]
        diff = cum[..., :, None] - cum[..., None, :]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp(diff.masked_fill(~causal, float("-inf")))
        y = (qc @ kc.transpose(-1, -2) * decay) @ vc
        y = y + (qc * cum.exp()[..., None]) @ state
        outs.append(y)
        tail = (cum[..., -1:] - cum).exp()[..., None]  # decay from each step to the chunk end
        state = state * cum[..., -1].exp()[..., None, None] + (kc * tail).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2)


class Mamba2(nn.Module):
    """Mamba-2-style selective SSM: gated, causal depthwise conv, scalar-decay SSD per head."""

    def __init__(self, hidden: int, heads: int, *, head_dim: int, state: int, conv: int = 4,
                 chunk: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim, self.state, self.chunk = heads, head_dim, state, chunk
        inner = heads * head_dim
        self.conv_dim = inner + 2 * state
        self.in_proj = nn.Linear(hidden, 2 * inner + 2 * state + heads, bias=False)
        self.conv = nn.Conv1d(self.conv_dim, self.conv_dim, conv, groups=self.conv_dim, padding=conv - 1)
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, heads)))
        self.d = nn.Parameter(torch.ones(heads))
        self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.norm = RMSNorm(inner)
        self.out_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        inner = self.heads * self.head_dim
        z, xbc, dt = self.in_proj(x).split([inner, self.conv_dim, self.heads], dim=-1)
        xbc = F.silu(self.conv(xbc.transpose(1, 2))[..., :s].transpose(1, 2))
        xs, bmat, cmat = xbc.split([inner, self.state, self.state], dim=-1)
        dt = F.softplus(dt + self.dt_bias).transpose(1, 2)  # (b, h, s)
        xs = xs.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # (b, h, s, p)
        kmat = bmat[:, None].expand(b, self.heads, s, self.state) * dt[..., None]
        qmat = cmat[:, None].expand(b, self.heads, s, self.state)
        y = _decay_mix(qmat, kmat, xs, -self.a_log.exp()[None, :, None] * dt, self.chunk)
        y = y + xs * self.d[None, :, None, None]
        y = y.transpose(1, 2).reshape(b, s, inner)
        return self.out_proj(self.norm(y * F.silu(z)))


class GatedLinearAttention(nn.Module):
    """Gated linear attention (a simpler stand-in for Gated DeltaNet): per-head data-dependent
    scalar decay, L2-normalised keys and queries, output gate and norm."""

    def __init__(self, hidden: int, heads: int, *, key_dim: int, value_dim: int, chunk: int = 64) -> None:
        super().__init__()
        self.heads, self.key_dim, self.value_dim, self.chunk = heads, key_dim, value_dim, chunk
        self.qkv = nn.Linear(hidden, heads * (2 * key_dim + value_dim), bias=False)
        self.gate = nn.Linear(hidden, heads, bias=True)
        self.out_gate = nn.Linear(hidden, heads * value_dim, bias=False)
        self.norm = RMSNorm(value_dim)
        self.o = nn.Linear(heads * value_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, self.heads, -1).transpose(1, 2).split(
            [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        log_decay = F.logsigmoid(self.gate(x) + 4.0).transpose(1, 2)  # (b, h, s), decay near 1
        y = self.norm(_decay_mix(q, k, v, log_decay, self.chunk))
        y = y.transpose(1, 2).reshape(b, s, -1) * F.silu(self.out_gate(x))
        return self.o(y)


class Block(nn.Module):
    """Pre-norm residual layer: ``x + mixer(norm(x))`` then ``x + ffn(norm(x))`` (either may be absent)."""

    def __init__(self, hidden: int, mixer: nn.Module | None, ffn: nn.Module | None) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(hidden) if mixer is not None else None
        self.mixer = mixer
        self.ffn_norm = RMSNorm(hidden) if ffn is not None else None
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mixer is not None:
            x = x + self.mixer(self.mixer_norm(x))
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x


def _mixer(arch: Architecture, spec: LayerSpec) -> nn.Module | None:
    h = arch.hidden_size
    if spec.mixer in ("attention", "sliding_attention", "mla"):
        return Attention(h, arch.num_attention_heads, kv_heads=max(1, arch.num_key_value_heads),
                         head_dim=arch.attn_head_dim,
                         window=spec.window if spec.mixer == "sliding_attention" else None,
                         kv_rank=arch.kv_lora_rank if spec.mixer == "mla" else None)
    if spec.mixer == "mamba":
        heads = arch.mamba_num_heads or max(1, 2 * h // arch.mamba_head_dim)
        return Mamba2(h, heads, head_dim=arch.mamba_head_dim, state=arch.ssm_state_size,
                      conv=arch.mamba_conv_kernel)
    if spec.mixer == "linear_attention":
        return GatedLinearAttention(h, arch.linear_num_value_heads, key_dim=arch.linear_key_head_dim,
                                    value_dim=arch.linear_value_head_dim)
    return None


def _ffn(arch: Architecture, spec: LayerSpec) -> nn.Module | None:
    h = arch.hidden_size
    if spec.ffn == "mlp":
        return MLP(h, arch.intermediate_size or 4 * h, gated=arch.gated_mlp)
    if spec.ffn == "moe":
        if arch.num_experts < 1:
            raise ConfigError("a MoE layer needs num_experts >= 1", source=arch.name, field="num_experts")
        return MoE(h, arch.num_experts, top_k=max(1, arch.num_experts_per_tok), inner=arch.moe_intermediate_size or h,
                   shared=arch.num_shared_experts, shared_inner=arch.shared_expert_intermediate_size)
    return None


#: Layer kinds the executor builds as an attention+MLP stand-in (:func:`build_layer`): it runs
#: plans that hold them, but cannot measure them as they are.
STAND_IN_KINDS = ("mtp", "vision")


def build_layer(arch: Architecture, spec: LayerSpec) -> nn.Module:
    """The torch module of one layer. ``mtp`` and ``vision`` layers are built as an attention+MLP
    block at the model's hidden size (a stand-in of similar cost; they are not trained as such)."""
    if spec.kind == "embedding":
        return Embedding(arch.vocab_size, arch.hidden_size)
    if spec.kind == "head":
        if spec.shards > 1:
            return HeadShard(arch.vocab_size, arch.hidden_size, shard=spec.shard, shards=spec.shards)
        return Head(arch.vocab_size, arch.hidden_size)
    if spec.kind in STAND_IN_KINDS:
        spec = LayerSpec(kind="block", mixer="attention", ffn="mlp")
    block = Block(arch.hidden_size, _mixer(arch, spec), _ffn(arch, spec))
    for module in block.modules():  # small init for stable fp32 comparisons
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02 / math.sqrt(2.0))
    return block
