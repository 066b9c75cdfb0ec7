"""The job search: choose tp, pp, dp, cp, ep and the micro-batch size, with the pipeline plan inside.

Given a model, ``gpus``, a global batch (sequences per iteration), a sequence length and a GPU
preset, :func:`search_job`

1. enumerates the configurations :func:`candidate_degrees` allows (TP inside a node, CP for
   attention-only models, EP for MoE models out of the ``dp * cp`` ranks, micro-batch sizes that
   divide the per-replica batch; every one checked by :func:`pipeline.parallelism.validate_job`);
2. prices each with a cheap bound: the pipeline's lower bound (:func:`pipeline.bounds.lower_bound`
   on the job's per-layer costs, under the runtime) and the least memory any plan can need on
   its fullest device (the replica's weights, optimizer state and one micro-batch of activations
   spread evenly over its ``pp`` devices); configurations that cannot fit are dropped;
3. builds Megatron-LM's usual choice for every configuration in bound order (its even split, 1F1B
   or interleaved 1F1B at its best chunk count, :func:`pipeline.parallelism.megatron_job_plan`;
   in the lightest activation-checkpointing mode of ``ac_modes`` that fits: none, selective, full),
   skipping those whose bound is already above the best Megatron step found: the best of these is
   **Megatron's best even-split configuration**, the baseline;
4. runs the AdaPtis tuner (:class:`agents.tuner.AdaptisTuner`, ``calls_per_config`` simulator
   calls) on the ``tune_top`` configurations with the fastest Megatron steps, and on no
   configuration whose bound is above the best tuned step found so far, in Megatron's row's AC
   mode and the next lighter one (an uneven plan may fit where the even split does not);
With ``runtime="torchtitan"`` every configuration is priced on torchtitan's runtime instead
(:mod:`pipeline.torchtitan_job`: FSDP2 over ``dp * cp``, torchtitan's TP/CP/AC, its step): step 3
prices torchtitan's own plan (its even split, 1F1B or Interleaved1F1B at two stages per rank),
**torchtitan's best even-split configuration**, and the tuner's plans are priced on the same model.

5. returns every evaluated configuration as a row (``tp, pp, dp, cp, ep, microbatch_size,
   microbatches, tokens_per_s_per_gpu, mfu, peak_memory_gb``, the method and the plan), the best
   first, beside Megatron's row for the same degrees; with ``reference`` (``--reference``,
   :func:`parse_reference`), that configuration priced as Megatron runs it
   (:func:`price_reference`) joins them as method ``reference``.

Outer configurations are independent: ``workers > 1`` fans them out over local processes
(:class:`concurrent.futures.ProcessPoolExecutor`, its workers ignoring Ctrl-C), ``ray_address``
over a Ray cluster (Ray is an optional dependency, imported only then), in waves of :data:`WAVE`;
results do not depend on either.

The tuner optimises the pipeline's step; the data-parallel tail (gradient reduce-scatter and the
parameter all-gather, :func:`pipeline.parallelism.dp_tail`) is added to every plan afterwards.

With an output folder, :func:`write_job_exports` writes the rows, the best plan, and its
deployment files with every degree (:mod:`pipeline.job_targets`).

The command line (``search --gpus N --global-batch B``) is :mod:`experiments.commands.job_search`.

Over 600 lines: the search's phases, its rows and ``--reference`` share JobConfig and JobRow; the
pricing of each runtime is elsewhere (:mod:`pipeline.parallelism`, :mod:`pipeline.torchtitan_job`).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.base import Budget
from agents.tuner import AdaptisTuner
from pipeline.arch import Architecture
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.errors import AdaptisError, ConfigError
from pipeline.megatron import megatron_chunk_counts
from pipeline.parallelism import (
    AC_MODES,
    DEFAULT_MOE_IMBALANCE,
    ZERO_STAGES,
    JobEstimate,
    Parallelism,
    estimate_job,
    job_cluster,
    job_profile,
    megatron_job_plan,
    selective_savings,
    validate_job,
)
from pipeline.plan import Plan
from pipeline.runtime import RUNTIMES
from pipeline.spec import Cluster, ModelProfile, TrainingConfig
from pipeline.torchtitan_job import (
    DEFAULT_TITAN_FEATURES,
    titan_best_own,
    titan_job_estimate,
    titan_job_setup,
    titan_model_of,
    titan_reference_schedules,
)

__all__ = ["DEFAULT_CALLS_PER_CONFIG", "DEFAULT_TUNE_TOP", "JobConfig", "JobRow", "JobSearchResult", "Reference",
           "candidate_degrees", "job_setup", "parse_reference", "plan_summary", "price_reference", "search_job"]

#: Simulator calls the tuner spends on one configuration (small: many configurations are tuned).
DEFAULT_CALLS_PER_CONFIG = 1000
#: Configurations the tuner runs on (those with the fastest Megatron steps).
DEFAULT_TUNE_TOP = 8
#: Configurations evaluated between two updates of the best step the bound prunes against.
WAVE = 8


@dataclass(frozen=True)
class JobConfig:
    """What the search is asked: the model, the machine, the batch, and the fixed settings."""

    arch: Architecture
    gpus: int
    global_batch: int
    seq_len: int
    gpu: str = "h100"
    gpus_per_node: int = 8
    memory_gb: float | None = None
    """Capacity per GPU in GiB (default the preset's)."""
    runtime: str = "megatron"
    """The runtime both the baseline and the searched plans are priced on (:data:`pipeline.runtime.RUNTIMES`);
    ``torchtitan``: torchtitan's FSDP2 runtime model (:mod:`pipeline.torchtitan_job`), its own plan the baseline."""
    titan_features: tuple[str, ...] = DEFAULT_TITAN_FEATURES
    """torchtitan's training flags under ``runtime="torchtitan"`` (:data:`pipeline.torchtitan_job.TITAN_FEATURES`)."""
    zero_stage: int = 1
    """1: Megatron's distributed optimizer (the default in practice); 0 plain DDP; 3 FSDP."""
    microbatch_sizes: tuple[int, ...] = (1, 2, 4)
    max_cp: int = 8
    pp_choices: tuple[int, ...] | None = None
    """Pipeline degrees to try (None: every divisor); e.g. ``(8,)`` to compare at a fixed pipeline."""
    tp_choices: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try (None: every divisor up to a node)."""
    calls_per_config: int = DEFAULT_CALLS_PER_CONFIG
    tune_top: int = DEFAULT_TUNE_TOP
    seed: int = 0
    ac_modes: tuple[str, ...] = AC_MODES
    """Activation-checkpointing modes to try, lightest first: each configuration takes the first
    in which Megatron's plan fits (:data:`pipeline.parallelism.AC_MODES`)."""
    moe_imbalance: float = DEFAULT_MOE_IMBALANCE
    """The busiest expert's tokens over the mean (:attr:`pipeline.parallelism.Parallelism.moe_imbalance`)."""
    fp8: bool = False
    """FP8 linear GEMMs, saved inputs and EP dispatch (:attr:`pipeline.parallelism.Parallelism.fp8`)."""
    ep_overlap: float = 0.0
    """Share of the EP all-to-all overlapped with compute (:attr:`pipeline.parallelism.Parallelism.ep_overlap`)."""
    moe_max_nodes: int = 0
    """Node-limited routing (:attr:`pipeline.parallelism.Parallelism.moe_max_nodes`); 0: unlimited."""
    reference: Reference | None = None
    """A configuration to price beside the search's (the one the authors published)."""


@dataclass(frozen=True)
class Reference:
    """A given configuration (``--reference``): its degrees, schedule and, if stated, AC mode."""

    par: Parallelism
    chunks: int | None = None
    """Chunks per device: 1 for 1F1B; None: interleaved at Megatron's fastest count that fits."""
    ac: str | None = None
    """Activation checkpointing; None: the lightest of the search's modes that fits."""
    text: str = ""
    schedule: str | None = None
    """``1f1b``, ``interleaved`` or None (Megatron's fastest that fits, either)."""

    def describe(self) -> str:
        sched = self.schedule or "Megatron's fastest schedule"
        if self.chunks and self.chunks > 1:
            sched += f":{self.chunks}"
        p = self.par
        ac = f", ac={self.ac}" if self.ac else ""
        return (f"{self.text}: tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep} mbs={p.microbatch_size}{ac}, "
                f"{sched}")

    def chunk_choices(self, allowed: list[int]) -> list[int]:
        """The chunk counts this reference allows among Megatron's ``allowed`` ones."""
        if self.chunks is not None:
            return [self.chunks]
        return [v for v in allowed if v > 1] if self.schedule == "interleaved" else list(allowed)


_REFERENCE_HELP = ("give comma-separated tpN, ppN, dpN, cpN, epN (dp may be left out), optional mbs=N, ac=none|"
                   "selective|full, zero=" + "|".join(ZERO_STAGES) + ", and 1f1b or interleaved[:v], e.g. "
                   "tp8,pp8,dp8,interleaved")


def parse_reference(text: str, cfg: JobConfig) -> Reference:
    """The :class:`Reference` of ``--reference`` text for ``cfg`` (see :data:`_REFERENCE_HELP`);
    a :class:`ConfigError` naming ``--reference`` and the fix on bad input."""
    import re

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{text!r}: {why}; {_REFERENCE_HELP}", field="--reference")

    degrees: dict[str, int] = {}
    mbs, chunks, ac, zero, schedule = None, None, None, cfg.zero_stage, None
    for raw in (t.strip().lower() for t in text.split(",")):
        if not raw:
            continue
        m = re.fullmatch(r"(tp|pp|dp|cp|ep)=?(\d+)", raw)
        if m:
            if m.group(1) in degrees:
                raise bad(f"{m.group(1)} given twice")
            degrees[m.group(1)] = int(m.group(2))
            continue
        m = re.fullmatch(r"(1f1b|interleaved)(?::(\d+))?", raw)
        if m:
            if schedule is not None:
                raise bad("two schedules")
            schedule = m.group(1)
            chunks = 1 if schedule == "1f1b" else (int(m.group(2)) if m.group(2) else None)
            if schedule == "1f1b" and m.group(2):
                raise bad("1f1b takes no chunk count")
            if chunks is not None and schedule == "interleaved" and chunks < 2:
                raise bad("interleaved needs at least 2 chunks per device")
            continue
        key, _, value = raw.partition("=")
        if key == "mbs" and value.isdigit() and int(value) >= 1:
            mbs = int(value)
        elif key == "ac" and value in AC_MODES:
            ac = value
        elif key == "zero" and value in ZERO_STAGES:
            zero = ZERO_STAGES[value]
        else:
            raise bad(f"cannot read {raw!r}")
    if any(v < 1 for v in degrees.values()):
        raise bad("degrees must be >= 1")
    tp, pp, cp, ep = (degrees.get(k, 1) for k in ("tp", "pp", "cp", "ep"))
    dp = degrees.get("dp")
    if dp is None:
        if cfg.gpus % (tp * pp * cp):
            raise bad(f"tp*pp*cp = {tp * pp * cp} does not divide {cfg.gpus} GPUs")
        dp = cfg.gpus // (tp * pp * cp)
    if mbs is None:  # Megatron's --micro-batch-size 1; torchtitan's default pp micro-batches per local batch
        local = cfg.global_batch // dp if dp and cfg.global_batch % dp == 0 else 0
        mbs = local // pp if cfg.runtime == "torchtitan" and pp > 1 and local and local % pp == 0 else 1
    if tp * pp * dp * cp != cfg.gpus:
        fix = (f"use dp{cfg.gpus // (tp * pp * cp)} or leave dp out" if cfg.gpus % (tp * pp * cp) == 0
               else "choose degrees whose product is the number of GPUs")
        raise bad(f"tp*pp*dp*cp = {tp * pp * dp * cp}, not the {cfg.gpus} GPUs of --gpus ({fix})")
    par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, microbatch_size=mbs, global_batch=cfg.global_batch,
                      zero_stage=zero, moe_imbalance=cfg.moe_imbalance, fp8=cfg.fp8, ep_overlap=cfg.ep_overlap,
                      moe_max_nodes=cfg.moe_max_nodes)
    try:
        validate_job(cfg.arch, par, seq_len=cfg.seq_len, gpus=cfg.gpus)
    except ConfigError as exc:
        raise ConfigError(f"{text!r}: {exc}", field="--reference") from None
    if schedule == "interleaved" and pp == 1:
        raise bad("an interleaved schedule needs pp >= 2")
    return Reference(par, chunks, ac, text, schedule)


