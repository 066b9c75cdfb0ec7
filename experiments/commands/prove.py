"""Prove how good a plan's schedule is: the best order of its actions and a lower bound on every order.

For the plan's partition and placement, a CP-SAT model (OR-Tools) searches the per-device order of
its F / I / W (or B) actions under the simulator's dependencies, transfer latencies and memory
limit, warm-started from the plan's own order and the list scheduler's; it proves a lower bound
on every order of those actions. The best time printed is the simulator's time of the best order
found (never the solver's objective); the bound is the largest of the solver's, pipeline.bounds'
and the partition's device-load bound. gap = best / bound - 1. See docs/prove.md.

Example:
  python -m experiments prove --plan runs/plan.json --model gemma-small --devices 4 --seconds 30
  python -m experiments prove --plan plan.json --profile p.json --cluster c.json --runtime zb-sync \\
      --seconds 60 --json --out better_plan.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from experiments.common import (
    add_cluster_args,
    add_model_args,
    add_runtime_arg,
    positive_int,
    resolve_cluster,
    resolve_profile,
    resolve_training,
)
from pipeline.errors import ConfigError
from pipeline.exact import DEFAULT_MAX_ACTIONS, prove
from pipeline.plan import Plan, validate_layout

NAME = "prove"
HELP = "the best schedule of a plan's partition and placement, and a proven lower bound (optimality gap)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON (partition, placement, schedule)")
    add_model_args(parser)
    add_cluster_args(parser)
    add_runtime_arg(parser)
    parser.add_argument("--seconds", type=float, required=True,
                        help="time limit for the whole proof, solver included (seconds > 0)")
    parser.add_argument("--workers", type=positive_int, default=8, help="CP-SAT search workers (default 8)")
    parser.add_argument("--max-actions", type=positive_int, default=DEFAULT_MAX_ACTIONS,
                        help="largest plan (F/I/W/B actions) the exact model is built for; above it the bound is "
                             f"the analytic one (default {DEFAULT_MAX_ACTIONS})")
    parser.add_argument("--out", metavar="FILE", help="write the best plan found to this JSON file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.seconds) or args.seconds <= 0:
        raise ConfigError(f"must be a number of seconds above 0, got {args.seconds:g}", field="--seconds")
    profile = resolve_profile(args)
    cluster = resolve_cluster(args)
    plan = Plan.load(args.plan)
    validate_layout(plan, num_layers=profile.num_layers, devices=cluster.devices, source=args.plan)
    if args.out and args.out == args.plan:
        raise ConfigError("names the input plan; write the better plan to another file", field="--out")
    training = resolve_training(args)
    proof = prove(plan, profile, cluster, training=training, seconds=args.seconds, workers=args.workers,
                  max_actions=args.max_actions)
    if args.out:
        proof.plan.save(args.out)
    row = {"plan": args.plan, "runtime": training.runtime if isinstance(training.runtime, str) else
           training.runtime.name, **proof.summary()}
    if args.out:
        row["out"] = args.out
    if args.json:
        print(json.dumps({**row, "interrupted": proof.interrupted is not None}))
        return _stopped(proof)
    print(f"plan {args.plan}: {plan.num_stages} stages on {plan.devices} devices, {plan.microbatches} micro-batches, "
          f"{proof.actions} actions, runtime {row['runtime']}")
    fits = "" if proof.plan_fits else "; OVER the memory limit, so the best must be an order that fits"
    print(f"plan_ms  {row['plan_ms']:.3f}   (the plan's own order, simulated{fits})")
    print(f"best_ms  {row['best_ms']:.3f}   (best order found: {proof.source}; simulated)")
    print(f"bound_ms {row['bound_ms']:.3f}   (largest of: solver {_fmt(row['solver_bound_ms'])}, pipeline.bounds "
          f"{_fmt(row['analytic_bound_ms'])}, device load {_fmt(row['load_bound_ms'])})")
    print(f"gap      {100 * proof.gap:.3f}%   (best / bound - 1); the plan was {100 * row['plan_vs_best']:.3f}% "
          f"above the best")
    if row["solver_makespan_ms"] is not None:
        print(f"solver   status {proof.status}, makespan {row['solver_makespan_ms']:.3f} ms (rounded durations); "
              f"its order simulates to {_fmt(row['solver_order_ms'])} ms")
    else:
        print(f"solver   status {proof.status}")
    print(f"formulation: {proof.formulation}")
    if args.out:
        print(f"wrote {args.out}")
    return _stopped(proof)


def _stopped(proof) -> int:
    """0, or for a proof a Ctrl-C (130) or SIGTERM (143) cut short, that exit code after one line."""
    if proof.interrupted is None:
        return 0
    print(f"interrupted after {proof.seconds:.1f} s: the best order and bound found until then", file=sys.stderr)
    return 143 if isinstance(proof.interrupted, SystemExit) else 130


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
