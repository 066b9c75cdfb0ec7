"""The whole workflow in one tracked run: costs, search (tuner + RL policy), replay, summary.

On this machine (no --gpu, no --cluster) it profiles the model and the link on --devices local
ranks with the executor (gloo on CPU), searches plans with those measured costs, replays the best
plan and the Megatron baseline under torchrun, and compares prediction with measurement. With
--gpu NAME it uses the analytic costs of that GPU for a cluster of --devices and skips the
replay (the cluster is not this machine) with a note.

Ends with one summary: predicted and measured iteration times, speedup over Megatron, bubbles,
peak memory, and where the time went (per device busy/bubble and dominant layer kind; layer kinds
by share of the compute; measured time by F/I/W/B). Writes to --out: plan.json, plan.csv,
profile.json, cluster.json, search_rows.jsonl (each method's row as it ends; kept on Ctrl-C),
gantt_predicted.png, gantt_measured.png, gantt_fidelity.png and summary.json. Before each torchrun
job the ranks' memory is checked against this machine's (executor/preflight.py). Logs one W&B
group (offline by default): runs profile, [train,] search, [replay,] summary; the summary run
holds the metrics, tables, Gantt charts and the plan artifact.
--target {executor,torchtitan,megatron} keeps the plan inside what that runtime runs and writes
megatron_args.txt / torchtitan.toml (experiments/deploy.py); --trace FILE.json writes the best
plan's predicted and measured timelines in the Chrome trace format.

Examples:
  python -m experiments run                                     # tiny-hybrid on 2 local CPU ranks
  python -m experiments run --model tiny-hybrid --devices 2 --train-policy 2000
  python -m experiments run --model gemma-medium --gpu h100 --devices 8   # analytic, no replay
  python -m experiments run --hf-config config.json --gpu a100 --devices 4 --memory-gb 40
  python -m experiments run --model gemma-small --gpu h100 --devices 4 --target megatron --trace t.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agents.base import DEFAULT_CALLS
from experiments.common import (
    add_granularity_args,
    add_strict_arg,
    check_microbatches,
    interrupted,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    print_table,
)
from experiments.deploy import add_target_arguments, add_trace_argument, print_targets
from experiments.workflow import DEFAULT_METHODS, SEARCH_ROWS, WorkflowConfig, WorkflowReport, run_workflow

__all__ = ["NAME", "HELP", "add_arguments", "run", "config_from_args", "print_report"]

NAME = "run"
HELP = "the whole workflow: profile or analytic costs, search (tuner + RL), replay, compare, one W&B group"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model (one of)")
    ex = model.add_mutually_exclusive_group()
    ex.add_argument("--model", default=None, help="zoo model (default tiny-hybrid: built and run here)")
    ex.add_argument("--hf-config", metavar="FILE", help="a Hugging Face config.json (needs --gpu)")
    model.add_argument("--profile", metavar="FILE", help="use this profile JSON instead of profiling")
    add_strict_arg(model)
    model.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence (default: model's)")
    model.add_argument("--microbatch-size", type=positive_int, default=1, help="sequences per micro-batch")
    model.add_argument("--scale", type=positive_float, default=1.0, help="shrink the local model's widths (0, 1]")
    add_granularity_args(model)
    cl = parser.add_argument_group("cluster (default: this machine)")
    cl.add_argument("--gpu", default=None, help="GPU preset (h100, a100, ...): analytic costs, no replay")
    cl.add_argument("--cluster", metavar="FILE", help="a cluster JSON (not this machine: no replay)")
    cl.add_argument("--devices", type=positive_int, default=2, help="pipeline devices (local ranks here)")
    cl.add_argument("--gpus-per-node", type=positive_int, default=8, help="devices per node")
    cl.add_argument("--memory-gb", type=positive_float, default=None,
                    help="memory capacity per device in GiB, 2**30 bytes (default: the GPU's; 64 here)")
    cl.add_argument("--memory-reserve-gb", type=non_negative_float, default=None,
                    help="GiB per device plans may not use: CUDA context, NCCL, fragmentation (default: the "
                         "GPU preset's or cluster file's; 0 on CPU ranks)")
    se = parser.add_argument_group("search")
    se.add_argument("--microbatches", type=positive_int, default=None, help="per iteration (default 8 here, 32 GPU)")
    se.add_argument("--method", default=",".join(DEFAULT_METHODS),
                    help="comma-separated methods; 'rl' is skipped with a note when no policy loads")
    se.add_argument("--budget", default=str(DEFAULT_CALLS),
                    help=f"per method: simulator calls ({DEFAULT_CALLS}) or seconds (30s)")
    se.add_argument("--max-seconds", type=positive_float, default=60.0, help="cap on each method's search time")
    se.add_argument("--seed", type=int, default=0)
    se.add_argument("--perturb-moves", type=positive_int, default=None, help="the tuner's perturbation strength")
    se.add_argument("--policy", default=None, help="RL policy file (default: the shipped one)")
    se.add_argument("--train-policy", type=non_negative_int, default=0, metavar="TIMESTEPS",
                    help="first train an RL policy this many steps and use it (0: no training)")
    rp = parser.add_argument_group("replay (this machine only)")
    rp.add_argument("--no-replay", action="store_true", help="search only")
    rp.add_argument("--steps", type=positive_int, default=10, help="timed steps per plan (median kept)")
    rp.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps first")
    rp.add_argument("--profile-repeats", type=positive_int, default=5, help="timed repeats per layer when profiling")
    rp.add_argument("--calibration-plans", type=non_negative_int, default=6, metavar="N",
                    help="random plans replayed to calibrate the profile before the search (0: none)")
    rp.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank")
    rp.add_argument("--timeout", type=positive_float, default=900.0, help="seconds for each torchrun job")
    add_target_arguments(parser)
    add_trace_argument(parser, "the best plan's predicted and measured timelines")
    parser.add_argument("--out", default=None, help="output folder (default runs/run-<model>)")
    parser.add_argument("--group", default=None, help="W&B group (default run-<model>-<time>)")
    parser.add_argument("--wandb-project", default="adaptis", help="W&B project (runs are offline by default)")
    parser.add_argument("--json", action="store_true", help="print summary.json's content as one JSON line")


def config_from_args(args: argparse.Namespace) -> WorkflowConfig:
    """The :class:`WorkflowConfig` that the parsed arguments describe."""
    model = args.model or (None if args.hf_config or (args.profile and args.gpu) else "tiny-hybrid")
    methods = tuple(m.strip() for m in args.method.split(",") if m.strip())
    label = model or "model"
    if args.hf_config or (args.profile and not model):
        label = Path(args.hf_config or args.profile).stem
    return WorkflowConfig(
        model=model, hf_config=args.hf_config, profile_path=args.profile, cluster_path=args.cluster, gpu=args.gpu,
        devices=args.devices, gpus_per_node=args.gpus_per_node, memory_gb=args.memory_gb,
        memory_reserve_gb=args.memory_reserve_gb, seq_len=args.seq_len,
        microbatch_size=args.microbatch_size, scale=args.scale, granularity=args.granularity,
        head_shards=args.head_shards, microbatches=args.microbatches, methods=methods,
        budget=args.budget, max_seconds=args.max_seconds, seed=args.seed, perturb_moves=args.perturb_moves,
        policy=args.policy, train_policy=args.train_policy, replay=not args.no_replay, steps=args.steps,
        warmup=args.warmup, profile_repeats=args.profile_repeats, calibration_plans=args.calibration_plans,
        threads=args.threads, timeout=args.timeout,
        out=args.out or f"runs/run-{label}", group=args.group, project=args.wandb_project, target=args.target,
        trace=args.trace)


def print_report(report: WorkflowReport) -> None:
    """The summary on stdout: comparison, where the time went, files, W&B group."""
    cfg, costs = report.config, report.costs
    p, c = costs.profile, costs.cluster
    where = (f"this machine ({costs.device or 'cpu'}, {costs.backend or 'gloo'}, costs {costs.source})" if costs.local
             else f"{c.name} (costs {costs.source})")
    unit = p.time_unit
    print(f"\n{cfg.label}: {p.num_layers} layers on {c.devices} devices of {where}, "
          f"{report.best.plan.microbatches} micro-batches of {p.microbatch_size}x{p.seq_len} tokens\n")
    table = []
    for r in report.rows:
        table.append({"method": r["method"] + ("" if r.get("feasible", True) or r.get("predicted") is None
                                                else " (OOM)"),
                      f"predicted_{unit}": r.get("predicted") if r.get("predicted") is not None
                      else (r.get("note") or "")[:60],
                      "speedup": r.get("speedup"), "bubble_%": r.get("bubble_pct"), "peak_GiB": r.get("peak_mem_gb"),
                      "measured_ms": r.get("measured_ms"), "meas_speedup": r.get("measured_speedup"),
                      "meas_bubble_%": r.get("measured_bubble_pct"), "pred_err_%": r.get("error_pct"),
                      "same_job_err_%": r.get("same_job_error_pct")})
    table = [{k: ("" if v is None else v) for k, v in row.items()} for row in table]
    empty = [k for k in table[0] if all(row[k] == "" for row in table)]
    table = [{k: v for k, v in row.items() if k not in empty} for row in table]
    print_table(table, list(table[0]), title="methods (speedup = over megatron; measured = replayed here)")
    s = report.summary
    line = f"\nbest: {s['best_method']} predicted {s['predicted_time']:.4g} {unit}"
    if "predicted_speedup" in s:
        line += f", {s['predicted_speedup']:.2f}x megatron predicted"
    if "measured_speedup" in s:
        line += (f", {s['measured_speedup']:.2f}x measured ({s['measured_ms']:.4g} ms vs "
                 f"{s['megatron_measured_ms']:.4g} ms)")
    elif "measured_ms" in s:
        line += f", measured {s['measured_ms']:.4g} ms"
    if "prediction_error_pct" in s:
        line += f"; prediction error {s['prediction_error_pct']:+.1f}%"
        if "same_job_error_pct" in s:
            line += f" ({s['same_job_error_pct']:+.1f}% calibrated on the random plans replayed in the same job)"
    print(line)
    print()
    print_table(report.devices, list(report.devices[0]),
                title=f"where the time went: {s['best_method']} per device (busy in {unit}; top_kind = layer kind "
                      "taking most of its compute)")
    print()
    print_table(report.kinds, list(report.kinds[0]), title="layer kinds by share of the compute (f/b/w per layer)")
    ops = ", ".join(f"{op} {pct:.0f}%" for op, pct in report.op_share.items())
    print(f"\n{'measured' if report.best.method in report.measured else 'predicted'} busy time by action: {ops}")
    if s.get("targets"):
        print_targets(s["targets"], cfg.target, unit)
    for note in report.notes:
        print(f"note: {note}")
    print(f"\nfiles: {cfg.out}/ (plan.json, plan.csv, profile.json, cluster.json, {SEARCH_ROWS}, "
          + ", ".join(sorted({k.split('/')[-1] for k in report.files if k.startswith('gantt')})) + " gantt PNGs, "
          "summary.json)")
    if report.run_dirs:
        print(f"W&B group {report.group!r} (offline): {len(report.run_dirs)} runs in "
              f"{min(report.run_dirs.values()).rsplit('/', 1)[0]}; upload with: wandb sync <run folder>")
    print(f"took {report.seconds.get('total', 0):.0f} s")


#: What the workflow writes to --out, in the order its phases write them.
KEPT_FILES = ("profile.json", "cluster.json", "calibrated_profile.json", "policy/policy.pth", SEARCH_ROWS, "plan.json",
              "plan.csv", "megatron_args.txt", "torchtitan.toml", "summary.json")


def kept_files(out: Path) -> str:
    """What an interrupted workflow left in ``out`` (for its last line): the files written so far, with
    the methods whose search rows were kept, or none."""
    kept = [name for name in KEPT_FILES if (out / name).is_file()]
    if not kept:
        return f"stopped before any file was written to {out}"
    line = f"kept {', '.join(kept)} in {out}"
    if "plan.json" not in kept:
        methods = []
        if SEARCH_ROWS in kept:
            for text in (out / SEARCH_ROWS).read_text().splitlines():
                try:
                    methods.append(str(json.loads(text)["method"]))
                except (ValueError, KeyError, TypeError):
                    continue
        if methods:
            line += (f" ({SEARCH_ROWS}: the rows of {len(methods)} finished method{'s' if len(methods) > 1 else ''}, "
                     f"{', '.join(methods)})")
        line += "; the search had not finished: no plan yet"
    return line


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.microbatches is not None:
        check_microbatches(args.microbatches, args.devices)
    try:
        report = run_workflow(cfg)
    except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C, or SIGTERM (experiments.cli makes it SystemExit);
        return interrupted(stop, kept_files(Path(cfg.out)))  # a torchrun job was stopped by the executor
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        print_report(report)
    return 0
