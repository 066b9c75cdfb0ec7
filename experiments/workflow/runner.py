"""The end-to-end workflow behind ``python -m experiments run``: costs, (training), search, replay, summary.

Runs one :class:`~experiments.workflow.config.WorkflowConfig`; the phases it calls are in
:mod:`experiments.workflow.phases`, the tables it reports in :mod:`experiments.workflow.report`.

Reads top to bottom in :func:`run_workflow`:

1. **costs** — on this machine (no ``gpu``/``cluster_path``) the executor profiles the model and
   the link on ``devices`` local ranks, then replays ``calibration_plans`` random plans and fits
   how the runtime spends the profile (per-operation factors and per-layer times, overheads), which the
   search then prices plans with; for a named GPU the analytic costs are used instead;
2. **train** (optional) — a short RL training run whose policy the ``rl`` method then uses;
3. **search** — the Megatron baseline, named schedules, the AdaPtis tuner and the RL policy;
4. **replay** — on this machine, the fastest predicted plans (``candidates``) and the Megatron
   baseline run through the executor under ``torchrun`` and are measured, round-robin with the
   calibration plans again, so each prediction is also given re-calibrated in the same job; with
   ``choose="measured"`` the plan fastest on the even timed steps is kept and every time reported
   is the odd steps' (skipped, with a note, for a named GPU cluster);
5. **summary** — predicted and measured times, speedups, bubbles, memory, and where the time went.

Tracking: one W&B run per phase (``profile``, ``train``, ``search``, ``replay``, ``summary``), all
in one group (``cfg.group``), offline by default. Separate runs keep each phase's config and
metrics apart, survive a later phase failing, and show as one unit in W&B's group view. The
``summary`` run is self-contained: the comparison metrics, the tables, the Gantt charts and the
plan artifact (type ``plan``); the ``profile`` run holds the profile artifact (type ``profile``).
Every file also lands in ``cfg.out`` with ``summary.json`` naming the group and the run folders.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.base import Budget, SearchResult
from agents.run_methods import with_baseline
from experiments.common import output_folder, prediction_meta
from experiments.deploy import best_for, with_target_method, write_exports, write_plan_trace
from experiments.workflow.config import WorkflowConfig
from experiments.workflow.phases import (
    Costs,
    Log,
    analytic_costs,
    calibrate_here,
    measure_here,
    replay,
    search_methods,
    train_policy,
)
from experiments.workflow.report import Measurement, device_rows, kind_rows, method_rows, op_share
from pipeline.calibration.fidelity import calibration_plans
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError

__all__ = ["WorkflowReport", "run_workflow", "SEARCH_ROWS"]


@dataclass
class WorkflowReport:
    """What :func:`run_workflow` found; also written as ``summary.json``."""

    config: WorkflowConfig
    costs: Costs
    outcomes: list[SearchResult]
    best: SearchResult | None
    megatron: SearchResult | None
    rows: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    kinds: list[dict[str, Any]]
    op_share: dict[str, float]
    notes: list[str]
    files: dict[str, str]
    group: str
    run_dirs: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Measurement] = field(default_factory=dict)
    """Method -> what its replay measured (the plans replayed: the best, Megatron's and, chosen by
    measurement, the other candidates)."""

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "source": self.costs.source, "cluster": self.costs.cluster.to_dict(),
                "calibration": self.costs.scales,
                "rows": self.rows, "devices": self.devices, "kinds": self.kinds, "op_share": self.op_share,
                "notes": self.notes, "files": self.files, "group": self.group, "run_dirs": self.run_dirs,
                "seconds": self.seconds, "summary": self.summary,
                "replays": {method: m.steps_dict() for method, m in self.measured.items()}}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Runs:
    """Opens one W&B run per phase in the workflow's group and remembers their folders."""

    def __init__(self, cfg: WorkflowConfig, group: str) -> None:
        self.cfg = cfg
        self.group = group
        self.dirs: dict[str, str] = {}

    @contextmanager
    def phase(self, name: str, extra: dict[str, Any] | None = None) -> Iterator[Any]:
        from experiments.tracking import start_run

        config = {**asdict(self.cfg), "phase": name, **(extra or {})}
        with start_run(command="run", config=config, project=self.cfg.project, group=self.group,
                       name=f"{self.group}-{name}", job_type=name) as tracker:
            if tracker.run_dir is not None:
                self.dirs[name] = str(tracker.run_dir)
            yield tracker


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-.")
    return out[:100] or "model"


