"""The runtime a whole job is priced on, by GPU (the job search's ``--runtime``).

The ``megatron`` runtime (:data:`pipeline.runtime.RUNTIMES`) was fitted on A100s (Zero Bubble's
rows: compute scale 1.05). The whole-job model (:mod:`pipeline.parallelism`) fitted across
Megatron-Core's own H100 runs (``python -m experiments.benchmarks.published
../shared/data/published/megatron_core_h100_readme.json --fit``, ``SOURCES["h100"]`` in
experiments.benchmarks.published_job) needs compute 1.15 times the preset's roofline, so a
Megatron job on an H100-class GPU (H100, H200, H800, and B200 until measured, as published_job
does) is priced at that scale (:func:`job_runtime`); nothing else changes.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.hardware import GPUSpec, get_gpu
from pipeline.runtime import RUNTIMES, Runtime

__all__ = ["MEGATRON_H100_COMPUTE_SCALE", "H100_CLASS", "job_runtime"]

#: The ``megatron`` runtime's compute scale on H100-class GPUs: the whole-job model fitted across the
#: 9 usable rows of Megatron-Core's H100 weak-scaling table (median |error| 1.4%, docs/whole-job.md).
MEGATRON_H100_COMPUTE_SCALE = 1.15
#: GPUs that take it: the H100 source's GPUs in experiments.benchmarks.published_job (``source_of``).
H100_CLASS = ("h100", "h200", "h800", "b200")


def job_runtime(name: str, gpu: str | GPUSpec) -> str | Runtime:
    """The runtime a job on ``gpu`` is priced on: ``megatron`` on an H100-class GPU at
    :data:`MEGATRON_H100_COMPUTE_SCALE`; any other runtime, or GPU, as named."""
    if name == "megatron" and get_gpu(gpu).name in H100_CLASS:
        base = RUNTIMES["megatron"]
        return replace(base, compute_scale=MEGATRON_H100_COMPUTE_SCALE,
                       fitted_on="megatron_core_h100_readme.json, 9 rows (benchmarks.published --fit); p2p and "
                                 f"step as {base.fitted_on}")
    return name
