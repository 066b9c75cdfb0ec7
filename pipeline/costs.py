"""Analytic per-layer costs: FLOPs, bytes, parameters and activations -> a :class:`ModelProfile`.

Over 600 lines: one table of kernels per layer kind (mixers, FFNs, special layers) that reads
best in one place; the layer-kind builders share the private ``_Builder``.

For a micro-batch of ``b`` sequences of ``s`` tokens (``T = b*s``) every layer of an
:class:`~pipeline.arch.Architecture` is broken into kernels (ops) for each of the three passes
F (forward), I (backward for inputs) and W (backward for weights). A matmul ``[T, n] @ [n, m]``
costs ``2*T*n*m`` FLOPs in each pass: its input gradient goes to I, its weight gradient to W.
Attention, SSD and delta-rule cores have no weights: all of their backward is I. Sources:

* dense layer FLOPs: Narayanan et al. 2021 (Megatron-LM, SC'21), ``72*b*s*h^2*(1 + s/(6h) + ...)``
  for F+B, i.e. ``24*b*s*h^2 + 4*b*s^2*h`` forward with a 4h MLP; attention pairs are counted
  in full (``s^2``), the convention of that formula and of MFU accounting;
* activation memory: Korthikanti et al. 2022 ("Reducing Activation Recomputation"), ``s*b*h*(34 +
  5*a*s/h)`` bytes per layer with dropout and without FlashAttention; reproduced exactly with
  ``CostOptions(dropout=True, flash_attention=False)``; FlashAttention (Dao et al. 2022) keeps only
  the output and the log-sum-exp instead of the ``a*s^2`` scores;
* MLA: DeepSeek-V2 (arXiv 2405.04434) section 2.1: low-rank q and joint kv compression, decoupled RoPE key;
* MoE: tokens run through ``top_k`` routed experts plus the shared experts (DeepSeekMoE,
  arXiv 2401.06066); every expert's weights are held and streamed;
* Mamba-2: Dao & Gu 2024 (arXiv 2405.21060) section 6, the chunked SSD algorithm (intra-chunk
  ``Q*P + Q*N/heads_per_group``, state ``2*N*P`` multiply-adds per token and head); Mamba-1:
  Gu & Dao 2023, a memory-bound selective scan of ~9 FLOPs per state element;
* linear attention: Gated DeltaNet (Yang et al. 2024, arXiv 2412.06464), chunkwise WY/UT form
  (``C*(3*dk + 2*dv) + 3*dk*dv`` multiply-adds per token and value head);
* head: final norm, ``h x V`` projection and the cross-entropy as memory traffic in the runtime's
  loss dtype (:class:`CostOptions`, :data:`RUNTIME_COST_OPTIONS`): by default op by op in fp32 as
  Megatron-LM's ``vocab_parallel_cross_entropy`` and PyTorch's ``F.cross_entropy(logits.float())``
  run it, keeping the fp32 softmax, with F's logits as the layer's workspace. A head shard
  (:func:`pipeline.arch.refine_architecture`) does the same over its share of the tokens, holds
  the whole head's weights (a shared copy after the first shard), reads them in each pass and
  sends the remaining tokens' hidden states plus the fp32 partial loss on;
* sub-block units (``part`` mixer / ffn) are the two halves of :func:`_block`, each with its own
  norm and residual add; the mixer unit sends the hidden state after its residual add.

Time of one pass = the sum over its ops of a roofline ``max(FLOPs / rate, bytes / bandwidth)``,
matmul-class ops at the GPU's achievable tensor-core rate (GEMMs times their shape efficiency,
:meth:`pipeline.hardware.GPUSpec.gemm_efficiency`), element-wise ops at its vector rate,
plus a fixed per-kernel overhead and, with tensor parallelism, ring all-reduces over NVLink
(Megatron's two per block and pass). See docs/cost-model.md.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.arch import Architecture, LayerSpec, head_shard_tokens
from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, get_gpu
from pipeline.spec import LayerCost, ModelProfile

__all__ = [
    "BF16",
    "ELEMENTWISE",
    "FP8",
    "FP8_PEAK_RATIO",
    "CostOptions",
    "RUNTIME_COST_OPTIONS",
    "runtime_cost_options",
    "Op",
    "PassWork",
    "LayerWork",
    "layer_work",
    "architecture_work",
    "count_params",
    "layer_cost",
    "profile_from_architecture",
]

BF16 = 2
FP32 = 4
INT64 = 8
DEFAULT_SEQ_LEN = 4096
_LOSS_BYTES = {"fp32": FP32, "bf16": BF16}
#: :attr:`Op.tag` of a block's per-token element-wise kernels (:attr:`GPUSpec.elementwise_traffic`).
ELEMENTWISE = "elementwise"
FP8 = 1
#: Dense FP8 over dense bf16 tensor-core peak by GPU preset: Hopper (H100/H200/H800 data sheets:
#: 1979 vs 989 TFLOPS) and Blackwell (B200: 4.5 vs 2.25 PFLOPS) double it; a GPU not listed (A100)
#: has no FP8 tensor cores.
FP8_PEAK_RATIO = {"h100": 2.0, "h200": 2.0, "h800": 2.0, "b200": 2.0}
#: Bytes per element an FP8 quantization kernel moves: reads bf16, writes FP8 and one fp32 scale per
#: 128 elements (DeepSeek-V3's 1x128 activation tiles, section 3.3.1).
_FP8_QUANT_BYTES = BF16 + FP8 + FP32 / 128


@dataclass(frozen=True)
class CostOptions:
    """Conventions of the analytic model (defaults: Megatron FLOPs, FlashAttention, no dropout)."""

    causal: bool = False
    """Count only the causal half of the attention pairs (FlashAttention skips masked tiles). Off by
    default to match the Megatron FLOPs formula; the matmul efficiency absorbs the difference."""
    flash_attention: bool = True
    """Keep no ``s x s`` scores for backward (FlashAttention); False gives Korthikanti's 5as/h term."""
    dropout: bool = False
    """Keep dropout masks (Korthikanti et al. assume dropout; current LLM pre-training runs without)."""
    attention_backward_factor: float = 2.0
    """Backward/forward FLOPs of an attention core: 2 counts dQ, dK, dV, dP (Megatron); FlashAttention's
    recomputation of the scores makes it 2.5."""
    scan_backward_factor: float = 2.0
    """Backward/forward FLOPs of SSD, selective-scan and delta-rule cores."""
    loss_dtype: str = "fp32"
    """Dtype of the logits the cross-entropy works on: ``"fp32"`` (Megatron-LM and PyTorch cast the bf16
    logits up before the loss) or ``"bf16"`` (Megatron's ``--fp16-lm-cross-entropy``)."""
    fused_cross_entropy: bool = False
    """One fused loss kernel that reads the bf16 logits once and writes their gradient once (Megatron-core
    ``--cross-entropy-loss-fusion``, Liger); False: the op-by-op loss of Megatron's
    ``vocab_parallel_cross_entropy`` / PyTorch's ``F.cross_entropy(logits.float())`` (see :func:`_lm_head`)."""
    main_grad_bytes: int = FP32
    """Bytes per element of the buffer weight gradients accumulate into (Megatron's fp32 ``main_grad``):
    the embedding's dense gradient is added into it each micro-batch."""
    fp8_linear: bool = False
    """FP8 training as DeepSeek-V3 ran it (arXiv 2412.19437, section 3.3): the linear layers of the
    blocks and of the MTP module (attention projections, dense and expert MLPs) run Fprop, Dgrad and
    Wgrad as FP8 GEMMs (:data:`FP8_PEAK_RATIO` times the bf16 rate, same efficiency), each input
    quantized by a memory-bound kernel, and keep their saved inputs (and the routed experts' SwiGLU
    input, section 3.3.3) in FP8; the embedding, the output head, the MoE router, norms and the
    attention core stay bf16/fp32."""

    def __post_init__(self) -> None:
        if self.loss_dtype not in _LOSS_BYTES:
            raise ConfigError(f"unknown {self.loss_dtype!r}; use one of {', '.join(_LOSS_BYTES)}",
                              field="loss_dtype")

    @property
    def loss_bytes(self) -> int:
        return _LOSS_BYTES[self.loss_dtype]