def price_reference(cfg: JobConfig, ref: Reference) -> JobRow:
    """Megatron's plan of ``ref`` on ``cfg``'s model and GPUs (its even split at the schedule given),
    in its AC mode or the lightest of ``cfg.ac_modes`` that fits; method ``reference``."""
    modes = (ref.ac,) if ref.ac else cfg.ac_modes
    if _titan(cfg):
        return _titan_row(cfg, ref.par, modes, "reference", 0.0, titan_reference_schedules(ref.schedule, ref.chunks),
                          note=ref.text)
    row: JobRow | None = None
    for mode in modes:
        par = ref.par.with_ac(mode)
        profile, cluster, training = job_setup(cfg, par)
        allowed = megatron_chunk_counts(profile, par.pp, par.microbatches)
        tries = ref.chunk_choices(allowed)
        if not tries or any(v not in allowed for v in tries):
            raise ConfigError(f"{ref.text!r}: Megatron cannot run {tries or 'interleaving'} chunks per device here "
                              f"(it can: {allowed}; interleaving needs micro-batches divisible by pp and a block "
                              "per chunk); give one of those as interleaved:v, or 1f1b", field="--reference")
        plan = megatron_job_plan(profile, cluster, par, training=training, chunks=tries)
        est = estimate_job(profile, cluster, plan, par=par, training=training, gpu=cfg.gpu,
                           gpus_per_node=cfg.gpus_per_node, seq_len=cfg.seq_len)
        row = JobRow(par, "reference", est, 0.0, note=f"{ref.text}, ac={mode}")
        if est.fits:
            break
    assert row is not None
    return row


