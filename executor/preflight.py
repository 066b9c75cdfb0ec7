"""Pre-flight memory check of the commands that allocate real tensors on the CPU (``replay``, ``profile``).

Before any process starts, the peak host memory of every process is estimated from the model's
analytic profile (:func:`pipeline.costs.profile_from_architecture`) and the sum is compared with
what this machine has available (``MemAvailable`` of ``/proc/meminfo``). A job that would not fit
is refused with the figures and the fix (``--scale``, fewer ranks, a smaller model) instead of
being killed by the kernel's OOM killer minutes later.

The estimate, per process (all in fp32, as the CPU runs them):

* :data:`PROCESS_BYTES` for Python, torch and the executor;
* profiling (the ``profile`` command, and every rank of a ``replay`` that measures its profile):
  the whole model at :data:`BYTES_PER_PARAM` plus one layer's activations, its gradients and
  their copies (:data:`PROFILE_ACT_COPIES`);
* running a plan: the rank's stages at :data:`BYTES_PER_PARAM` plus the activations the simulator
  predicts that rank holds at its peak; ``--check`` adds a whole reference model with its SGD
  momentum (1.5 x :data:`BYTES_PER_PARAM`). A rank that profiled first adds the two: its malloc
  thresholds are pinned (:mod:`executor.host_memory`), so the heap the profile freed stays mapped.

Measured on 2 cores (max RSS of the largest process): ``profile`` of tiny-hybrid 0.35 GiB, of
nemotronh-small 5.13 GiB at scale 1 (5.3e8 parameters: 9.7 bytes each over the base) and 1.65 GiB at
scale 0.5 (10.3 bytes); ``replay`` of a 2-rank plan of nemotronh-small (megatron, 8 stages, 32 micro-batches)
8.24 GiB per rank, estimated 8.2 GiB.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.arch import Architecture
from pipeline.errors import ConfigError
from pipeline.plan import Plan
from pipeline.spec import GIB, ModelProfile

__all__ = ["PROCESS_BYTES", "BYTES_PER_PARAM", "HEADROOM", "MemoryEstimate", "available_bytes", "profile_estimate",
           "replay_estimate", "job_estimate", "check_fits", "check_job", "fitting_scale", "runs_on_gpu", "CHECKED_ENV"]

#: Python, torch, gloo and the executor in one process (max RSS of ``profile --model tiny-hybrid``).
PROCESS_BYTES = int(0.35 * GIB)
#: fp32 weights, their gradients and transient copies, per parameter (measured 9.7-10.3).
BYTES_PER_PARAM = 10.0
#: The cost model counts bf16 activations; the CPU runs fp32.
FP32_OVER_BF16 = 2.0
#: Copies of a layer's activations alive while the profiler times it (saved tensors, gradients).
PROFILE_ACT_COPIES = 3.0
#: Share of the available memory a job may plan to use (the rest: page cache, estimate error).
HEADROOM = 0.9


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of each process of a job, and what sets the peak."""

    per_process: tuple[int, ...]
    cause: str
    """e.g. ``"profiling the whole model in every rank"``."""

    @property
    def total(self) -> int:
        return sum(self.per_process)

    def describe(self) -> str:
        """``"152.6 GiB (8 ranks x up to 19.1 GiB: profiling the whole model in every rank)"``."""
        n = len(self.per_process)
        each = max(self.per_process) / GIB
        who = f"{n} ranks x up to {each:.1f} GiB: " if n > 1 else ""
        return f"{self.total / GIB:.1f} GiB ({who}{self.cause})"


def available_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes (None where there is no /proc/meminfo, e.g. macOS: no check)."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return None


def _analytic(arch: Architecture, seq_len: int, microbatch_size: int) -> ModelProfile:
    from pipeline.costs import profile_from_architecture

    return profile_from_architecture(arch, seq_len=seq_len, microbatch_size=microbatch_size)