#: What each runtime (:data:`pipeline.runtime.RUNTIMES` names) runs for the kernels that
#: :class:`CostOptions` states, read from its code; a runtime not listed gets ``CostOptions()``.
#:
#: * ``megatron`` (megatron-core 0.16): FlashAttention through Transformer Engine; the loss is
#:   ``vocab_parallel_cross_entropy`` on fp32 logits (``calculate_logits_max`` casts them) unless
#:   ``--cross-entropy-loss-fusion``, which is off by default; fp32 ``main_grad`` buffers.
#: * ``zb`` / ``zb-sync`` (the Zero Bubble fork of Megatron-LM): ``vocab_parallel_cross_entropy(
#:   output.float(), labels)`` unless ``--fp16-lm-cross-entropy``; FlashAttention (its launch
#:   scripts pass ``--use-flash-attn``); fp32 ``main_grad``.
#: * ``pytorch`` (torch.distributed.pipelining: our executor, torchtitan): ``F.cross_entropy(
#:   logits.float(), labels)``; SDPA's flash kernel on a GPU.
RUNTIME_COST_OPTIONS: dict[str, CostOptions] = {}


def runtime_cost_options(runtime: str, **overrides: Any) -> CostOptions:
    """The :class:`CostOptions` of the runtime named ``runtime`` (see
    :data:`RUNTIME_COST_OPTIONS`), with ``overrides`` (what a row or plan states, e.g.
    ``flash_attention=False``) on top."""
    base = RUNTIME_COST_OPTIONS.get(runtime, CostOptions())
    try:
        return replace(base, **overrides)
    except TypeError as exc:
        raise ConfigError(f"{exc}; CostOptions has {', '.join(CostOptions.__dataclass_fields__)}",
                          field="options") from None


@dataclass(frozen=True)
class Op:
    """One kernel: ``kind`` is ``matmul`` (tensor cores), ``vector`` (element-wise) or ``comm`` (all-reduce)."""

    kind: str
    flops: float
    bytes: float
    tag: str = ""
    """``"core"`` for the weight-free attention/SSD/delta-rule cores (what context parallelism's ring
    overlaps its transfers with); ``"elementwise"`` for a block's per-token element-wise kernels
    (norms, residual adds, RoPE, the MLP activation), whose bytes the GPU's
    :attr:`~pipeline.hardware.GPUSpec.elementwise_traffic` scales; empty otherwise."""
    mn: float = 0.0
    """A GEMM's output elements (``m * n``) for its shape efficiency (:meth:`GPUSpec.gemm_efficiency`); 0: none."""
    k: float = 0.0
    """A GEMM's reduction depth; 0: none."""
    fp8: bool = False
    """An FP8 GEMM (:attr:`CostOptions.fp8_linear`): at :data:`FP8_PEAK_RATIO` times the matmul rate."""


def _op(kind: str, flops: float, nbytes: float, *, tag: str = "", mn: float = 0.0, k: float = 0.0,
        fp8: bool = False) -> Op:
    """``Op(kind, flops, nbytes, ...)`` without the frozen constructor's cost (a layer builds dozens;
    ``tests/pipeline/test_costs.py`` checks that both build the same)."""
    op = object.__new__(Op)
    object.__setattr__(op, "__dict__", {"kind": kind, "flops": flops, "bytes": nbytes, "tag": tag, "mn": mn, "k": k,
                                        "fp8": fp8})
    return op


@dataclass
class PassWork:
    """The kernels of one pass (F, I or W) of one layer."""

    ops: list[Op] = field(default_factory=list)

    @property
    def matmul_flops(self) -> float:
        return sum(op.flops for op in self.ops if op.kind == "matmul")

    @property
    def vector_flops(self) -> float:
        return sum(op.flops for op in self.ops if op.kind == "vector")

    @property
    def bytes(self) -> float:
        """HBM traffic (communication excluded)."""
        return sum(op.bytes for op in self.ops if op.kind != "comm")

    @property
    def comm_bytes(self) -> float:
        return sum(op.bytes for op in self.ops if op.kind == "comm")

    def seconds(self, gpu: GPUSpec) -> float:
        """Sum of per-kernel rooflines plus per-kernel overhead and TP communication."""
        latency, link = gpu.nvlink_latency_us * 1e-6, gpu.nvlink_gbps * 1e9  # the GPU's figures, read once
        matmul, vector, memory = gpu.matmul_flops_per_s, gpu.vector_flops_per_s, gpu.memory_bytes_per_s
        overhead, traffic = gpu.kernel_overhead_us * 1e-6, gpu.elementwise_traffic
        total = 0.0
        for op in self.ops:
            if op.kind == "comm":
                total += latency + op.bytes / link
                continue
            if op.kind == "matmul":
                rate = matmul * gpu.gemm_efficiency(op.mn, op.k)
                if op.fp8:
                    rate *= FP8_PEAK_RATIO.get(gpu.name, 1.0)
            else:
                rate = vector
            nbytes = op.bytes * traffic if op.tag == ELEMENTWISE else op.bytes
            total += max(op.flops / rate, nbytes / memory) + overhead
        return total


@dataclass
class LayerWork:
    """Hardware-independent work of one layer for one micro-batch (after tensor parallelism)."""

    name: str
    kind: str
    f: PassWork = field(default_factory=PassWork)
    i: PassWork = field(default_factory=PassWork)
    w: PassWork = field(default_factory=PassWork)
    sharded_params: int = 0
    """Parameters split across tensor-parallel ranks (matrices, embeddings)."""
    replicated_params: int = 0
    """Parameters every tensor-parallel rank holds whole (norms)."""
    shared_params: int = 0
    """Of the above, copies of weights another layer owns (tied LM head, MTP's embedding and head)."""
    act_bytes: float = 0.0
    w_act_bytes: float = 0.0
    """Of ``act_bytes``, what W still needs after I (the inputs of the weight operations)."""
    w_grad_bytes: float = 0.0
    """Gradients at the outputs of the weight operations, which PyTorch's split backward keeps
    from I until W (``stage_backward_input``'s ``param_groups[...]["grads"]``)."""
    workspace_bytes: float = 0.0
    """Peak bytes a pass allocates above what the layer holds after it and frees before the next
    (the head's bf16 logits and fp32 copies in F)."""
    w_workspace_bytes: float = 0.0
    """Bytes the weight pass allocates for a moment once its stage's backward has freed what it frees
    (the embedding's dense gradient, the last gradient a backward computes)."""
    loss_bytes: float = 0.0
    """Of ``act_bytes``, what lies above every weight operation (the loss side of a head), which
    even PyTorch's I frees."""
    out_bytes: float = 0.0
    tp: int = 1
    unit: dict[str, Any] = field(default_factory=dict)
    """Optional profile fields naming where a finer unit comes from (see :func:`layer_work`)."""

    @property
    def params(self) -> int:
        """Parameters held by one tensor-parallel rank."""
        return math.ceil(self.sharded_params / self.tp) + self.replicated_params

    @property
    def unique_params(self) -> int:
        """Parameters this layer adds to the model's count (whole layer, shared copies excluded)."""
        return self.sharded_params + self.replicated_params - self.shared_params


RUNTIME_COST_OPTIONS.update({
    "megatron": CostOptions(flash_attention=True, loss_dtype="fp32", fused_cross_entropy=False),
    "zb": CostOptions(flash_attention=True, loss_dtype="fp32", fused_cross_entropy=False),
    "zb-sync": CostOptions(flash_attention=True, loss_dtype="fp32", fused_cross_entropy=False),
    "pytorch": CostOptions(flash_attention=True, loss_dtype="fp32", fused_cross_entropy=False),
})


