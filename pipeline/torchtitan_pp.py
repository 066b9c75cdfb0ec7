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

from dataclasses import replace

from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, build_cluster, get_gpu
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, interleaved_placement, sequential_placement
from pipeline.runtime import RUNTIMES
from pipeline.simulator import simulate
from pipeline.spec import LayerCost, ModelProfile, TrainingConfig
from pipeline.torchtitan_model import (
    ADAMW_BYTES_PER_PARAM,
    TitanFit,
    TitanJob,
    TitanModel,
    TitanStep,
    block_seconds,
    fsdp_block_seconds,
    head_seconds,
    memory_parts,
    titan_fit_for,
)

__all__ = ["titan_pp_profile", "titan_pp_plan", "titan_pp_step", "inflight_microbatches"]


def titan_pp_profile(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100",
                     fit: TitanFit | None = None) -> ModelProfile:
    """Per-layer seconds (ms) of one micro-batch on one rank: embedding, blocks, output layer."""
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
    blocks = [LayerCost(f"layer{i}", "attention", f * 1e3, b * 1e3, 0.0, model.block_params // job.tp, 0, out)
              for i in range(model.layers)]
    head = head_seconds(model, job, fit, gpu=spec, microbatch=mb)
    return ModelProfile(
        name=f"{model.name}-torchtitan", time_unit="ms", seq_len=job.seq_len // job.cp, microbatch_size=mb,
        layers=(LayerCost("embed", "embedding", 0.0, 0.0, 0.0, model.vocab * model.hidden // job.tp, 0, out),
                *blocks, LayerCost("head", "head", head / 3 * 1e3, 2 * head / 3 * 1e3, 0.0,
                                   model.vocab * model.hidden // job.tp, 0, 0)))


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
    order = one_f_one_b_order(P, M) if v == 1 else interleaved_order(P, v, M)
    return Plan(P, M, partition, placement, order, {"method": "torchtitan", "schedule": job.schedule, "chunks": v})


def inflight_microbatches(job: TitanJob, rank: int) -> float:
    """Stage-chunks of activations rank ``rank`` holds at its peak: 1F1B ``min(m, pp - rank)``;
    Interleaved1F1B torch's warm-up ``(v - 1) * pp + 2 * (pp - 1 - rank)`` plus one."""
    P, M = job.pp, job.microbatches
    if job.schedule != "Interleaved1F1B" or job.chunks == 1:
        return float(min(M, P - rank))
    return float(min(M * job.chunks, (job.chunks - 1) * P + 2 * (P - 1 - rank) + 1))


def titan_pp_step(model: TitanModel, job: TitanJob, *, gpu: str | GPUSpec = "h100",
                  fit: TitanFit | None = None) -> TitanStep:
    """One pipelined torchtitan step: simulated replica plus FSDP's edges and the optimizer."""
    spec = get_gpu(gpu)
    fit = fit or titan_fit_for(spec)
    job.validate(model)
    profile = titan_pp_profile(model, job, gpu=spec, fit=fit)
    plan = titan_pp_plan(profile, job)
    stride = job.tp * job.cp * job.dp_shard * job.dp_replicate
    cluster = build_cluster(spec, devices=job.pp, gpus_per_node=max(1, job.gpus_per_node // stride))
    runtime = replace(RUNTIMES["torchtitan"], compute_scale=1.0, optimizer_bytes_per_param=0.0)
    res = simulate(plan, profile, cluster, training=TrainingConfig(runtime=runtime), validate=False,
                   record_timeline=False)
    if not res.valid:
        raise ConfigError(f"the pipeline cannot run: {res.error}", field="schedule")
    pipeline_s = res.iteration_time * profile.seconds_per_unit
    v = job.chunks if job.schedule == "Interleaved1F1B" else 1
    per_chunk = -(-model.layers // (job.pp * v))
    per_stage = per_chunk * v
    stage_params = per_stage * model.block_params + model.vocab * model.hidden
    edge = 0.0
    if not job.reshards:  # one gather in the first forward, one reduce-scatter after the last backward
        ag, rs = fsdp_block_seconds(model, job, fit, gpu=spec, params=stage_params)
        first_f = sum(x.f for x in profile.layers[1:1 + per_stage]) * profile.seconds_per_unit
        last_b = sum(x.b for x in profile.layers[1:1 + per_stage]) * profile.seconds_per_unit
        edge = max(0.0, ag - first_f) + max(0.0, rs - last_b)
    shard = stage_params / (job.tp * job.fsdp_ranks)
    opt = ADAMW_BYTES_PER_PARAM * shard / (spec.hbm_tbps * 1e12 * fit.memory_efficiency)
    step = pipeline_s + edge + opt
    mb = job.local_batch // job.microbatches
    peaks = []
    for rank, head_here in ((0, job.pp == 1), (job.pp - 1, True)):
        layers = inflight_microbatches(job, rank) * per_chunk
        peaks.append(memory_parts(model, job, mb, inflight_layers=layers, stage_params=stage_params,
                                   head_here=head_here))
    parts = max(peaks, key=lambda p: sum(p.values()))
    tokens = job.dp_shard * job.dp_replicate * job.local_batch * job.seq_len / job.gpus
    return TitanStep(step, sum(res.busy) / len(res.busy) * profile.seconds_per_unit, edge, 0.0, tokens / step,
                     fit.memory_reserved_factor * sum(parts.values()), parts)