def _profiling_bytes(profile: ModelProfile) -> int:
    """Bytes beyond :data:`PROCESS_BYTES` of profiling every layer of ``profile``'s model in one process."""
    weights = sum(x.params for x in profile.layers) * BYTES_PER_PARAM
    act = max(x.act_bytes for x in profile.layers) * FP32_OVER_BF16 * PROFILE_ACT_COPIES
    return int(weights + act)


def profile_estimate(arch: Architecture, *, seq_len: int, microbatch_size: int = 1) -> MemoryEstimate:
    """The ``profile`` command: one process that builds every layer and times them one by one."""
    profile = _analytic(arch, seq_len, microbatch_size)
    return MemoryEstimate((PROCESS_BYTES + _profiling_bytes(profile),), "the whole model's weights and gradients")


def _stage_bytes(plan: Plan, profile: ModelProfile) -> list[int]:
    """Per rank: its stages' weights and gradients plus its peak activations (fp32) as the simulator predicts."""
    from pipeline.simulator import simulate
    from pipeline.spec import Cluster, TrainingConfig

    training = TrainingConfig(bytes_per_param=BYTES_PER_PARAM, activation_scale=FP32_OVER_BF16)
    result = simulate(plan, profile, Cluster(devices=plan.devices, memory_gb=1e9), training=training)
    if result.valid:
        return [int(b) for b in result.peak_memory]
    out = [0] * plan.devices  # an order the simulator refuses: every micro-batch's activations at once
    for (start, end), device in zip(plan.partition, plan.placement):
        layers = profile.layers[start:end]
        out[device] += int(sum(x.params * BYTES_PER_PARAM + x.act_bytes * FP32_OVER_BF16 * plan.microbatches
                               for x in layers))
    return out


def replay_estimate(plan: Plan, arch: Architecture, *, seq_len: int, microbatch_size: int, measure: bool,
                    check: bool = False) -> MemoryEstimate:
    """``replay``: one rank per device of ``plan``; with ``measure`` each rank first profiles the whole
    model (all at once), then runs its stages; ``check`` adds a reference model in every rank."""
    return job_estimate([plan], arch, seq_len=seq_len, microbatch_size=microbatch_size, measure=measure, check=check)


def job_estimate(plans: Sequence[Plan], arch: Architecture, *, seq_len: int, microbatch_size: int, measure: bool,
                 check: bool = False, nproc: int | None = None) -> MemoryEstimate:
    """One ``torchrun`` job of :func:`executor.replay.run_job` (``python -m executor.launch``): one rank
    per device of ``plans`` (all for the same devices; ``nproc`` ranks when there is none); with
    ``measure`` each rank first profiles the whole model, then builds the stages of every plan (they
    are alive together: the plans are timed round-robin); ``check`` adds a reference model."""
    profile = _analytic(arch, seq_len, microbatch_size)
    world = plans[0].devices if plans else (nproc or 2)
    stages = [0] * world
    for plan in plans:
        for rank, used in enumerate(_stage_bytes(plan, profile)):
            stages[rank] += used
    whole = _profiling_bytes(profile) if measure else 0
    reference = int(1.5 * sum(x.params for x in profile.layers) * BYTES_PER_PARAM) if check else 0
    per_rank = tuple(PROCESS_BYTES + whole + s + reference for s in stages)
    parts = (["profiling the whole model in every rank"] if measure else []) + \
        ([f"the rank's stages{f' of {len(plans)} plans' if len(plans) > 1 else ''}"] if plans else []) + \
        (["a reference model for --check"] if check else [])
    return MemoryEstimate(per_rank, ", then ".join(parts) or "Python and torch")


