"""How far this machine's measurement moves by itself: the same plans replayed in several jobs.

A prediction can be no closer to a measurement than the measurement is to itself. Each of
``--jobs`` torchrun jobs (2 ranks, the fidelity benchmark's settings) replays the same plans
round-robin, the first of them twice (two copies of one plan in one job: what one job cannot
tell apart), and records the machine's load average as the job starts. Printed per job: each
plan's median time, the copies' difference and each plan's time over the first's; then across
the jobs: each plan's spread (max - min over the median of the jobs' medians), the spread of each
ratio, and the median difference between the two copies. A ratio that moves by more than a model's
error between jobs makes "within x% of the prediction" a statement about the machine.

  python -m experiments.benchmarks.noise_floor [--jobs 5] [--steps 10] [--plans 1f1b,adaptis]
      [--plan-file plan.json ...] [--json]

``--plans`` names plans of :func:`experiments.benchmarks.predicted_vs_measured.benchmark_plans` (the named
schedules, ``uneven-custom``, and ``adaptis`` / ``rl``: the tuner's and the RL policy's plans searched
on a first quick profile of this machine); ``--plan-file`` adds saved plans (a ``run``'s
``plan.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from executor.replay import ReplayOptions, run_job  # noqa: E402
from experiments.common import print_table  # noqa: E402
from pipeline.plan import Plan  # noqa: E402

__all__ = ["JobTimes", "spread_summary", "main"]


@dataclass(frozen=True)
class JobTimes:
    """One job's medians: ``times[name]`` in ms (the first plan's copy under ``copy_of_first``)."""

    load: float
    times: dict[str, float]
    copy_of_first: float


def spread_summary(jobs: Sequence[JobTimes], names: Sequence[str]) -> dict[str, Any]:
    """Across ``jobs``: each plan's spread and each plan's ratio to the first plan's (median, spread,
    range), both as % of the median over jobs, and the median |difference| of the first plan's two
    copies within a job, % of the first plan's time."""
    if not jobs or not names:
        raise ValueError("spread_summary needs at least one job and one plan")
    first = names[0]

    def pct_spread(values: list[float]) -> float:
        return 100 * (max(values) - min(values)) / statistics.median(values)

    plans = {}
    for name in names:
        times = [j.times[name] for j in jobs]
        ratios = [j.times[name] / j.times[first] for j in jobs]
        plans[name] = {"median_ms": statistics.median(times), "spread_pct": pct_spread(times),
                       "ratio_to_first": statistics.median(ratios), "ratio_spread_pct": pct_spread(ratios),
                       "ratio_min": min(ratios), "ratio_max": max(ratios)}
    copies = [100 * abs(j.copy_of_first - j.times[first]) / j.times[first] for j in jobs]
    return {"jobs": len(jobs), "plans": plans, "copy_difference_pct": statistics.median(copies),
            "copy_difference_max_pct": max(copies), "load": [j.load for j in jobs]}


def _plans(args: argparse.Namespace, options: ReplayOptions) -> list[tuple[str, Plan]]:
    from experiments.benchmarks.predicted_vs_measured import benchmark_plans
    from pipeline.calibration.fidelity import measured_cluster
    from pipeline.spec import ModelProfile

    wanted = [n for n in args.plans.split(",") if n]
    named: list[tuple[str, Plan]] = []
    if wanted:
        first = run_job([], options, measure=True, profile_repeats=3)
        profile, cluster = ModelProfile.from_dict(first["profile"]), measured_cluster(2, first["p2p"])
        searched = {"adaptis", "rl"} & set(wanted)
        available = dict(benchmark_plans(profile, cluster, args.microbatches, tuner_calls=400 if searched else 0))
        unknown = [n for n in wanted if n not in available]
        if unknown:
            raise SystemExit(f"--plans: unknown plan(s) {unknown}; choose from {sorted(available)}")
        named += [(n, available[n]) for n in wanted]
    for path in args.plan_file:
        named.append((Path(path).parent.name + "/" + Path(path).stem, Plan.load(path)))  # its own micro-batches
    if not named:
        raise SystemExit("nothing to replay: give --plans or --plan-file")
    return named


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-hybrid")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--jobs", type=int, default=5, help="torchrun jobs, one after another (>= 2)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per plan and job (the median is its time)")
    p.add_argument("--plans", default="1f1b,adaptis", help="comma-separated benchmark plan names ('' for none)")
    p.add_argument("--plan-file", action="append", default=[], metavar="PLAN.json", help="also replay this plan")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.jobs < 2:
        p.error("--jobs must be at least 2 (a spread needs two jobs)")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    options = ReplayOptions(model=args.model, steps=args.steps)
    named = _plans(args, options)
    names = [n for n, _ in named]
    replayed = [plan for _, plan in named] + [named[0][1]]
    jobs: list[JobTimes] = []
    for k in range(args.jobs):
        load = os.getloadavg()[0]
        runs = run_job(replayed, options)["runs"]
        times = {n: r["measured_iteration_time"] for n, r in zip(names, runs)}
        jobs.append(JobTimes(load, times, runs[-1]["measured_iteration_time"]))
        if not args.json:
            print(f"job {k + 1}/{args.jobs} (load {load:.1f}): "
                  + ", ".join(f"{n} {t:.1f} ms" for n, t in times.items())
                  + f", {names[0]} again {jobs[-1].copy_of_first:.1f} ms", flush=True)
    summary = spread_summary(jobs, names)
    if args.json:
        print(json.dumps({"per_job": [{"load": j.load, **j.times, "copy_of_first": j.copy_of_first} for j in jobs],
                          **summary}))
        return 0
    print_table([{"plan": n, **{k: round(v, 3) for k, v in row.items()}} for n, row in summary["plans"].items()],
                ["plan", "median_ms", "spread_pct", "ratio_to_first", "ratio_spread_pct", "ratio_min", "ratio_max"])
    print(f"two copies of {names[0]} in one job: median |difference| {summary['copy_difference_pct']:.1f}%, "
          f"max {summary['copy_difference_max_pct']:.1f}%; load at each job's start "
          + ", ".join(f"{x:.1f}" for x in summary["load"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
