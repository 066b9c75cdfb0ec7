"""Every named schedule on a model: a table sorted by iteration time, with the speedup over the
Megatron baseline (interleaved 1F1B at Megatron's even split and its best chunk count).

Example:
  python -m experiments baselines --model gemma-medium --devices 8 --microbatches 32
  python -m experiments baselines --profile P.json --cluster C.json --microbatches 16 --json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from agents.base import Budget, SearchResult
from agents.run_methods import run_methods, with_baseline
from experiments.common import (
    add_cluster_args,
    add_model_args,
    add_output_args,
    add_runtime_arg,
    check_microbatches,
    positive_int,
    print_json_lines,
    print_table,
    resolve_scenario,
    resolve_training,
)
from experiments.results import MethodRow, method_rows
from experiments.tracking.hooks import tracked_run
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.render import gantt_png
from pipeline.schedules import NAMED_METHODS

NAME = "baselines"
HELP = "compare every named schedule (GPipe, 1F1B, interleaved, zero-bubble, V-shape, ...)"
COLUMNS = ("method", "iteration_time", "speedup", "bubble_pct", "peak_mem_gb", "feasible", "vs_lower_bound")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser)
    parser.add_argument("--microbatches", type=positive_int, default=32, help="micro-batches per iteration")
    parser.add_argument("--methods", default=",".join(NAMED_METHODS),
                        help="comma-separated methods (default: all named ones; i1f1b-vN for N chunks)")
    parser.add_argument("--gantt-dir", metavar="DIR", help="write a Gantt chart per method here")
    add_runtime_arg(parser)
    add_output_args(parser)


def compare(scenario: Scenario, methods: Sequence[str]) -> tuple[list[MethodRow], list[SearchResult]]:
    """Each named method on ``scenario``, ``megatron`` added last when missing (the speedups are over it):
    the rows ``baselines`` prints (:func:`experiments.results.method_rows`, sorted) and the search
    results, in ``methods``' order."""
    results = run_methods(scenario, with_baseline(methods, first=False), budget=Budget())
    sc = scenario
    bound = lower_bound(sc.profile, sc.cluster, sc.microbatches, runtime=sc.training.runtime).value
    return method_rows(results, bound), results


def run(args: argparse.Namespace) -> int:
    profile, cluster = resolve_scenario(args)
    check_microbatches(args.microbatches, cluster.devices)
    methods = with_baseline([m.strip() for m in args.methods.split(",") if m.strip()], first=False)
    scenario = Scenario(profile, cluster, args.microbatches, resolve_training(args))
    rows, results = compare(scenario, methods)
    config = {"profile": profile.name, "devices": cluster.devices, "microbatches": args.microbatches,
              "methods": methods}
    with tracked_run(args, command=NAME, config=config) as tracker:
        tracker.log_table("baselines", [r.as_dict() for r in rows])
        for r in results:
            if args.gantt_dir and r.ok:
                path = gantt_png(r.result.timeline_dict(), Path(args.gantt_dir) / f"{r.method}.png",
                                 title=f"{r.method} on {profile.name}")
                tracker.log_image(f"gantt/{r.method}", path)
    if args.json:
        print_json_lines([r.as_dict() for r in rows])
        return 0
    cells = [{**r.cells(), "method": r.method} | ({"iteration_time": f"n/a: {r.error[:60]}"} if r.error else {})
             for r in rows]
    print_table(cells, COLUMNS, title=f"{profile.name} on {cluster.devices} devices, {args.microbatches} "
                f"micro-batches (time in {profile.time_unit}; speedup over megatron)")
    return 0
