"""The steps of the end-to-end workflow, each usable alone: costs, policy training, search, replay.

* :func:`measure_here` — profile the model and the link on this machine, in one ``torchrun`` job
  with one process per device (every rank profiles at once, as loaded as in the pipeline).
* :func:`calibrate_here` — replay random plans on this machine and fit the runtime scales and the
  per-action overhead that the search then prices plans with (the measurements fed back).
* :func:`analytic_costs` — the analytic per-layer costs for a named GPU and its cluster.
* :func:`train_policy` — a short RL training run (its curves go to the given tracker).
* :func:`search_methods` — every method on one scenario, the RL policy included when it loads.
* :func:`replay` — run plans through the executor and pair each with its prediction.

No module here prints to stdout: progress goes to the ``log`` callable (stderr in the commands).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.base import Budget, SearchResult
from experiments.workflow.report import Measurement
from pipeline.errors import AdaptisError, ConfigError
from pipeline.plan import Plan
from pipeline.spec import Cluster, ModelProfile

__all__ = ["Costs", "measure_here", "calibrate_here", "analytic_costs", "train_policy", "search_methods", "replay",
           "Log"]

Log = Callable[[str], None]


@dataclass
class Costs:
    """A profile and a cluster, and where they came from."""

    profile: ModelProfile
    cluster: Cluster
    source: str
    """``measured`` (this machine) or ``analytic`` (a named GPU), or ``file``."""
    local: bool
    """True when the cluster is this machine, so plans can be replayed here."""
    p2p: dict[str, Any] | None = None
    """The measured link (latency_us, p2p_gbps, backend) when measured."""
    backend: str | None = None
    device: str | None = None
    scales: dict[str, float] | None = None
    """Runtime scales and per-action overhead fitted on replays (:func:`calibrate_here`), or None."""
    calibration_ms: list[float] | None = None
    """The calibration plans' measured times (ms) in the job that fitted ``scales``, in their order."""

    @property
    def search_profile(self) -> ModelProfile:
        """The profile the search prices plans with: calibrated when replays taught it."""
        from pipeline.calibration.fidelity import calibrated_profile

        return calibrated_profile(self.profile, self.scales) if self.scales else self.profile


def measure_here(*, model: str, devices: int, seq_len: int | None, microbatch_size: int, scale: float,
                 repeats: int, threads: int, timeout: float, memory_gb: float | None,
                 memory_reserve_gb: float | None = None, profile_path: str | None = None,
                 granularity: str = "layer", head_shards: int = 1,
                 log: Log = print) -> Costs:
    """Profile ``model`` (a zoo name the executor builds) and the p2p link on ``devices`` local ranks.

    With ``profile_path`` only the link is measured. The cluster's memory is ``memory_gb`` or 64 GiB,
    less ``memory_reserve_gb`` (default: 0 on gloo/CPU, the GPU default on NCCL).
    """
    from executor.model import default_seq_len, resolve_architecture
    from executor.replay import ReplayOptions, p2p_bench, run_job
    from pipeline.calibration.fidelity import measured_cluster

    arch = resolve_architecture(model, scale=scale, granularity=granularity, head_shards=head_shards)
    seq = seq_len or default_seq_len(arch)
    from experiments.common import check_devices

    if profile_path:
        profile = ModelProfile.load(profile_path)
        check_devices(devices, profile.num_layers, model=profile.name)
        log(f"measuring the link between 2 local ranks (profile from {profile_path})")
        bench = p2p_bench(timeout=timeout) if devices > 1 else None
        backend, device = (bench or {}).get("backend"), None
    else:
        check_devices(devices, len(arch.layers), model=model)  # before starting one process per device
        log(f"profiling {model} ({len(arch.layers)} layers, {microbatch_size}x{seq} tokens) and the link on "
            f"{devices} local ranks ({repeats} repeats per layer) ...")
        options = ReplayOptions(model=model, scale=scale, seq_len=seq, microbatch_size=microbatch_size,
                                threads=threads, granularity=granularity, head_shards=head_shards)
        result = run_job([], options, measure=True, nproc=devices, timeout=timeout, profile_repeats=repeats)
        profile = ModelProfile.from_dict(result["profile"], source="measured profile")
        bench, backend, device = result.get("p2p"), result.get("backend"), result.get("device")
    link = bench or {"latency_us": 0.0, "p2p_gbps": 1e6}
    cluster = measured_cluster(devices, {**link, "backend": backend or "gloo"}, memory_gb=memory_gb or 64.0,
                               memory_reserve_gb=memory_reserve_gb, name=f"local-{device or 'cpu'}-{backend or 'gloo'}")
    return Costs(profile, cluster, "file" if profile_path else "measured", True, bench, backend, device)


