"""torchtitan's runtime as an analytic model: one training step of a dense Llama-style model (docs/torchtitan.md).

What torchtitan (9dec370, Dec 2024) does, priced per layer and micro-batch on one rank:

* **compute**: linear layers at ``matmul_efficiency`` of the bf16 peak (``float8_speedup`` faster
  with Float8 on the block linears; torchtitan leaves the output layer in bf16), the SDPA flash
  attention core (causal: half the ``s^2`` pairs; backward 2.5x forward) at ``attention_efficiency``,
  element-wise kernels (:data:`EAGER_VECTOR_BYTES`) streaming HBM, ``compile_vector_factor`` of that
  traffic with ``torch.compile`` (per-block compile fuses norms, RoPE, SwiGLU, residuals);
* **activation checkpointing**: full AC re-runs each block's forward; selective "op" AC
  (torchtitan's default policy) saves matmul and SDPA outputs but recomputes every second matmul
  of a block (wk, wo, w3: :data:`SAC_RECOMPUTED_MATMULS`) and every element-wise op;
* **FSDP2** over the ``dp_shard * cp`` ranks: per block, a bf16 all-gather of its parameters
  prefetched one block ahead (overlapping the previous block's forward) and, with
  ``reshard_after_forward``, again for its backward, plus an fp32 reduce-scatter of its gradients
  (``reduce_dtype=float32``) overlapping the next block's backward; only what exceeds that compute
  is exposed, and ``overlap_interference`` of the hidden part slows the compute (NCCL's SMs and
  HBM traffic). The first gather and the last reduce-scatter are never hidden;
* **TP** with sequence parallelism: two all-gathers and two reduce-scatters of ``T x h`` bf16 per
  block and pass, exposed; with async TP only ``async_tp_exposed`` of them;
* **CP** ring attention: ``cp - 1`` K/V passes around the ring in the forward, K/V and dK/dV in the
  backward, overlapped with the attention blocks (exposed only beyond the attention core);
* **the step**: AdamW over the rank's fp32 shard (:data:`ADAMW_BYTES_PER_PARAM` streamed).

Memory (GiB, per rank): the sharded fp32 weights, gradients and two Adam moments (16 bytes per
parameter), FSDP's unsharded bf16 parameters and fp32 gradients of two blocks at a time (all of a
stage's under PP without resharding, the gradients accumulated in fp32), saved activations by AC
mode, and the logits with the loss's fp32 copies. Every fitted number is in :class:`TitanFit`, per
GPU (:data:`TITAN_FITS`), never per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, get_gpu

__all__ = ["TitanModel", "TitanJob", "TitanFit", "TITAN_FITS", "TitanStep", "titan_step", "titan_fit_for",
           "AC_MODES", "SAC_RECOMPUTED_MATMULS", "EAGER_VECTOR_BYTES", "ADAMW_BYTES_PER_PARAM", "LOSS_BYTES_PER_LOGIT",
           "block_seconds", "fsdp_block_seconds", "head_seconds", "memory_parts", "activation_bytes_per_token",
           "replay_bytes"]

AC_MODES = ("none", "selective", "full")
#: AdamW (torch foreach, fp32 shard): weight, gradient and two moments read, weight and moments written.
ADAMW_BYTES_PER_PARAM = 28.0
#: Element-wise HBM bytes per token of one block's eager forward, in units of ``h`` (bf16 unless
#: said): two RMSNorms with their fp32 upcast (~30 h each), RoPE on q and k in fp32 (~16 per
#: element of q and k), SwiGLU on the ``f``-wide halves (~10 bytes per element, given per h below
#: from ``f``) and two residual adds (~6 h each). A count from the code, not a fit.
EAGER_VECTOR_BYTES = dict(norms=60.0, residuals=12.0, rope_per_qk=16.0, swiglu_per_f=10.0)
#: Selective "op" AC recomputes every second ``mm`` of a block (count reset per block): of wq, wk,
#: wv, wo, w1, w3, w2 the 2nd, 4th and 6th.
SAC_RECOMPUTED_MATMULS = ("wk", "wo", "w3")
#: The cross-entropy's HBM traffic per logit over F and backward: bf16 logits written, their fp32
#: upcast, the log-softmax and its gradient (read and written in fp32), the bf16 gradient.
LOSS_BYTES_PER_LOGIT = 30.0


@dataclass(frozen=True)
class TitanModel:
    """A dense Llama-style model (torchtitan's ``ModelArgs``): untied output layer, SwiGLU, GQA."""

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matmul_params(self) -> dict[str, int]:
        """Weights of one block's matmuls by torchtitan's names."""
        h, f, kvd = self.hidden, self.ffn_hidden, self.kv_heads * self.head_dim
        return {"wq": h * h, "wk": h * kvd, "wv": h * kvd, "wo": h * h, "w1": h * f, "w3": h * f, "w2": f * h}

    @property
    def block_params(self) -> int:
        return sum(self.matmul_params().values()) + 2 * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + 2 * self.vocab * self.hidden + self.hidden


@dataclass(frozen=True)
class TitanJob:
    """One torchtitan job: degrees, batch and the training flags of its TOML."""

    gpus: int
    dp_shard: int = 1
    dp_replicate: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    seq_len: int = 8192
    local_batch: int = 1
    """Sequences per data-parallel rank per step (``training.batch_size``)."""
    microbatches: int = 1
    """Pipeline micro-batches per step (pp > 1)."""
    compile: bool = False
    float8: bool = False
    ac: str = "selective"
    async_tp: bool = False
    reshard_after_forward: bool | None = None
    """None: torchtitan's "default" policy, resharding unless pipelined."""
    schedule: str = "1F1B"
    """Pipeline schedule (pp > 1): ``1F1B`` or ``Interleaved1F1B``."""
    chunks: int = 1
    """Stages per rank under Interleaved1F1B."""
    gpus_per_node: int = 8

    @property
    def reshards(self) -> bool:
        return self.pp == 1 if self.reshard_after_forward is None else self.reshard_after_forward

    @property
    def fsdp_ranks(self) -> int:
        """Ranks FSDP shards over (torchtitan's ``dp_shard_cp`` mesh)."""
        return self.dp_shard * self.cp

    def validate(self, model: TitanModel) -> None:
        """A ConfigError naming the field when the job cannot run ``model``."""
        for name in ("gpus", "dp_shard", "dp_replicate", "tp", "cp", "pp", "seq_len", "local_batch",
                     "microbatches", "chunks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"must be a whole number >= 1, got {v!r}", field=name)
        prod = self.dp_shard * self.dp_replicate * self.tp * self.cp * self.pp
        if prod != self.gpus:
            raise ConfigError(f"dp_shard*dp_replicate*tp*cp*pp = {prod}, not the {self.gpus} GPUs; give degrees "
                              "whose product is the number of GPUs", field="parallel")
        if self.ac not in AC_MODES:
            raise ConfigError(f"unknown activation checkpointing {self.ac!r}; use one of {', '.join(AC_MODES)}",
                              field="activation_checkpoint")
        if model.heads % self.tp or model.kv_heads % self.tp:
            raise ConfigError(f"{model.heads} heads / {model.kv_heads} kv heads do not split {self.tp} ways",
                              field="tp")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise ConfigError(f"seq_len {self.seq_len} is not a multiple of 2*cp = {2 * self.cp}", field="cp")
        if self.pp > 1:
            if self.schedule not in ("1F1B", "Interleaved1F1B"):
                raise ConfigError(f"unknown pipeline schedule {self.schedule!r}; use 1F1B or Interleaved1F1B",
                                  field="schedule")
            if self.layers_per_stage(model) < 1:
                raise ConfigError(f"{model.layers} layers for {self.pp * self.chunks} stages", field="pp")
            if self.schedule == "Interleaved1F1B" and self.microbatches % self.pp:
                raise ConfigError(f"Interleaved1F1B needs micro-batches ({self.microbatches}) divisible by pp "
                                  f"({self.pp})", field="microbatches")
            if self.local_batch % self.microbatches:
                raise ConfigError(f"local batch {self.local_batch} does not split into {self.microbatches} "
                                  "micro-batches", field="microbatches")

    def layers_per_stage(self, model: TitanModel) -> int:
        return model.layers // (self.pp * (self.chunks if self.schedule == "Interleaved1F1B" else 1))


@dataclass(frozen=True)
class TitanFit:
    """torchtitan's fitted values on one GPU (``python -m experiments.benchmarks.published_titan FILE --fit``)."""

    matmul_efficiency: float
    """Share of the bf16 dense peak the block and output linears reach in bf16."""
    attention_efficiency: float
    """Share of the bf16 peak SDPA's flash attention reaches (causal FLOPs counted)."""
    float8_speedup: float
    """Block linears' speed-up with Float8 (torchao dynamic scaling, casts included)."""
    compile_vector_factor: float
    """Element-wise HBM traffic with torch.compile over eager."""
    comm_efficiency: float
    """Share of the link bandwidth NCCL's collectives reach."""
    overlap_interference: float
    """Compute slowed by this share of the communication it hides."""
    async_tp_exposed: float
    """Share of TP communication async TP leaves exposed."""
    cp_attention_overhead: float = 0.0
    """Ring attention's attention time over plain SDPA's, per ``(cp - 1) / cp``: 1.0 is a ring
    that loses the causal skip on every step after the first (no load balancing), 0.0 a perfect one."""
    memory_reserved_factor: float = 1.0
    """Reserved over allocated memory (torchtitan reports the caching allocator's max reserved)."""
    memory_efficiency: float = 0.8
    """Share of HBM bandwidth streaming kernels reach (the preset's, not fitted)."""
    fitted_on: str = ""


#: Fitted across the 12 rows of shared/data/published/torchtitan_llama3_h100_no_pp.json
#: (``python -m experiments.benchmarks.published_titan FILE --fit``: ranking first, then error).
TITAN_FITS: dict[str, TitanFit] = {
    "h100": TitanFit(matmul_efficiency=0.45, attention_efficiency=0.25, float8_speedup=1.5,
                     compile_vector_factor=0.2, comm_efficiency=0.8, overlap_interference=0.0,
                     async_tp_exposed=0.3, cp_attention_overhead=0.25, memory_reserved_factor=1.12,
                     fitted_on="torchtitan_llama3_h100_no_pp.json, 12 rows (published_titan --fit)"),
}


def titan_fit_for(gpu: str | GPUSpec) -> TitanFit:
    """The fit for ``gpu`` (H200/H800 take the H100 fit on their own preset); ConfigError otherwise."""
    name = get_gpu(gpu).name
    fit = TITAN_FITS.get(name) or (TITAN_FITS["h100"] if name in ("h200", "h800") else None)
    if fit is None:
        raise ConfigError(f"torchtitan is fitted on {', '.join(TITAN_FITS)} only, not {name}", field="gpu")
    return fit


def _ring(nbytes: float, size: int, stride: int, gpu: GPUSpec, per_node: int, eff: float) -> float:
    """A ring all-gather or reduce-scatter moving ``(n-1)/n * nbytes`` per rank, hierarchical across nodes."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    nv, ib = gpu.nvlink_gbps * 1e9 * eff, gpu.inter_node_gbps * 1e9 * eff
    if size * stride <= per_node:
        return gpu.nvlink_latency_us * 1e-6 + (size - 1) / size * nbytes / nv
    k = max(1, min(size, per_node // stride))
    nodes = math.ceil(size / k)
    intra = (k - 1) / k * nbytes / nv if k > 1 else 0.0
    return gpu.inter_node_latency_us * 1e-6 + intra + (nodes - 1) / nodes * (nbytes / k) / ib


@dataclass(frozen=True)
class BlockTimes:
    """Seconds of one block for one micro-batch on one rank."""

    forward: float
    backward: float
    recompute: float
    tp_exposed: float
    """TP seconds on the critical path over F, recompute and backward."""
    ring_exposed: float


def block_seconds(model: TitanModel, job: TitanJob, fit: TitanFit, *, gpu: GPUSpec, microbatch: int) -> BlockTimes:
    """One block's F, backward and recompute seconds for ``microbatch`` sequences on one rank."""
    tp, cp = job.tp, job.cp
    T = microbatch * job.seq_len / cp
    peak = gpu.peak_bf16_tflops * 1e12
    bw = gpu.hbm_tbps * 1e12 * fit.memory_efficiency
    mm = model.matmul_params()
    lin_rate = peak * fit.matmul_efficiency * (fit.float8_speedup if job.float8 else 1.0)
    lin_f = 2 * T * sum(mm.values()) / tp / lin_rate
    attn_f = 2 * T * job.seq_len * model.hidden / tp / (peak * fit.attention_efficiency)  # causal half of s^2
    attn_f *= 1.0 + fit.cp_attention_overhead * (cp - 1) / cp
    h, f, qk = model.hidden, model.ffn_hidden, model.hidden + model.kv_heads * model.head_dim
    vec_bytes = (EAGER_VECTOR_BYTES["norms"] + EAGER_VECTOR_BYTES["residuals"]) * h \
        + EAGER_VECTOR_BYTES["rope_per_qk"] * qk + EAGER_VECTOR_BYTES["swiglu_per_f"] * f
    vec_f = T * vec_bytes / tp / bw * (fit.compile_vector_factor if job.compile else 1.0)
    fwd = lin_f + attn_f + vec_f
    bwd = 2 * lin_f + 2.5 * attn_f + 2 * vec_f
    if job.ac == "full":
        rec = fwd
    elif job.ac == "selective":
        rec = lin_f * sum(mm[k] for k in SAC_RECOMPUTED_MATMULS) / sum(mm.values()) + vec_f
    else:
        rec = 0.0
    passes = 3 if job.ac == "full" else 2  # F (and its replay) and the backward each run the block's collectives
    # per pass two all-gathers (in float8 under Float8: torchao's Float8ColwiseParallel casts before
    # gathering; the backward's gathers stay bf16) and two reduce-scatters of T x h
    ag_f = _ring((1.0 if job.float8 else 2.0) * T * h, tp, 1, gpu, job.gpus_per_node, fit.comm_efficiency)
    bf16 = _ring(2.0 * T * h, tp, 1, gpu, job.gpus_per_node, fit.comm_efficiency)
    tp_comm = (passes - 1) * (2 * ag_f + 2 * bf16) + 4 * bf16
    tp_exp = tp_comm * (fit.async_tp_exposed if job.async_tp else 1.0)
    ring = 0.0
    if cp > 1:
        kv = 2.0 * T * 2 * model.kv_heads * model.head_dim / tp
        nv = gpu.nvlink_gbps * 1e9 * fit.comm_efficiency if cp * tp <= job.gpus_per_node else \
            gpu.inter_node_gbps * 1e9 * fit.comm_efficiency
        step = kv / nv
        ring = (max(0.0, (cp - 1) * step - attn_f) * (2 if job.ac == "full" else 1)
                + max(0.0, (cp - 1) * 2 * step - 2.5 * attn_f))
    return BlockTimes(fwd, bwd, rec, tp_exp, ring)


@dataclass(frozen=True)
class TitanStep:
    """One predicted step: seconds, throughput and memory."""

    step_s: float
    compute_s: float
    fsdp_exposed_s: float
    tp_exposed_s: float
    tokens_per_s_per_gpu: float
    peak_memory_gib: float
    memory_parts_gib: dict[str, float]


def fsdp_block_seconds(model: TitanModel, job: TitanJob, fit: TitanFit, *, gpu: GPUSpec,
                       params: float) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of ``params`` parameters over the FSDP group."""
    ag = _ring(2.0 * params / job.tp, job.fsdp_ranks, job.tp, gpu, job.gpus_per_node, fit.comm_efficiency)
    rs = _ring(4.0 * params / job.tp, job.fsdp_ranks, job.tp, gpu, job.gpus_per_node, fit.comm_efficiency)
    return ag, rs


def head_seconds(model: TitanModel, job: TitanJob, fit: TitanFit, *, gpu: GPUSpec, microbatch: int) -> float:
    """Output projection (bf16 under Float8 too) and the cross-entropy, F and backward."""
    T = microbatch * job.seq_len / job.cp
    peak = gpu.peak_bf16_tflops * 1e12
    mm = 6 * T * model.hidden * model.vocab / job.tp / (peak * fit.matmul_efficiency)
    loss = T * model.vocab / job.tp * LOSS_BYTES_PER_LOGIT / (gpu.hbm_tbps * 1e12 * fit.memory_efficiency)
    return mm + loss


def activation_bytes_per_token(model: TitanModel, job: TitanJob) -> float:
    """Bytes one block saves per token of a micro-batch on one rank, by AC mode (bf16)."""
    h, f, kvd, tp = model.hidden, model.ffn_hidden, model.kv_heads * model.head_dim, job.tp
    sp = tp  # sequence parallelism shards the block input and the norms' outputs
    if job.ac == "full":
        return 2.0 * h / sp
    saved_sac = 2.0 * (h / sp + (h + kvd) / tp + h / tp + f / tp + h / sp) + 4.0 * model.heads / tp
    if job.ac == "selective":
        return saved_sac
    return saved_sac + 2.0 * (3 * h / sp + kvd / tp + 3 * f / tp + h / tp)


def replay_bytes(model: TitanModel, job: TitanJob, microbatch: int) -> float:
    """Under full AC, one block's forward replayed whole (nothing checkpointed inside) for its backward:
    its activations, held while that block's backward runs; 0 otherwise."""
    if job.ac != "full":
        return 0.0
    return microbatch * job.seq_len / job.cp * activation_bytes_per_token(model, replace(job, ac="none"))


def memory_parts(model: TitanModel, job: TitanJob, microbatch: int, *, inflight_layers: float,
                 stage_params: float, head_here: bool) -> dict[str, float]:
    gib = 2.0 ** 30
    T = microbatch * job.seq_len / job.cp
    shard = stage_params / (job.tp * job.fsdp_ranks)
    block = model.block_params / job.tp
    # PP without resharding keeps the stage's bf16 weights unsharded all step, and its gradients
    # unsharded until the last micro-batch's backward: FSDP2 accumulates a gradient it does not
    # reduce-scatter in ``reduce_dtype`` (fp32; ``FSDPParam.to_accumulated_grad_if_needed``), so
    # 2 + 4 bytes per parameter; otherwise two blocks' bf16 weights and fp32 gradients at a time
    buffers = stage_params / job.tp * 6.0 if job.pp > 1 and not job.reshards else 2 * block * 6.0
    parts = {"sharded_state": 16.0 * shard / gib, "fsdp_buffers": buffers / gib,
             "activations": inflight_layers * T * activation_bytes_per_token(model, job) / gib}
    parts["activations"] += replay_bytes(model, job, microbatch) / gib
    if head_here:
        logits = T * model.vocab / job.tp
        parts["logits"] = logits * (2.0 + 4.0 + 4.0) / gib  # bf16 logits, fp32 upcast, fp32 gradient
        parts["head_buffers"] = model.vocab * model.hidden / job.tp * (2.0 + 4.0) / gib
    return parts


def titan_step(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100",
               fit: TitanFit | None = None) -> TitanStep:
    """One torchtitan step of ``model`` under ``job`` (pp == 1; pipelined jobs: pipeline.torchtitan_pp)."""
    spec = get_gpu(gpu)
    fit = fit or titan_fit_for(spec)
    job.validate(model)
    if job.pp != 1:
        raise ConfigError("titan_step prices pipeline-free jobs; use pipeline.torchtitan_pp.titan_pp_step",
                          field="pp")
    mb = job.local_batch
    bt = block_seconds(model, job, fit, gpu=spec, microbatch=mb)
    ag, rs = fsdp_block_seconds(model, job, fit, gpu=spec, params=model.block_params)
    fwd_window, bwd_window = bt.forward, bt.backward + bt.recompute
    bwd_comm = rs + (ag if job.reshards else 0.0)
    exposed = max(0.0, ag - fwd_window) + max(0.0, bwd_comm - bwd_window)
    hidden = (ag + bwd_comm) - exposed
    per_block = fwd_window + bwd_window + bt.tp_exposed + bt.ring_exposed + fit.overlap_interference * hidden
    head = head_seconds(model, job, fit, gpu=spec, microbatch=mb)
    hag, hrs = fsdp_block_seconds(model, job, fit, gpu=spec, params=model.vocab * model.hidden)
    edge = ag + rs + hag + hrs  # the first gather and the last reduce-scatters are not hidden
    shard = model.params / (job.tp * job.fsdp_ranks)
    opt = ADAMW_BYTES_PER_PARAM * shard / (spec.hbm_tbps * 1e12 * fit.memory_efficiency)
    compute = model.layers * (fwd_window + bwd_window) + head
    step = model.layers * per_block + head + edge + opt
    tokens = mb * job.seq_len / (job.tp * job.cp)
    parts = memory_parts(model, job, mb, inflight_layers=model.layers, stage_params=model.params,
                         head_here=True)
    return TitanStep(step, compute, model.layers * exposed + edge, model.layers * bt.tp_exposed, tokens / step,
                     fit.memory_reserved_factor * sum(parts.values()), parts)