class _Builder:
    """Accumulates ops, parameters and saved activations of one layer."""

    def __init__(self, work: LayerWork, tokens: int, tp: int, options: CostOptions, *, cp: int = 1, ep: int = 1,
                 sequence_parallel: bool = False) -> None:
        self.work = work
        self.T = tokens
        self.tp = tp
        self.opt = options
        self.cp = cp
        self.ep = ep
        self.sp = sequence_parallel
        self.fp8 = False
        """Inside an FP8 region (:attr:`CostOptions.fp8_linear`: the blocks and the MTP's projection)."""

    def _div(self, shard: bool) -> int:
        """Sharded work and saved tensors are split ``tp`` ways; with sequence parallelism the
        rest too (norms, residuals, dropout and the inputs of column-parallel matmuls live on
        ``T / tp`` tokens; Korthikanti et al. 2022)."""
        return self.tp if shard or self.sp else 1

    def linear(self, n_in: int, n_out: int, *, tokens: int | None = None, shard: bool = True,
               shared: bool = False, bf16: bool = False) -> None:
        """``y = x @ W`` with ``W: n_in x n_out``: 2*T*n_in*n_out FLOPs in each of F, I (dX) and W (dW);
        in an FP8 region unless ``bf16`` (the router) an FP8 GEMM (:meth:`fp8_quantize`)."""
        t = self.T if tokens is None else tokens
        d = self._div(shard)
        fp8 = self.fp8 and not bf16
        flops = 2.0 * t * n_in * n_out / d
        q = FP8 if fp8 else BF16
        nbytes = (q * (t * n_in + n_in * n_out) + BF16 * t * n_out) / d
        # TP shards the wider side (column-parallel up-projections, row-parallel down-projections)
        a, b = (n_in, n_out / d) if n_out >= n_in else (n_in / d, n_out)
        for p, mn, k in ((self.work.f, t * b, a), (self.work.i, t * a, b), (self.work.w, a * b, t)):
            p.ops.append(_op("matmul", flops, nbytes, mn=mn, k=k, fp8=fp8))
        if fp8:
            self.fp8_quantize(t * n_in / d, t * n_out / d)
        self.params(n_in * n_out, shard=shard, shared=shared)
        self.weight_grad(BF16 * t * n_out, shard=shard)

    def fp8_quantize(self, x: float, dy: float) -> None:
        """The quantization kernels of one FP8 GEMM with ``x`` input and ``dy`` output-gradient
        elements (per rank): F quantizes x, I dy, W both again in the transposed (128x1) tiling
        (DeepSeek-V3 section 3.3.1); weights are quantized once per step, not per micro-batch."""
        for p, n in ((self.work.f, x), (self.work.i, dy), (self.work.w, x + dy)):
            p.ops.append(_op("vector", 3.0 * n, _FP8_QUANT_BYTES * n))

    def params(self, n: int, *, shard: bool = True, shared: bool = False) -> None:
        if shard:
            self.work.sharded_params += int(n)
        else:
            self.work.replicated_params += int(n)
        if shared:
            self.work.shared_params += int(n)

    def core(self, flops: float, io_bytes: float, *, backward_factor: float, shard: bool = True) -> None:
        """A weight-free matmul-class core (attention, SSD, delta rule): all of its backward is I."""
        d = self._div(shard)
        self.work.f.ops.append(_op("matmul", flops / d, io_bytes / d, tag="core"))
        self.work.i.ops.append(_op("matmul", backward_factor * flops / d, 2.0 * io_bytes / d, tag="core"))

    def vector(self, passes: str, nbytes: float, flops: float = 0.0, *, shard: bool = True, tag: str = "") -> None:
        """An element-wise kernel in each pass named in ``passes`` (a subset of ``"fiw"``); ``tag``: the
        :attr:`Op.tag` (:data:`ELEMENTWISE` for a block's per-token element-wise kernels)."""
        d = self._div(shard)
        for name in passes:
            getattr(self.work, name).ops.append(_op("vector", flops / d, nbytes / d, tag=tag))

    def norm(self, dim: int, *, tokens: int | None = None, shard: bool = False) -> None:
        """RMSNorm/LayerNorm: F reads x, writes y; I reads x and dy, writes dx (gamma's grad fused in)."""
        t = self.T if tokens is None else tokens
        self.vector("f", 2 * BF16 * t * dim, 4.0 * t * dim, shard=shard, tag=ELEMENTWISE)
        self.vector("i", 3 * BF16 * t * dim, 8.0 * t * dim, shard=shard, tag=ELEMENTWISE)
        self.params(dim, shard=False)
        self.save(BF16 * t * dim, shard=shard)
        self.weight_grad(BF16 * t * dim, shard=shard)

    def residual(self, dim: int, *, tokens: int | None = None) -> None:
        """``x + f(x)`` forward; the two gradient streams are summed in I."""
        t = self.T if tokens is None else tokens
        self.vector("fi", 3 * BF16 * t * dim, 1.0 * t * dim, shard=False, tag=ELEMENTWISE)

    def save(self, nbytes: float, *, for_w: bool = False, loss: bool = False, shard: bool = True,
             bf16: bool = False, fp8: bool = False) -> None:
        """Activations held from F until backward; ``for_w``: still needed by W after I (a linear
        layer's input: in an FP8 region cached in FP8 unless ``bf16``; ``fp8``: cached in FP8 there
        though not a linear input); ``loss``: saved above every weight operation (the loss side),
        freed even by PyTorch's I."""
        held = nbytes / self._div(shard)
        if (for_w or fp8) and self.fp8 and not bf16:
            held *= FP8 / BF16
        self.work.act_bytes += held
        if for_w:
            self.work.w_act_bytes += held
        if loss:
            self.work.loss_bytes += held

    def weight_grad(self, nbytes: float, *, shard: bool = True) -> None:
        """The gradient at the output of an operation with weights: PyTorch's I keeps it for W."""
        self.work.w_grad_bytes += nbytes / self._div(shard)

    def all_reduce(self, passes: str, nbytes: float) -> None:
        """Ring all-reduce across tensor-parallel ranks: 2*(t-1)/t of the tensor per rank."""
        if self.tp > 1:
            for name in passes:
                getattr(self.work, name).ops.append(_op("comm", 0.0, 2.0 * (self.tp - 1) / self.tp * nbytes))


# --------------------------------------------------------------------------------------------- mixers

def _pairs(s: int, window: int | None, causal: bool, cp: int = 1) -> float:
    """Query-key pairs per sequence and head: ``s*min(s, w)``, or their causal part. With context
    parallelism ``s`` is the rank's share of a sequence of ``cp*s`` tokens: its queries meet every
    key of the sequence (ring attention), and a load-balanced split gives each rank ``1/cp`` of the
    causal pairs."""
    if cp > 1:
        return _pairs(cp * s, window, causal) / cp
    w = s if window is None else min(window, s)
    if not causal:
        return float(s) * w
    return float(w) * s - w * (w - 1) / 2.0


def _attention_core(bld: _Builder, *, batch: int, s: int, heads: int, kv_heads: int, d_qk: int, d_v: int,
                    window: int | None, causal: bool) -> None:
    """Scores ``Q K^T`` and ``P V``: 2*pairs*(d_qk + d_v) FLOPs per head; FlashAttention I/O."""
    pairs = _pairs(s, window, causal, bld.cp)
    flops = 2.0 * batch * heads * pairs * (d_qk + d_v)
    io = BF16 * batch * s * (heads * d_qk + kv_heads * (d_qk + d_v) + heads * d_v) + FP32 * batch * s * heads
    bld.core(flops, io, backward_factor=bld.opt.attention_backward_factor)
    if bld.opt.flash_attention:
        bld.save(FP32 * batch * s * heads)  # log-sum-exp; the output is saved as the out-proj input
    else:
        # materialised scores (Megatron-LM before FlashAttention): QK^T writes them, the fused
        # scale-mask-softmax reads and writes them, PV reads them; backward twice that
        scores = batch * heads * pairs
        bld.vector("f", 4 * BF16 * scores, 5.0 * scores)
        bld.vector("i", 8 * BF16 * scores, 5.0 * scores)
        bld.save(BF16 * scores)  # softmax output (Korthikanti: 2as^2b)
        if bld.opt.dropout:
            bld.save(1 * scores + BF16 * scores)  # dropout mask (as^2b) and output (2as^2b)


