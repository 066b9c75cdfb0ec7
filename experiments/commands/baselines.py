"""Every named schedule on a model: a table sorted by iteration time, with the speedup over the
Megatron baseline (interleaved 1F1B at Megatron's even split and its best chunk count).

Example:
  python -m experiments baselines --model gemma-medium --devices 8 --microbatches 32
  python -m experiments baselines --profile P.json --cluster C.json --microbatches 16 --json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.common import (
    add_cluster_args,
    add_model_args,
    add_output_args,
    positive_int,
    print_json_lines,
    print_table,
    resolve_cluster,
    resolve_profile,
)
from experiments.tracking_hooks import tracked_run
from pipeline.compare import evaluate_named, table_rows
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
    add_output_args(parser)


def run(args: argparse.Namespace) -> int:
    profile = resolve_profile(args)
    cluster = resolve_cluster(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "megatron" not in methods:
        methods.append("megatron")
    evals = evaluate_named(methods, profile, cluster, args.microbatches)
    rows = table_rows(evals, profile, cluster, args.microbatches)
    config = {"profile": profile.name, "devices": cluster.devices, "microbatches": args.microbatches,
              "methods": methods}
    with tracked_run(args, command=NAME, config=config) as tracker:
        tracker.log_table("baselines", rows)
        for e in evals:
            if args.gantt_dir and e.ok:
                assert e.result is not None
                path = gantt_png(e.result.timeline_dict(), Path(args.gantt_dir) / f"{e.method}.png",
                                 title=f"{e.method} on {profile.name}")
                tracker.log_image(f"gantt/{e.method}", path)
    if args.json:
        print_json_lines(rows)
        return 0
    for r in rows:
        r["bubble_pct"] = 100 * r["bubble"] if r.get("bubble") is not None else None
        r["peak_mem_gb"] = r.get("peak_memory_max_gb")
        if r.get("error"):
            r["iteration_time"] = "n/a: " + str(r["error"])[:60]
    print_table(rows, COLUMNS, title=f"{profile.name} on {cluster.devices} devices, {args.microbatches} "
                f"micro-batches (time in {profile.time_unit}; speedup over megatron)")
    return 0
