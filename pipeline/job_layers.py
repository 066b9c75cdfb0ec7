"""Per-layer pieces of the whole-job model that :mod:`pipeline.costs` does not price: the busiest
expert-parallel rank's MoE load and selective activation recomputation (docs/whole-job.md)."""

from __future__ import annotations

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import BF16, Op, PassWork
from pipeline.hardware import GPUSpec

__all__ = ["SELECTIVE_MODULES", "expert_rank_imbalance", "selective_recompute"]

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
                        gpu: GPUSpec) -> tuple[float, float]:
    """(bytes not saved, seconds recomputed in the backward) of selective recomputation
    (:data:`SELECTIVE_MODULES`) in one block of ``tokens`` tokens on one of ``tp`` ranks: the
    outputs of its two pre-norms (``T * h`` bf16 each, split ``tp`` ways under sequence parallelism)
    and, in an MoE block, of the experts' activation (``T * top_k * f`` bf16 over ``tp``); each
    recomputed by the kernel that made it (the norm's and the activation's forward, priced as
    :mod:`pipeline.costs` prices them)."""
    h = arch.hidden_size
    sp = tp if sequence_parallel and tp > 1 else 1
    ops: list[Op] = []
    freed = 0.0
    norms = int(layer.mixer != "none") + int(layer.ffn != "none")
    for _ in range(norms):
        ops.append(Op("vector", 4.0 * tokens * h / sp, 2 * BF16 * tokens * h / sp))
        freed += BF16 * tokens * h / sp
    if layer.ffn == "moe":
        rows, f = tokens * arch.num_experts_per_tok, arch.moe_intermediate_size
        width = 2 * f if arch.gated_mlp else f
        ops.append(Op("vector", 8.0 * rows * f / tp, BF16 * rows * (width + f) / tp))
        freed += BF16 * rows * f / tp
    return freed, PassWork(ops).seconds(gpu)