def _attention(bld: _Builder, arch: Architecture, spec: LayerSpec, *, batch: int, s: int) -> None:
    """Multi-, grouped- or multi-query attention (``num_key_value_heads`` = heads, fewer, or 1)."""
    h, a, g, d = arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.attn_head_dim
    T = bld.T
    q_dim, kv_dim = a * d, g * d
    gate = q_dim if arch.attn_output_gate else 0
    bld.save(BF16 * T * h, for_w=True, shard=False)  # input of the QKV projection
    bld.linear(h, q_dim + gate + 2 * kv_dim)
    bld.vector("fi", 2 * BF16 * T * (q_dim + kv_dim), 3.0 * T * (q_dim + kv_dim), tag=ELEMENTWISE)  # RoPE on q, k
    bld.save(BF16 * T * (q_dim + 2 * kv_dim))  # q, k, v for the core's backward
    window = spec.window if spec.mixer == "sliding_attention" else None
    _attention_core(bld, batch=batch, s=s, heads=a, kv_heads=g, d_qk=d, d_v=d, window=window,
                    causal=bld.opt.causal)
    if gate:
        bld.vector("fi", 3 * BF16 * T * q_dim, 4.0 * T * q_dim)
        bld.save(BF16 * T * gate)
    bld.save(BF16 * T * q_dim, for_w=True)  # input of the output projection
    bld.linear(q_dim, h)
    bld.all_reduce("fi", BF16 * T * h)


def _mla(bld: _Builder, arch: Architecture, spec: LayerSpec, *, batch: int, s: int) -> None:
    """Multi-head latent attention (DeepSeek-V2 section 2.1)."""
    h, a = arch.hidden_size, arch.num_attention_heads
    T = bld.T
    d_qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    bld.save(BF16 * T * h, for_w=True, shard=False)  # shared input of the q and kv down-projections
    if arch.q_lora_rank:
        bld.linear(h, arch.q_lora_rank, shard=False)
        bld.norm(arch.q_lora_rank)
        bld.save(BF16 * T * arch.q_lora_rank, for_w=True, shard=False)
        bld.linear(arch.q_lora_rank, a * d_qk)
    else:
        bld.linear(h, a * d_qk)
    bld.linear(h, arch.kv_lora_rank + arch.qk_rope_head_dim, shard=False)
    bld.norm(arch.kv_lora_rank)
    bld.save(BF16 * T * arch.kv_lora_rank, for_w=True, shard=False)
    bld.linear(arch.kv_lora_rank, a * (arch.qk_nope_head_dim + arch.v_head_dim))
    bld.vector("fi", 2 * BF16 * T * (a + 1) * arch.qk_rope_head_dim, 3.0 * T * (a + 1) * arch.qk_rope_head_dim)
    bld.save(BF16 * T * a * (2 * d_qk + arch.v_head_dim))
    window = spec.window if spec.mixer == "sliding_attention" else None
    _attention_core(bld, batch=batch, s=s, heads=a, kv_heads=a, d_qk=d_qk, d_v=arch.v_head_dim, window=window,
                    causal=bld.opt.causal)
    bld.save(BF16 * T * a * arch.v_head_dim, for_w=True)
    bld.linear(a * arch.v_head_dim, h)
    bld.all_reduce("fi", BF16 * T * h)


def _mamba2(bld: _Builder, arch: Architecture, *, batch: int, s: int) -> None:
    """Mamba-2 (SSD) mixer: in_proj -> conv1d -> chunked SSD -> gated norm -> out_proj."""
    h, T = arch.hidden_size, bld.T
    H, P, N, G = arch.mamba_num_heads, arch.mamba_head_dim, arch.ssm_state_size, arch.mamba_n_groups
    if H < 1:
        raise ConfigError("must be >= 1 for a mamba layer", source=arch.name, field="mamba_num_heads")
    d_in = H * P
    conv_ch = d_in + 2 * G * N
    in_dim = 2 * d_in + 2 * G * N + H  # z, x, B, C, dt
    bld.save(BF16 * T * h, for_w=True, shard=False)
    bld.linear(h, in_dim)
    k = arch.mamba_conv_kernel
    bld.params(conv_ch * (k + 1) + 3 * H)  # conv weight + bias, A_log, D, dt_bias
    bld.weight_grad(BF16 * T * conv_ch + BF16 * T * d_in)  # at the conv's and the SSD's (A, D, dt_bias) outputs
    bld.vector("fi", 2 * BF16 * T * conv_ch, 2.0 * T * conv_ch * k + 4.0 * T * conv_ch)  # causal conv1d + SiLU
    bld.vector("w", BF16 * T * conv_ch, 2.0 * T * conv_ch * k)  # conv weight gradient
    bld.save(BF16 * T * (in_dim + conv_ch), for_w=True)  # conv input (z, dt too) and output
    q = min(arch.mamba_chunk_size, s)
    macs = H * (q * P + 2 * N * P) + G * q * N
    io = BF16 * T * (2 * d_in + 2 * G * N) + FP32 * T * H
    bld.core(2.0 * T * macs, io, backward_factor=bld.opt.scan_backward_factor)
    bld.norm(d_in, shard=True)  # gated RMSNorm (its input is y)
    bld.vector("fi", 3 * BF16 * T * d_in, 4.0 * T * d_in)  # y * silu(z)
    bld.save(BF16 * T * d_in, for_w=True)
    bld.linear(d_in, h)
    bld.all_reduce("fi", BF16 * T * h)


def _mamba1(bld: _Builder, arch: Architecture) -> None:
    """Mamba-1 mixer (Jamba): in_proj -> conv1d -> x_proj/dt_proj -> selective scan -> out_proj."""
    h, T = arch.hidden_size, bld.T
    d_in = arch.mamba_expand * h
    N = arch.ssm_state_size
    R = arch.mamba_dt_rank or math.ceil(h / 16)
    k = arch.mamba_conv_kernel
    bld.save(BF16 * T * h, for_w=True, shard=False)
    bld.linear(h, 2 * d_in)
    bld.params(d_in * (k + 1) + d_in * N + d_in + d_in)  # conv, A_log, D, dt bias
    bld.weight_grad(2 * BF16 * T * d_in)  # at the conv's and the scan's (A, D, dt bias) outputs
    bld.vector("fi", 2 * BF16 * T * d_in, 2.0 * T * d_in * k + 4.0 * T * d_in)
    bld.vector("w", BF16 * T * d_in, 2.0 * T * d_in * k)
    bld.save(BF16 * T * 3 * d_in, for_w=True)  # x, z and the conv output
    bld.linear(d_in, R + 2 * N)
    bld.save(BF16 * T * R, for_w=True)
    bld.linear(R, d_in)
    scan_flops = 9.0 * T * d_in * N
    scan_bytes = BF16 * T * (4 * d_in + 2 * N)
    bld.vector("f", scan_bytes, scan_flops)
    bld.vector("i", 2 * scan_bytes, bld.opt.scan_backward_factor * scan_flops)
    bld.save(BF16 * T * (2 * d_in + 2 * N))  # delta, B, C
    bld.save(BF16 * T * d_in, for_w=True)
    bld.linear(d_in, h)
    bld.all_reduce("fi", BF16 * T * h)