def _costs(cfg: WorkflowConfig, log: Log) -> Costs:
    if cfg.local:
        if cfg.hf_config or not cfg.model:
            raise ConfigError("on this machine the executor builds zoo models by name (e.g. --model tiny-hybrid); "
                              "for a config.json pass --gpu NAME (analytic costs, no replay)", field="--hf-config")
        return measure_here(model=cfg.model, devices=cfg.devices, seq_len=cfg.seq_len,
                            microbatch_size=cfg.microbatch_size, scale=cfg.scale, repeats=cfg.profile_repeats,
                            threads=cfg.threads, timeout=cfg.timeout, memory_gb=cfg.memory_gb,
                            memory_reserve_gb=cfg.memory_reserve_gb, profile_path=cfg.profile_path,
                            granularity=cfg.granularity, head_shards=cfg.head_shards, log=log)
    return analytic_costs(model=cfg.model, hf_config=cfg.hf_config, profile_path=cfg.profile_path,
                          cluster_path=cfg.cluster_path, gpu=cfg.gpu or "h100", devices=cfg.devices,
                          gpus_per_node=cfg.gpus_per_node, memory_gb=cfg.memory_gb, seq_len=cfg.seq_len,
                          microbatch_size=cfg.microbatch_size, memory_reserve_gb=cfg.memory_reserve_gb,
                          granularity=cfg.granularity, head_shards=cfg.head_shards)


def _budget(cfg: WorkflowConfig) -> Budget:
    try:
        b = Budget.parse(cfg.budget)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--budget") from None
    seconds = min(b.seconds, cfg.max_seconds) if b.seconds is not None else cfg.max_seconds
    return Budget(sim_calls=b.sim_calls, seconds=seconds)


def _log_profile(tracker: Any, costs: Costs, out: Path, slug: str) -> None:
    profile, cluster = costs.profile, costs.cluster
    profile.save(out / "profile.json")
    cluster.save(out / "cluster.json")
    if costs.scales:
        costs.search_profile.save(out / "calibrated_profile.json")
        tracker.log_metrics({f"calibration/{k}": v for k, v in costs.scales.items()})
    tracker.log_table("layers", [{"index": i, "name": x.name, "kind": x.kind, "f": x.f, "b": x.b, "w": x.w,
                                  "params": x.params, "act_bytes": x.act_bytes, "out_bytes": x.out_bytes}
                                 for i, x in enumerate(profile.layers)])
    tracker.log_table("layer_kinds", kind_rows(profile))
    tracker.log_artifact(out / "profile.json", name=f"profile-{slug}", type="profile",
                         metadata={"source": costs.source, "layers": profile.num_layers, "seq_len": profile.seq_len,
                                   "time_unit": profile.time_unit, "device": costs.device})
    tracker.log_artifact(out / "cluster.json", name=f"cluster-{slug}", type="cluster",
                         metadata={"source": costs.source, "devices": cluster.devices})
    if costs.p2p:
        tracker.log_metrics({"p2p/latency_us": costs.p2p["latency_us"], "p2p/gbps": costs.p2p["p2p_gbps"]})
    total = sum(x.f + x.b + x.w for x in profile.layers)
    tracker.summary({"layers": profile.num_layers, "fbw_per_microbatch": total, "time_unit": profile.time_unit})


