"""Sweep search and agent settings offline: a grid of trials, each an offline W&B run in one group.

Every combination of the --param values is one trial: a search of the model and cluster with one
method (default the AdaPtis tuner) under those settings. The trials are logged as W&B runs in one
group (offline by default; compare them in W&B's group view after `wandb sync`), plus a run
"summary" with the table of all trials and the best plan as an artifact. Prints the trials, best
first (objective: predicted iteration time of a plan that fits in memory), and writes
OUT/trials.jsonl, OUT/best_plan.json and OUT/best_plan.csv.

The sampler is a plain grid (Optuna is not a dependency). With Optuna installed, --sampler optuna
lets its TPE sampler choose --max-trials combinations among the same values. W&B's own sweeps
need a W&B server (the sweep controller lives there); use them when you have one.

Settings (--param KEY=V1,V2, repeatable): scenario settings microbatches, memory_gb, devices, runtime
(the runtime model every trial's plan and its Megatron reference are priced on; default --runtime);
search settings budget (calls, or seconds as 30s), seed, method; and any setting of the method's
searcher, e.g. perturb_moves (adaptis) or samples, max_calls (rl).

Examples:
  python -m experiments sweep --param budget=100,400 --param seed=0,1 --param perturb_moves=2,4
  python -m experiments sweep --model deepseek-small --devices 4 --param memory_gb=40,80 --param microbatches=16,32
  python -m experiments sweep --param runtime=ideal,megatron,zb --param seed=0
  python -m experiments sweep --profile runs/run-tiny-hybrid/profile.json \\
      --cluster runs/run-tiny-hybrid/cluster.json --param seed=0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agents.run_methods import Interrupted
from experiments.common import (
    add_cluster_args,
    add_model_args,
    add_runtime_arg,
    check_microbatches,
    interrupted,
    output_folder,
    positive_int,
    print_json_lines,
    print_table,
    resolve_scenario,
    resolve_training,
)
from pipeline.runtime import runtime_named

__all__ = ["NAME", "HELP", "add_arguments", "run"]

NAME = "sweep"
HELP = "grid sweep over search/agent settings (budget, seed, perturb_moves, microbatches, memory); one W&B group"
COLUMNS = ("trial", "iteration_time", "speedup", "bubble_pct", "peak_mem_gb", "sim_calls", "seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser, default_devices=8)
    parser.add_argument("--param", action="append", default=[], metavar="KEY=V1,V2",
                        help="a setting and its values (repeat for more settings); default: seed=0,1")
    parser.add_argument("--method", default="adaptis", help="method searched in every trial (or --param method=...)")
    parser.add_argument("--microbatches", type=positive_int, default=32, help="micro-batches (unless swept)")
    parser.add_argument("--budget", default="200", help="per trial: simulator calls or seconds (30s), unless swept")
    parser.add_argument("--seed", type=int, default=0, help="seed (unless swept); also Optuna's")
    add_runtime_arg(parser)
    parser.add_argument("--sampler", choices=("grid", "optuna"), default="grid",
                        help="grid: every combination; optuna: TPE over the values (needs optuna installed)")
    parser.add_argument("--max-trials", type=positive_int, default=None, help="stop after this many trials")
    parser.add_argument("--out", default=None, help="output folder (default runs/sweep-<model>)")
    parser.add_argument("--group", default=None, help="W&B group (default sweep-<model>-<time>)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per trial, best first")
    parser.add_argument("--wandb-project", default="adaptis", help="W&B project (runs are offline by default)")


def run(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from agents.base import Budget
    from experiments.common import DEFAULT_MODEL
    from experiments.sweeps import Trial, parse_params, run_sweep, save_trials
    from experiments.tracking import start_run
    from pipeline.errors import ConfigError

    params = parse_params(args.param or ["seed=0,1"])
    try:
        Budget.parse(args.budget)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--budget") from None
    profile, cluster = resolve_scenario(args)
    mbs = [v for v in params.get("microbatches", [args.microbatches]) if isinstance(v, int)]
    devs = [v for v in params.get("devices", [cluster.devices]) if isinstance(v, int)]
    check_microbatches(max(mbs, default=1), max(devs, default=1),
                       field="--param microbatches" if "microbatches" in params else "--microbatches")
    label = args.model or (Path(args.profile).stem if args.profile else None) or \
        (Path(args.hf_config).stem if args.hf_config else DEFAULT_MODEL)
    group = args.group or f"sweep-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = output_folder(args.out or f"runs/sweep-{label}", command=NAME, inputs=args)
    size = 1
    for values in params.values():
        size *= len(values)
    total = min(size, args.max_trials or size)
    bar = tqdm(total=total, desc="sweep", unit="trial", file=sys.stderr, disable=None)
    base = {"profile": profile.name, "devices": cluster.devices, "microbatches": args.microbatches,
            "method": args.method, "budget": args.budget, "seed": args.seed, "sampler": args.sampler,
            "runtime": runtime_named(resolve_training(args).runtime).name}

    finished: list[Trial] = []

    def on_trial(trial: Trial) -> None:
        finished.append(trial)
        with open(out / "trials.jsonl", "a" if len(finished) > 1 else "w") as fh:  # rewritten best first at the end
            fh.write(json.dumps(trial.row()) + "\n")
        with start_run(command=NAME, config={**base, **trial.params, "trial": trial.index},
                       project=args.wandb_project, group=group, name=f"{group}-t{trial.index}",
                       job_type="trial") as tracker:
            tracker.log_metrics({k: v for k, v in trial.row().items() if isinstance(v, int | float)
                                 and not isinstance(v, bool) and k != "trial"})
            tracker.summary({"objective": trial.objective if trial.feasible else None, "feasible": trial.feasible})
            trial.run_dir = str(tracker.run_dir) if tracker.run_dir else None
        bar.update(1)
        bar.set_postfix_str(f"t{trial.index}: {trial.iteration_time or float('nan'):.4g}")

    try:
        trials = run_sweep(params, profile=profile, cluster=cluster, microbatches=args.microbatches,
                           method=args.method, budget=args.budget, seed=args.seed, max_trials=args.max_trials,
                           sampler=args.sampler, on_trial=on_trial, runtime=base["runtime"])
    except (KeyboardInterrupt, SystemExit, Interrupted) as stop:  # Ctrl-C, or SIGTERM (SystemExit: experiments.cli)
        bar.close()
        return interrupted(stop, _keep_finished(finished, out, total))
    bar.close()
    save_trials(trials, out)
    rows = [t.row() for t in trials]
    best = trials[0] if trials and trials[0].feasible else None
    with start_run(command=NAME, config={**base, "params": params}, project=args.wandb_project, group=group,
                   name=f"{group}-summary", job_type="summary") as tracker:
        tracker.log_table("trials", rows)
        if best is not None:
            tracker.log_plan(best.plan, name=f"sweep-best-{label}"[:128].replace("/", "-"), metadata=best.row())
            tracker.summary({"best_trial": best.index, "best_iteration_time": best.iteration_time,
                             "best_speedup": best.speedup, **{f"best/{k}": v for k, v in best.params.items()}})
    if args.json:
        print_json_lines(rows)
    else:
        keys = list(params)
        why = ["reason"] if any(r.get("reason") for r in rows) else []
        table = [{**row, **(t.found.cells() if t.found else {}), "method": t.method,
                  "reason": (row.get("reason") or "")[:70]} for t, row in zip(trials, rows)]
        print_table(table, [COLUMNS[0], *keys, *COLUMNS[1:], *why],
                    title=f"{profile.name} on {cluster.devices} devices: {len(trials)} trials of {args.method} "
                          f"(sampler {args.sampler}; time in {profile.time_unit}; speedup over megatron), best first")
        if best is not None:
            setting = ", ".join(f"{k}={v}" for k, v in best.params.items())
            print(f"\nbest: trial {best.index} ({setting}) {best.iteration_time:.4g} {profile.time_unit}"
                  + (f", {best.speedup:.2f}x megatron" if best.speedup else "")
                  + f" -> {out / 'best_plan.json'}; W&B group {group!r}")
        if best is None:
            near = min(trials, key=lambda t: (t.peak_memory_max_gb is None, t.peak_memory_max_gb or 0.0), default=None)
            why = f"; trial {near.index}: {near.reason}" if near is not None and near.reason else ""
            print(f"no trial found a plan that fits in memory{why}", file=sys.stderr)
    return 0 if best is not None else 3


def _keep_finished(finished: list, out: Path, total: int) -> str:
    """An interrupted sweep writes its finished trials (OUT/trials.jsonl, best first) and the best plan
    among them (OUT/best_plan.json); what was kept and where, for its last line."""
    import math

    from experiments.sweeps import save_trials

    if not finished:
        return f"no trial of {total} had finished; nothing written to {out}"
    trials = sorted(finished, key=lambda t: (t.objective, t.index))
    save_trials(trials, out)
    kept = (f"kept the rows of {len(trials)} finished trial{'s' if len(trials) > 1 else ''} of {total} in "
            f"{out / 'trials.jsonl'}")
    if math.isfinite(trials[0].objective) and trials[0].plan is not None:
        kept += f" and the best plan so far (trial {trials[0].index}) in {out / 'best_plan.json'}"
    return kept
