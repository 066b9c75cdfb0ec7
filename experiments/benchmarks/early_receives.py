"""What posting every receive early buys the executor: the same plans under both lowerings.

Profiles the model on 2 local ranks, builds the fidelity benchmark's plans (the named schedules,
a hand-made uneven plan, the tuner's and the RL policy's plans), then replays them alternately
under PyTorch's own lowering (``torch``: each RECV where the lock-step round-robin puts it) and
ours (``early``: every RECV at the start of the step, executor/lowering.py), ``--rounds`` times
each. Prints per plan the median measured iteration time and bubble under each, and their ratio.

  python -m experiments.benchmarks.early_receives [--rounds 2] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import replace

from executor.replay import ReplayOptions, run_job
from experiments.benchmarks.predicted_vs_measured import benchmark_plans
from experiments.common import non_negative_int, positive_int, print_table
from experiments.workflow.report import timeline_busy
from pipeline.calibration.fidelity import measured_cluster
from pipeline.spec import ModelProfile

__all__ = ["main"]


def _bubble(run: dict) -> float:
    """Measured idle share of the iteration, averaged over devices (compute-only timeline)."""
    busy, _ = timeline_busy(run["timeline"])
    span = run["measured_iteration_time"]
    return statistics.fmean(max(0.0, 1 - b / span) for b in busy)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-hybrid")
    p.add_argument("--microbatches", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per plan and replay")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps per plan and replay first")
    p.add_argument("--rounds", type=positive_int, default=2, help="replays of all plans under each lowering")
    p.add_argument("--tuner-calls", type=int, default=400, help="calls of the tuner whose plan joins the set")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    base = ReplayOptions(model=args.model, steps=args.steps, warmup=args.warmup)
    first = run_job([], base, measure=True, profile_repeats=3)
    profile, cluster = ModelProfile.from_dict(first["profile"]), measured_cluster(2, first["p2p"])
    plans = benchmark_plans(profile, cluster, args.microbatches, tuner_calls=args.tuner_calls)
    times: dict[str, dict[str, list[float]]] = {name: {"torch": [], "early": []} for name, _ in plans}
    bubbles: dict[str, dict[str, list[float]]] = {name: {"torch": [], "early": []} for name, _ in plans}
    for _ in range(args.rounds):
        for lowering in ("torch", "early"):
            runs = run_job([plan for _, plan in plans], replace(base, lowering=lowering))["runs"]
            for (name, _), run in zip(plans, runs):
                times[name][lowering].append(run["measured_iteration_time"])
                bubbles[name][lowering].append(_bubble(run))
    rows = []
    for name, _ in plans:
        t, e = statistics.median(times[name]["torch"]), statistics.median(times[name]["early"])
        rows.append({"plan": name, "torch_ms": t, "early_ms": e, "torch_over_early": t / e,
                     "torch_bubble_pct": 100 * statistics.median(bubbles[name]["torch"]),
                     "early_bubble_pct": 100 * statistics.median(bubbles[name]["early"])})
    ratios = [r["torch_over_early"] for r in rows]
    summary = {"summary": True, "median_torch_over_early": statistics.median(ratios), "max": max(ratios),
               "min": min(ratios), "rounds": args.rounds}
    if args.json:
        for row in rows:
            print(json.dumps(row))
        print(json.dumps(summary))
        return 0
    print_table(rows, ["plan", "torch_ms", "early_ms", "torch_over_early", "torch_bubble_pct", "early_bubble_pct"],
                title=f"{args.model}: 2 gloo ranks, {args.microbatches} micro-batches, medians of {args.rounds} "
                      f"replays x {args.steps} steps per lowering")
    print(f"torch / early: median {summary['median_torch_over_early']:.3f}, "
          f"range {summary['min']:.3f}-{summary['max']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