def fitting_scale(estimate: Callable[[float], MemoryEstimate], scale: float,
                  available: int) -> tuple[float, int] | None:
    """The largest of ``scale`` x 0.7, 0.7**2, ... (two digits; down to 1/64 of it: the weights shrink
    about as its square) whose estimate fits, with its bytes."""
    s = scale
    while s > scale / 64:
        s = float(f"{s * 0.7:.2g}")
        total = estimate(s).total
        if total <= HEADROOM * available:
            return s, total
    return None


def check_fits(estimate: MemoryEstimate, *, what: str, fixes: list[str], available: int | None = None) -> None:
    """Refuse (one :class:`ConfigError` with the figures and ``fixes``) a job that would not fit in memory."""
    if available is None:
        available = available_bytes()
    if available is None or estimate.total <= HEADROOM * available:
        return
    raise ConfigError(f"{what} needs about {estimate.describe()}, and this machine has {available / GIB:.1f} GiB "
                      f"available: {'; '.join(fixes)}", field="memory")


#: Set in the environment of a job whose memory was checked before ``torchrun`` started it, so its
#: ranks (:mod:`executor.launch`) do not check again against memory their siblings already took.
CHECKED_ENV = "ADAPTIS_MEMORY_CHECKED"


def runs_on_gpu(backend: str | None) -> bool:
    """Whether the ranks run on GPUs (NCCL): their tensors then live in GPU, not host, memory."""
    if backend is not None:
        return backend == "nccl"
    import torch

    return torch.cuda.is_available()


def check_job(plans: Sequence[Plan], *, model: str, scale: float, seq_len: int, microbatch_size: int,
              measure: bool, check: bool = False, nproc: int | None = None, granularity: str = "layer",
              head_shards: int = 1, backend: str | None = None, available: int | None = None,
              ranks: Sequence[int] | None = None) -> None:
    """Refuse, before any process starts, a CPU job of ``plans`` (or, with none, ``nproc`` ranks that
    ``measure``) whose ranks would not fit in this machine's available memory (:func:`job_estimate`):
    one :class:`ConfigError` with the figures and the fixes (a ``--scale`` that fits, fewer ranks, a
    smaller model). ``ranks``: only those ranks run on this machine (a job over several nodes).
    GPU jobs (NCCL) and machines without ``/proc/meminfo`` are not checked."""
    if available is None:
        available = available_bytes()
    if available is None or runs_on_gpu(backend):
        return
    from executor.model import resolve_architecture

    def estimate(s: float) -> MemoryEstimate:
        arch = resolve_architecture(model, scale=s, granularity=granularity, head_shards=head_shards)
        found = job_estimate(plans, arch, seq_len=seq_len, microbatch_size=microbatch_size, measure=measure,
                             check=check, nproc=nproc)
        if ranks is None:
            return found
        return MemoryEstimate(tuple(found.per_process[r] for r in ranks if r < len(found.per_process)), found.cause)

    found = estimate(scale)
    if found.total <= HEADROOM * available:
        return
    fixes = []
    fit = fitting_scale(estimate, scale, available)
    if fit is not None:
        fixes.append(f"--scale {fit[0]:g} (about {fit[1] / GIB:.1f} GiB)")
    ranks = len(found.per_process)
    if ranks > 1:
        fitting = int(HEADROOM * available // max(found.per_process))
        if 1 <= fitting < ranks:
            fixes.append(f"fewer ranks ({fitting} or fewer of this size fit; this job has {ranks}: --devices or a plan "
                         "for fewer devices)")
    fixes.append("or a smaller model (--model tiny-hybrid)")
    where = f"on {ranks} CPU rank{'s' if ranks > 1 else ''}"
    what = (f"replaying {len(plans)} plan{'s' if len(plans) != 1 else ''} of {model} {where}" if plans
            else f"profiling {model} {where}")
    check_fits(found, what=what, fixes=fixes, available=available)


def checked_before_start() -> bool:
    """Whether the launcher that started this rank has checked the job's memory (:data:`CHECKED_ENV`)."""
    return os.environ.get(CHECKED_ENV) == "1"
