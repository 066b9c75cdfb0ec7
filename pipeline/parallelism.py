"""The whole job: tensor, pipeline, data, context and expert parallel degrees around the pipeline plan.

A training job on ``gpus = tp * pp * dp * cp`` GPUs (``ep`` is carved out of the ``dp * cp``
ranks, as in Megatron-LM) is one pipeline of ``pp`` stages, replicated ``dp * cp`` times, each
stage run by ``tp`` ranks. The pipeline part is what the rest of the toolkit plans and simulates;
this module adds what the other degrees do to it (docs/whole-job.md):

* **per-layer costs** (:func:`job_profile`): :func:`pipeline.costs.architecture_work` with the
  degrees (``tp``-way matrices, ``cp``-way sequence shares, ``ep``-way experts, sequence
  parallelism), each pass's non-communication kernels priced by the cost model's roofline and its
  communication by the links of the group that runs it:

  - TP all-reduces (or, with sequence parallelism, reduce-scatter + all-gather, the same bytes) on
    the stage's critical path over NVLink, or the NIC when the TP group spans nodes; with
    ``tp_comm_overlap`` (Megatron-core's ``--tp-comm-overlap``) only what exceeds the pass's
    matmul time stays exposed;
  - CP ring attention: ``cp - 1`` exchanges of the rank's K and V in F, of K, V, dK and dV in I,
    overlapped with the attention core (only what exceeds the core's time is exposed);
  - EP all-to-all: dispatch and combine of the ``T * top_k`` routed tokens' hidden states in F and
    again in I, per MoE layer, not overlapped;
  - MoE load imbalance (:attr:`Parallelism.moe_imbalance`, the busiest expert's tokens over the
    mean): the busiest expert-parallel rank (:func:`expert_rank_imbalance`) runs that many times the
    mean routed rows, in its expert GEMMs, activation, permutes and all-to-all;
  - activation checkpointing (:data:`AC_MODES`): ``selective`` drops each block's norm outputs and
    MoE activation output and re-runs their kernels in I; ``full`` recomputes whole stages (the
    plan's ``recompute``);
  - the stage-to-stage tensor is split ``tp`` ways (Megatron's scatter/gather optimisation, or
    sequence parallelism's sharded activations) and each TP rank sends its share on its own link;

* **memory** (:meth:`Parallelism.training`): the per-parameter state sharded over the ``dp * cp``
  ranks by ZeRO stage (:attr:`pipeline.spec.TrainingConfig.zero_stage`), routed experts' over the
  expert-data-parallel ``dp * cp / ep`` ranks (an MoE layer's ``params`` is the memory-equivalent
  count; ``extra["dense_params"]`` and ``extra["expert_params"]`` hold the real ones);
* **the data-parallel tail** (:func:`dp_tail`): gradient all-reduce (ZeRO-0) or reduce-scatter
  plus parameter all-gather (ZeRO-1/2), or FSDP's gathers and reduce-scatter (ZeRO-3), priced on
  the DP group's links (hierarchical: NVLink inside a node, the NIC across nodes) with NCCL's ring,
  tree or PAT latency per gradient bucket (:func:`collective_seconds`), routed experts' gradients
  over the expert-data-parallel group, overlapped with
  the last micro-batch's backward on the device as ``--overlap-grad-reduce`` does (the last bucket
  never overlaps). The optimizer step itself is the runtime's (``Runtime.optimizer_bytes_per_param``,
  divided by ``dp * cp`` under ZeRO >= 1 through :meth:`Parallelism.training`).

Rank order is Megatron-LM's default ``tp-cp-ep-dp-pp``: TP ranks are adjacent, so a group of
``n`` ranks ``stride`` apart fits in a node when ``n * stride <= gpus_per_node``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.arch import Architecture, LayerSpec
from pipeline.collectives import (
    GRAD_BUCKET_PARAMS,
    GRAD_BUCKET_PARAMS_PER_RANK,
    bucket_params,
    collective_seconds,
    gradient_buckets,
    group_link,
)
from pipeline.costs import CostOptions, LayerWork, PassWork, architecture_work, layer_cost, layer_work
from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, build_cluster, get_gpu
from pipeline.job_layers import (
    SELECTIVE_MODULES,
    check_moe_knobs,
    ep_all_to_all_seconds,
    expert_rank_imbalance,
    exposed_all_to_all,
    fp8_options,
    selective_recompute,
)
from pipeline.megatron import megatron_chunk_counts, megatron_partition
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, interleaved_placement, sequential_placement
from pipeline.simulator import Result, simulate
from pipeline.spec import Cluster, LayerCost, ModelProfile, TrainingConfig

__all__ = ["Parallelism", "ZERO_STAGES", "AC_MODES", "SELECTIVE_MODULES", "DEFAULT_MOE_IMBALANCE",
           "expert_rank_imbalance", "collective_seconds", "selective_savings", "validate_job", "job_profile",
           "job_cluster", "dp_tail", "DPTail", "JobEstimate", "estimate_job", "megatron_job_plan", "model_flops",
           "group_link", "GRAD_BUCKET_PARAMS", "GRAD_BUCKET_PARAMS_PER_RANK", "GRAD_BYTES"]

#: ZeRO stage by name (``--zero``): none, Megatron's distributed optimizer (ZeRO-1), ZeRO-2, FSDP.
ZERO_STAGES = {"none": 0, "zero1": 1, "dist-opt": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
#: Bytes per gradient element in the data-parallel reduction (bf16: ``grad_reduce_in_fp32`` off).
GRAD_BYTES = 2.0
#: Activation-checkpointing modes the job search tries (``--ac``).
AC_MODES = ("none", "selective", "full")
#: The busiest expert's routed tokens over the mean (``moe_imbalance``): Switch Transformer's
#: training capacity factor 1.25 (Fedus et al. 2022, JMLR 23, section 2.2 and Table 1), the load
#: a token-dropping router provisions each expert for; a dropless router is bounded only by its
#: balancing loss, so 1.25 is a typical figure, not a bound.
DEFAULT_MOE_IMBALANCE = 1.25


@dataclass(frozen=True)
class Parallelism:
    """The degrees and the data-parallel and micro-batch settings of one job."""

    tp: int = 1
    """Tensor-parallel degree (ranks per stage sharing every matrix)."""
    pp: int = 1
    """Pipeline-parallel degree (devices of the pipeline plan)."""
    dp: int = 1
    """Data-parallel replicas of the pipeline."""
    cp: int = 1
    """Context-parallel degree: each rank holds ``seq_len / cp`` tokens of every sequence (ring attention)."""
    ep: int = 1
    """Expert-parallel degree: each rank holds ``num_experts / ep`` experts; carved out of ``dp * cp``."""
    microbatch_size: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    global_batch: int | None = None
    """Sequences per iteration over the whole job; None: one micro-batch per replica."""
    sequence_parallel: bool = True
    """Megatron's sequence parallelism with ``tp > 1`` (norms and dropout sharded, RS/AG for AR)."""
    zero_stage: int = 1
    """Sharding of the per-parameter state over the ``dp * cp`` ranks (see :data:`ZERO_STAGES`)."""
    overlap_grad_reduce: bool = True
    """Gradient reduction overlapped with the last micro-batch's backward (``--overlap-grad-reduce``)."""
    overlap_param_gather: bool = True
    """The distributed optimizer's parameter all-gather overlapped with the next forward."""
    tp_comm_overlap: bool = False
    """TP communication overlapped with the matmuls (``--tp-comm-overlap``)."""
    recompute: bool = False
    """Full activation recomputation on every stage (``--recompute-granularity full``)."""
    selective_recompute: bool = False
    """Selective recomputation (:data:`SELECTIVE_MODULES`, Megatron-core's output-discarding
    ``--recompute-modules layernorm moe_act``): each block's two norm outputs and its MoE activation
    output are not saved but recomputed in the backward. Ignored under :attr:`recompute`."""
    moe_imbalance: float = DEFAULT_MOE_IMBALANCE
    """Busiest expert's routed tokens over the mean expert's (``>= 1``); the busiest expert-parallel
    rank's load follows from it (:func:`expert_rank_imbalance`)."""
    fp8: bool = False
    """FP8 linear layers and EP dispatch, DeepSeek-V3's recipe (:func:`pipeline.job_layers.fp8_options`)."""
    ep_overlap: float = 0.0
    """Share of the EP all-to-all hidden behind compute (:func:`pipeline.job_layers.exposed_all_to_all`)."""
    moe_max_nodes: int = 0
    """Node-limited routing: nodes a token's experts span at most; 0: unlimited (DeepSeek-V3: 4)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def ac(self) -> str:
        """The activation-checkpointing mode: ``none``, ``selective`` or ``full`` (:data:`AC_MODES`)."""
        return "full" if self.recompute else "selective" if self.selective_recompute else "none"

    def with_ac(self, mode: str) -> Parallelism:
        """This job with activation-checkpointing ``mode`` (one of :data:`AC_MODES`)."""
        if mode not in AC_MODES:
            raise ConfigError(f"unknown mode {mode!r}; use one of {', '.join(AC_MODES)}", field="ac")
        return replace(self, recompute=mode == "full", selective_recompute=mode == "selective")

    @property
    def expert_data_parallel(self) -> int:
        """Ranks that hold the same experts (Megatron's expert-data-parallel group): ``dp * cp / ep``."""
        return max(1, self.replicas // self.ep)

    @property
    def replicas(self) -> int:
        """Ranks that hold the same weights: the data-parallel group of the gradient reduction."""
        return self.dp * self.cp

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.dp * self.microbatch_size

    @property
    def microbatches(self) -> int:
        """Micro-batches per iteration through each pipeline replica."""
        return self.batch // (self.dp * self.microbatch_size)

    def training(self, base: TrainingConfig = TrainingConfig()) -> TrainingConfig:
        """``base`` with this job's ZeRO sharding over its ``dp * cp`` replicas."""
        return replace(base, data_parallel=self.replicas, zero_stage=self.zero_stage)

    def describe(self) -> str:
        return (f"tp={self.tp} pp={self.pp} dp={self.dp} cp={self.cp} ep={self.ep} mbs={self.microbatch_size} "
                f"m={self.microbatches} ac={self.ac}")

    def as_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep,
                "microbatch_size": self.microbatch_size, "microbatches": self.microbatches,
                "global_batch": self.batch, "sequence_parallel": self.sequence_parallel and self.tp > 1,
                "zero_stage": self.zero_stage, "recompute": self.recompute, "ac": self.ac, "fp8": self.fp8,
                "ep_overlap": self.ep_overlap, "moe_max_nodes": self.moe_max_nodes}


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a whole number >= 1, got {value!r}", field=name)
    return value


def validate_job(arch: Architecture, par: Parallelism, *, seq_len: int, gpus: int | None = None) -> None:
    """Raise a :class:`ConfigError` naming the field and the fix when ``par`` cannot run ``arch``."""
    for name in ("tp", "pp", "dp", "cp", "ep", "microbatch_size"):
        _whole(getattr(par, name), name)
    _whole(seq_len, "seq_len")
    imb = par.moe_imbalance
    if isinstance(imb, bool) or not isinstance(imb, (int, float)) or not imb >= 1.0:
        raise ConfigError(f"must be a number >= 1 (the busiest expert's tokens over the mean; 1: perfectly "
                          f"balanced), got {imb!r}", field="moe_imbalance")
    check_moe_knobs(fp8=par.fp8, ep_overlap=par.ep_overlap, moe_max_nodes=par.moe_max_nodes)
    if par.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"must be 0, 1, 2 or 3 (or one of {', '.join(ZERO_STAGES)}), got {par.zero_stage!r}",
                          field="zero_stage")
    if gpus is not None and par.gpus != gpus:
        raise ConfigError(f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {par.gpus}, not {gpus}; choose "
                          "degrees whose product is the number of GPUs", field="gpus")
    if par.global_batch is not None:
        _whole(par.global_batch, "global_batch")
        step = par.dp * par.microbatch_size
        if par.global_batch % step:
            raise ConfigError(f"{par.global_batch} is not a multiple of dp*microbatch_size = {step}; use a global "
                              f"batch divisible by {step} or a smaller micro-batch", field="global_batch")
    heads, groups = arch.num_attention_heads, arch.num_key_value_heads
    mixers = {layer.mixer for layer in arch.layers if layer.kind == "block"}
    if mixers & {"attention", "sliding_attention", "mla"}:
        if heads % par.tp:
            raise ConfigError(f"{heads} attention heads do not split {par.tp} ways; use a tp that divides {heads}",
                              source=arch.name, field="tp")
        if "mla" not in mixers and groups % par.tp:
            raise ConfigError(f"{groups} key/value heads do not split {par.tp} ways (Megatron needs "
                              f"num_query_groups % tp == 0); use a tp that divides {groups}", source=arch.name,
                              field="tp")
    blocks = arch.num_blocks
    if par.pp > max(1, blocks):
        raise ConfigError(f"{par.pp} pipeline stages for {blocks} blocks; use pp <= {blocks}", source=arch.name,
                          field="pp")
    if par.cp > 1:
        if mixers - {"attention", "sliding_attention", "mla", "none"}:
            raise ConfigError(f"context parallelism is modelled for attention only, the model has "
                              f"{sorted(mixers - {'none'})}; use cp=1", source=arch.name, field="cp")
        if seq_len % (2 * par.cp):
            raise ConfigError(f"seq_len {seq_len} is not a multiple of 2*cp = {2 * par.cp} (ring attention's "
                              "load-balanced chunks); use a cp that divides seq_len / 2", field="cp")
    if par.sequence_parallel and par.tp > 1 and (seq_len // par.cp) % par.tp:
        raise ConfigError(f"seq_len / cp = {seq_len // par.cp} does not split {par.tp} ways for sequence "
                          "parallelism; use a tp that divides it or sequence_parallel=False", field="tp")
    if par.ep > 1:
        experts = arch.num_experts
        if experts < 1:
            raise ConfigError("expert parallelism needs an MoE model; use ep=1", source=arch.name, field="ep")
        if experts % par.ep:
            raise ConfigError(f"{experts} experts do not split {par.ep} ways; use an ep that divides {experts}",
                              source=arch.name, field="ep")
        if par.replicas % par.ep:
            raise ConfigError(f"ep={par.ep} must divide dp*cp = {par.replicas} (expert-parallel ranks are "
                              "data-parallel ranks); raise dp or lower ep", field="ep")


def _kv_width(arch: Architecture, mixer: str) -> int:
    """Elements per token of K and V together that ring attention exchanges."""
    if mixer == "mla":
        a = arch.num_attention_heads
        return a * (arch.qk_nope_head_dim + arch.qk_rope_head_dim + arch.v_head_dim)
    return 2 * arch.num_key_value_heads * arch.attn_head_dim


def _pass_seconds(p: PassWork, gpu: GPUSpec, *, tp_link: tuple[float, float], overlap_tp: bool,
                  ring_s: float = 0.0, a2a_s: float = 0.0) -> float:
    compute = PassWork([op for op in p.ops if op.kind != "comm"]).seconds(gpu)
    bw, lat = tp_link
    tp_comm = sum(lat + op.bytes / bw for op in p.ops if op.kind == "comm")
    if overlap_tp:
        tp_comm = max(0.0, tp_comm - PassWork([op for op in p.ops if op.kind == "matmul"]).seconds(gpu))
    core = PassWork([op for op in p.ops if op.tag == "core"]).seconds(gpu)
    return compute + tp_comm + max(0.0, ring_s - core) + a2a_s


def _routed_seconds(arch: Architecture, spec_layer: Any, work: LayerWork, par: Parallelism, *, gpu: GPUSpec,
                    seq_len: int, options: CostOptions | None) -> tuple[float, float, float]:
    """(F, I, W) seconds one more ``top_k`` of routed rows per token adds to an MoE layer: the layer
    priced at ``top_k + dk`` routed experts per token less at ``top_k``, over ``dk`` (``dk = top_k`` where
    the experts allow, else the experts left), times ``top_k``: the routed rows' own time."""
    k, experts = arch.num_experts_per_tok, arch.num_experts
    dk = min(k, experts - k)
    if dk < 1:
        return 0.0, 0.0, 0.0
    more = replace(arch, num_experts_per_tok=k + dk)
    index = arch.layers.index(spec_layer)
    other = layer_work(more, index, seq_len=seq_len, microbatch_size=par.microbatch_size, tp=par.tp,
                       options=options, cp=par.cp, ep=par.ep,
                       sequence_parallel=par.sequence_parallel and par.tp > 1)
    scale = k / dk
    return tuple(max(0.0, scale * (getattr(other, x).seconds(gpu) - getattr(work, x).seconds(gpu)))
                 for x in ("f", "i", "w"))  # type: ignore[return-value]


def _selective(arch: Architecture, layer: LayerSpec, par: Parallelism, *, gpu: GPUSpec,
               tokens: int) -> tuple[float, float]:
    return selective_recompute(arch, layer, tokens=tokens, tp=par.tp, sequence_parallel=par.sequence_parallel,
                               gpu=gpu, fp8=par.fp8)


def selective_savings(arch: Architecture, par: Parallelism, *, gpu: str | GPUSpec, seq_len: int) -> float:
    """Activation bytes of one micro-batch on one rank (all of its layers) that selective
    recomputation does not keep (:func:`_selective`)."""
    spec = get_gpu(gpu)
    tokens = par.microbatch_size * (seq_len // par.cp)
    memo: dict[Any, float] = {}
    total = 0.0
    for layer in arch.layers:
        if layer.kind == "block":
            if layer not in memo:
                memo[layer] = _selective(arch, layer, par, gpu=spec, tokens=tokens)[0]
            total += memo[layer]
    return total


def job_profile(arch: Architecture, par: Parallelism, *, gpu: str | GPUSpec, seq_len: int,
                gpus_per_node: int | None = 8, options: CostOptions | None = None,
                name: str | None = None) -> ModelProfile:
    """Per-layer costs (ms) of one TP x CP rank of ``arch`` under ``par`` (see the module docstring).
    Layers of the same spec cost the same: each spec is priced once."""
    spec = get_gpu(gpu)
    validate_job(arch, par, seq_len=seq_len)
    names, params_total = _model_facts(arch, options)
    ctx = _JobContext(arch, par, spec, seq_len // par.cp, gpus_per_node, options)
    priced: dict[Any, LayerCost] = {}
    layers = []
    for index, spec_layer in enumerate(arch.layers):
        cost = priced.get(spec_layer)
        if cost is None:
            cost = priced[spec_layer] = ctx.layer(index, names[index])
        layers.append(cost if cost.name == names[index] else replace(cost, name=names[index]))
    return ModelProfile(
        name=name or f"{arch.name}-{par.describe().replace(' ', '-')}",
        layers=tuple(layers), time_unit="ms", seq_len=ctx.s_local, microbatch_size=par.microbatch_size,
        extra={"model_type": arch.model_type, "gpu": spec.name, "source": "analytic", **par.as_dict(),
               "params_total": params_total, "seq_len_total": seq_len, "moe_rank_imbalance": ctx.rank_imb},
    )


#: id(arch) -> (arch, layer names, parameter count) of :func:`_model_facts`.
_FACTS: dict[tuple[int, Any], tuple[Architecture, list[str], int]] = {}


def _model_facts(arch: Architecture, options: CostOptions | None) -> tuple[list[str], int]:
    """The layers' names and the model's parameter count (kept per architecture object)."""
    key = (id(arch), options)
    hit = _FACTS.get(key)
    if hit is None or hit[0] is not arch:
        if len(_FACTS) > 64:
            _FACTS.clear()
        whole = _whole_model(arch, options)
        hit = _FACTS[key] = (arch, [w.name for w in whole], sum(w.unique_params for w in whole))
    return hit[1], hit[2]


class _JobContext:
    """What :func:`job_profile` prices every layer with: the degrees' links, the expert rank's
    imbalance, the selective recomputation and the experts' state sharding."""

    def __init__(self, arch: Architecture, par: Parallelism, spec: GPUSpec, s_local: int,
                 gpus_per_node: int | None, options: CostOptions | None) -> None:
        options = fp8_options(spec, options) if par.fp8 else options
        self.arch, self.par, self.spec, self.s_local, self.options = arch, par, spec, s_local, options
        self.sp = par.sequence_parallel and par.tp > 1
        self.tp_link = group_link(par.tp, 1, gpu=spec, gpus_per_node=gpus_per_node)
        self.cp_link = group_link(par.cp, par.tp, gpu=spec, gpus_per_node=gpus_per_node)
        self.tokens = par.microbatch_size * s_local
        self.rank_imb = expert_rank_imbalance(par.moe_imbalance, arch.num_experts, par.ep)
        self.selective = par.selective_recompute and not par.recompute
        self.expert_state = _expert_state_scale(par)
        self.a2a = ep_all_to_all_seconds(  # per MoE layer and pass: dispatch + combine
            tokens=par.microbatch_size * s_local / (par.tp if self.sp else 1), hidden=arch.hidden_size,
            top_k=arch.num_experts_per_tok, ep=par.ep, stride=par.tp * par.cp, gpu=spec, gpus_per_node=gpus_per_node,
            rank_imbalance=self.rank_imb, max_nodes=par.moe_max_nodes, fp8=par.fp8)

    def layer(self, index: int, name: str) -> LayerCost:
        """The :class:`LayerCost` of layer ``index`` under the job's degrees."""
        arch, par, spec, tokens = self.arch, self.par, self.spec, self.tokens
        spec_layer = arch.layers[index]
        work = layer_work(arch, index, seq_len=self.s_local, microbatch_size=par.microbatch_size, tp=par.tp,
                          options=self.options, name=name, cp=par.cp, ep=par.ep, sequence_parallel=self.sp)
        ring_f = ring_i = a2a = 0.0
        if par.cp > 1 and spec_layer.kind == "block" and spec_layer.mixer in ("attention", "sliding_attention",
                                                                                "mla"):
            cp_bw, cp_lat = self.cp_link
            kv = 2.0 * tokens * _kv_width(arch, spec_layer.mixer) / par.tp
            ring_f = (par.cp - 1) * (cp_lat + kv / cp_bw)
            ring_i = (par.cp - 1) * (cp_lat + 2 * kv / cp_bw)
        moe = spec_layer.kind == "block" and spec_layer.ffn == "moe"
        extra_f = extra_i = extra_w = 0.0
        if moe and self.rank_imb > 1.0:  # the busiest expert rank runs rank_imb times the mean routed rows
            routed_s = _routed_seconds(arch, spec_layer, work, par, gpu=spec, seq_len=self.s_local,
                                       options=self.options)
            extra_f, extra_i, extra_w = ((self.rank_imb - 1.0) * x for x in routed_s)
        a2a = self.a2a if moe else 0.0
        cost = layer_cost(work, spec)
        overlap, link = par.tp_comm_overlap, self.tp_link
        f = _pass_seconds(work.f, spec, tp_link=link, overlap_tp=overlap, ring_s=ring_f) + extra_f
        i = _pass_seconds(work.i, spec, tp_link=link, overlap_tp=overlap, ring_s=ring_i) + extra_i
        hide = 0.0 if par.recompute else par.ep_overlap  # Megatron refuses the overlap with full recompute
        f += exposed_all_to_all(a2a, f, overlap=hide, gpu=spec)
        i += exposed_all_to_all(a2a, i, overlap=hide, gpu=spec)
        w = _pass_seconds(work.w, spec, tp_link=link, overlap_tp=overlap) + extra_w
        act = cost.act_bytes
        extra: dict[str, Any] = {**cost.extra, "expert": bool(moe)}
        if self.selective and spec_layer.kind == "block":
            freed, redo = _selective(arch, spec_layer, par, gpu=spec, tokens=tokens)
            act = max(0, int(round(act - freed)))
            i += redo
            extra["recompute_s"] = redo
        params = cost.params
        if moe:
            experts = _expert_params(arch, par)
            extra["expert_params"] = experts
            extra["dense_params"] = params - experts
            # the memory-equivalent count: expert state is sharded over dp*cp/ep ranks, not dp*cp
            params = int(round(params - experts + experts * self.expert_state))
        return replace(cost, f=f * 1e3, b=i * 1e3, w=w * 1e3, out_bytes=int(cost.out_bytes // par.tp),
                       params=params, act_bytes=act, w_act_bytes=min(act, cost.w_act_bytes), extra=extra)


def _whole_model(arch: Architecture, options: CostOptions | None) -> list[LayerWork]:
    return architecture_work(arch, seq_len=1, options=options)


def _expert_params(arch: Architecture, par: Parallelism) -> int:
    """Routed-expert parameters one rank holds in one MoE layer (``E / ep`` experts, split ``tp`` ways)."""
    f = arch.moe_intermediate_size
    width = 2 * f if arch.gated_mlp else f
    return int(math.ceil(arch.num_experts // par.ep * (arch.hidden_size * width + f * arch.hidden_size) / par.tp))


def _expert_state_scale(par: Parallelism) -> float:
    """Bytes per expert parameter over bytes per dense parameter: expert state is sharded over the
    expert-data-parallel group (``dp * cp / ep`` ranks) where ZeRO shards the rest over ``dp * cp``."""
    dense = par.training().param_bytes
    expert = replace(par.training(), data_parallel=par.expert_data_parallel).param_bytes
    return expert / dense if dense > 0 else 1.0


def job_cluster(par: Parallelism, *, gpu: str | GPUSpec, gpus_per_node: int | None = 8,
                memory_gb: float | None = None) -> Cluster:
    """The ``pp`` devices of one pipeline replica: consecutive stages are ``tp*cp*dp`` ranks apart,
    so they share a node only when that stride is below ``gpus_per_node``."""
    stride = par.tp * par.cp * par.dp
    per_node = None if gpus_per_node is None else max(1, gpus_per_node // stride)
    return build_cluster(gpu, devices=par.pp, gpus_per_node=per_node, memory_gb=memory_gb)


@dataclass(frozen=True)
class DPTail:
    """What the data-parallel collectives add after the pipeline, per device."""

    comm_s: tuple[float, ...]
    """Data-parallel collective seconds per device (before overlap)."""
    exposed_s: tuple[float, ...]
    """Of them, what the backward did not hide."""

    @property
    def seconds(self) -> float:
        """The iteration ends when the slowest device's tail does."""
        return max(self.exposed_s, default=0.0)


def dp_tail(profile: ModelProfile, plan: Plan, par: Parallelism, *, gpu: str | GPUSpec,
            gpus_per_node: int | None = 8) -> DPTail:
    """The data-parallel tail of ``plan`` (see the module docstring): per device, its collectives
    (:func:`collective_seconds`: ring or tree, per-bucket latency) and what the backward of its last
    micro-batch (FSDP: its whole step's compute) leaves exposed. Dense gradients reduce over the
    ``dp * cp`` replicas, routed experts' over the expert-data-parallel group (``dp * cp / ep``
    ranks ``tp * ep`` apart), one after the other."""
    spec = get_gpu(gpu)
    unit = profile.seconds_per_unit
    devices = plan.devices
    dense = [0.0] * devices
    expert = [0.0] * devices
    window = [0.0] * devices
    busy = [0.0] * devices
    for s, (a, b) in enumerate(plan.partition):
        d = plan.placement[s]
        redo = par.recompute or (plan.recompute is not None and plan.recompute[s])
        for layer in profile.layers[a:b]:
            e = float(layer.extra.get("expert_params", 0.0))
            dense[d] += float(layer.extra.get("dense_params", layer.params - e))
            expert[d] += e
            window[d] += (layer.b + layer.w + (layer.f if redo else 0.0)) * unit
            busy[d] += (layer.f + layer.b + layer.w) * unit * plan.microbatches
    groups = ((par.replicas, par.tp, dense), (par.expert_data_parallel, par.tp * par.ep, expert))
    comm, exposed = [], []
    for d in range(devices):
        c = tail = gather = g_first = 0.0
        for n, stride, params in groups:
            p = params[d]
            if p <= 0 or n <= 1:
                continue
            buckets = gradient_buckets(p, n)
            first = min(p, bucket_params(n))

            def run(nbytes: float, kind: str, count: int, n: int = n, stride: int = stride) -> float:
                return collective_seconds(nbytes, n, stride, gpu=spec, gpus_per_node=gpus_per_node, kind=kind,
                                          buckets=count)
            if par.zero_stage == 0:
                c += run(GRAD_BYTES * p, "all_reduce", buckets)
                tail += run(GRAD_BYTES * first, "all_reduce", 1)
            else:
                c += run(GRAD_BYTES * p, "reduce_scatter", buckets)
                tail += run(GRAD_BYTES * first, "reduce_scatter", 1)
                gather += run(2.0 * p, "all_gather", buckets)
                g_first += run(2.0 * first, "all_gather", 1)
        if par.zero_stage == 3:  # gathered for F and again for the backward, gradients reduce-scattered
            total = c + 2 * gather
            e = max(tail, total - busy[d])
            comm.append(total)
        else:
            e = max(tail, c - window[d]) if par.overlap_grad_reduce else c
            e += (g_first if par.overlap_param_gather else gather) if par.zero_stage else 0.0
            comm.append(c + gather)
        exposed.append(e)
    return DPTail(tuple(comm), tuple(exposed))


def model_flops(profile: ModelProfile, par: Parallelism) -> float:
    """Matmul-class FLOPs of one iteration over the whole job (recomputation not counted: MFU, not HFU)."""
    per_rank = sum(float(x.extra.get("flops_f", 0)) + float(x.extra.get("flops_b", 0))
                   + float(x.extra.get("flops_w", 0)) for x in profile.layers)
    return per_rank * par.tp * par.cp * par.dp * par.microbatches


@dataclass(frozen=True)
class JobEstimate:
    """One job's predicted step: the pipeline, the data-parallel tail, throughput, memory."""

    par: Parallelism
    plan: Plan
    result: Result
    pipeline_s: float
    tail: DPTail
    iteration_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    peak_memory_gb: float
    memory_limit_gb: float

    @property
    def fits(self) -> bool:
        return self.result.feasible

    def row(self) -> dict[str, Any]:
        return {**self.par.as_dict(), "iteration_ms": 1e3 * self.iteration_s, "pipeline_ms": 1e3 * self.pipeline_s,
                "dp_exposed_ms": 1e3 * self.tail.seconds,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "peak_memory_gb": self.peak_memory_gb, "fits": self.fits}


def estimate_job(profile: ModelProfile, cluster: Cluster, plan: Plan, *, par: Parallelism,
                 training: TrainingConfig | None = None, gpu: str | GPUSpec | None = None,
                 gpus_per_node: int | None = 8, seq_len: int | None = None) -> JobEstimate:
    """Simulate ``plan`` on one replica and add the data-parallel tail: the whole job's step."""
    spec = get_gpu(gpu if gpu is not None else cluster.extra.get("gpu", "h100"))
    train = par.training(training or TrainingConfig(runtime="megatron"))
    result = simulate(plan, profile, cluster, training=train, record_timeline=False)
    pipeline_s = result.iteration_time * profile.seconds_per_unit
    tail = dp_tail(profile, plan, par, gpu=spec, gpus_per_node=gpus_per_node)
    it = pipeline_s + tail.seconds
    s_total = seq_len if seq_len is not None else int(profile.extra.get("seq_len_total", profile.seq_len or 0))
    tokens = par.batch * s_total
    flops = model_flops(profile, par)
    peak = max(result.peak_memory, default=0.0) / 2**30
    limit = min(result.memory_limit, default=math.inf) / 2**30
    return JobEstimate(par, plan, result, pipeline_s, tail, it, tokens / it / par.gpus if it > 0 else 0.0,
                       flops / (it * par.gpus * spec.peak_bf16_tflops * 1e12) if it > 0 else 0.0, peak, limit)


def megatron_job_plan(profile: ModelProfile, cluster: Cluster, par: Parallelism, *,
                      training: TrainingConfig | None = None, chunks: Sequence[int] | None = None) -> Plan:
    """Megatron-LM's usual choice for one replica: its even split, 1F1B or interleaved 1F1B at the
    fastest chunk count it can run that fits the memory (the fastest of all when none fits;
    ``chunks``: only these), every stage recomputing with ``par.recompute``."""
    P, M = par.pp, par.microbatches
    train = par.training(training or TrainingConfig(runtime="megatron"))
    allowed = megatron_chunk_counts(profile, P, M)
    tries = list(chunks) if chunks else allowed
    bad = [v for v in tries if v not in allowed]
    if bad:
        raise ConfigError(f"Megatron cannot run {bad} chunks per device here (it can: {allowed}; interleaving needs "
                          "micro-batches divisible by pp and a block per chunk); choose one of those", field="chunks")
    best: tuple[tuple[bool, float], Plan] | None = None
    for v in tries:
        S = P * v
        placement = sequential_placement(P) if v == 1 else interleaved_placement(P, v)
        order = one_f_one_b_order(P, M) if v == 1 else interleaved_order(P, v, M)
        plan = Plan(P, M, megatron_partition(profile, S), placement, order,
                    {"method": "megatron", "chunks": v}, recompute=(True,) * S if par.recompute else None)
        res = simulate(plan, profile, cluster, training=train, validate=False, record_timeline=False)
        key = (not res.feasible, res.iteration_time)
        if best is None or key < best[0]:
            best = (key, plan)
    assert best is not None
    return best[1]