@dataclass
class JobRow:
    """One evaluated configuration with one method's plan."""

    par: Parallelism
    method: str
    estimate: JobEstimate | None
    bound_s: float
    note: str = ""
    runtime: str = "megatron"
    """The runtime the row is priced on (:attr:`JobConfig.runtime`)."""

    @property
    def iteration_s(self) -> float:
        return self.estimate.iteration_s if self.estimate is not None else math.inf

    @property
    def feasible(self) -> bool:
        return self.estimate is not None and self.estimate.fits

    def as_dict(self, *, with_plan: bool = False) -> dict[str, Any]:
        par = self.estimate.par if self.estimate is not None else self.par
        out: dict[str, Any] = {"method": self.method, "runtime": self.runtime, **par.as_dict(),
                               "bound_ms": 1e3 * self.bound_s}
        if self.estimate is not None:
            row = self.estimate.row()
            out.update({k: row[k] for k in ("iteration_ms", "pipeline_ms", "dp_exposed_ms", "tokens_per_s_per_gpu",
                                            "mfu", "fits")})
            out["peak_memory"] = row["peak_memory_gb"]
            out["plan_summary"] = plan_summary(self.estimate.plan)
            if with_plan:
                out["plan"] = self.estimate.plan.to_dict()
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class JobSearchResult:
    rows: list[JobRow]
    """Best feasible plan per tuned configuration (method ``adaptis``), Megatron's per evaluated one,
    and the reference's (method ``reference``) when one was given."""
    configurations: int
    """Configurations enumerated (valid degrees)."""
    pruned_memory: int
    pruned_bound: int
    seconds: float
    best: JobRow | None = None
    megatron_best: JobRow | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    reference: JobRow | None = None
    """The given configuration (``JobConfig.reference``) priced on the same model, method ``reference``."""

    def speedup_over(self, row: JobRow | None) -> float | None:
        """The best step's speedup over ``row``'s (None without both)."""
        if self.best is None or row is None or not self.best.feasible or row.estimate is None:
            return None
        return row.iteration_s / self.best.iteration_s

    @property
    def speedup(self) -> float | None:
        if self.best is None or self.megatron_best is None or not self.best.feasible:
            return None
        return self.megatron_best.iteration_s / self.best.iteration_s


