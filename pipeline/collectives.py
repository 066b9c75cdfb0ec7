"""Collectives of a group of ranks on a GPU preset's links: the group's link, and NCCL's ring,
tree and PAT algorithms with their per-step latency, for the whole-job model
(:mod:`pipeline.parallelism`, docs/whole-job.md)."""

from __future__ import annotations

import math

from pipeline.hardware import GPUSpec

__all__ = ["GRAD_BUCKET_PARAMS", "GRAD_BUCKET_PARAMS_PER_RANK", "bucket_params", "collective_seconds",
           "gradient_buckets", "group_link"]

#: Megatron-core's gradient bucket (``DistributedDataParallel``'s ``bucket_size``: ``max(40M, 1M *
#: dp)`` parameters, megatron/core/distributed/distributed_data_parallel.py); the last one is
#: reduced after the backward, never overlapped.
GRAD_BUCKET_PARAMS = 40_000_000
GRAD_BUCKET_PARAMS_PER_RANK = 1_000_000


def group_link(size: int, stride: int, *, gpu: GPUSpec, gpus_per_node: int | None) -> tuple[float, float]:
    """(bytes/s, latency s) of a group of ``size`` ranks ``stride`` apart: NVLink when it fits in a node."""
    if gpus_per_node is None or size * stride <= gpus_per_node:
        return gpu.nvlink_gbps * 1e9, gpu.nvlink_latency_us * 1e-6
    return gpu.inter_node_gbps * 1e9, gpu.inter_node_latency_us * 1e-6


#: NCCL's algorithms by collective: all-reduce as a ring or a (double binary) tree; reduce-scatter
#: and all-gather as a ring, or with one rank per node as PAT (NCCL 2.23's Parallel Aggregated
#: Trees, log-depth like the tree).
_ALGORITHMS = {"all_reduce": ("ring", "tree"), "reduce_scatter": ("ring", "pat"), "all_gather": ("ring", "pat")}


def collective_seconds(nbytes: float, size: int, stride: int, *, gpu: GPUSpec, gpus_per_node: int | None,
                       kind: str = "all_reduce", buckets: int = 1) -> float:
    """Seconds of a ``kind`` collective of ``nbytes`` per rank over ``size`` ranks ``stride`` apart,
    issued as ``buckets`` collectives (Megatron's gradient buckets), at the faster of NCCL's algorithms
    (:data:`_ALGORITHMS`; PAT only with one rank per node), as NCCL picks by size. Hierarchical:
    ``k`` members of the group in a node (NVLink, latency ``a_nv``), ``N`` nodes (the NIC, latency
    ``a_ib``); every GPU of a node runs its own group's collective at once, so each gets its NIC's
    share of the node's NICs (the presets' one per GPU). Per-bucket latency (NCCL's tuning model,
    ``src/graph/tuning.cc``: a hop's latency per step): ring ``(k - 1) a_nv + (N - 1) a_ib`` per phase,
    tree and PAT ``log2(k) a_nv + log2(N) a_ib`` per phase (all-reduce: two phases). Bandwidth: the
    ring moves ``(n-1)/n`` of the data per phase and level (inter-node on a ``1/k`` share), the trees
    all of it."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    phases = 2.0 if kind == "all_reduce" else 1.0
    nv_bw, nv_lat = gpu.nvlink_gbps * 1e9, gpu.nvlink_latency_us * 1e-6
    ib_bw, ib_lat = gpu.inter_node_gbps * 1e9, gpu.inter_node_latency_us * 1e-6
    if gpus_per_node is None or size * stride <= gpus_per_node:
        k, nodes = size, 1
    else:
        k = max(1, min(size, gpus_per_node // stride))
        nodes = math.ceil(size / k)
    best = math.inf
    for algo in _ALGORITHMS[kind]:
        if algo == "pat" and not (k == 1 and nodes > 1):
            continue
        if algo == "ring":
            share = (k - 1) / k * nbytes / nv_bw + (nodes - 1) / nodes * (nbytes / k) / ib_bw
            steps = (k - 1) * nv_lat + (nodes - 1) * ib_lat
        else:
            share = (nbytes / nv_bw if k > 1 else 0.0) + (nbytes / k / ib_bw if nodes > 1 else 0.0)
            steps = math.ceil(math.log2(k)) * nv_lat + math.ceil(math.log2(nodes)) * ib_lat
        best = min(best, phases * (share + max(1, buckets) * steps))
    return best


def gradient_buckets(params: float, group: int) -> int:
    """Megatron-core's gradient buckets over ``params`` in a data-parallel group of ``group`` ranks."""
    return max(1, math.ceil(params / bucket_params(group)))


def bucket_params(group: int) -> int:
    """Parameters in one of Megatron-core's gradient buckets: ``max(40M, 1M * dp)``."""
    return max(GRAD_BUCKET_PARAMS, GRAD_BUCKET_PARAMS_PER_RANK * group)