def calibrate_here(costs: Costs, *, model: str, scale: float, microbatches: int, count: int, seed: int,
                   steps: int, warmup: int, threads: int, timeout: float, granularity: str = "layer",
                   head_shards: int = 1, contention: bool = False, layer_factors: bool = False,
                   log: Log = print) -> Costs:
    """Replay ``count`` random plans (:func:`pipeline.calibration.fidelity.calibration_plans`) on this machine
    and return ``costs`` with the fitted runtime scales and per-action overhead (and, with
    ``contention``, the compute contention between the ranks; with ``layer_factors``, two plans
    that time every layer alone as well, and each layer's own factor). If the job fails,
    ``costs`` come back unchanged with no scales (the search then uses the per-layer profile)."""
    from dataclasses import replace

    from executor.replay import LaunchError, ReplayOptions, run_job
    from pipeline.calibration.fidelity import calibrate, calibration_plans

    profile, cluster = costs.profile, costs.cluster
    plans = calibration_plans(profile, cluster, microbatches, count=count, seed=seed, units=layer_factors)
    if not plans:
        return costs
    log(f"calibrating: replaying {len(plans)} plans ({warmup} warm-up + {steps} timed steps each) ...")
    options = ReplayOptions(model=model, scale=scale, seq_len=profile.seq_len, microbatch_size=profile.microbatch_size,
                            steps=steps, warmup=warmup, threads=threads, granularity=granularity,
                            head_shards=head_shards)
    try:
        result = run_job([p for _, p in plans], options, timeout=timeout)
    except (LaunchError, AdaptisError) as exc:
        log(f"calibration skipped: {exc}")
        return costs
    scales = calibrate(plans, profile, cluster, runs=result["runs"], contention=contention, layers=layer_factors)
    to_ms = profile.seconds_per_unit * 1e3
    log("  measured / profiled: " + ", ".join(f"{k} {v:.2f}" for k, v in scales.items()
                                           if k not in ("overhead", "transfer", "contention") and "#" not in k)
        + ("; each layer's own: " + ", ".join(f"{op} {min(v):.2f}-{max(v):.2f}"
                                               for op, v in sorted(_layer_ranges(scales).items()))
           if _layer_ranges(scales) else "")
        + f"; per-action overhead {scales['overhead'] * to_ms:.3f} ms"
        + f", per transfer end {scales.get('transfer', 0.0) * to_ms:.3f} ms"
        + (f", compute contention {scales['contention']:.3f}" if "contention" in scales else ""))
    return replace(costs, scales=scales, calibration_ms=[r["measured_iteration_time"] for r in result["runs"]])


def _layer_ranges(scales: dict[str, float]) -> dict[str, list[float]]:
    """The layers' own factors (keys ``"F#3"``) grouped by operation."""
    out: dict[str, list[float]] = {}
    for key, v in scales.items():
        if "#" in key:
            out.setdefault(key.split("#")[0], []).append(v)
    return out


