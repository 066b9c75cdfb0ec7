"""Run a plan on real layers with torch.distributed and compare it with the performance model.

Starts ``torchrun`` with one process per device of the plan (gloo on CPU, NCCL on GPU). The job
first measures the link and profiles the model on this machine (unless --profile is given),
then runs the plan: --warmup steps, then --steps timed steps; the median is the measured
iteration time. The prediction simulates the same plan with that profile and link, so

  python -m experiments search --model tiny-hybrid --devices 2 --out DIR
  python -m experiments replay --plan DIR/plan.json --model tiny-hybrid

compares like with like. Writes the measured and predicted timelines (JSON) and both Gantt
charts in one PNG to --out (default: next to the plan), and the measurements fed back:
``calibrated_profile.json``, the profile with each kind of operation (F, I, W, B) scaled by
measured over predicted time on this replay and the runtime's per-action overhead fitted, for
``search --profile``. --check also compares the loss, every
gradient and the weights after a few optimizer steps with the unpipelined model. --trace FILE.json
writes the measured and the predicted timeline in one Chrome trace (Perfetto, chrome://tracing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.common import (
    add_granularity_args,
    add_strict_arg,
    check_file_path,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from pipeline.arch import Architecture
    from pipeline.plan import Plan
    from pipeline.spec import Cluster, ModelProfile

__all__ = ["NAME", "HELP", "add_arguments", "run"]

NAME = "replay"
HELP = "run a plan on real layers (torchrun), measure it and compare with the prediction"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON")
    parser.add_argument("--model", default="tiny-hybrid", help="zoo model the plan was made for")
    parser.add_argument("--scale", type=positive_float, default=1.0, help="shrink the model's widths (0, 1]")
    add_granularity_args(parser)
    parser.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence")
    parser.add_argument("--microbatch-size", type=positive_int, default=None, help="sequences per micro-batch")
    parser.add_argument("--profile", metavar="P.json", help="predict with this profile instead of measuring one")
    add_strict_arg(parser)
    parser.add_argument("--cluster", metavar="C.json", help="predict with this cluster instead of the measured link")
    parser.add_argument("--nproc", type=positive_int, default=None, help="processes (must equal the plan's devices)")
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps first")
    parser.add_argument("--profile-repeats", type=positive_int, default=7,
                        help="timed repeats per layer of the job's profile (none with --profile and --cluster)")
    parser.add_argument("--check", action="store_true", help="compare loss/gradients/weights with one process")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per process")
    parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds for the whole job")
    parser.add_argument("--transfer-timeout", type=positive_float, default=60.0,
                        help="seconds for process-group set-up and for each transfer")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    parser.add_argument("--out", metavar="DIR", help="where timelines and the Gantt PNG go")
    parser.add_argument("--trace", metavar="FILE.json",
                        help="write the measured and predicted timelines in the Chrome trace format")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--wandb-project", default="adaptis", help="W&B project (offline by default)")


def run(args: argparse.Namespace) -> int:
    check_file_path(args.trace, "--trace")  # before the job, not after it
    from executor.model import default_seq_len, resolve_architecture
    from executor.replay import ReplayOptions, check_plan, run_job
    from pipeline.calibration.agreement import compare_plans
    from pipeline.calibration.fidelity import calibrate, calibrated_profile, measured_cluster
    from pipeline.plan import Plan
    from pipeline.render import gantt_side_by_side
    from pipeline.spec import Cluster, ModelProfile

    plan = Plan.load(args.plan)
    arch = resolve_architecture(args.model, scale=args.scale, granularity=args.granularity,
                                head_shards=args.head_shards)
    check_plan(plan, arch, world_size=args.nproc or plan.devices, source=args.plan)  # before any process starts
    given = ModelProfile.load(args.profile) if args.profile else None
    seq_len = args.seq_len or (given.seq_len if given else default_seq_len(arch))
    mbs = args.microbatch_size or (given.microbatch_size if given else 1)
    measure = given is None or not args.cluster
    check_memory(args, plan, arch, seq_len=seq_len, microbatch_size=mbs, measure=measure)  # before torchrun
    out_dir = output_folder(args.out if args.out else Path(args.plan).resolve().parent / "replay")
    options = ReplayOptions(model=args.model, scale=args.scale, granularity=args.granularity,
                            head_shards=args.head_shards, seq_len=seq_len, microbatch_size=mbs,
                            steps=args.steps, warmup=args.warmup, check=args.check, threads=args.threads,
                            transfer_timeout=args.transfer_timeout, backend=args.backend)
    result = run_job([plan], options, measure=measure, timeout=args.timeout,
                     profile_repeats=args.profile_repeats)
    profile = given or ModelProfile.from_dict(result["profile"], source="measured profile")
    if args.cluster:
        cluster = Cluster.load(args.cluster)
    else:
        cluster = measured_cluster(plan.devices, result["p2p"] or {"latency_us": 0.0, "p2p_gbps": 1e6})
    comp = compare_plans([(plan.method, plan)], profile, cluster, runs=result["runs"])[0]
    to_ms = profile.seconds_per_unit * 1e3
    predicted_ms = comp.predicted * to_ms
    searched_ms, notes = prediction_notes(plan, profile, cluster, profile_file=args.profile,
                                          cluster_file=args.cluster, replay_ms=predicted_ms)
    pred_tl = dict(comp.predicted_timeline)
    if to_ms != 1.0:
        pred_tl["events"] = [{**e, "start": e["start"] * to_ms, "end": e["end"] * to_ms} for e in pred_tl["events"]]
        pred_tl["time_unit"] = "ms"
    (out_dir / "measured_timeline.json").write_text(json.dumps(comp.measured_timeline) + "\n")
    (out_dir / "predicted_timeline.json").write_text(json.dumps(pred_tl) + "\n")
    if args.trace:
        from experiments.deploy import write_plan_trace

        write_plan_trace(args.trace, plan, profile, cluster=cluster, predicted=pred_tl, measured=comp.measured_timeline,
                         title=f"{plan.method} replay")
    if given is None:
        profile.save(out_dir / "profile.json")
    cluster.save(out_dir / "cluster.json")
    scales = calibrate([(plan.method, plan)], profile, cluster, runs=result["runs"])
    calibrated_profile(profile, scales).save(out_dir / "calibrated_profile.json")
    png = gantt_side_by_side([comp.measured_timeline, pred_tl],
                             [f"measured ({plan.method})", "predicted (performance model)"], out_dir / "gantt.png")
    run_out = comp.run
    row = {
        "plan": args.plan, "method": plan.method, "devices": plan.devices, "microbatches": plan.microbatches,
        "time_unit": "ms",
        "measured_iteration_time": comp.measured,
        "predicted_iteration_time": predicted_ms,
        "error_pct": 100 * (predicted_ms - comp.measured) / comp.measured,
        "measured_iteration_times": run_out["measured_iteration_times"],
        "loss": run_out.get("loss"),
        "backend": result.get("backend"), "device": result.get("device"),
        "p2p_latency_us": cluster.latency_us, "p2p_gbps": cluster.p2p_gbps,
        "gantt": str(png), "out": str(out_dir),
        "search_predicted_iteration_time": searched_ms, "profile": args.profile or "measured",
        "notes": notes,
        "runtime_scales": {k: round(v, 4) for k, v in scales.items()},
        "calibrated_profile": str(out_dir / "calibrated_profile.json"),
    }
    if args.check:
        row.update({k: run_out[k] for k in ("max_grad_error", "loss_error", "max_weight_error")})
    # --- W&B: one small call; the tracking helper decides offline/disabled ------------------
    try:
        from experiments.tracking.hooks import tracked_run

        with tracked_run(args, command=NAME, config={"plan": args.plan, "model": args.model}) as tracker:
            tracker.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))})
            tracker.log_image("gantt", str(png))
    except Exception as exc:  # noqa: BLE001 - tracking must never fail a replay
        if not args.json:
            print(f"(W&B logging skipped: {exc})")
    # ------------------------------------------------------------------------------------------
    if args.json:
        print(json.dumps(row))
        return 0
    print(f"replayed {args.plan}: {plan.method}, {plan.num_stages} stages on {plan.devices} ranks "
          f"({row['backend']}, {row['device']}), {plan.microbatches} micro-batches of {mbs}x{seq_len} tokens")
    print(f"measured iteration time  {comp.measured:9.2f} ms  (median of {args.steps}: "
          + ", ".join(f"{t:.1f}" for t in row["measured_iteration_times"]) + ")")
    print(f"predicted iteration time {predicted_ms:9.2f} ms  ({row['error_pct']:+.1f}%; PyTorch's runtime on the "
          f"plan's stages: fused B, first stage's backward in W)")
    for note in notes:
        print(note)
    if args.check:
        print(f"check vs one process: max gradient error {row['max_grad_error']:.2e}, loss error "
              f"{row['loss_error']:.2e}, weights after optimizer steps {row['max_weight_error']:.2e}")
    print("measured / predicted per kind of operation: "
          + ", ".join(f"{k} {v:.2f}" for k, v in scales.items() if k != "overhead")
          + f"; per-action overhead {scales['overhead'] * to_ms:.3f} ms"
          + f" -> {out_dir / 'calibrated_profile.json'} (use with search --profile)")
    print(f"timelines and Gantt chart: {out_dir} ({png.name})")
    return 0


def prediction_notes(plan: Plan, profile: ModelProfile, cluster: Cluster, *, profile_file: str | None,
                     cluster_file: str | None, replay_ms: float) -> tuple[float, list[str]]:
    """The prediction ``search``/``run`` make of ``plan`` with this profile and cluster (ms), and the lines
    replay prints about it: which profile and cluster it used and, when the plan's ``meta["predicted"]``
    (written by search and run) was priced with other costs, that it was and what it predicted there."""
    from experiments.common import digest
    from pipeline.simulator import simulate
    from pipeline.spec import TrainingConfig

    meta = plan.meta.get("predicted") if isinstance(plan.meta.get("predicted"), dict) else {}
    runtime = meta.get("runtime") if isinstance(meta.get("runtime"), str) else TrainingConfig().runtime
    try:
        training = TrainingConfig(runtime=runtime)
    except (ValueError, TypeError):
        training = TrainingConfig()
    to_ms = profile.seconds_per_unit * 1e3
    searched_ms = simulate(plan, profile, cluster, training=training).iteration_time * to_ms
    used = f"profile {profile_file}" if profile_file else "the profile this job measured on this machine"
    link = f"cluster {cluster_file}" if cluster_file else "the link this job measured"
    lines = [f"predicted with {used} and {link}: search's model {searched_ms:.2f} ms for this plan "
             f"(runtime {training.runtime}); the replay's {replay_ms:.2f} ms adds what PyTorch's runtime does on its "
             "stages"]
    if meta.get("iteration_time") is not None:
        other = [what for what, key, thing in (("profile", "profile_digest", profile),
                                               ("cluster", "cluster_digest", cluster))
                 if meta.get(key) and meta.get(key) != digest(thing)]
        unit = meta.get("time_unit", profile.time_unit)
        if not other:
            lines.append(f"the same profile and cluster as this plan's search, which predicted "
                         f"{float(meta['iteration_time']):.4g} {unit}")
        else:
            where = meta.get("profile_file") or meta.get("profile", "?")
            lines.append(f"note: this plan was searched with another {' and '.join(other)} ({where}), which "
                         f"predicted {float(meta['iteration_time']):.4g} {unit}; for the same prediction replay it "
                         "with --profile and --cluster of that search")
    return searched_ms, lines


def on_gpu(backend: str | None) -> bool:
    """Whether the ranks run on GPUs (NCCL): their tensors then live in GPU, not host, memory."""
    if backend is not None:
        return backend == "nccl"
    import torch

    return torch.cuda.is_available()


def check_memory(args: argparse.Namespace, plan: Plan, arch: Architecture, *, seq_len: int, microbatch_size: int,
                 measure: bool) -> None:
    """Refuse a CPU replay whose ranks would not fit in this machine's available memory, with the fixes
    (:mod:`executor.preflight`); GPU replays are not checked."""
    from executor.model import resolve_architecture
    from executor.preflight import HEADROOM, available_bytes, check_fits, fitting_scale, replay_estimate
    from pipeline.spec import GIB

    available = available_bytes()
    if available is None or on_gpu(args.backend):
        return

    def estimate(scale: float, *, profiling: bool = measure):
        narrowed = arch if scale == args.scale else resolve_architecture(
            args.model, scale=scale, granularity=args.granularity, head_shards=args.head_shards)
        return replay_estimate(plan, narrowed, seq_len=seq_len, microbatch_size=microbatch_size,
                               measure=profiling, check=args.check)

    found = estimate(args.scale)
    if found.total <= HEADROOM * available:
        return
    fixes = []
    fit = fitting_scale(estimate, args.scale, available)
    if fit is not None:
        fixes.append(f"--scale {fit[0]:g} (about {fit[1] / GIB:.1f} GiB)")
    if measure:
        fixes.append(f"--profile P.json --cluster C.json, so the ranks do not profile the whole model (about "
                     f"{estimate(args.scale, profiling=False).total / GIB:.1f} GiB)")
    if plan.devices > 1 and max(found.per_process) <= HEADROOM * available:
        fixes.append(f"a plan for fewer ranks (search --devices N; this one has {plan.devices})")
    fixes.append("or a smaller model (--model tiny-hybrid)")
    check_fits(found, what=f"replaying {args.plan} on {plan.devices} CPU ranks", fixes=fixes, available=available)
