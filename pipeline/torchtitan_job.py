"""A whole job on torchtitan's runtime: one job-search configuration priced as torchtitan runs it.

The job search (:mod:`agents.job_search`, ``--runtime torchtitan``) prices every configuration
``(tp, pp, dp, cp, microbatch_size, ac)`` with :mod:`pipeline.torchtitan_pp` instead of the
Megatron-runtime job model of :mod:`pipeline.parallelism`: ``dp`` is torchtitan's FSDP degree
(``data_parallel_shard_degree``; FSDP2 shards over ``dp * cp``), ``cp`` its ring attention, ``tp``
its sequence-parallel TP, and the training flags are :data:`DEFAULT_TITAN_FEATURES` unless given.
torchtitan's own plan is its even split under 1F1B or Interleaved1F1B (:func:`titan_schedules`);
another plan (the tuner's) is priced on the same per-layer profile, FSDP edges and optimizer
(:func:`pipeline.torchtitan_pp.titan_pp_run`). Dense Llama-style models only (what
:class:`pipeline.torchtitan_model.TitanModel` describes). MFU counts the same matmul FLOPs as the
Megatron-runtime rows (:func:`pipeline.parallelism.model_flops`) against the bf16 peak, Float8 or not.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.arch import Architecture
from pipeline.errors import ConfigError
from pipeline.hardware import get_gpu
from pipeline.parallelism import DPTail, JobEstimate, Parallelism, job_profile, model_flops
from pipeline.plan import Plan
from pipeline.spec import Cluster, ModelProfile, TrainingConfig
from pipeline.torchtitan_model import TitanJob, TitanModel, titan_fit_for
from pipeline.torchtitan_pp import TITAN_PP_TRAINING, titan_pp_cluster, titan_pp_memory, titan_pp_profile, titan_pp_run

__all__ = ["TITAN_FEATURES", "DEFAULT_TITAN_FEATURES", "titan_model_of", "titan_job_of", "titan_schedules",
           "titan_job_setup", "titan_job_estimate", "titan_own_fits", "titan_best_own", "titan_reference_schedules"]

#: torchtitan's training flags the job search can set (``--titan-features``).
TITAN_FEATURES = ("compile", "float8", "async-tp")
#: torchtitan's published Llama 3.1 405B runs (benchmarks/llama3_h100_202412_torchtitan.md, Tables 5
#: and 6): torch.compile, Float8 linears and async TP.
DEFAULT_TITAN_FEATURES = TITAN_FEATURES
#: Stages per rank of an interleaved schedule by default: torchtitan's ``generate_split_points`` for a
#: looped schedule at 9dec370.
TITAN_DEFAULT_CHUNKS = 2


def titan_model_of(arch: Architecture) -> TitanModel:
    """The :class:`TitanModel` of a dense Llama-style ``arch``; a ConfigError naming ``runtime`` otherwise."""
    kinds = {(x.mixer, x.ffn) for x in arch.layers if x.kind == "block"}
    if kinds != {("attention", "mlp")} or not arch.gated_mlp or arch.tie_word_embeddings:
        raise ConfigError(f"torchtitan's runtime model prices dense Llama-style models (attention, SwiGLU MLP, "
                          f"untied output layer); {arch.name} has {sorted(kinds)}; use --runtime megatron",
                          field="runtime")
    return TitanModel(arch.name, arch.num_blocks, arch.hidden_size, arch.intermediate_size,
                      arch.num_attention_heads, arch.num_key_value_heads, arch.vocab_size)


def titan_job_of(par: Parallelism, *, seq_len: int, gpus_per_node: int = 8,
                 features: tuple[str, ...] = DEFAULT_TITAN_FEATURES, schedule: str = "1F1B",
                 chunks: int = 1) -> TitanJob:
    """The torchtitan job of ``par``: FSDP over ``dp``, the batch split into ``par.microbatches``."""
    bad = [f for f in features if f not in TITAN_FEATURES]
    if bad:
        raise ConfigError(f"unknown torchtitan features {bad}; use any of {', '.join(TITAN_FEATURES)}",
                          field="titan_features")
    if par.ep > 1:
        raise ConfigError("torchtitan's runtime model has no expert parallelism; use ep=1", field="ep")
    return TitanJob(gpus=par.gpus, dp_shard=par.dp, tp=par.tp, cp=par.cp, pp=par.pp, seq_len=seq_len,
                    local_batch=par.batch // par.dp, microbatches=par.microbatches, compile="compile" in features,
                    float8="float8" in features, ac=par.ac, async_tp="async-tp" in features and par.tp > 1,
                    schedule=schedule, chunks=chunks, gpus_per_node=gpus_per_node)


def titan_schedules(model: TitanModel, job: TitanJob) -> list[tuple[str, int]]:
    """torchtitan's schedules for ``job``: 1F1B, and Interleaved1F1B at two stages per rank where it
    runs (micro-batches divisible by pp, a block per stage); one entry without a pipeline."""
    if job.pp == 1:
        return [("1F1B", 1)]
    out = [("1F1B", 1)]
    inter = replace(job, schedule="Interleaved1F1B", chunks=TITAN_DEFAULT_CHUNKS)
    try:
        inter.validate(model)
        out.append(("Interleaved1F1B", TITAN_DEFAULT_CHUNKS))
    except ConfigError:
        pass
    return out


def titan_own_fits(arch: Architecture, par: Parallelism, *, gpu: str, seq_len: int, gpus_per_node: int = 8,
                   memory_gb: float | None = None, features: tuple[str, ...] = DEFAULT_TITAN_FEATURES,
                   schedule: str = "1F1B", chunks: int = 1) -> bool:
    """Whether torchtitan's own plan of ``par`` fits the GPU's memory (no simulation: a cheap check
    before :func:`titan_job_estimate`)."""
    spec = get_gpu(gpu)
    model = titan_model_of(arch)
    job = titan_job_of(par, seq_len=seq_len, gpus_per_node=gpus_per_node, features=features, schedule=schedule,
                       chunks=chunks)
    peak, _ = titan_pp_memory(model, job, fit=titan_fit_for(spec))
    return peak * 2**30 <= min(titan_pp_cluster(job, spec, memory_gb=memory_gb).memory_limits_bytes)


def titan_job_setup(arch: Architecture, par: Parallelism, *, gpu: str, seq_len: int, gpus_per_node: int = 8,
                    memory_gb: float | None = None,
                    features: tuple[str, ...] = DEFAULT_TITAN_FEATURES) -> tuple[ModelProfile, Cluster, TrainingConfig]:
    """The profile, cluster and training settings of one configuration's pipeline on torchtitan's
    runtime (what the tuner and the bound run on)."""
    spec = get_gpu(gpu)
    model = titan_model_of(arch)
    job = titan_job_of(par, seq_len=seq_len, gpus_per_node=gpus_per_node, features=features)
    job.validate(model)
    profile = titan_pp_profile(model, job, gpu=spec, fit=titan_fit_for(spec))
    return profile, titan_pp_cluster(job, spec, memory_gb=memory_gb), TITAN_PP_TRAINING


_FLOPS: dict[tuple, tuple[Architecture, float]] = {}


def _flops(arch: Architecture, par: Parallelism, gpu: str, seq_len: int, gpus_per_node: int) -> float:
    """The job's matmul FLOPs per step (:func:`pipeline.parallelism.model_flops`), kept per configuration."""
    key = (id(arch), par, gpu, seq_len, gpus_per_node)
    hit = _FLOPS.get(key)
    if hit is None or hit[0] is not arch:
        if len(_FLOPS) > 256:
            _FLOPS.clear()
        profile = job_profile(arch, par, gpu=gpu, seq_len=seq_len, gpus_per_node=gpus_per_node)
        hit = _FLOPS[key] = (arch, model_flops(profile, par))
    return hit[1]


