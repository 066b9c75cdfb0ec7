"""Compare the RL policy, rl+tuner, the AdaPtis tuner and random search on held-out models.

The scenarios are zoo models (experiments/configs/models/, never seen in training: the policy
trains on synthetic models only) on --devices, plus any --hf-config files. For each, prints
iteration time relative to the tuner's (1.0 = as fast; below 1.0 slower), feasibility,
simulator calls and seconds. Writes OUT/results.jsonl, OUT/summary.json and, given --train-dir,
OUT/learning_curve.png from that run's eval.jsonl. Logs a table to W&B (offline by default).

Examples:
  python -m experiments evaluate-agent                                   # default policy, zoo, 4 and 8 devices
  python -m experiments evaluate-agent --models gemma-small --devices 4 --budget 100 --policy runs/t/policy.pth
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from experiments.common import add_output_args, positive_int, print_json_lines, print_table

NAME = "evaluate-agent"
HELP = "compare the RL policy with the tuner and random search on held-out models"
COLUMNS = ("model", "devices", "method", "iter_time", "feasible", "quality", "sim_calls", "seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help="policy file (default: the shipped policy)")
    parser.add_argument("--models", default="all", help="comma-separated zoo models, or 'all'")
    parser.add_argument("--hf-config", action="append", default=[], help="extra HF config.json files")
    parser.add_argument("--devices", default="4,8", help="comma-separated device counts")
    parser.add_argument("--microbatches", type=positive_int, default=32)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--budget", type=positive_int, default=400, help="simulator calls of the tuner and random")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="cap in seconds per search, besides its simulator-call budget")
    parser.add_argument("--methods", default="rl,rl+tuner,adaptis,random")
    parser.add_argument("--samples", type=int, default=4, help="K: sampled rollouts of the policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-dir", default=None, help="a training run's folder: plot its learning curve")
    parser.add_argument("--out", default="runs/evaluate-agent")
    add_output_args(parser)


def _scenarios(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from pipeline.costs import profile_from_architecture
    from pipeline.hf import load_hf_config
    from pipeline.zoo import list_models, zoo_profile

    names = [m for m in list_models() if m != "tiny-hybrid"] if args.models == "all" else \
        [m.strip() for m in args.models.split(",") if m.strip()]
    out = [(name, zoo_profile(name, gpu=args.gpu)) for name in names]
    for path in args.hf_config:
        arch = load_hf_config(path)
        out.append((Path(path).stem, profile_from_architecture(arch, gpu=args.gpu)))
    return out


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agents.base import Budget
    from agents.registry import make_searcher
    from experiments.tracking_hooks import tracked_run
    from pipeline.hardware import build_cluster
    from pipeline.space import Problem

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    devices = [int(d) for d in args.devices.split(",") if d.strip()]
    budget = Budget(args.budget, args.max_seconds)
    rows: list[dict[str, Any]] = []
    jobs = [(name, prof, P) for name, prof in _scenarios(args) for P in devices if prof.num_layers >= P]
    for name, profile, P in tqdm(jobs, desc="evaluate-agent", unit="scenario", file=sys.stderr, disable=None):
        problem = Problem(profile, build_cluster(args.gpu, devices=P), args.microbatches)
        results = {}
        for m in methods:
            searcher = make_searcher(m)
            if hasattr(searcher, "policy_path") and args.policy:
                searcher.policy_path = args.policy
            if hasattr(searcher, "samples"):
                searcher.samples = args.samples
            results[m] = searcher.search(problem, budget=budget, seed=args.seed)
        ref = results.get("adaptis")
        for m, r in results.items():
            row = {"model": name, "devices": P, "method": m, "iter_time": r.iteration_time if r.ok else None,
                   "feasible": bool(r.ok and r.result.feasible), "sim_calls": r.sim_calls,
                   "seconds": round(r.seconds, 2)}
            if ref is not None and ref.ok and r.ok and ref.result.feasible and r.result.feasible:
                row["quality"] = ref.iteration_time / r.iteration_time
            rows.append(row)
    summary = _summarise(rows, methods)
    with open(out / "results.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    png = None
    if args.train_dir:
        from experiments.commands.train import learning_curve

        png = learning_curve(Path(args.train_dir) / "eval.jsonl", out / "learning_curve.png")
    config = {"methods": methods, "devices": devices, "budget": args.budget, "policy": args.policy or "default"}
    with tracked_run(args, command=NAME, config=config) as tracker:
        tracker.log_table("evaluate_agent", rows)
        tracker.summary({f"{m}/{k}": v for m, s in summary.items() for k, v in s.items() if v is not None})
        if png is not None:
            tracker.log_image("learning_curve", png)
    if args.json:
        print_json_lines(rows)
    else:
        print_table(rows, COLUMNS, title=f"quality = tuner's iteration time / method's (feasible plans; "
                    f"tuner budget {args.budget} calls)")
        print()
        print_table([{"method": m, **s} for m, s in summary.items()],
                    ("method", "mean_quality", "min_quality", "feasible", "mean_calls", "mean_seconds"))
    return 0


def _summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        q = [r["quality"] for r in mine if r.get("quality") is not None]
        out[m] = {"mean_quality": sum(q) / len(q) if q else None, "min_quality": min(q) if q else None,
                  "feasible": sum(r["feasible"] for r in mine),
                  "mean_calls": sum(r["sim_calls"] for r in mine) / max(1, len(mine)),
                  "mean_seconds": sum(r["seconds"] for r in mine) / max(1, len(mine))}
    return out