def _linear_attention(bld: _Builder, arch: Architecture, *, s: int) -> None:
    """Gated DeltaNet mixer (Qwen3-Next): in_proj -> conv1d -> chunkwise gated delta rule -> gated norm."""
    h, T = arch.hidden_size, bld.T
    hk, hv, dk, dv = (arch.linear_num_key_heads, arch.linear_num_value_heads, arch.linear_key_head_dim,
                      arch.linear_value_head_dim)
    key_dim, val_dim = hk * dk, hv * dv
    conv_ch = 2 * key_dim + val_dim
    k = arch.linear_conv_kernel
    bld.save(BF16 * T * h, for_w=True, shard=False)
    bld.linear(h, 2 * key_dim + 2 * val_dim + 2 * hv)  # q, k, v, z, beta, alpha
    bld.params(conv_ch * k + 2 * hv)  # conv, A_log, dt_bias
    bld.weight_grad(BF16 * T * (conv_ch + val_dim))  # at the conv's and the delta rule's (A, dt_bias) outputs
    bld.vector("fi", 2 * BF16 * T * conv_ch, 2.0 * T * conv_ch * k + 4.0 * T * conv_ch)
    bld.vector("w", BF16 * T * conv_ch, 2.0 * T * conv_ch * k)
    bld.save(BF16 * T * (2 * conv_ch + val_dim + 2 * hv), for_w=True)
    c = min(arch.linear_chunk_size, s)
    macs = hv * (c * (3 * dk + 2 * dv) + 3 * dk * dv)
    io = BF16 * T * (2 * hv * dk + 2 * val_dim) + FP32 * T * 2 * hv
    bld.core(2.0 * T * macs, io, backward_factor=bld.opt.scan_backward_factor)
    bld.norm(dv, tokens=T * hv, shard=True)  # per-head gated RMSNorm
    bld.vector("fi", 3 * BF16 * T * val_dim, 4.0 * T * val_dim)
    bld.save(BF16 * T * val_dim, for_w=True)
    bld.linear(val_dim, h)
    bld.all_reduce("fi", BF16 * T * h)


# ----------------------------------------------------------------------------------------------- FFNs

def _mlp_body(bld: _Builder, h: int, f: int, gated: bool, *, tokens: int | None = None) -> None:
    """fc1 (gate+up when gated) -> activation -> fc2; the fc1 input is saved by the caller."""
    t = bld.T if tokens is None else tokens
    width = 2 * f if gated else f
    bld.linear(h, width, tokens=t)
    bld.vector("fi", BF16 * t * (width + f), 8.0 * t * f, tag=ELEMENTWISE)  # SiLU*up / GeLU / ReLU^2
    bld.save(BF16 * t * width)  # activation input (Megatron's fused SwiGLU keeps only this)
    bld.save(BF16 * t * f, for_w=True)  # fc2 input
    bld.linear(f, h, tokens=t)


def _mlp(bld: _Builder, arch: Architecture) -> None:
    h, T = arch.hidden_size, bld.T
    if arch.intermediate_size < 1:
        raise ConfigError("must be >= 1 for a layer with a dense MLP", source=arch.name, field="intermediate_size")
    bld.save(BF16 * T * h, for_w=True, shard=False)
    _mlp_body(bld, h, arch.intermediate_size, arch.gated_mlp)
    bld.all_reduce("fi", BF16 * T * h)


def _moe(bld: _Builder, arch: Architecture) -> None:
    """Router + top-k routed experts + shared experts; FLOPs by active experts, weights by all."""
    h, T = arch.hidden_size, bld.T
    E, k, f = arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size
    for key, value in (("num_experts", E), ("num_experts_per_tok", k), ("moe_intermediate_size", f)):
        if value < 1:
            raise ConfigError("must be >= 1 for a layer with an MoE block", source=arch.name, field=key)
    if k > E:
        raise ConfigError(f"{k} exceeds num_experts {E}", source=arch.name, field="num_experts_per_tok")
    bld.save(BF16 * T * h, for_w=True, shard=False, bf16=True)  # router (bf16) and shared-expert input
    bld.linear(h, E, shard=False, bf16=True)
    bld.vector("fi", FP32 * T * E * 3, 10.0 * T * E, shard=False)  # softmax/sigmoid + top-k in fp32
    bld.save(FP32 * T * E, shard=False)
    routed = T * k
    bld.vector("fi", 2 * BF16 * routed * h + BF16 * T * h)  # permute tokens to their experts
    bld.save(BF16 * routed * h, for_w=True)  # expert fc1 input
    # grouped GEMMs over T*k rows; all E experts' weights are held and read
    width = 2 * f if arch.gated_mlp else f
    d = bld.tp
    held = E // bld.ep  # expert parallelism: each rank holds E / ep experts and runs T*k rows through them
    q = FP8 if bld.fp8 else BF16
    for n_in, n_out in ((h, width), (f, h)):
        flops = 2.0 * routed * n_in * n_out / d
        nbytes = (q * (routed * n_in + held * n_in * n_out) + BF16 * routed * n_out) / d
        # grouped GEMM: every expert's rows together fill the GPU; each weight gradient reduces
        # over only its expert's ~T*k/E rows
        a, b = (n_in, n_out / d) if n_out >= n_in else (n_in / d, n_out)
        shapes = ((bld.work.f, routed * b, a), (bld.work.i, routed * a, b), (bld.work.w, held * a * b, routed / E))
        for p, mn, kk in shapes:
            p.ops.append(_op("matmul", flops, nbytes, mn=mn, k=kk, fp8=bld.fp8))
        if bld.fp8:
            bld.fp8_quantize(routed * n_in / d, routed * n_out / d)
        bld.params(held * n_in * n_out)
        bld.weight_grad(BF16 * routed * n_out)
    bld.vector("fi", BF16 * routed * (width + f), 8.0 * routed * f)
    bld.save(BF16 * routed * width, fp8=True)  # SwiGLU input: FP8 under fp8_linear (DeepSeek-V3 3.3.3)
    bld.save(BF16 * routed * f, for_w=True)
    bld.vector("fi", 2 * BF16 * routed * h + BF16 * T * h, 2.0 * routed * h)  # weighted un-permute
    bld.save(BF16 * routed * h)  # expert outputs, for the routing weights' gradient
    n_shared = arch.num_shared_experts
    if n_shared:
        f_shared = n_shared * (arch.shared_expert_intermediate_size or f)
        _mlp_body(bld, h, f_shared, arch.gated_mlp)
        bld.vector("fi", 3 * BF16 * T * h, 1.0 * T * h, shard=False)
    bld.all_reduce("fi", BF16 * T * h)


# ------------------------------------------------------------------------------------ special layers

def _block(bld: _Builder, arch: Architecture, spec: LayerSpec, *, batch: int, s: int) -> None:
    h = arch.hidden_size
    mixer = spec.mixer
    if mixer != "none":
        bld.norm(h)
        if mixer in ("attention", "sliding_attention"):
            _attention(bld, arch, spec, batch=batch, s=s)
        elif mixer == "mla":
            _mla(bld, arch, spec, batch=batch, s=s)
        elif mixer == "mamba":
            if arch.mamba_version == 1:
                _mamba1(bld, arch)
            else:
                _mamba2(bld, arch, batch=batch, s=s)
        elif mixer == "linear_attention":
            _linear_attention(bld, arch, s=s)
        if bld.opt.dropout:
            bld.save(1 * bld.T * h, shard=False)
        bld.residual(h)
    if spec.ffn != "none":
        bld.norm(h)
        if spec.ffn == "moe":
            _moe(bld, arch)
        else:
            _mlp(bld, arch)
        if bld.opt.dropout:
            bld.save(1 * bld.T * h, shard=False)
        bld.residual(h)


def _embedding(bld: _Builder, arch: Architecture, *, vision_tokens: int) -> None:
    """Token gather (F, memory-bound); W scatter-adds into a dense vocab x h gradient; no I."""
    h, V, T = arch.hidden_size, arch.vocab_size, bld.T
    bld.params(V * h)
    bld.vector("f", INT64 * T + 2 * BF16 * T * h, 1.0 * T * h)
    # the dense bf16 gradient zeroed, then added into the main-grad buffer (read both, write it)
    dense = V * h / bld.tp
    bld.work.w.ops.append(_op("vector", dense, (2 * BF16 + 2 * bld.opt.main_grad_bytes) * dense))
    bld.work.w_workspace_bytes = max(bld.work.w_workspace_bytes, BF16 * dense)
    bld.vector("w", INT64 * T + 3 * BF16 * T * h, 1.0 * T * h)  # scatter-add of the rows
    bld.save(INT64 * T, for_w=True, shard=False)  # token ids
    bld.all_reduce("f", BF16 * T * h)
    if vision_tokens:
        # projector from the vision tower into the language model (a linear over the image tokens)
        bld.save(BF16 * vision_tokens * arch.vision_hidden_size, for_w=True, shard=False)
        bld.linear(arch.vision_hidden_size, h, tokens=vision_tokens)


