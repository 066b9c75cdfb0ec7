"""Models of the runtimes that execute a plan: what each one adds to the ideal event simulation.

The ideal model (:data:`IDEAL`, the simulator's rules in :mod:`pipeline.simulator`) runs every
action for its profiled time, overlaps every transfer with compute and ends the iteration at the
last action. Real runtimes differ in four ways, each one a field (or a few) of :class:`Runtime`:

* **compute under pipelining** (``compute_scale``): kernels inside a pipelined step run slower
  than the same kernels profiled alone (allocator, launch queue, NCCL's SMs);
* **per-action overhead** (``action_overhead_s``): launch and framework work of one F/I/W/B;
* **transfers that hold their devices** (``p2p_hold_share``): the zero-bubble fork's fused,
  single-communicator p2p holds both ends of a transfer for a share of its time;
* **blocking transfers** (``blocking_p2p``): Megatron-LM's 1F1B and interleaved schedules wait on
  their batched send/recv before the next compute (megatron-core 0.16.1
  ``_communicate(wait_on_reqs=True)``), so a stage's device is held until the tensor it sends has
  arrived; in the simulation the transfer moves from the link onto the sender's action;
* **the iteration boundary** (``overlap_iterations``, ``step_s``, ``optimizer_bytes_per_param``): a
  runtime that synchronises before the optimizer step (Megatron-LM: the gradient-norm all-reduce)
  ends the iteration at the last action of any device, plus the step (its memory traffic over the
  GPU's bandwidth, on the device holding the most parameters) and, with ``sums_tied_gradients``,
  the all-reduce of a tied head's gradient with the embedding's device; the zero-bubble
  runtime's post-validation lets each device start the next iteration as soon as its own step is
  done, so iterations overlap and the steady-state period, not the single iteration's makespan, is
  the time per step (simulated as the second of two back-to-back iterations).

Every field is per runtime and hardware, never per plan. Where a value was fitted, ``fitted_on``
names the data and the command that prints the fit (``python -m experiments.benchmarks.published
FILE --fit``); docs/fidelity.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import PlanError

__all__ = ["Runtime", "RUNTIMES", "IDEAL", "MEGATRON_ADAM_BYTES_PER_PARAM", "MEGATRON_H100_COMPUTE_SCALE",
           "H100_CLASS", "runtime_named"]


@dataclass(frozen=True)
class Runtime:
    """What one runtime adds to the ideal simulation (see the module docstring)."""

    name: str
    """The ``--runtime`` name."""
    description: str
    """One line for ``--help`` and docs."""
    compute_scale: float = 1.0
    """Multiplier on every profiled F/I/W/B time."""
    action_overhead_s: float = 0.0
    """Seconds added to every action, on top of the profile's own ``action_overhead``."""
    blocking_p2p: bool = False
    """The sender's device waits until its activation or gradient has arrived."""
    p2p_hold_share: float = 0.0
    """Share of each transfer between devices that holds the actions at both its ends, though the
    transfer itself overlaps compute: the Zero Bubble fork fuses a device's sends and receives into
    one ``batch_isend_irecv`` whose consumer waits on every handle of the batch, on one communicator,
    under ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (compute queues behind communication). 0: transfers cost
    their devices nothing."""
    overlap_iterations: bool = False
    """Iterations overlap across devices (zero-bubble post-validation): time per step is the
    steady-state period of back-to-back iterations."""
    step_s: float = 0.0
    """Seconds per iteration outside the pipeline besides the optimizer's own streaming (its
    synchronisation, other per-step work)."""
    optimizer_bytes_per_param: float = 0.0
    """Memory traffic of the optimizer step per parameter a device holds, bytes: the step is priced
    from the device's parameters and its GPU's memory bandwidth
    (:func:`pipeline.simulator.optimizer_step_seconds`); 0: not priced."""
    sums_tied_gradients: bool = False
    """Tied weights' gradients (an LM head tied to the embedding) are all-reduced between their
    devices after the last action (:func:`pipeline.simulator.tied_gradient_seconds`)."""
    fitted_on: str = ""
    """Where the values come from (empty: nothing fitted)."""
    analytic_compute_scales: tuple[tuple[str, float], ...] = ()
    """``compute_scale`` by GPU preset for profiles the cost model priced (``extra["source"] ==
    "analytic"``): where the codebase was fitted against the preset's roofline on that GPU rather
    than against profiled kernels (Megatron on H100-class GPUs). Other GPUs and profiled times keep
    ``compute_scale`` (:meth:`compute_scale_for`)."""

    def compute_scale_for(self, profile: Any) -> float:
        """The compute scale of ``profile``'s times on this runtime (see ``analytic_compute_scales``)."""
        if not self.analytic_compute_scales:
            return self.compute_scale
        extra = getattr(profile, "extra", None) or {}
        if extra.get("source") == "analytic":
            gpu = extra.get("gpu")
            for name, scale in self.analytic_compute_scales:
                if name == gpu:
                    return scale
        return self.compute_scale


#: Megatron-LM's mixed-precision Adam (megatron-core 0.16.1 ``Float16OptimizerWithFloat16Params``, no
#: distributed optimizer) per parameter: the fp32 main weight, its fp32 gradient and the two moments
#: read (16 bytes) and the weight and moments written (12), the bf16 model weight written from the
#: fp32 one just updated (2) and the gradient buffer zeroed (4): 34 bytes, streamed at the GPU's
#: achievable bandwidth. A count from the code, not a fit.
MEGATRON_ADAM_BYTES_PER_PARAM = 34.0

