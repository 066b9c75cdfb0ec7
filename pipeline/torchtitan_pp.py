"""torchtitan with pipeline parallelism: torch.distributed.pipelining's 1F1B / Interleaved1F1B around FSDP2.

The block, head and collective prices are :mod:`pipeline.torchtitan_model`'s; this module turns
them into a per-layer profile of one micro-batch and simulates one pipeline replica under the
``torchtitan`` runtime (:data:`pipeline.runtime.RUNTIMES`), with what torchtitan's FSDP does
under PP:

* ``reshard_after_forward`` off (torchtitan's default with PP): a stage's parameters are gathered
  once, in its first micro-batch's forward (exposed beyond that forward), kept unsharded, and its
  gradients kept unsharded (accumulated in fp32, FSDP2's ``reduce_dtype``) until the last
  micro-batch's backward, whose reduce-scatters are exposed beyond that backward;
* ``reshard_after_forward`` on: every micro-batch gathers each block for its forward and again for
  its backward (exposed beyond the block's compute, as without PP).

Layers split as evenly as they can over the ``pp * chunks`` stages (the first take one more),
the embedding on the first, the output layer on the last; Interleaved1F1B places stage ``c * pp + d`` on rank ``d``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, build_cluster, get_gpu
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, interleaved_placement, sequential_placement
from pipeline.runtime import RUNTIMES
from pipeline.simulator import Result, simulate
from pipeline.spec import Cluster, LayerCost, ModelProfile, TrainingConfig
from pipeline.torchtitan_model import (
    ADAMW_BYTES_PER_PARAM,
    TitanFit,
    TitanJob,
    TitanModel,
    TitanStep,
    activation_bytes_per_token,
    block_seconds,
    fsdp_block_seconds,
    head_seconds,
    memory_parts,
    replay_bytes,
    titan_fit_for,
)

__all__ = ["titan_pp_profile", "titan_pp_plan", "titan_pp_step", "titan_pp_run", "titan_pp_cluster", "TitanRun",
           "TITAN_PP_TRAINING", "inflight_microbatches", "titan_pp_memory"]

#: The simulation's settings: the torchtitan runtime with its compute and optimizer left to the
#: profile and :func:`titan_pp_run` (the profile is priced at torchtitan's fit), 18 bytes per
#: profile parameter (the profile's ``params`` are byte-equivalents of torchtitan's memory).
TITAN_PP_TRAINING = TrainingConfig(runtime=replace(RUNTIMES["torchtitan"], compute_scale=1.0,
                                                   optimizer_bytes_per_param=0.0), zero_stage=0)


def titan_pp_profile(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100",
                     fit: TitanFit | None = None) -> ModelProfile:
    """Per-layer seconds (ms) of one micro-batch on one rank: embedding, blocks, output layer. Its
    ``params`` and ``act_bytes`` carry torchtitan's memory (:data:`TITAN_PP_TRAINING`'s bytes per
    parameter): a layer's ``params`` is the count whose 18 bytes are its sharded fp32 state, its
    unsharded bf16 weights and fp32 gradients (under PP without resharding) and, on the output
    layer, its gathered buffers; ``act_bytes`` what one micro-batch saves (the output layer: the
    logits with the loss's fp32 copies), all times ``memory_reserved_factor``. The real counts are
    in ``extra["params"]``."""
    spec = get_gpu(gpu)
    fit = fit or titan_fit_for(spec)
    mb = job.local_batch // job.microbatches
    bt = block_seconds(model, job, fit, gpu=spec, microbatch=mb)
    ag, rs = fsdp_block_seconds(model, job, fit, gpu=spec, params=model.block_params)
    f, b = bt.forward, bt.backward + bt.recompute
    if job.reshards:  # gathered per micro-batch for F and again for the backward
        f += max(0.0, ag - bt.forward)
        b += max(0.0, ag - b)
    f += bt.tp_exposed / 3 + bt.ring_exposed / 3
    b += 2 * bt.tp_exposed / 3 + 2 * bt.ring_exposed / 3
    T = mb * job.seq_len // job.cp
    out = int(2 * T * model.hidden / job.tp)
    reserved = fit.memory_reserved_factor
    per_param = 16.0 / job.fsdp_ranks + (0.0 if job.reshards else 6.0)  # bytes per parameter on its TP rank

    def held(params: float, extra_bytes: float = 0.0) -> int:
        return int(round(reserved * (params / job.tp * per_param + extra_bytes) / TITAN_PP_TRAINING.param_bytes))

    act = int(reserved * T * activation_bytes_per_token(model, job))
    blocks = [LayerCost(f"layer{i}", "attention", f * 1e3, b * 1e3, 0.0, held(model.block_params), act, out,
                        extra={"params": model.block_params})
              for i in range(model.layers)]
    head = head_seconds(model, job, fit, gpu=spec, microbatch=mb)
    vh = model.vocab * model.hidden
    logits = int(reserved * T * model.vocab / job.tp * (2.0 + 4.0 + 4.0))  # bf16 logits, fp32 upcast, fp32 grad
    return ModelProfile(
        name=f"{model.name}-torchtitan", time_unit="ms", seq_len=job.seq_len // job.cp, microbatch_size=mb,
        layers=(LayerCost("embed", "embedding", 0.0, 0.0, 0.0, held(vh), 0, out, extra={"params": vh}),
                *blocks, LayerCost("head", "head", head / 3 * 1e3, 2 * head / 3 * 1e3, 0.0,
                                   held(vh, vh / job.tp * 6.0), logits, 0, extra={"params": vh})))


def titan_pp_plan(profile: ModelProfile, job: TitanJob) -> Plan:
    """torchtitan's even split and its 1F1B or Interleaved1F1B order for one replica."""
    P, M = job.pp, job.microbatches
    v = job.chunks if job.schedule == "Interleaved1F1B" else 1
    S = P * v
    blocks = len(profile.layers) - 2
    if blocks < S:
        raise ConfigError(f"{blocks} layers for {S} stages; use fewer stages", field="pp")
    k, extra = divmod(blocks, S)  # as even as can be, the first stages taking one more
    bounds = [0]
    for s in range(S - 1):
        bounds.append(1 + sum(k + (i < extra) for i in range(s + 1)))
    bounds.append(len(profile.layers))
    partition = tuple(zip(bounds[:-1], bounds[1:], strict=True))
    placement = sequential_placement(P) if v == 1 else interleaved_placement(P, v)
    meta = {"method": "torchtitan", "schedule": job.schedule, "chunks": v}
    return Plan(P, M, partition, placement, _order(P, v, M), meta)


@lru_cache(maxsize=8)
def _order(devices: int, chunks: int, microbatches: int) -> tuple:
    """1F1B or Interleaved1F1B's order (kept: a job's AC modes and plans share it)."""
    return one_f_one_b_order(devices, microbatches) if chunks == 1 else interleaved_order(devices, chunks, microbatches)


def titan_pp_memory(model: TitanModel, job: TitanJob, *, fit: TitanFit) -> tuple[float, dict[str, float]]:
    """(peak GiB, its parts) of torchtitan's own plan of ``job``: the fuller of the first and last
    rank, activations in flight by :func:`inflight_microbatches`, times ``memory_reserved_factor``."""
    v = job.chunks if job.schedule == "Interleaved1F1B" else 1
    per_chunk = -(-model.layers // (job.pp * v))
    stage_params = per_chunk * v * model.block_params + model.vocab * model.hidden
    mb = job.local_batch // job.microbatches
    peaks = []
    for rank, head_here in ((0, job.pp == 1), (job.pp - 1, True)):
        layers = inflight_microbatches(job, rank) * per_chunk
        peaks.append(memory_parts(model, job, mb, inflight_layers=layers, stage_params=stage_params,
                                   head_here=head_here))
    parts = max(peaks, key=lambda p: sum(p.values()))
    return fit.memory_reserved_factor * sum(parts.values()), parts


def inflight_microbatches(job: TitanJob, rank: int) -> float:
    """Stage-chunks of activations rank ``rank`` holds at its peak: 1F1B ``min(m, pp - rank)``;
    Interleaved1F1B torch's warm-up ``(v - 1) * pp + 2 * (pp - 1 - rank)`` plus one."""
    P, M = job.pp, job.microbatches
    if job.schedule != "Interleaved1F1B" or job.chunks == 1:
        return float(min(M, P - rank))
    return float(min(M * job.chunks, (job.chunks - 1) * P + 2 * (P - 1 - rank) + 1))


def titan_pp_cluster(job: TitanJob, gpu: str | GPUSpec = "h100", *, memory_gb: float | None = None) -> Cluster:
    """The ``pp`` ranks of one pipeline replica: consecutive stages ``tp * cp * dp`` ranks apart."""
    stride = job.tp * job.cp * job.dp_shard * job.dp_replicate
    return build_cluster(gpu, devices=job.pp, gpus_per_node=max(1, job.gpus_per_node // stride), memory_gb=memory_gb)


@dataclass(frozen=True)
class TitanRun:
    """One priced torchtitan step with the plan, the simulated replica and its parts."""

    step: TitanStep
    plan: Plan
    result: Result
    pipeline_s: float
    edge_s: float
    """FSDP's exposed first gather and last reduce-scatter (the slowest rank's)."""
    optimizer_s: float


def titan_pp_run(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100", fit: TitanFit | None = None,
                 plan: Plan | None = None, memory_gb: float | None = None) -> TitanRun:
    """One pipelined torchtitan step: the simulated replica plus FSDP's edges and the optimizer.
    ``plan``: any plan of :func:`titan_pp_profile`'s layers (default torchtitan's own,
    :func:`titan_pp_plan`), priced per rank from the layers it holds; torchtitan's own plan takes
    its memory from :func:`memory_parts` (torch's warm-up count), another plan from the simulator's
    peak on the profile's memory, plus the full-AC replay of one block."""
    spec = get_gpu(gpu)
    fit = fit or titan_fit_for(spec)
    job.validate(model)
    profile = titan_pp_profile(model, job, gpu=spec, fit=fit)
    own = plan is None
    plan = titan_pp_plan(profile, job) if plan is None else plan
    cluster = titan_pp_cluster(job, spec, memory_gb=memory_gb)
    res = simulate(plan, profile, cluster, training=TITAN_PP_TRAINING, validate=False, record_timeline=False)
    if not res.valid:
        raise ConfigError(f"the pipeline cannot run: {res.error}", field="schedule")
    unit = profile.seconds_per_unit
    pipeline_s = res.iteration_time * unit
    held = [[] for _ in range(plan.devices)]
    for s, (a, b) in enumerate(plan.partition):
        held[plan.placement[s]].extend(profile.layers[a:b])
    edge, most = 0.0, 0.0
    for layers in held:
        params = sum(float(x.extra["params"]) for x in layers)
        most = max(most, params)
        if not job.reshards:  # one gather in the first forward, one reduce-scatter after the last backward
            ag, rs = fsdp_block_seconds(model, job, fit, gpu=spec, params=params)
            fwd, bwd = (sum(getattr(x, k) for x in layers) * unit for k in ("f", "b"))
            edge = max(edge, max(0.0, ag - fwd) + max(0.0, rs - bwd))
    opt = ADAMW_BYTES_PER_PARAM * most / (job.tp * job.fsdp_ranks) / (spec.hbm_tbps * 1e12 * fit.memory_efficiency)
    step = pipeline_s + edge + opt
    mb = job.local_batch // job.microbatches
    if own:
        peak, parts = titan_pp_memory(model, job, fit=fit)
    else:
        replay = replay_bytes(model, job, mb) * fit.memory_reserved_factor
        parts = {"simulated": max(res.peak_memory) / 2**30, "replay": replay / 2**30}
        peak = sum(parts.values())
    res = replace(res, peak_memory=tuple(peak * 2**30 for _ in res.peak_memory))
    tokens = job.dp_shard * job.dp_replicate * job.local_batch * job.seq_len / job.gpus
    busy = sum(res.busy) / len(res.busy) * unit
    return TitanRun(TitanStep(step, busy, edge, 0.0, tokens / step, peak, parts), plan, res, pipeline_s, edge, opt)


def titan_pp_step(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100",
                  fit: TitanFit | None = None) -> TitanStep:
    """One pipelined torchtitan step of torchtitan's own plan (:func:`titan_pp_run`)."""
    return titan_pp_run(model, job, gpu=gpu, fit=fit).step