def analytic_costs(*, model: str | None, hf_config: str | None, profile_path: str | None,
                   cluster_path: str | None, gpu: str, devices: int, gpus_per_node: int, memory_gb: float | None,
                   seq_len: int | None, microbatch_size: int, memory_reserve_gb: float | None = None,
                   granularity: str = "layer", head_shards: int = 1) -> Costs:
    """Analytic costs of a zoo model / HF config on ``gpu`` (or the given profile / cluster files)."""
    from experiments.common import resolve_scenario

    ns = argparse.Namespace(model=model, hf_config=hf_config, profile=profile_path, cluster=cluster_path, gpu=gpu,
                            devices=devices, gpus_per_node=gpus_per_node, memory_gb=memory_gb, seq_len=seq_len,
                            microbatch_size=microbatch_size, memory_reserve_gb=memory_reserve_gb,
                            granularity=granularity, head_shards=head_shards)
    profile, cluster = resolve_scenario(ns)
    return Costs(profile, cluster, "file" if profile_path else "analytic", False)


def train_policy(*, timesteps: int, seed: int, out: Path, tracker: Any, log: Log = print) -> str:
    """Train a MaskablePPO plan-editing policy for ``timesteps`` steps; returns the policy path.

    SB3's metrics and the evaluation curve go to ``tracker`` (the workflow's ``train`` run).
    """
    from agents.rl.train import PPOConfig, train
    from experiments.tracking.sb3 import make_sb3_logger

    n_steps = max(16, min(256, timesteps // 2 // 16 * 16))  # a multiple of 16: every minibatch of min(64, n) is full
    config = PPOConfig(timesteps=timesteps, seed=seed, n_envs=1, out=str(out), n_steps=n_steps,
                       batch_size=min(64, n_steps), eval_every=max(n_steps, timesteps // 2), eval_scenarios=2,
                       checkpoint_every=timesteps, progress_bar=False)
    log(f"training an RL policy for {timesteps} steps -> {out}")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # the run's own folder: a re-run replaces it, as its plans
    summary = train(config, tracker=tracker, logger=make_sb3_logger(tracker, formats=()),
                    command=f"python -m experiments run --train-policy {timesteps}")
    tracker.summary({f"train/{k}": v for k, v in summary.items() if isinstance(v, int | float | bool)})
    return str(summary["policy"])


def search_methods(scenario: Any, methods: Sequence[str], *, budget: Budget, seed: int,
                   settings: dict[str, dict[str, Any]] | None = None, policy: str | None = None,
                   log: Log = print, on_result: Callable[[list[SearchResult]], None] | None = None,
                   ) -> list[SearchResult]:
    """Run every method on ``scenario`` (:func:`agents.run_methods.run_methods`); an RL method that
    cannot run (e.g. no policy yet) gets a note instead of a plan.

    ``settings`` maps a method name to settings of its searcher, e.g.
    ``{"adaptis": {"perturb_moves": 2}}``; ``policy`` is the RL policy file for ``rl`` methods;
    ``on_result`` is called with the outcomes so far each time a method ends (an interrupted
    workflow keeps what it wrote). Ctrl-C raises :class:`agents.run_methods.Interrupted`.
    """
    from agents.run_methods import run_methods

    def skip(name: str, exc: Exception) -> str | None:
        if not name.startswith("rl"):
            return None
        if isinstance(exc, ConfigError):
            return f"skipped: {exc}"
        return f"skipped: the RL agent is not available ({type(exc).__name__}: {exc})"

    def each(outcomes: list[SearchResult]) -> None:
        res = outcomes[-1]
        if res.note.startswith("skipped:") and res.plan is None:
            log(f"  {res.method:<10} {res.note}")
        else:
            shown = f"{res.iteration_time:.4g} {scenario.profile.time_unit}" if res.ok else "no valid plan"
            log(f"  {res.method:<10} {shown}  ({res.sim_calls} simulator calls, {res.seconds:.1f} s)")
        if on_result is not None:
            on_result(outcomes)

    return run_methods(scenario, methods, budget=budget, seed=seed, settings=settings, policy=policy, skip=skip,
                       on_result=each)


def replay(outcomes: Sequence[SearchResult], costs: Costs, *, model: str, scale: float, steps: int, warmup: int,
           threads: int, timeout: float, granularity: str = "layer", head_shards: int = 1,
           calibration: Sequence[tuple[str, Plan]] = (), contention: bool = False, layer_factors: bool = False,
           log: Log = print) -> tuple[dict[str, Measurement], str | None]:
    """Run the plans of ``outcomes`` in one ``torchrun`` job and measure them.

    With ``calibration`` (the random plans the costs were calibrated on), those are replayed in the
    same job, round-robin with the outcomes' plans, and the runtime's terms re-fitted on them give a
    second prediction per plan (:attr:`Measurement.predicted_same_job_ms`): it tells a model error
    (both predictions miss) from the machine running at another speed than during calibration (only
    the first misses). Returns (method -> its :class:`Measurement`, ``None``) on success, else
    (``{}``, a note saying why nothing was measured: the job failed).
    """
    from executor.replay import LaunchError, ReplayOptions, run_job
    from pipeline.calibration.agreement import compare_plans
    from pipeline.calibration.fidelity import calibrate

    plans = [o.plan for o in outcomes if o.plan is not None]
    profile = costs.profile
    options = ReplayOptions(model=model, scale=scale, seq_len=profile.seq_len,
                            microbatch_size=profile.microbatch_size, steps=steps, warmup=warmup, threads=threads,
                            granularity=granularity, head_shards=head_shards)
    again = f", with the {len(calibration)} calibration plans again" if calibration else ""
    log(f"replaying {', '.join(o.method for o in outcomes)} on {plans[0].devices} local ranks "
        f"({warmup} warm-up + {steps} timed steps{again}) ...")
    try:
        result = run_job(plans + [p for _, p in calibration], options, timeout=timeout)
    except (LaunchError, AdaptisError) as exc:
        return {}, f"replay failed: {exc}"
    to_ms = profile.seconds_per_unit * 1e3
    runs, calibration_runs = result["runs"][:len(plans)], result["runs"][len(plans):]
    comps = compare_plans([(o.method, o.plan) for o in outcomes], profile, costs.cluster, runs=runs,
                          scales=costs.scales)
    same_job = [None] * len(comps)
    speed = None
    if calibration and costs.calibration_ms and len(costs.calibration_ms) == len(calibration_runs):
        speed = statistics.median(r["measured_iteration_time"] / before
                                  for r, before in zip(calibration_runs, costs.calibration_ms))
        log(f"  the calibration plans ran {abs(speed - 1):.1%} {'slower' if speed >= 1 else 'faster'} in this job "
            "than in the calibration job (the machine's speed between the two jobs; median over the plans)")
    if calibration:
        refit = calibrate(calibration, profile, costs.cluster, runs=calibration_runs, contention=contention,
                          layers=layer_factors)
        same_job = [c.predicted * to_ms for c in compare_plans([(o.method, o.plan) for o in outcomes], profile,
                                                               costs.cluster, runs=runs, scales=refit)]
    measured: dict[str, Measurement] = {}
    for o, comp, again_ms in zip(outcomes, comps, same_job):
        tl = dict(comp.predicted_timeline)
        if to_ms != 1.0:
            tl["events"] = [{**e, "start": e["start"] * to_ms, "end": e["end"] * to_ms} for e in tl["events"]]
            tl["time_unit"] = "ms"
        m = measured[o.method] = Measurement(
            measured_ms=comp.measured, predicted_runtime_ms=comp.predicted * to_ms,
            measured_timeline=comp.measured_timeline, predicted_timeline=tl, loss=comp.run.get("loss"),
            measured_iteration_times=comp.run.get("measured_iteration_times"), predicted_same_job_ms=again_ms,
            raw_iteration_times=comp.run.get("raw_iteration_times"), calibration_plans_ratio=speed)
        refitted = "" if again_ms is None else f" ({again_ms:.4g} ms calibrated in this job)"
        log(f"  {o.method:<10} measured {comp.measured:.4g} ms (all timed steps), "
            f"predicted {m.predicted_runtime_ms:.4g} ms{refitted}")
    return measured, None
