"""The ``cpu`` preset's figures beside what one thread of this machine's torch measures.

The ``cpu`` GPU preset (:mod:`pipeline.hardware`) prices the zoo's tiny models for comparison with
what the executor's profiler measures on a CPU rank. This prints, side by side, the preset's
matmul rate and memory bandwidth and the rates measured here (one torch thread, medians):

* an fp32 GEMM of the tiny models' shapes (128 tokens x 64 x 8192: the head);
* an element-wise op on 1-64 MB tensors, writing into a preallocated output (as gradient
  accumulation and the optimizer do) and allocating its output (as eager forward ops do).

  python -m experiments.benchmarks.cpu_preset
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pipeline.hardware import get_gpu

__all__ = ["main"]


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    spec = get_gpu("cpu")
    a, b = torch.randn(128, 64), torch.randn(64, 8192)
    gemm = 2 * 128 * 64 * 8192 / _median_seconds(lambda: a @ b, 30)
    print(f"matmul   preset {spec.matmul_flops_per_s / 1e9:7.1f} GFLOP/s   measured {gemm / 1e9:7.1f} GFLOP/s "
          "(128 x 64 x 8192 fp32)")
    print(f"memory   preset {spec.memory_bytes_per_s / 1e9:7.1f} GB/s")
    for mb in (1, 4, 16, 64):
        x = torch.randn(mb * (1 << 20) // 4)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 4
        in_place = nbytes / _median_seconds(lambda x=x, y=y: torch.mul(x, 2.0, out=y), 15)
        allocating = nbytes / _median_seconds(lambda x=x: x * 2.0, 15)
        print(f"  {mb:3d} MB  measured {in_place / 1e9:7.1f} GB/s into a preallocated output, "
              f"{allocating / 1e9:6.1f} GB/s allocating it")


if __name__ == "__main__":
    main()
