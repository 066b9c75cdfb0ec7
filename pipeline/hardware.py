"""GPU presets and a cluster builder.

Numbers are the vendors' data-sheet figures for the SXM parts (dense bf16, no sparsity):

* A100-SXM4-80GB: 312 TFLOPS bf16, 2.039 TB/s HBM2e, NVLink 3 600 GB/s both ways, HDR 200 Gb/s NIC per GPU.
* H100-SXM5-80GB: 989 TFLOPS bf16, 3.35 TB/s HBM3, NVLink 4 900 GB/s both ways, NDR 400 Gb/s NIC per GPU.
* H200-SXM-141GB: H100 compute, 4.8 TB/s HBM3e, 141 GB, the same links.
* H800-SXM-80GB: H100 compute and memory, NVLink cut to 400 GB/s both ways (200 one way); DeepSeek-V3's
  cluster (arXiv 2412.19437, section 3.1) pairs each GPU with a 400 Gb/s InfiniBand NIC (8 x 400 Gb/s
  per node).
* B200-SXM-180GB (HGX/DGX B200, 1000 W): 2.25 PFLOPS dense bf16 (the data sheet's 4.5 PFLOPS is with
  2:4 sparsity; DGX B200's 72 PFLOPS FP8 training over 8 GPUs, halved for sparsity and again for bf16),
  8 TB/s HBM3e, 180 GB per GPU in DGX B200 (1,440 GB over 8; 192 GB of HBM3e stacks are fitted),
  NVLink 5 1.8 TB/s both ways, a ConnectX-7 400 Gb/s NIC per GPU, 75 TFLOPS fp32, 148 SMs.

GEMM shape efficiency (:meth:`GPUSpec.gemm_efficiency`): a GEMM producing an ``m x n`` output over a
reduction of ``k`` reaches ``matmul_efficiency * mn / (mn + gemm_half_mn) * k / (k + gemm_half_k)``
of the peak. ``gemm_half_mn`` is half a 128 x 128 output tile per SM (``sm_count * 8192``): with fewer
output tiles than SMs a GEMM cannot fill the GPU (tile and wave quantisation, smoothed);
``gemm_half_k`` = 64, one 64-deep main-loop stage, stands for the prologue and epilogue a short
reduction cannot hide. Both are stated, not fitted: on A100 they give a square 1024 GEMM ~51% of
the large-GEMM rate and a 2048 one ~80%, below the curves of cuBLAS benchmarks by a few points, and
leave the layers of large models (``m = b*s`` >= 2048, ``h`` >= 4096) within 4-11% of it.

``nvlink_gbps`` and ``inter_node_gbps`` are GB/s in one direction per GPU, the unit of
:attr:`pipeline.spec.Cluster.p2p_gbps`.

Memory: ``memory_gb`` is the data sheet's figure in GB; clusters use ``memory_gib``, the capacity
``nvidia-smi`` reports in MiB over 1024 (A100-SXM4-80GB 81920 MiB = 80.0 GiB; H100/H800 "80GB"
81559 MiB = 79.6 GiB; H200 "141GB" 143771 MiB = 140.4 GiB; B200 183359 MiB = 179.1 GiB, as B200
systems report it, not checked here), less ``memory_reserve_gb`` for the
CUDA context, NCCL and fragmentation (:data:`pipeline.spec.DEFAULT_MEMORY_RESERVE_GB`).

Efficiency factors (what share of the peak a well-shaped kernel reaches): large bf16 GEMMs reach
about 75-80% of peak on A100 and 65-75% on H100/H200 in cuBLAS benchmarks, and streaming kernels about
80-90% of HBM bandwidth. The presets use the conservative ends (0.65 / 0.8): they stand for the
mix of GEMM shapes in a layer, not for the best one. The A100's matmul efficiency (0.8) and its
``elementwise_traffic`` (2.0) are fitted to published A100 runs (the comment at its entry;
docs/cost-model.md, "A100 fit").
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.spec import DEFAULT_MEMORY_RESERVE_GB, Cluster

__all__ = ["GPUSpec", "GPUS", "ALIASES", "get_gpu", "gpu_names", "build_cluster"]


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: peak rates, memory and links."""

    name: str
    """Canonical short name, e.g. ``h100``."""
    full_name: str
    """Marketing name, e.g. ``H100-SXM5-80GB``."""
    peak_bf16_tflops: float
    """Dense bf16 tensor-core peak, TFLOPS."""
    hbm_tbps: float
    """HBM bandwidth, TB/s."""
    memory_gb: float
    """Device memory on the data sheet, GB (10**9 bytes, as marketed); not used for limits."""
    nvlink_gbps: float
    """Intra-node GPU-to-GPU bandwidth, GB/s in one direction."""
    inter_node_gbps: float
    """Inter-node bandwidth per GPU (its NIC), GB/s in one direction."""
    vector_tflops: float
    """Non-tensor-core fp32 peak, TFLOPS: the rate of element-wise and scan arithmetic."""
    matmul_efficiency: float = 0.65
    """Share of ``peak_bf16_tflops`` that the layer's matmuls (and attention/SSD cores) achieve."""
    memory_efficiency: float = 0.8
    """Share of ``hbm_tbps`` that streaming (element-wise, gather, reduction) kernels achieve."""
    kernel_overhead_us: float = 4.0
    """Fixed cost of one kernel (launch + tail), microseconds; dominates only for tiny layers."""
    nvlink_latency_us: float = 5.0
    inter_node_latency_us: float = 10.0
    memory_gib: float | None = None
    """Capacity the device reports, GiB (2**30 bytes): the cluster's ``memory_gb``. None: ``memory_gb``."""
    memory_reserve_gb: float = DEFAULT_MEMORY_RESERVE_GB
    """GiB per device a plan may not use (CUDA context, NCCL, fragmentation): the cluster's reserve."""
    sm_count: int = 0
    """Streaming multiprocessors; 0: no shape-dependent GEMM efficiency (the rate is ``matmul_efficiency``)."""
    gemm_half_k: float = 64.0
    """Reduction depth at which the k term of :meth:`gemm_efficiency` halves."""
    elementwise_traffic: float = 1.0
    """Multiplier on the bytes of a block's per-token element-wise kernels (norms, residual adds, RoPE,
    the MLP activation: ops tagged ``"elementwise"`` in :mod:`pipeline.costs`), which the cost model
    counts as fused kernels do: what a codebase moves beyond that count (unfused bias adds, dropout,
    layout copies, fp32 norm internals). 1: the fused count."""

    @property
    def gemm_half_mn(self) -> float:
        """Output elements (``m * n``) at which the occupancy term of :meth:`gemm_efficiency`
        halves: half a 128 x 128 tile per SM."""
        return self.sm_count * 8192.0

    def gemm_efficiency(self, mn: float, k: float) -> float:
        """Share of the achievable matmul rate a GEMM with ``mn`` output elements and reduction
        depth ``k`` reaches (1 for unknown shapes or a preset without ``sm_count``)."""
        if self.sm_count <= 0 or mn <= 0 or k <= 0:
            return 1.0
        return mn / (mn + self.gemm_half_mn) * k / (k + self.gemm_half_k)

    @property
    def capacity_gib(self) -> float:
        """Device memory in GiB, as ``nvidia-smi`` and ``torch.cuda`` count it."""
        return self.memory_gib if self.memory_gib is not None else self.memory_gb

    @property
    def matmul_flops_per_s(self) -> float:
        """Achievable matmul rate, FLOP/s."""
        return self.peak_bf16_tflops * 1e12 * self.matmul_efficiency

    @property
    def vector_flops_per_s(self) -> float:
        """Achievable element-wise rate, FLOP/s (the matmul efficiency applied to the fp32 vector peak)."""
        return self.vector_tflops * 1e12 * self.matmul_efficiency

    @property
    def memory_bytes_per_s(self) -> float:
        """Achievable HBM bandwidth, bytes/s."""
        return self.hbm_tbps * 1e12 * self.memory_efficiency

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a matmul is compute-bound."""
        return self.matmul_flops_per_s / self.memory_bytes_per_s


GPUS: dict[str, GPUSpec] = {
    # matmul_efficiency and elementwise_traffic FITTED (6 Dec 2026; were 0.75 stated and 1), jointly
    # across both published A100 sources, never per row: the Zero Bubble authors' profiled middle-stage
    # T_F/T_B/T_W (zero_bubble_qi2024_dev.json, zero_bubble_qi2024_dev_more.json; Table 9, 6 profiles)
    # and Narayanan et al. 2021's 10 Megatron-LM rows (megatron_narayanan2021.json, with that source's
    # compute scale and step refitted: experiments.benchmarks.published_job.SOURCES). Reproduce:
    # `python -m experiments.benchmarks.stage_times --fit --workers 2` (docs/cost-model.md, "A100 fit").
    # Both A100 sources ran Megatron-LM's legacy GPT (fp16, LayerNorm, biases, dropout, attention
    # without FlashAttention), so the element-wise factor stands for that codebase on this GPU; the
    # other presets keep 1. The grid stops at 0.8, the top of cuBLAS's large-GEMM range above.
    "a100": GPUSpec("a100", "A100-SXM4-80GB", peak_bf16_tflops=312.0, hbm_tbps=2.039, memory_gb=80.0,
                    nvlink_gbps=300.0, inter_node_gbps=25.0, vector_tflops=19.5, matmul_efficiency=0.8,
                    memory_gib=80.0, sm_count=108, elementwise_traffic=2.0),
    "h100": GPUSpec("h100", "H100-SXM5-80GB", peak_bf16_tflops=989.0, hbm_tbps=3.35, memory_gb=80.0,
                    nvlink_gbps=450.0, inter_node_gbps=50.0, vector_tflops=67.0, memory_gib=79.6,
                    sm_count=132),
    "h200": GPUSpec("h200", "H200-SXM-141GB", peak_bf16_tflops=989.0, hbm_tbps=4.8, memory_gb=141.0,
                    nvlink_gbps=450.0, inter_node_gbps=50.0, vector_tflops=67.0, memory_gib=140.4,
                    sm_count=132),
    "h800": GPUSpec("h800", "H800-SXM5-80GB", peak_bf16_tflops=989.0, hbm_tbps=3.35, memory_gb=80.0,
                    nvlink_gbps=200.0, inter_node_gbps=50.0, vector_tflops=67.0, memory_gib=79.6,
                    sm_count=132),
    # matmul efficiency not measured on a B200: the H100 class's 0.65 until gpu_check runs on one
    "b200": GPUSpec("b200", "B200-SXM-180GB", peak_bf16_tflops=2250.0, hbm_tbps=8.0, memory_gb=180.0,
                    nvlink_gbps=900.0, inter_node_gbps=50.0, vector_tflops=75.0, memory_gib=179.1,
                    sm_count=148),
    # One x86 core running fp32 torch, for comparing analytic costs with what the executor's profiler
    # measures on a CPU rank. Calibrated on the 2-core development machine (one thread): a 512^3
    # matmul ran at ~100 GFLOP/s, an eager op cost ~3 us (more with autograd bookkeeping, hence
    # 10 us); gloo between two local ranks ~3 GB/s. Memory: 20 GB/s, re-measured on 5 Dec 2026 for
    # the zoo's tiny models (`python -m experiments.benchmarks.cpu_preset`): an element-wise op
    # streams 20-25 GB/s on 16-64 MB tensors (more on the 1-4 MB that stay in cache); only an op
    # that maps fresh memory for a 64 MB output falls to ~4 GB/s, the figure the preset had. That
    # 5 GB/s made the tiny models' head 2.5x and their embedding 5x slower than the profiler measures.
    "cpu": GPUSpec("cpu", "x86 core (fp32, 1 thread)", peak_bf16_tflops=0.1, hbm_tbps=0.02, memory_gb=16.0,
                   nvlink_gbps=3.0, inter_node_gbps=1.0, vector_tflops=0.005, matmul_efficiency=0.6,
                   memory_efficiency=0.8, kernel_overhead_us=10.0, memory_reserve_gb=0.0),
}

#: Other spellings accepted by :func:`get_gpu` (compared lower-case, ``_`` and spaces as ``-``).
ALIASES: dict[str, str] = {
    "a100-80gb": "a100", "a100-sxm": "a100", "a100-sxm4": "a100", "a100-sxm4-80gb": "a100",
    "a100-sxm-80gb": "a100",
    "h100-80gb": "h100", "h100-sxm": "h100", "h100-sxm5": "h100", "h100-sxm-80gb": "h100",
    "h100-sxm5-80gb": "h100",
    "h200-141gb": "h200", "h200-sxm": "h200", "h200-sxm-141gb": "h200",
    "h800-80gb": "h800", "h800-sxm": "h800", "h800-sxm5": "h800", "h800-sxm-80gb": "h800",
    "h800-sxm5-80gb": "h800",
    "b200-180gb": "b200", "b200-sxm": "b200", "b200-sxm-180gb": "b200", "b200-192gb": "b200",
    "dgx-b200": "b200", "hgx-b200": "b200",
}


def gpu_names() -> list[str]:
    """Canonical preset names."""
    return sorted(GPUS)


def get_gpu(gpu: str | GPUSpec) -> GPUSpec:
    """The preset named ``gpu`` (case-insensitive; aliases such as ``H100-SXM-80GB``), or ``gpu`` itself."""
    if isinstance(gpu, GPUSpec):
        return gpu
    key = str(gpu).strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key not in GPUS:
        raise ConfigError(f"unknown GPU {gpu!r}; known: {', '.join(gpu_names())} "
                          f"(aliases: {', '.join(sorted(ALIASES))})", field="gpu")
    return GPUS[key]


def build_cluster(gpu: str | GPUSpec = "h100", *, devices: int, gpus_per_node: int | None = 8,
                  memory_gb: float | None = None, memory_reserve_gb: float | None = None,
                  name: str | None = None) -> Cluster:
    """A homogeneous cluster of ``devices`` GPUs, ``gpus_per_node`` to a node (None: one node).

    Within a node stages talk over NVLink (``p2p_gbps``); across nodes over the GPU's NIC.
    Memory per device: ``memory_gb`` GiB (default the preset's :attr:`GPUSpec.capacity_gib`), of
    which ``memory_reserve_gb`` (default the preset's) is kept off-limits.
    """
    spec = get_gpu(gpu)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"must be a whole number >= 1, got {devices!r}", field="devices")
    if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                      or gpus_per_node < 1):
        raise ConfigError(f"must be a whole number >= 1, got {gpus_per_node!r}", field="gpus_per_node")
    return Cluster(
        devices=devices,
        memory_gb=memory_gb if memory_gb is not None else spec.capacity_gib,
        memory_reserve_gb=memory_reserve_gb if memory_reserve_gb is not None else spec.memory_reserve_gb,
        p2p_gbps=spec.nvlink_gbps,
        latency_us=spec.nvlink_latency_us,
        gpus_per_node=gpus_per_node,
        inter_node_gbps=spec.inter_node_gbps,
        inter_node_latency_us=spec.inter_node_latency_us,
        name=name or f"{spec.name}x{devices}",
        extra={"gpu": spec.name},
    )


def memory_bandwidth(cluster: Cluster) -> float | None:
    """Achievable memory bandwidth of one of the cluster's devices, bytes/s: its GPU preset's
    (:attr:`GPUSpec.memory_bytes_per_s`, named by the cluster's ``gpu`` field, as
    :func:`build_cluster` and the cluster files it writes carry it); None for a cluster without one
    (a measured CPU cluster, a hand-written file)."""
    name = cluster.extra.get("gpu")
    if not isinstance(name, str) or name.lower() not in GPUS:
        return None
    return GPUS[name.lower()].memory_bytes_per_s