def plan_summary(plan: Plan) -> str:
    """One line on a plan: its method, stages, chunks per device and stage sizes."""
    sizes = [b - a for a, b in plan.partition]
    kind = plan.meta.get("method", "")
    chunks = plan.num_stages // plan.devices
    return f"{kind} {plan.num_stages} stages ({chunks}/device) sizes {min(sizes)}-{max(sizes)}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_global_batch(cfg: JobConfig, *, reach: int = 4096) -> int | None:
    """The global batch nearest ``cfg.global_batch`` (the smaller on a tie, within ``reach``) for which
    :func:`candidate_degrees` has a configuration, or None."""
    for step in range(1, reach + 1):
        for batch in (cfg.global_batch - step, cfg.global_batch + step):
            if batch >= 1 and candidate_degrees(replace(cfg, global_batch=batch)):
                return batch
    return None


def candidate_degrees(cfg: JobConfig) -> list[Parallelism]:
    """Every valid (tp, pp, dp, cp, ep, micro-batch size) for ``cfg`` (see the module docstring)."""
    arch = cfg.arch
    mixers = {layer.mixer for layer in arch.layers if layer.kind == "block"} - {"none"}
    attention_only = bool(mixers) and mixers <= {"attention", "sliding_attention", "mla"}
    out = []
    for tp in _divisors(cfg.gpus):
        if tp > cfg.gpus_per_node or (cfg.tp_choices is not None and tp not in cfg.tp_choices):
            continue
        for cp in _divisors(cfg.gpus // tp):
            if cp > 1 and (not attention_only or cp > cfg.max_cp):
                continue
            for pp in _divisors(cfg.gpus // (tp * cp)):
                if cfg.pp_choices is not None and pp not in cfg.pp_choices:
                    continue
                dp = cfg.gpus // (tp * cp * pp)
                eps = [e for e in _divisors(dp * cp) if arch.num_experts and arch.num_experts % e == 0] or [1]
                for ep in eps:
                    for mbs in cfg.microbatch_sizes:
                        par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, microbatch_size=mbs,
                                          global_batch=cfg.global_batch, zero_stage=cfg.zero_stage,
                                          moe_imbalance=cfg.moe_imbalance, fp8=cfg.fp8,
                                          ep_overlap=cfg.ep_overlap, moe_max_nodes=cfg.moe_max_nodes)
                        try:
                            validate_job(arch, par, seq_len=cfg.seq_len, gpus=cfg.gpus)
                        except ConfigError:
                            continue
                        out.append(par)
    return out


def _training(cfg: JobConfig, par: Parallelism) -> TrainingConfig:
    return par.training(TrainingConfig(runtime=cfg.runtime))  # H100-class scale: Runtime.compute_scale_for


def _titan(cfg: JobConfig) -> bool:
    """Whether ``cfg`` is priced on torchtitan's runtime model."""
    return cfg.runtime == "torchtitan"


def check_runtime(cfg: JobConfig) -> None:
    """A one-line ConfigError naming ``runtime`` when the job search cannot price ``cfg.runtime``."""
    if not isinstance(cfg.runtime, str) or cfg.runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {cfg.runtime!r} for the job search; use one of {', '.join(RUNTIMES)} "
                          "(torchtitan: torchtitan's FSDP2 runtime; the others: the Megatron-runtime job model "
                          "under that runtime)", field="runtime")
    if _titan(cfg):
        titan_model_of(cfg.arch)