def _gantts(best: SearchResult, mega: SearchResult | None, measured: dict[str, Measurement], *, out: Path,
            label: str) -> dict[str, Path]:
    """Predicted Megatron vs best (one time axis); measured Megatron vs best; best measured vs predicted."""
    from pipeline.render import gantt_side_by_side

    files: dict[str, Path] = {}
    pairs = [(mega, "megatron"), (best, f"best: {best.method}")] if mega is not None and mega is not best \
        else [(best, f"best: {best.method}")]
    files["gantt/predicted"] = gantt_side_by_side(
        [o.result.timeline_dict() for o, _ in pairs], [f"{t} on {label} (predicted)" for _, t in pairs],
        out / "gantt_predicted.png")
    replayed = [(measured[o.method], t) for o, t in pairs if o.method in measured]
    if replayed:
        files["gantt/measured"] = gantt_side_by_side(
            [m.measured_timeline for m, _ in replayed], [f"{t} (measured)" for _, t in replayed],
            out / "gantt_measured.png")
    if best.method in measured:
        files["gantt/fidelity"] = gantt_side_by_side(
            [measured[best.method].measured_timeline, measured[best.method].predicted_timeline],
            [f"{best.method} measured", f"{best.method} predicted (performance model)"], out / "gantt_fidelity.png")
    return files


#: The rows of the search's finished methods, rewritten as each ends (kept by an interrupted run).
SEARCH_ROWS = "search_rows.jsonl"


def _write_rows(path: Path, outcomes: list[SearchResult], time_unit: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, default=str) + "\n" for row in method_rows(outcomes, time_unit=time_unit)))
    tmp.replace(path)