def _cross_entropy(bld: _Builder, T: int, V: int) -> None:
    """The loss over ``T x V`` bf16 logits, as memory traffic (per vocabulary-parallel rank).

    Fused: F reads the logits once (max, log-sum-exp, target), I reads them and writes the
    gradient; the bf16 logits are kept. Op by op (Megatron's ``vocab_parallel_cross_entropy`` on
    ``logits.float()``; PyTorch's ``F.cross_entropy(logits.float())`` moves the same bytes): F casts
    to the loss dtype (L bytes; read 2, write L), takes the max (read L), subtracts it (read L,
    write L), exponentiates in place (read L, write L), sums (read L) and divides in place (read L,
    write L): ``2 + 9L`` bytes (``8L`` without a cast); I scales the saved softmax by the loss's
    gradient in place (read L, write L) and casts it back (read L, write 2). The softmax is kept
    (L bytes per logit); F's peak also holds the bf16 logits and the pre-subtraction copy,
    ``2 + L`` above it, which the layer's ``workspace_bytes`` carry."""
    n = T * V / bld.tp
    if bld.opt.fused_cross_entropy:
        bld.vector("f", BF16 * n + FP32 * T, 4.0 * n)
        bld.vector("i", 2 * BF16 * n, 4.0 * n)
        bld.save(BF16 * n, loss=True, shard=False)
        return
    L = bld.opt.loss_bytes
    cast = L != BF16
    f_bytes = [L, 2 * L, 2 * L, L, 2 * L] + ([BF16 + L] if cast else [])  # max, sub, exp, sum, div, cast
    for nbytes in f_bytes:
        bld.work.f.ops.append(_op("vector", n, nbytes * n))
    for nbytes in [2 * L] + ([L + BF16] if cast else []):  # scale in place, cast back
        bld.work.i.ops.append(_op("vector", n, nbytes * n))
    bld.save(L * n, loss=True, shard=False)
    bld.work.workspace_bytes = max(bld.work.workspace_bytes, (BF16 + L) * n if cast else BF16 * n)


def _lm_head(bld: _Builder, arch: Architecture, *, shared: bool, tokens: int | None = None) -> None:
    """Final norm + ``h x V`` projection + cross-entropy (over ``tokens``, default all)."""
    h, V = arch.hidden_size, arch.vocab_size
    T = bld.T if tokens is None else tokens
    bld.fp8 = False  # the output head stays bf16 (also after an MTP module's FP8 block)
    bld.norm(h, tokens=T)
    bld.save(BF16 * T * h, for_w=True, shard=False)
    bld.linear(h, V, tokens=T, shared=shared)
    _cross_entropy(bld, T, V)
    bld.all_reduce("f", 3 * FP32 * T)  # vocabulary-parallel max / sum / target logit
    bld.all_reduce("i", BF16 * T * h)


def _head(bld: _Builder, arch: Architecture, spec: LayerSpec) -> int:
    """The head, or one shard of it over its tokens; returns the bytes it sends on."""
    if spec.shards == 1:
        _lm_head(bld, arch, shared=arch.tie_word_embeddings)
        return 0
    start, end = head_shard_tokens(bld.T, spec.shard, spec.shards)
    _lm_head(bld, arch, shared=arch.tie_word_embeddings or spec.shard > 0, tokens=end - start)
    if spec.shard > 0:  # a copy of the first shard's weights (norm included)
        bld.work.shared_params = bld.work.sharded_params + bld.work.replicated_params
    bld.vector("f", FP32 * 3, 1.0, shard=False)  # add the partial loss to the carried one
    if spec.shard == spec.shards - 1:
        return 0
    return BF16 * (bld.T - end) * arch.hidden_size + FP32  # remaining tokens' hidden states + loss


def _dominant_mixer(arch: Architecture) -> str:
    mixers = Counter(layer.mixer for layer in arch.layers if layer.kind == "block" and layer.mixer != "none")
    return mixers.most_common(1)[0][0] if mixers else "attention"


def _mtp(bld: _Builder, arch: Architecture, *, batch: int, s: int) -> None:
    """DeepSeek-V3 multi-token prediction module (arXiv 2412.19437 section 2.2): embed the shifted
    tokens (shared embedding), norm both inputs, project [h; e] -> h, one block, shared head + loss."""
    h, V, T = arch.hidden_size, arch.vocab_size, bld.T
    bld.params(V * h, shared=True)  # copy of the embedding
    bld.vector("f", INT64 * T + 2 * BF16 * T * h)
    bld.vector("w", INT64 * T + 3 * BF16 * T * h)
    bld.norm(h)
    bld.norm(h)
    bld.save(2 * BF16 * T * h, for_w=True, shard=False)
    bld.linear(2 * h, h)
    mixer = _dominant_mixer(arch)
    ffn = "moe" if arch.num_experts > 0 else "mlp"
    _block(bld, arch, LayerSpec(kind="block", mixer=mixer, ffn=ffn), batch=batch, s=s)
    _lm_head(bld, arch, shared=True)


def _vision(bld: _Builder, arch: Architecture, *, batch: int, vision_tokens: int) -> None:
    """Pre-LN ViT block over the image tokens: full (non-causal) MHA + GeLU MLP (Dosovitskiy et al. 2021)."""
    hv, fv, a = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads
    for key, value in (("vision_hidden_size", hv), ("vision_intermediate_size", fv), ("vision_tokens", vision_tokens)):
        if value < 1:
            raise ConfigError("must be >= 1 for a vision layer", source=arch.name, field=key)
    t, n, d = vision_tokens, arch.vision_tokens, hv // a
    bld.norm(hv, tokens=t)
    bld.save(BF16 * t * hv, for_w=True, shard=False)
    bld.linear(hv, 3 * hv, tokens=t)
    bld.save(BF16 * t * 3 * hv)
    _attention_core(bld, batch=batch, s=n, heads=a, kv_heads=a, d_qk=d, d_v=d, window=None, causal=False)
    bld.save(BF16 * t * hv, for_w=True)
    bld.linear(hv, hv, tokens=t)
    bld.all_reduce("fi", BF16 * t * hv)
    bld.residual(hv, tokens=t)
    bld.norm(hv, tokens=t)
    bld.save(BF16 * t * hv, for_w=True, shard=False)
    _mlp_body(bld, hv, fv, False, tokens=t)
    bld.all_reduce("fi", BF16 * t * hv)
    bld.residual(hv, tokens=t)
    bld.params(2 * hv + 3 * hv + hv + fv + hv, shard=False)  # LayerNorm shifts and linear biases


# ------------------------------------------------------------------------------------------ public API

def _layer_names(arch: Architecture) -> list[str]:
    names: list[str] = []
    counts: dict[str, int] = {}  # layers of each kind named so far
    for layer in arch.layers:
        kind = layer.kind
        seen = counts.get(kind, 0)
        if layer.part is not None:  # a unit cut from block ``layer.block``
            names.append(f"layer{layer.block}.{layer.part}")
            counts["block"] = (layer.block or 0) + 1
            continue
        if kind == "head" and layer.shards > 1:
            base = "head" if seen == 0 else f"head{seen}"
            names.append(f"{base}.{layer.shard}")
            counts["head"] = seen + (layer.shard == layer.shards - 1)
            continue
        if kind == "block":
            names.append(f"layer{seen}")
        elif kind == "embedding":
            names.append("embed" if seen == 0 else f"embed{seen}")
        elif kind == "head":
            names.append("head" if seen == 0 else f"head{seen}")
        else:
            names.append(f"{kind}{seen}")
        counts[kind] = seen + 1
    return names


def _check_degrees(arch: Architecture, **degrees: int) -> None:
    for key, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"must be a whole number >= 1, got {value!r}", source=arch.name, field=key)