#: The Zero Bubble paper's runtime (a Megatron-LM fork) on A100 SXM 80GB, fitted once across the 65
#: rows of shared/data/published/zero_bubble_qi2024_dev.json and zero_bubble_qi2024_dev_more.json
#: (Tables 4, 6, 7, 10, 11, 12: 8- and 16-GPU pipelines, ZB-V, other micro-batch sizes) with the
#: authors' own profiled stage times, ranking first (``python -m experiments.benchmarks.published
#: --all ../shared/data/published/ --fit --workers 2``: 93 of 93 pairs ranked as measured, median
#: 0.9%, max 5.1%, 160 grid points): the same four numbers for every row, schedule and model, with
#: the NIC share of :data:`experiments.benchmarks.published.NIC_EFFICIENCY` (the optimizer's bytes
#: are counted). ZB-1p / ZB-2p rows run the fork's own greedy order (:mod:`pipeline.zb_greedy`);
#: fitted on our list-scheduled orders before 6 Dec the values were 1.04 / 0.1 ms / 0.2.
#: ``p2p_hold_share`` acts on ``zb`` / ``zb-sync`` only (Megatron's blocking p2p holds the whole
#: transfer); without it (0.0, compute scale 1.03) ZB-V ranked above ZB-2p in Table 6's three groups.
#:
#: On H100-class GPUs an analytic profile is priced at :data:`MEGATRON_H100_COMPUTE_SCALE` instead:
#: the whole-job model fitted across Megatron-Core's own H100 weak-scaling runs
#: (``python -m experiments.benchmarks.published ../shared/data/published/megatron_core_h100_readme.json
#: --fit``, ``SOURCES["h100"]`` in experiments.benchmarks.published_job: 9 rows, median 1.3%) needs
#: compute 1.15 times the H100 preset's roofline. The same number prices every Megatron-family runtime
#: (megatron, zb, zb-sync) there, in the pipeline search and the job search alike; profiled times and
#: other GPUs keep the A100 fit (the A100 preset itself is fitted to the authors' profiled times).
MEGATRON_H100_COMPUTE_SCALE = 1.15
#: GPUs that take it: the H100 source's GPUs (experiments.benchmarks.published_job ``source_of``; B200
#: until measured).
H100_CLASS = ("h100", "h200", "h800", "b200")
_A100_FIT = dict(compute_scale=1.05, action_overhead_s=0.0, step_s=0.0, p2p_hold_share=0.2,
                 optimizer_bytes_per_param=MEGATRON_ADAM_BYTES_PER_PARAM, sums_tied_gradients=True,
                 analytic_compute_scales=tuple((gpu, MEGATRON_H100_COMPUTE_SCALE) for gpu in H100_CLASS))
_A100_SOURCE = ("Zero Bubble (Qi et al. 2024) Tables 4, 6, 7, 10-12, A100, authors' profiled stage times; "
                "benchmarks.published --all --fit; analytic profiles on H100-class GPUs: Megatron-Core's "
                "H100 table (megatron_core_h100_readme.json --fit)")

def _torchtitan_fit() -> dict:
    """torchtitan on H100 (:data:`pipeline.torchtitan_model.TITAN_FITS`): its fitted bf16 matmul
    efficiency against the H100 preset's as the compute scale of an analytic profile, and AdamW's bytes."""
    from pipeline.hardware import get_gpu
    from pipeline.torchtitan_model import ADAMW_BYTES_PER_PARAM, TITAN_FITS
    fit = TITAN_FITS["h100"]
    return dict(compute_scale=round(get_gpu("h100").matmul_efficiency / fit.matmul_efficiency, 3),
                optimizer_bytes_per_param=ADAMW_BYTES_PER_PARAM, fitted_on=fit.fitted_on)


IDEAL = Runtime("ideal", "the performance model alone: profiled times, transfers overlap compute, no step cost")

RUNTIMES: dict[str, Runtime] = {
    r.name: r for r in (
        IDEAL,
        Runtime("megatron", "Megatron-LM 1F1B/interleaved: blocking p2p, synchronised optimizer step",
                blocking_p2p=True, fitted_on=_A100_SOURCE, **_A100_FIT),
        Runtime("zb", "the zero-bubble runtime: overlapped p2p, post-validation lets iterations overlap",
                overlap_iterations=True, fitted_on=_A100_SOURCE, **_A100_FIT),
        Runtime("zb-sync", "the zero-bubble runtime with an all-reduce before the optimizer step",
                fitted_on=_A100_SOURCE, **_A100_FIT),
        Runtime("pytorch", "torch.distributed.pipelining's _PipelineScheduleRuntime (our executor, "
                "torchtitan): isend waited at the end of the step, overheads from the profile"),
        Runtime("torchtitan", "torchtitan on H100 (torch.distributed.pipelining + FSDP2): the pytorch runtime "
                "at torchtitan's fitted compute speed, AdamW step priced (docs/torchtitan.md)", **_torchtitan_fit()),
    )
}


def runtime_named(name: str | Runtime) -> Runtime:
    """The runtime called ``name`` (a :class:`Runtime` is returned as it is: calibration tries its own
    values); a PlanError naming the choices otherwise."""
    if isinstance(name, Runtime):
        return name
    try:
        return RUNTIMES[name]
    except KeyError:
        raise PlanError(f"unknown runtime {name!r}; use one of {', '.join(RUNTIMES)}", field="runtime") from None