def titan_job_estimate(arch: Architecture, par: Parallelism, *, gpu: str, seq_len: int, gpus_per_node: int = 8,
                       memory_gb: float | None = None, features: tuple[str, ...] = DEFAULT_TITAN_FEATURES,
                       schedule: str = "1F1B", chunks: int = 1, plan: Plan | None = None) -> JobEstimate:
    """One configuration's step on torchtitan's runtime: torchtitan's own plan at ``schedule`` and
    ``chunks`` (``plan`` None) or ``plan``; FSDP's exposed edges and the AdamW step are the
    estimate's tail (``dp_exposed_ms``)."""
    spec = get_gpu(gpu)
    model = titan_model_of(arch)
    par = replace(par, zero_stage=3)
    job = titan_job_of(par, seq_len=seq_len, gpus_per_node=gpus_per_node, features=features,
                       schedule=schedule if plan is None else "1F1B", chunks=chunks if plan is None else 1)
    run = titan_pp_run(model, job, gpu=spec, plan=plan, memory_gb=memory_gb)
    it = run.step.step_s
    tail_s = run.edge_s + run.optimizer_s
    tail = DPTail((tail_s,) * run.plan.devices, (tail_s,) * run.plan.devices)
    flops = _flops(arch, replace(par, recompute=False, selective_recompute=False), spec.name, seq_len, gpus_per_node)
    plan_out = replace(run.plan, meta={**run.plan.meta, "runtime": "torchtitan"})
    return JobEstimate(par, plan_out, run.result, run.pipeline_s, tail, it, run.step.tokens_per_s_per_gpu,
                       flops / (it * par.gpus * spec.peak_bf16_tflops * 1e12), run.step.peak_memory_gib,
                       min(run.result.memory_limit) / 2**30)