def layer_work(arch: Architecture, index: int, *, seq_len: int = DEFAULT_SEQ_LEN, microbatch_size: int = 1,
               tp: int = 1, options: CostOptions | None = None, name: str | None = None, cp: int = 1,
               ep: int = 1, sequence_parallel: bool = False) -> LayerWork:
    """FLOPs, bytes, parameters and activations of layer ``index`` of ``arch`` for one micro-batch.

    Whole-job degrees (:mod:`pipeline.parallelism`; all 1 / False by default): ``cp`` context
    parallelism, ``seq_len`` then being the rank's share of a ``cp * seq_len`` sequence (attention
    pairs as ring attention computes them); ``ep`` expert parallelism (each rank holds
    ``num_experts / ep`` experts); ``sequence_parallel`` shards what TP keeps whole by ``tp``."""
    _check_degrees(arch, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, cp=cp, ep=ep)
    spec = arch.layers[index]
    opt = options or CostOptions()
    T = seq_len * microbatch_size
    work = LayerWork(name=name or _layer_names(arch)[index], kind=spec.label, tp=tp)
    bld = _Builder(work, T, tp, opt, cp=cp, ep=ep, sequence_parallel=sequence_parallel)
    bld.fp8 = opt.fp8_linear and spec.kind in ("block", "mtp")
    has_vision = any(layer.kind == "vision" for layer in arch.layers)
    vision_tokens = microbatch_size * arch.vision_tokens if has_vision else 0
    if spec.kind == "embedding":
        _embedding(bld, arch, vision_tokens=vision_tokens)
        work.out_bytes = BF16 * T * arch.hidden_size
    elif spec.kind == "head":
        work.out_bytes = _head(bld, arch, spec)
        if spec.shards > 1:
            # every shard holds the head's weights; their gradients are summed after the step
            work.unit = {"block": work.name.rsplit(".", 1)[0], "shard": spec.shard, "shards": spec.shards,
                         "shared_group": work.name.rsplit(".", 1)[0], "grad_sync_bytes": FP32 * work.params}
    elif spec.kind == "mtp":
        _mtp(bld, arch, batch=microbatch_size, s=seq_len)
        work.out_bytes = BF16 * T * arch.hidden_size
    elif spec.kind == "vision":
        _vision(bld, arch, batch=microbatch_size, vision_tokens=vision_tokens)
        work.out_bytes = BF16 * vision_tokens * arch.vision_hidden_size
    else:
        _block(bld, arch, spec, batch=microbatch_size, s=seq_len)
        work.out_bytes = BF16 * T * arch.hidden_size  # pre-norm: the residual stream is the output
        if spec.part is not None:
            work.unit = {"block": f"layer{spec.block}", "part": spec.part}
    return work


def architecture_work(arch: Architecture, *, seq_len: int = DEFAULT_SEQ_LEN, microbatch_size: int = 1,
                      tp: int = 1, options: CostOptions | None = None, cp: int = 1, ep: int = 1,
                      sequence_parallel: bool = False) -> list[LayerWork]:
    """:func:`layer_work` for every layer, in order."""
    names = _layer_names(arch)
    return [layer_work(arch, i, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, options=options,
                       name=names[i], cp=cp, ep=ep, sequence_parallel=sequence_parallel)
            for i in range(len(arch.layers))]


def count_params(arch: Architecture) -> int:
    """The model's parameter count: every layer's weights once (tied and shared copies excluded)."""
    return sum(work.unique_params for work in architecture_work(arch, seq_len=1))


def layer_cost(work: LayerWork, gpu: str | GPUSpec = "h100") -> LayerCost:
    """Times (ms) of a :class:`LayerWork` on ``gpu``, as the profile's :class:`LayerCost`."""
    spec = get_gpu(gpu)
    extra = {
        "flops_f": work.f.matmul_flops, "flops_b": work.i.matmul_flops, "flops_w": work.w.matmul_flops,
        "bytes_f": work.f.bytes, "bytes_b": work.i.bytes, "bytes_w": work.w.bytes,
    }
    if work.unique_params != work.params:
        extra["unique_params"] = work.unique_params
    if work.workspace_bytes:
        extra["workspace_bytes"] = int(round(work.workspace_bytes))
    if work.w_workspace_bytes:
        extra["w_workspace_bytes"] = int(round(work.w_workspace_bytes))
    extra.update(work.unit)
    act = int(round(work.act_bytes))
    graph = int(round(work.act_bytes - work.loss_bytes + work.w_grad_bytes))
    return LayerCost(
        name=work.name,
        kind=work.kind,
        f=work.f.seconds(spec) * 1e3,
        b=work.i.seconds(spec) * 1e3,
        w=work.w.seconds(spec) * 1e3,
        params=work.params,
        act_bytes=act,
        out_bytes=int(work.out_bytes),
        w_act_bytes=min(act, int(round(work.w_act_bytes))),
        w_graph_bytes=graph,
        extra=extra,
    )