def _titan_kw(cfg: JobConfig) -> dict[str, Any]:
    return dict(gpu=cfg.gpu, seq_len=cfg.seq_len, gpus_per_node=cfg.gpus_per_node, memory_gb=cfg.memory_gb,
                features=cfg.titan_features)


def _titan_row(cfg: JobConfig, par: Parallelism, modes: tuple[str, ...], method: str, bound: float,
               schedules: list[tuple[str, int]] | None = None, *, note: str = "") -> JobRow:
    """torchtitan's own plan of ``par`` (:func:`pipeline.torchtitan_job.titan_best_own`) as a row."""
    try:
        est, k = titan_best_own(cfg.arch, par, modes, schedules=schedules, **_titan_kw(cfg))
    except AdaptisError as exc:
        if method == "reference":
            raise ConfigError(f"{note!r}: {exc}", field="--reference") from None
        return JobRow(par, method, None, bound, note=str(exc), runtime="torchtitan")
    text = f"{note}, ac={modes[k]}" if method == "reference" else (
        "" if k == 0 else f"{modes[k]} recomputation: it does not fit with less")
    return JobRow(par, method, est, bound, note=text, runtime="torchtitan")


def job_setup(cfg: JobConfig, par: Parallelism) -> tuple[ModelProfile, Cluster, TrainingConfig]:
    """The profile, cluster and training settings of one configuration's pipeline."""
    if _titan(cfg):
        return titan_job_setup(cfg.arch, par, **_titan_kw(cfg))
    profile = job_profile(cfg.arch, par, gpu=cfg.gpu, seq_len=cfg.seq_len, gpus_per_node=cfg.gpus_per_node)
    cluster = job_cluster(par, gpu=cfg.gpu, gpus_per_node=cfg.gpus_per_node, memory_gb=cfg.memory_gb)
    return profile, cluster, _training(cfg, par)