def titan_reference_schedules(schedule: str | None, chunks: int | None) -> list[tuple[str, int]] | None:
    """torchtitan's schedules a ``--reference`` allows (``1f1b``, ``interleaved[:v]``; None: torchtitan's)."""
    if schedule == "1f1b":
        return [("1F1B", 1)]
    if schedule == "interleaved":
        return [("Interleaved1F1B", chunks or TITAN_DEFAULT_CHUNKS)]
    return None


def titan_best_own(arch: Architecture, par: Parallelism, modes: tuple[str, ...], *,
                   schedules: list[tuple[str, int]] | None = None, gpu: str, seq_len: int, gpus_per_node: int = 8,
                   memory_gb: float | None = None,
                   features: tuple[str, ...] = DEFAULT_TITAN_FEATURES) -> tuple[JobEstimate, int]:
    """(torchtitan's own plan of ``par`` in the lightest of ``modes`` that fits at the fastest of
    ``schedules`` that fits, the index of its mode); the last mode's fastest when none fits. A lighter
    mode whose plans cannot fit (:func:`titan_own_fits`) is not simulated."""
    kw = dict(gpu=gpu, seq_len=seq_len, gpus_per_node=gpus_per_node, memory_gb=memory_gb, features=features)
    model = titan_model_of(arch)
    for k, mode in enumerate(modes):
        redo = par.with_ac(mode)
        job = titan_job_of(redo, seq_len=seq_len, gpus_per_node=gpus_per_node, features=features)
        tries = schedules or titan_schedules(model, job)
        if k < len(modes) - 1 and not any(titan_own_fits(arch, redo, schedule=sc, chunks=ch, **kw) for sc, ch in tries):
            continue  # a heavier mode remains
        best: JobEstimate | None = None
        for schedule, chunks in tries:
            est = titan_job_estimate(arch, redo, schedule=schedule, chunks=chunks, **kw)
            if best is None or (not est.fits, est.iteration_s) < (not best.fits, best.iteration_s):
                best = est
        assert best is not None
        if best.fits or k == len(modes) - 1:
            return best, k
    raise ConfigError("no activation-checkpointing mode to try; give at least one", field="ac")