def run_workflow(cfg: WorkflowConfig, *, log: Log = _stderr) -> WorkflowReport:
    """Run every phase (see the module docstring) and return the report; files go to ``cfg.out``."""
    t_start = time.perf_counter()
    out = output_folder(cfg.out, command="run", inputs=cfg)
    slug = _slug(cfg.label)
    group = cfg.group or f"run-{slug}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = _Runs(cfg, group)
    notes: list[str] = []
    seconds: dict[str, float] = {}
    budget = _budget(cfg)

    # 1. costs --------------------------------------------------------------------------------
    t0 = time.perf_counter()
    costs = _costs(cfg, log)
    microbatches = cfg.microbatches or (8 if cfg.local else 32)
    if cfg.local and cfg.replay and cfg.calibration_plans > 0 and cfg.model and costs.cluster.devices > 1:
        costs = calibrate_here(costs, model=cfg.model, scale=cfg.scale, microbatches=microbatches,
                               count=cfg.calibration_plans, seed=cfg.seed, steps=cfg.steps, warmup=cfg.warmup,
                               threads=cfg.threads, timeout=cfg.timeout, granularity=cfg.granularity,
                               head_shards=cfg.head_shards, contention=cfg.contention,
                               layer_factors=cfg.layer_factors, log=log)
    seconds["costs"] = time.perf_counter() - t0
    cluster = costs.cluster
    profile = costs.search_profile
    with runs.phase("profile", {"source": costs.source}) as tracker:
        _log_profile(tracker, costs, out, slug)

    # 2. optional policy training ---------------------------------------------------------------
    policy = cfg.policy
    if cfg.train_policy > 0:
        t0 = time.perf_counter()
        with runs.phase("train") as tracker:
            policy = train_policy(timesteps=cfg.train_policy, seed=cfg.seed, out=out / "policy", tracker=tracker,
                                  log=log)
            curve = out / "policy" / "eval.jsonl"
            if curve.is_file():
                from experiments.commands.train import learning_curve

                png = learning_curve(curve, out / "policy" / "learning_curve.png")
                if png is not None:
                    tracker.log_image("learning_curve", png)
        seconds["train"] = time.perf_counter() - t0

    # 3. search ---------------------------------------------------------------------------------
    t0 = time.perf_counter()
    methods = with_target_method(with_baseline(cfg.methods), cfg.target)
    log(f"searching {len(methods)} methods for {profile.name} on {cluster.devices} devices, {microbatches} "
        f"micro-batches (budget {cfg.budget}, at most {budget.seconds:g} s each)")
    scenario = Scenario(profile, cluster, microbatches)
    settings = {"adaptis": {"perturb_moves": cfg.perturb_moves}} if cfg.perturb_moves is not None else {}
    outcomes = search_methods(scenario, methods, budget=budget, seed=cfg.seed, settings=settings, policy=policy,
                              log=log, on_result=lambda done: _write_rows(out / SEARCH_ROWS, done, profile.time_unit))
    notes += [f"{o.method}: {o.note}" for o in outcomes if o.plan is None and o.note]
    feasible = [o for o in outcomes if o.feasible]
    mega = next((o for o in outcomes if o.method == "megatron" and o.ok), None)
    best = pick = best_for(cfg.target, feasible, profile)  # pick: the predicted best, kept when replays choose
    seconds["search"] = time.perf_counter() - t0
    if best is None:
        within = f" that {cfg.target} runs" if feasible else ""
        raise ConfigError(f"no plan{within} fits in {cluster.memory_gb - cluster.memory_reserve_gb:g} GiB usable per "
                          f"device ({cluster.memory_gb:g} less a {cluster.memory_reserve_gb:g} GiB reserve); add "
                          "devices or memory (--memory-gb, --memory-reserve-gb) or use fewer micro-batches",
                          field="--memory-gb")

    def save_best(o: SearchResult, **meta: str) -> None:
        """``plan.json`` and ``plan.csv``: ``o``'s plan, with its method and prediction in its meta."""
        o.plan = replace(o.plan, meta={**o.plan.meta, "method": o.method, **meta, "predicted": prediction_meta(
            o.iteration_time, profile=profile, cluster=cluster, runtime=scenario.training.runtime,
            profile_file=str(out / ("calibrated_profile.json" if costs.scales else "profile.json")))})
        o.plan.save(out / "plan.json")
        o.plan.save_csv(out / "plan.csv")

    save_best(best)
    targets = write_exports(out, feasible, profile, best=best,
                            reference=mega.iteration_time if mega is not None else None)

    # 4. replay ---------------------------------------------------------------------------------
    measured: dict[str, Measurement] = {}
    if not cfg.local:
        notes.append(f"replay skipped: the cluster is {cluster.name} ({cluster.devices} devices), not this machine; "
                     "deploy plan.csv there (docs/deploy.md)")
    elif not cfg.replay:
        notes.append("replay skipped (--no-replay)")
    else:
        t0 = time.perf_counter()
        to_replay = _replay_candidates(cfg, feasible, best=best, mega=mega, profile=profile)
        again = calibration_plans(costs.profile, cluster, microbatches, count=cfg.calibration_plans,  # the plans the
                                  seed=cfg.seed, units=cfg.layer_factors) if costs.scales else []  # costs fit on
        measured, failed = replay(to_replay, costs, model=cfg.model or "", scale=cfg.scale, steps=cfg.steps,
                                  warmup=cfg.warmup, threads=cfg.threads, timeout=cfg.timeout,
                                  granularity=cfg.granularity, head_shards=cfg.head_shards, calibration=again,
                                  contention=cfg.contention, layer_factors=cfg.layer_factors, log=log)
        if failed:
            notes.append(failed)
        if measured and cfg.choose == "measured":
            chosen, measured, note = _choose_by_measurement(to_replay, measured, predicted_best=best)
            notes.append(note)
            if chosen is not best:
                best = chosen
                save_best(best, chosen_by="measured")
                targets = write_exports(out, feasible, profile, reference=mega.iteration_time if mega else None,
                                        best=best)
                targets = _executor_row_is(targets, best, mega, out=out)
        seconds["replay"] = time.perf_counter() - t0

    # 5. summary --------------------------------------------------------------------------------
    best_measured = measured.get(best.method)
    rows = method_rows(outcomes, time_unit=profile.time_unit, measured=measured)
    devices = device_rows(profile, best.plan, cluster, result=best.result,
                          measured_timeline=best_measured.measured_timeline if best_measured else None)
    kinds = kind_rows(profile, best.plan)
    ops = op_share(best_measured.measured_timeline if best_measured else best.result.timeline_dict())
    gantts = _gantts(best, mega, measured, out=out, label=cfg.label)
    summary = _summary(best, mega, measured, unit=profile.time_unit)
    summary |= {"chosen_by": cfg.choose if measured else "predicted", "predicted_best_method": pick.method}
    files = {"plan": str(out / "plan.json"), "plan_csv": str(out / "plan.csv"), "profile": str(out / "profile.json"),
             "cluster": str(out / "cluster.json"), **{k: str(v) for k, v in gantts.items()},
             **{r["target"]: str(out / r["file"]) for r in targets if r.get("file")}}
    if cfg.trace:
        files["trace"] = str(write_plan_trace(cfg.trace, best.plan, profile, cluster=cluster,
                                              predicted=(best_measured.predicted_timeline if best_measured
                                                         else best.result.timeline_dict()),
                                              measured=best_measured.measured_timeline if best_measured else None,
                                              title=f"{best.method} on {cfg.label}"))
    with runs.phase("search", {"microbatches": microbatches, "methods": methods}) as tracker:
        for o in outcomes:
            if o.result is not None and o.result.valid:
                tracker.log_metrics({f"{o.method}/predicted": o.iteration_time,
                                     f"{o.method}/bubble": o.result.mean_bubble,
                                     f"{o.method}/peak_memory_gb": max(o.result.peak_memory_gb),
                                     f"{o.method}/sim_calls": o.sim_calls})
        tracker.log_table("methods", rows)
        tracker.log_image("gantt/predicted", gantts["gantt/predicted"])
        tracker.log_plan(best.plan, name=f"plan-{slug}", metadata=summary)
        tracker.summary(summary)
    if best_measured is not None:
        with runs.phase("replay") as tracker:
            for o in (x for x in outcomes if x.method in measured):
                tracker.log_metrics({f"{o.method}/measured_ms": measured[o.method].measured_ms,
                                     f"{o.method}/predicted_ms": measured[o.method].predicted_runtime_ms})
            for key in ("gantt/measured", "gantt/fidelity"):
                if key in gantts:
                    tracker.log_image(key, gantts[key])
            tracker.summary(summary)
    seconds["total"] = time.perf_counter() - t_start
    summary["seconds"] = round(seconds["total"], 1)
    with runs.phase("summary") as tracker:
        tracker.log_metrics({k: v for k, v in summary.items() if isinstance(v, int | float)})
        tracker.log_table("methods", rows)
        tracker.log_table("devices", devices)
        tracker.log_table("layer_kinds", kinds)
        for key, path in gantts.items():
            tracker.log_image(key, path)
        tracker.log_plan(best.plan, name=f"plan-{slug}", metadata=summary)
        tracker.summary({**summary, "notes": "; ".join(notes)})
    summary["targets"] = targets
    report = WorkflowReport(cfg, costs, outcomes, best, mega, rows, devices, kinds, ops, notes, files, group,
                            dict(runs.dirs), seconds, summary, measured)
    (out / "summary.json").write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n")
    return report