def _memory_need(profile: Any, cluster: Any, training: TrainingConfig, par: Parallelism, *,
                 saved: float = 0.0) -> tuple[float, float]:
    """(bytes the average device of ``par`` holds at least, the least device's limit): its stages'
    weights and state, and at some moment at least one micro-batch of their activations (a
    recomputing stage reserves one too; ``saved``: what selective recomputation does not keep of
    them); the average device bounds the fullest."""
    act = max(0.0, sum(x.act_bytes for x in profile.layers) - saved)
    static = (training.param_bytes * sum(x.params for x in profile.layers)
              + training.activation_scale * act) / par.pp
    return static, min(cluster.memory_limits_bytes)


def _saved(cfg: JobConfig, par: Parallelism) -> float:
    """Activation bytes of one micro-batch that the lightest-memory mode tried does not keep."""
    if "selective" not in cfg.ac_modes:
        return 0.0
    return selective_savings(cfg.arch, par, gpu=cfg.gpu, seq_len=cfg.seq_len)


def _bound(cfg: JobConfig, par: Parallelism) -> tuple[float, bool]:
    """(lower bound on the step in seconds, whether any plan can fit the memory)."""
    profile, cluster, training = job_setup(cfg, par.with_ac(cfg.ac_modes[0]) if _titan(cfg) else par)
    shards = training.data_parallel if training.zero_stage >= 1 else 1
    lb = lower_bound(profile, cluster, par.microbatches, runtime=training.runtime, optimizer_shards=shards)
    if _titan(cfg):  # torchtitan's profile carries its memory: the leanest mode tried bounds it
        lean, lean_cluster, _ = job_setup(cfg, par.with_ac(cfg.ac_modes[-1]))
        need, limit = _memory_need(lean, lean_cluster, training, par.with_ac(cfg.ac_modes[-1]))
        return lb.value * profile.seconds_per_unit, need <= limit
    need, limit = _memory_need(profile, cluster, training, par, saved=_saved(cfg, par))
    return lb.value * profile.seconds_per_unit, need <= limit


def no_fit_advice(cfg: JobConfig) -> str:
    """One line on what to change when no configuration of ``cfg`` fits: the leanest one's need
    against a GPU's memory, about how many GPUs that asks for, and the sharding that helps."""
    needs = []
    for par in candidate_degrees(cfg):
        profile, cluster, training = job_setup(cfg, par)
        need, limit = _memory_need(profile, cluster, training, par, saved=_saved(cfg, par))
        needs.append((need / limit, need, limit, par))
    if not needs:
        return "no valid degrees to try"
    ratio, need, limit, par = min(needs, key=lambda x: x[0])
    gib = 2 ** 30
    tips = []
    if ratio > 1:
        tips.append(f"about {math.ceil(ratio * cfg.gpus)} GPUs (--gpus)")
    if "full" not in cfg.ac_modes:
        tips.append("--ac none,selective,full (recompute where it does not fit)")
    if cfg.zero_stage < 3:
        tips.append("--zero fsdp (weights and optimizer state sharded over data parallel)")
    tips.append("a smaller --seq-len or --microbatch-sizes 1")
    return (f"the leanest configuration ({par.describe()}) needs at least {need / gib:.1f} GiB per GPU against "
            f"{limit / gib:.1f} GiB usable (Megatron's rows already tried the --ac modes); use "
            + ", or ".join(tips))


def _megatron(task: tuple[JobConfig, Parallelism, float]) -> JobRow:
    """Megatron's plan of one configuration in the lightest AC mode of ``cfg.ac_modes`` that fits
    (what a Megatron user does: selective, then ``--recompute-granularity full``); the last mode's
    row when none fits."""
    cfg, par, bound = task
    if _titan(cfg):
        return _titan_row(cfg, par, cfg.ac_modes, "torchtitan", bound)
    row: JobRow | None = None
    try:
        for k, mode in enumerate(cfg.ac_modes):
            redo = par.with_ac(mode)
            profile, cluster, training = job_setup(cfg, redo)
            plan = megatron_job_plan(profile, cluster, redo, training=training)
            est = estimate_job(profile, cluster, plan, par=redo, training=training, gpu=cfg.gpu,
                               gpus_per_node=cfg.gpus_per_node, seq_len=cfg.seq_len)
            note = "" if k == 0 else f"{mode} recomputation: it does not fit with less"
            if row is None or est.fits:
                row = JobRow(par, "megatron", est, bound, note=note)
            if est.fits:
                break
    except AdaptisError as exc:
        return JobRow(par, "megatron", None, bound, note=str(exc))
    assert row is not None
    return row


