"""Per-layer pieces of the whole-job model that :mod:`pipeline.costs` does not price: the busiest
expert-parallel rank's MoE load, the expert-parallel all-to-all (node-limited routing, FP8
dispatch, overlap with another micro-batch's compute) and selective activation recomputation
(docs/whole-job.md)."""

from __future__ import annotations

import math
from dataclasses import replace

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import BF16, FP8, FP8_PEAK_RATIO, CostOptions, Op, PassWork
from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec

__all__ = ["COMM_SMS", "SELECTIVE_MODULES", "check_moe_knobs", "ep_all_to_all_seconds", "expert_rank_imbalance",
           "exposed_all_to_all", "fp8_options", "fp8_peak_ratio", "selective_recompute"]

#: SMs the all-to-all kernels hold while they overlap compute: DeepSeek-V3 (arXiv 2412.19437,
#: section 3.2.2) dedicates 20 of the H800's 132 SMs to communication, leaving the rest to compute.
COMM_SMS = 20
#: Bytes per element of an FP8 dispatch: the FP8 value and one fp32 scale per 128 (section 3.3.4).
_FP8_DISPATCH_BYTES = FP8 + 4 / 128


def fp8_peak_ratio(gpu: GPUSpec) -> float:
    """FP8 over bf16 dense peak of ``gpu`` (:data:`pipeline.costs.FP8_PEAK_RATIO`); a
    :class:`ConfigError` naming ``fp8`` for a GPU without FP8 tensor cores."""
    ratio = FP8_PEAK_RATIO.get(gpu.name)
    if ratio is None:
        raise ConfigError(f"{gpu.full_name} has no FP8 tensor cores (FP8 GEMMs are priced on "
                          f"{', '.join(sorted(FP8_PEAK_RATIO))}); drop fp8 or choose one of those GPUs", field="fp8")
    return ratio


def fp8_options(gpu: GPUSpec, options: CostOptions | None) -> CostOptions:
    """``options`` with FP8 linear layers (:attr:`pipeline.costs.CostOptions.fp8_linear`), refusing a
    GPU without FP8 tensor cores (:func:`fp8_peak_ratio`)."""
    fp8_peak_ratio(gpu)
    return replace(options or CostOptions(), fp8_linear=True)


def check_moe_knobs(*, fp8: object, ep_overlap: object, moe_max_nodes: object) -> None:
    """A :class:`ConfigError` naming the field and the fix when the FP8, EP-overlap or node-limit
    setting of a job is not a bool, a share from 0 to 1, or a whole number >= 0."""
    if not isinstance(fp8, bool):
        raise ConfigError(f"must be True or False, got {fp8!r}", field="fp8")
    if isinstance(ep_overlap, bool) or not isinstance(ep_overlap, (int, float)) or not 0.0 <= ep_overlap <= 1.0:
        raise ConfigError(f"must be a share from 0 to 1 of the EP all-to-all overlapped with compute (DualPipe: "
                          f"1), got {ep_overlap!r}", field="ep_overlap")
    if isinstance(moe_max_nodes, bool) or not isinstance(moe_max_nodes, int) or moe_max_nodes < 0:
        raise ConfigError(f"must be a whole number >= 0 (nodes a token's experts may span; 0: unlimited), got "
                          f"{moe_max_nodes!r}", field="moe_max_nodes")