def _replay_candidates(cfg: WorkflowConfig, feasible: list[SearchResult], *, best: SearchResult,
                       mega: SearchResult | None, profile: Any) -> list[SearchResult]:
    """The outcomes to replay: the predicted best and Megatron's; with ``choose="measured"`` also
    the next fastest predicted distinct plans the target runs, ``cfg.candidates`` in all (Megatron's
    not counted)."""
    from pipeline.targets import target_reason

    picked = [best]
    if cfg.choose == "measured":
        for o in sorted(feasible, key=lambda o: o.iteration_time):
            if len(picked) >= cfg.candidates:
                break
            same = any(o.plan == p.plan for p in picked) or (mega is not None and o.plan == mega.plan)
            if o is mega or same or target_reason(cfg.target, o.plan, profile):
                continue
            picked.append(o)
    if mega is not None and mega is not best:
        picked.append(mega)  # even where best is its plan under another name: the baseline is always measured
    return picked


def _choose_by_measurement(replayed: list[SearchResult], measured: dict[str, Measurement], *,
                           predicted_best: SearchResult) -> tuple[SearchResult, dict[str, Measurement], str]:
    """Keep the replayed plan fastest on the even timed steps (:func:`pipeline.calibration.selection.choose_measured`;
    Megatron's plan competes too) and report every replayed plan's time from the odd steps."""
    from pipeline.calibration.selection import choose_measured

    times = {m: list(x.measured_iteration_times or [x.measured_ms]) for m, x in measured.items()}
    choice = choose_measured(times, among=[o.method for o in replayed if o.method in measured])
    reported = {m: replace(x, measured_ms=choice.reported_ms[m], chosen_on_ms=choice.choosing_ms[m])
                for m, x in measured.items()}
    chosen = next(o for o in replayed if o.method == choice.chosen)
    ranking = ", ".join(f"{m} {choice.choosing_ms[m]:.4g}" for m in sorted(times, key=choice.choosing_ms.get))
    how = ("the predicted best" if chosen is predicted_best
           else f"not the predicted best, {predicted_best.method}")
    return chosen, reported, (f"chosen by measurement: {chosen.method} ({how}) of {len(times)} replayed plans, "
                              f"by the median of the even timed steps (ms: {ranking}); every measured time "
                              "reported is the median of the odd steps")