def _tune(task: tuple[JobConfig, Parallelism, float]) -> JobRow:
    """The tuner on one configuration, in the AC mode of ``par`` (Megatron's row's) and, where that
    recomputes, also in the next lighter mode tried (an uneven plan may fit where the even split
    did not); the faster feasible plan."""
    cfg, par, bound = task
    modes = [par.ac]
    k = cfg.ac_modes.index(par.ac) if par.ac in cfg.ac_modes else 0
    if k > 0:
        modes.insert(0, cfg.ac_modes[k - 1])
    best: JobRow | None = None
    for mode in modes:
        row = _tune_one(cfg, par.with_ac(mode), bound)
        if best is None or _key(row) < _key(best):
            best = row
    assert best is not None
    best.par = par.with_ac("none")  # the configuration's key, as Megatron's row has it
    return best


def _tune_one(cfg: JobConfig, par: Parallelism, bound: float) -> JobRow:
    try:
        profile, cluster, training = job_setup(cfg, par)
        scenario = Scenario(profile, cluster, par.microbatches, training)
        found = AdaptisTuner().search(scenario, budget=Budget(sim_calls=cfg.calls_per_config), seed=cfg.seed)
        if found.plan is None:
            return JobRow(par, "adaptis", None, bound, note=found.note or "no plan")
        plan = found.plan
        if _titan(cfg):  # torchtitan's AC is in the profile's times and saved bytes
            est = titan_job_estimate(cfg.arch, par, plan=plan, **_titan_kw(cfg))
            return JobRow(par, "adaptis", est, bound, note=f"{found.sim_calls} calls, ac={par.ac}",
                          runtime="torchtitan")
        if par.recompute and plan.recompute is None:  # full recomputation: every stage
            plan = replace(plan, recompute=(True,) * plan.num_stages)
        est = estimate_job(profile, cluster, plan, par=par, training=training, gpu=cfg.gpu,
                           gpus_per_node=cfg.gpus_per_node, seq_len=cfg.seq_len)
    except AdaptisError as exc:
        return JobRow(par, "adaptis", None, bound, note=str(exc), runtime=cfg.runtime)
    return JobRow(par, "adaptis", est, bound, note=f"{found.sim_calls} calls, ac={par.ac}")