def ep_all_to_all_seconds(*, tokens: float, hidden: int, top_k: int, ep: int, stride: int, gpu: GPUSpec,
                          gpus_per_node: int | None, rank_imbalance: float = 1.0, max_nodes: int = 0,
                          fp8: bool = False) -> float:
    """Seconds of one pass's dispatch + combine all-to-all of ``tokens`` tokens' ``top_k`` routed
    copies of ``hidden`` elements over ``ep`` ranks ``stride`` apart, on the busiest rank
    (``rank_imbalance`` times the mean rows).

    Bytes: bf16 both ways; with ``fp8`` one of the pass's two transfers is FP8 with 1x128 scales
    (DeepSeek-V3 section 3.3.4: the forward dispatch and the backward's gradient dispatch before
    the down-projection in FP8, both combines in bf16). Unlimited routing (``max_nodes`` 0,
    Megatron's alltoall dispatcher): ``(ep - 1) / ep`` of the copies on the group's link (the NIC
    when the group spans nodes). Node-limited routing (``max_nodes`` M: each token to experts on at
    most M nodes; DeepSeek-V3 section 2.1.2 and its config's ``topk_group``, Megatron-core's
    ``moe_router_group_topk`` with ``moe_router_num_groups`` = nodes): a token crosses the NIC once
    per target node other than its own, at most ``min(top_k, M) * (N - 1) / N`` copies over the
    group's ``N`` nodes (the chosen nodes uniform over them), and NVLink forwards it to the ``top_k``
    experts' GPUs inside the node (``top_k * (g - 1) / g`` copies, ``g`` members per node) at the
    same time; the slower link sets the time. Latency: one hop per transfer."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    per_elem = (_FP8_DISPATCH_BYTES if fp8 else BF16) + BF16  # dispatch + combine, bytes per element
    rows = rank_imbalance * tokens * top_k * hidden * per_elem
    nv_bw, nv_lat = gpu.nvlink_gbps * 1e9, gpu.nvlink_latency_us * 1e-6
    ib_bw, ib_lat = gpu.inter_node_gbps * 1e9, gpu.inter_node_latency_us * 1e-6
    if gpus_per_node is None or ep * stride <= gpus_per_node:
        return 2 * nv_lat + (ep - 1) / ep * rows / nv_bw
    if max_nodes <= 0:
        return 2 * ib_lat + (ep - 1) / ep * rows / ib_bw
    g = max(1, min(ep, gpus_per_node // stride))
    nodes = math.ceil(ep / g)
    ib_copies = min(top_k, max_nodes) * (nodes - 1) / nodes
    nv_copies = top_k * (g - 1) / g
    return 2 * ib_lat + max(ib_copies * rows / top_k / ib_bw, nv_copies * rows / top_k / nv_bw)


def exposed_all_to_all(a2a_s: float, compute_s: float, *, overlap: float, gpu: GPUSpec) -> float:
    """What an all-to-all of ``a2a_s`` leaves on the critical path when a share ``overlap`` of it
    runs beside ``compute_s`` of another micro-batch's compute (DualPipe, arXiv 2412.19437 section
    3.2.1; Megatron-core's ``overlap_moe_expert_parallel_comm``): the hidden part is at most the
    compute, and while it runs the communication holds :data:`COMM_SMS` of the GPU's SMs, so the
    compute beside it is slowed by that share of the hidden time."""
    hidden = min(max(0.0, overlap) * a2a_s, max(0.0, compute_s))
    tax = COMM_SMS / gpu.sm_count if gpu.sm_count > COMM_SMS else 0.0
    return a2a_s - hidden + tax * hidden

#: What ``selective`` recomputes: Megatron-core's output-discarding ``--recompute-modules``.
SELECTIVE_MODULES = ("layernorm", "moe_act")


def expert_rank_imbalance(imbalance: float, experts: int, ep: int) -> float:
    """Max/mean routed tokens of the busiest of ``ep`` expert-parallel ranks when the busiest of
    ``experts`` experts gets ``imbalance`` times the mean and the others share the rest evenly: the
    rank holding it runs ``(c + (n - 1) * (E - c) / (E - 1)) / n`` times the mean rank's rows, ``n =
    E / ep`` experts per rank (1 at ``ep = 1``, ``c`` at ``ep = E``)."""
    if ep <= 1 or experts <= 1:
        return 1.0
    c = min(float(imbalance), float(experts))
    n = experts // ep
    return (c + (n - 1) * (experts - c) / (experts - 1)) / n



def selective_recompute(arch: Architecture, layer: LayerSpec, *, tokens: int, tp: int, sequence_parallel: bool,
                        gpu: GPUSpec, fp8: bool = False) -> tuple[float, float]:
    """(bytes not saved, seconds recomputed in the backward) of selective recomputation
    (:data:`SELECTIVE_MODULES`) in one block of ``tokens`` tokens on one of ``tp`` ranks: the
    outputs of its two pre-norms (``T * h`` bf16 each, split ``tp`` ways under sequence parallelism)
    and, in an MoE block, of the experts' activation (``T * top_k * f`` bf16 over ``tp``); each
    recomputed by the kernel that made it (the norm's and the activation's forward, priced as
    :mod:`pipeline.costs` prices them). With ``fp8`` (:attr:`pipeline.costs.CostOptions.fp8_linear`)
    the tensors that were linear inputs were kept in FP8, so dropping them frees half as much (an
    MoE block's second norm output, the router's bf16 input, excepted)."""
    h = arch.hidden_size
    sp = tp if sequence_parallel and tp > 1 else 1
    ops: list[Op] = []
    freed = 0.0
    kept = FP8 if fp8 else BF16
    norms = [layer.mixer != "none", layer.ffn != "none"]
    for index, present in enumerate(norms):
        if not present:
            continue
        ops.append(Op("vector", 4.0 * tokens * h / sp, 2 * BF16 * tokens * h / sp))
        freed += (BF16 if index == 1 and layer.ffn == "moe" else kept) * tokens * h / sp
    if layer.ffn == "moe":
        rows, f = tokens * arch.num_experts_per_tok, arch.moe_intermediate_size
        width = 2 * f if arch.gated_mlp else f
        ops.append(Op("vector", 8.0 * rows * f / tp, BF16 * rows * (width + f) / tp))
        freed += kept * rows * f / tp
    return freed, PassWork(ops).seconds(gpu)