def _executor_row_is(targets: list[dict[str, Any]], best: SearchResult, mega: SearchResult | None, *,
                     out: Path) -> list[dict[str, Any]]:
    """The deployment rows (and ``targets.json``) with the executor's naming the plan chosen by
    measurement, ``plan.json``."""
    ref = mega.iteration_time if mega is not None else None
    rows = [({**row, "method": best.method, "iteration_time": best.iteration_time,
              "speedup": ref / best.iteration_time if ref else None, "file": "plan.json", "chosen_by": "measured"}
             if row.get("target") == "executor" else row) for row in targets]
    (out / "targets.json").write_text(json.dumps(rows) + "\n")
    return rows


def _summary(best: SearchResult, mega: SearchResult | None, measured: dict[str, Measurement], *,
             unit: str) -> dict[str, Any]:
    """The headline figures: best method, predicted and measured times and speedups over Megatron."""
    out: dict[str, Any] = {"best_method": best.method, "predicted_time": best.iteration_time, "time_unit": unit,
                           "predicted_bubble": best.result.mean_bubble,
                           "peak_memory_gb": max(best.result.peak_memory_gb)}
    if mega is not None:
        out.update({"megatron_predicted_time": mega.iteration_time,
                    "predicted_speedup": mega.iteration_time / best.iteration_time,
                    "megatron_predicted_bubble": mega.result.mean_bubble})
    m = measured.get(best.method)
    if m is not None:
        out.update({"measured_ms": m.measured_ms, "predicted_runtime_ms": m.predicted_runtime_ms,
                    "prediction_error_pct": 100 * (m.predicted_runtime_ms - m.measured_ms) / m.measured_ms})
        if m.calibration_plans_ratio:
            out["calibration_plans_ratio"] = m.calibration_plans_ratio
        if m.predicted_same_job_ms:
            out.update({"predicted_same_job_ms": m.predicted_same_job_ms,
                        "same_job_error_pct": 100 * (m.predicted_same_job_ms - m.measured_ms) / m.measured_ms})
        mm = measured.get(mega.method) if mega is not None else None
        if mm is not None and mm.measured_ms:
            out.update({"megatron_measured_ms": mm.measured_ms,
                        "measured_speedup": mm.measured_ms / m.measured_ms})
    return out