def _ray(address: str):
    """Ray, connected to ``address`` (``local`` starts a local Ray; ``auto`` joins the running one)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'ray==2.58.0' (an optional dependency)", field="ray") from None
    if not ray.is_initialized():
        root = str(Path(__file__).resolve().parents[1])
        # the workers import this module by name: give them the checkout on their path
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": root}})
    return ray


def _map(fn, tasks: list, workers: int, ray_address: str | None = None) -> list:
    """``fn`` over ``tasks`` in order: here, over ``workers`` local processes, or as Ray tasks."""
    if ray_address and tasks:
        ray = _ray(ray_address)
        remote = ray.remote(fn)
        return ray.get([remote.remote(t) for t in tasks])
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    # workers ignore Ctrl-C (it reaches the whole process group; a worker it broke left the pool
    # waiting forever): the parent stops, cancels what has not started and does not wait
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_ignore_sigint)
    try:
        out = list(pool.map(fn, tasks))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _key(row: JobRow) -> tuple[int, float]:
    return (0 if row.feasible else 1, row.iteration_s)


def search_job(cfg: JobConfig, *, workers: int = 1, ray_address: str | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> JobSearchResult:
    """Search the degrees and the pipeline plan of one job (see the module docstring); ``ray_address``:
    run the configurations as Ray tasks on that cluster (``local`` starts one here). ``progress``
    is called after each wave with the phase (``"megatron"``, ``"tuner"``), the configurations
    that phase has settled (priced or pruned) and its total."""
    report = progress or (lambda phase, done, total: None)
    t0 = time.perf_counter()
    check_runtime(cfg)
    if _titan(cfg):  # torchtitan shards with FSDP2 over dp * cp
        cfg = replace(cfg, zero_stage=3)
    reference = price_reference(cfg, cfg.reference) if cfg.reference is not None else None
    pars = candidate_degrees(cfg)
    if not pars and cfg.tp_choices is not None:
        heads = cfg.arch.num_attention_heads
        usable = [t for t in cfg.tp_choices if not cfg.gpus % t and t <= cfg.gpus_per_node and not heads % t]
        if not usable:
            raise ConfigError(f"no tensor-parallel degree among {list(cfg.tp_choices)} divides both {cfg.gpus} GPUs "
                              f"and {heads} attention heads (and fits a node of {cfg.gpus_per_node}); use a --tp "
                              f"that divides both", field="--tp")
    if not pars and cfg.pp_choices is not None and not any(cfg.gpus % p == 0 for p in cfg.pp_choices):
        divisors = [d for d in range(1, cfg.gpus + 1) if cfg.gpus % d == 0]
        near = sorted({min(divisors, key=lambda d: (abs(d - p), d)) for p in cfg.pp_choices})
        raise ConfigError(f"no pipeline degree among {list(cfg.pp_choices)} divides {cfg.gpus} GPUs; the nearest "
                          f"that do: --pp {','.join(map(str, near))}", field="--pp")
    if not pars:
        near = nearest_global_batch(cfg)
        hint = f"the nearest that has one is {near}" if near is not None else "use other GPU counts"
        raise ConfigError(f"no valid (tp, pp, dp, cp, ep, micro-batch size) for {cfg.gpus} GPUs and a global batch "
                          f"of {cfg.global_batch} (it must split into data-parallel replicas of whole micro-batches): "
                          f"{hint}", field="global_batch")
    bounds = [(par, *_bound(cfg, par)) for par in pars]
    fitting = sorted(((par, b) for par, b, fits in bounds if fits), key=lambda x: x[1])
    pruned_memory = len(bounds) - len(fitting)
    # Megatron's usual choice, in bound order, in waves of `workers`; a bound above the best feasible
    # Megatron step cannot hold Megatron's best
    megatron: list[JobRow] = []
    best_m = math.inf
    pruned = 0
    wave = WAVE  # fixed, so that the pruning (and the result) does not depend on the number of workers
    i = 0
    while i < len(fitting):
        batch = []
        while i < len(fitting) and len(batch) < wave:
            par, b = fitting[i]
            i += 1
            if b >= best_m:
                pruned += 1
                continue
            batch.append((cfg, par, b))
        for row in _map(_megatron, batch, workers, ray_address):
            megatron.append(row)
            if row.feasible:
                best_m = min(best_m, row.iteration_s)
        report("megatron", i, len(fitting))
    # the tuner on the most promising configurations
    order = sorted(megatron, key=_key)
    tuned: list[JobRow] = []
    best_t = min((r.iteration_s for r in megatron if r.feasible), default=math.inf)
    todo = [(cfg, r.estimate.par if r.estimate is not None else r.par, r.bound_s) for r in order[:cfg.tune_top]
            if (r.bound_s < best_t or not r.feasible) and not (_titan(cfg) and r.par.pp == 1)]  # nothing to plan
    for k in range(0, len(todo), wave):
        batch = [t for t in todo[k:k + wave] if t[2] < best_t]
        pruned += len(todo[k:k + wave]) - len(batch)
        for row in _map(_tune, batch, workers, ray_address):
            tuned.append(row)
            if row.feasible:
                best_t = min(best_t, row.iteration_s)
        report("tuner", min(k + wave, len(todo)), len(todo))
    rows = sorted(tuned + megatron + ([reference] if reference is not None else []), key=_key)
    for r in rows:  # every row is priced on the job's runtime
        r.runtime = cfg.runtime
    best = min((r for r in tuned + megatron if r.feasible), key=lambda r: r.iteration_s, default=None)
    m_best = min((r for r in megatron if r.feasible), key=lambda r: r.iteration_s, default=None)
    return JobSearchResult(rows, len(pars), pruned_memory, pruned, time.perf_counter() - t0, best, m_best,
                           reference=reference)