#: ``(degrees' number, sizes, (layer, ...))`` -> ``(LayerCost, unique_params)`` (see :func:`_unit_cost`)
#: of :func:`profile_from_architecture`: an architecture repeats a few layer specs many times, and
#: the environments' scenarios repeat sizes across draws. The least recently used entry goes when full
#: (the default scenario generator's ~18k distinct layers fit: about 40 MiB).
_UNIT_COSTS: dict[tuple, tuple[LayerCost, int]] = {}
_UNIT_COSTS_MAX = 32768
_NOT_SIZES = ("name", "layers", "extra")
#: Fields a block (its mixer and FFN: ``_block``) never reads: blocks of the same sizes cost the
#: same under any vocabulary.
_NOT_BLOCK = (*_NOT_SIZES, "vocab_size", "tie_word_embeddings")
#: The only fields the embedding (``_embedding``) and an LM head or its shard (``_head``) read: they
#: cost the same under any block sizes (a vision tower's projector is keyed by ``has_vision``).
_EMBED_HEAD_FIELDS = ("hidden_size", "vocab_size", "tie_word_embeddings", "vision_hidden_size", "vision_tokens")
#: The fields a block reads, by its mixer and by its FFN (beside ``hidden_size`` and, with a vision
#: tower, ``vision_tokens``): a MoE block costs the same under any dense MLP width, an attention
#: block under any vocabulary or expert count. ``tests/pipeline/test_costs.py`` records what each
#: kind reads and fails on a field missing here.
_MIXER_FIELDS: dict[str, tuple[str, ...]] = {
    "attention": ("attn_head_dim", "attn_output_gate", "num_attention_heads", "num_key_value_heads"),
    "sliding_attention": ("attn_head_dim", "attn_output_gate", "num_attention_heads", "num_key_value_heads"),
    "mla": ("kv_lora_rank", "num_attention_heads", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim"),
    "mamba": ("mamba_chunk_size", "mamba_conv_kernel", "mamba_dt_rank", "mamba_expand", "mamba_head_dim",
              "mamba_n_groups", "mamba_num_heads", "mamba_version", "ssm_state_size"),
    "linear_attention": ("linear_chunk_size", "linear_conv_kernel", "linear_key_head_dim", "linear_num_key_heads",
                         "linear_num_value_heads", "linear_value_head_dim"),
    "none": (),
}
_FFN_FIELDS: dict[str, tuple[str, ...]] = {
    "mlp": ("gated_mlp", "intermediate_size"),
    "moe": ("gated_mlp", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "num_shared_experts",
            "shared_expert_intermediate_size"),
    "none": (),
}


def _block_fields(spec: LayerSpec) -> tuple[str, ...] | None:
    """What a block of ``spec``'s mixer and FFN reads (None: a kind not listed above)."""
    mixer, ffn = _MIXER_FIELDS.get(spec.mixer), _FFN_FIELDS.get(spec.ffn)
    if mixer is None or ffn is None:
        return None
    return ("hidden_size", "vision_tokens", *mixer, *ffn)


def _mtp_fields(mixer: str) -> tuple[str, ...] | None:
    """What an MTP module (``_mtp``) whose block has ``mixer`` reads: its copies of the embedding and
    head read ``hidden_size`` and ``vocab_size``; its block's FFN is a MoE or a dense MLP by
    ``num_experts`` (None: a mixer not listed above)."""
    fields = _MIXER_FIELDS.get(mixer)
    if fields is None:
        return None
    return tuple(dict.fromkeys(("hidden_size", "vision_tokens", "vocab_size", *fields, *_FFN_FIELDS["mlp"],
                                *_FFN_FIELDS["moe"])))


def _sizes(arch: Architecture, skip: tuple[str, ...]) -> tuple:
    """Every field of ``arch`` but ``skip`` (a layer's work reads no more beside its own spec; the
    name only labels errors), with their types (``4096`` and ``4096.0`` are equal keys but not
    equal arithmetic)."""
    values = tuple(getattr(arch, f) for f in arch.__dataclass_fields__ if f not in skip)
    return values + tuple(map(type, values))


def _fields(arch: Architecture, names: tuple[str, ...]) -> tuple:
    """``names``' values of ``arch`` with their types (as :func:`_sizes`)."""
    values = tuple(getattr(arch, f) for f in names)
    return names + values + tuple(map(type, values))


def _renamed(cost: LayerCost, name: str) -> LayerCost:
    """``replace(cost, name=name, extra=dict(cost.extra))`` without the constructor's cost."""
    out = object.__new__(LayerCost)
    d = cost.__dict__.copy()
    d["name"] = name
    d["extra"] = cost.extra.copy()
    object.__setattr__(out, "__dict__", d)
    return out


#: A layer spec's fields as one tuple: what its dataclass ``__eq__`` compares, hashed in C (the
#: spec's own ``__hash__`` is Python code).
_spec_fields = operator.attrgetter(*LayerSpec.__dataclass_fields__)


#: The degrees of the profiles priced lately (``(has_vision, seq_len, microbatch_size, tp, options,
#: gpu)``) -> the number standing for them in :data:`_UNIT_COSTS`' keys, so that a profile hashes
#: and compares its GPU and options once, not once per distinct layer. Numbers are never reused:
#: when full it is emptied, and the entries of the old numbers age out of the cache unread.
_DEGREES: dict[tuple, int] = {}
_DEGREES_MAX = 1024
_DEGREE_NUMBERS = itertools.count()


def _degrees_number(degrees: tuple) -> int:
    """The number of ``degrees`` in :data:`_DEGREES` (a new one for degrees not seen lately)."""
    number = _DEGREES.get(degrees)
    if number is None:
        if len(_DEGREES) >= _DEGREES_MAX:
            _DEGREES.clear()
        number = _DEGREES[degrees] = next(_DEGREE_NUMBERS)
    return number


def _unit_costs(arch: Architecture, *, spec: GPUSpec, seq_len: int, microbatch_size: int, tp: int,
                options: CostOptions) -> tuple[list[LayerCost], list[int]]:
    """``layer_cost(layer_work(...))`` of every layer, and their unique parameters, each computed once
    per distinct input: the layer's spec, the sizes and degrees, whether the model has a vision
    tower, an MTP layer's mixer, a head shard's name (which its unit fields repeat). A spec object
    that recurs (``env.scenarios`` shares them) is looked up once."""
    names = _layer_names(arch)
    degrees = _degrees_number((any(layer.kind == "vision" for layer in arch.layers), seq_len, microbatch_size, tp,
                               options, spec))
    found: dict[tuple, tuple[LayerCost, int]] = {}
    by_object: dict[int, tuple[LayerCost, int]] = {}  # id of a whole-head or unsharded spec -> its unit
    costs, uniques = [], []
    for index, (layer, name) in enumerate(zip(arch.layers, names)):
        hit = by_object.get(id(layer))  # the layers hold their specs: no id is reused meanwhile
        if hit is None:
            key = (type(layer), _spec_fields(layer), type(layer.window),
                   _dominant_mixer(arch) if layer.kind == "mtp" else None, name if layer.shards > 1 else None)
            hit = found.get(key)
            if hit is None:
                hit = found[key] = _unit_cost(arch, index, key, degrees, name=name, spec=spec, seq_len=seq_len,
                                              microbatch_size=microbatch_size, tp=tp, options=options)
            if layer.shards == 1:  # a head shard's key holds its name: the same spec is another unit
                by_object[id(layer)] = hit
        costs.append(_renamed(hit[0], name))
        uniques.append(hit[1])
    return costs, uniques


def _unit_cost(arch: Architecture, index: int, key: tuple, degrees: int, *, name: str, spec: GPUSpec, seq_len: int,
               microbatch_size: int, tp: int, options: CostOptions) -> tuple[LayerCost, int]:
    """Layer ``index``'s ``(LayerCost, unique params)`` from :data:`_UNIT_COSTS` (``key``: its
    key in :func:`_unit_costs`; ``degrees``: its degrees' number), priced on a miss."""
    layer = arch.layers[index]
    if layer.kind == "block":
        fields = _block_fields(layer)
        sizes = _sizes(arch, _NOT_BLOCK) if fields is None else _fields(arch, fields)
    elif layer.kind in ("embedding", "head"):
        sizes = _fields(arch, _EMBED_HEAD_FIELDS)
    elif layer.kind == "mtp" and (fields := _mtp_fields(key[3])) is not None:  # key[3]: the block's mixer
        sizes = _fields(arch, fields)
    else:
        sizes = _sizes(arch, _NOT_SIZES)
    full = (degrees, sizes, key)
    hit = _UNIT_COSTS.pop(full, None)
    if hit is None:
        work = layer_work(arch, index, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, options=options,
                          name=name)
        hit = (layer_cost(work, spec), work.unique_params)
        if len(_UNIT_COSTS) >= _UNIT_COSTS_MAX:  # the least recently used goes
            del _UNIT_COSTS[next(iter(_UNIT_COSTS))]
    _UNIT_COSTS[full] = hit  # (re)inserted last: dicts keep insertion order
    return hit


def profile_from_architecture(arch: Architecture, *, gpu: str | GPUSpec = "h100", seq_len: int | None = None,
                              microbatch_size: int = 1, tp: int = 1, options: CostOptions | None = None,
                              name: str | None = None) -> ModelProfile:
    """The per-layer profile (times in ms) of ``arch`` on ``gpu`` for micro-batches of
    ``microbatch_size`` sequences of ``seq_len`` tokens (default: the architecture's, else 4096)."""
    spec = get_gpu(gpu)
    s = seq_len if seq_len is not None else (arch.seq_len or DEFAULT_SEQ_LEN)
    _check_degrees(arch, seq_len=s, microbatch_size=microbatch_size, tp=tp)
    if tp > 1 and arch.num_attention_heads % tp and any(
            x.kind == "block" and x.mixer in ("attention", "sliding_attention", "mla") for x in arch.layers):
        raise ConfigError(f"{arch.num_attention_heads} attention heads do not split {tp} ways; use a tp that divides "
                          f"{arch.num_attention_heads}", source=arch.name, field="tp")
    shards = max((x.shards for x in arch.layers if x.kind == "head"), default=1)
    if shards > s * microbatch_size:
        raise ConfigError(f"{shards} head shards but only {s * microbatch_size} tokens per micro-batch (seq_len x "
                          "microbatch_size): each shard needs a token; use fewer --head-shards", source=arch.name,
                          field="head_shards")
    costs, uniques = _unit_costs(arch, spec=spec, seq_len=s, microbatch_size=microbatch_size, tp=tp,
                                 options=options or CostOptions())
    return ModelProfile(
        name=name or arch.name,
        layers=tuple(costs),
        time_unit="ms",
        seq_len=s,
        microbatch_size=microbatch_size,
        extra={"model_type": arch.model_type, "gpu": spec.name, "tp": tp, "source": "analytic",
               "params_total": sum(uniques),
               "granularity": arch.extra.get("granularity", "layer"), "head_shards": arch.extra.get("head_shards", 1)},
    )
