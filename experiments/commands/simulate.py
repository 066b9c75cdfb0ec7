"""Simulate one plan: iteration time, throughput, bubbles, peak memory and a Gantt chart.

Example:
  python -m experiments simulate --profile experiments/configs/profiles/hetero-head-16.json \
      --cluster experiments/configs/clusters/h100x4.json --plan plan.json --gantt plan.png

--trace FILE.json writes the predicted timeline (actions and transfers) in the Chrome trace format.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.common import (
    add_cluster_args,
    add_model_args,
    add_output_args,
    add_runtime_arg,
    check_file_path,
    resolve_cluster,
    resolve_profile,
    resolve_training,
)
from experiments.deploy import add_trace_argument, write_plan_trace
from experiments.tracking.hooks import tracked_run
from pipeline.bounds import lower_bound
from pipeline.errors import ConfigError
from pipeline.plan import Plan
from pipeline.render import gantt_png, gantt_text
from pipeline.simulator import simulate

NAME = "simulate"
HELP = "predict iteration time, bubbles and memory of a plan"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON (partition, placement, schedule)")
    add_model_args(parser)
    add_cluster_args(parser)
    parser.add_argument("--gantt", metavar="PNG", help="write the Gantt chart to this file")
    parser.add_argument("--text", action="store_true", help="print a text Gantt chart")
    add_trace_argument(parser)
    add_runtime_arg(parser)
    add_output_args(parser)


def check_image_path(path: str, field: str) -> None:
    """Refuse an image path whose suffix matplotlib cannot write (e.g. ``.txt``, or none), naming the field."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower()
    kinds = FigureCanvasBase.get_supported_filetypes()
    if suffix not in kinds:
        what = f": '.{suffix}' is not an image format" if suffix else " has no image suffix"
        raise ConfigError(f"{path!r}{what}; name a .png file (or {', '.join('.' + k for k in sorted(kinds))})",
                          field=field)


def run(args: argparse.Namespace) -> int:
    if args.gantt:
        check_image_path(args.gantt, "--gantt")
    check_file_path(args.trace, "--trace")
    profile = resolve_profile(args)
    cluster = resolve_cluster(args)
    plan = Plan.load(args.plan)
    searched = plan.meta.get("predicted", {}).get("profile") if isinstance(plan.meta.get("predicted"), dict) else None
    other_model = isinstance(searched, str) and searched != profile.name
    training = resolve_training(args)
    result = simulate(plan, profile, cluster, training=training)
    row = {"method": plan.method, **result.summary()}
    if other_model and result.valid:  # same layer count, another model: it still runs
        print(f"warning: {args.plan} was searched for {searched!r}, not {profile.name!r}: the figures below are "
              f"this plan's partition and order on {profile.name!r}", file=sys.stderr)
    elif other_model:  # no figures below: the provenance goes into the one error (and --json's row)
        row["error"] = f"{result.error} (the plan was searched for {searched!r}, not {profile.name!r})"
    if result.valid:
        bound = lower_bound(profile, cluster, plan.microbatches, runtime=training.runtime).value
        row["vs_lower_bound"] = result.iteration_time / bound
    with tracked_run(args, command=NAME, config={"plan": args.plan, "profile": profile.name,
                                                 "devices": cluster.devices}) as tracker:
        tracker.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))})
        if args.gantt and result.valid:
            gantt_png(result.timeline_dict(), args.gantt, title=f"{plan.method} on {profile.name}")
            tracker.log_image("gantt", args.gantt)
        tracker.log_plan(plan, name=plan.method, metadata=row)
    if args.trace and result.valid:
        write_plan_trace(args.trace, plan, profile, cluster=cluster, predicted=result.timeline_dict(),
                         title=f"{plan.method} on {profile.name}")
    if args.json:
        print(json.dumps(row))
    elif not result.valid:  # one line on stderr, as every refusal; exit 1 (the plan, not the command line)
        print(f"error: invalid plan: {row['error']}", file=sys.stderr)
    else:
        unit = result.time_unit
        print(f"plan {args.plan}: {plan.method}, {plan.num_stages} stages on {plan.devices} devices, "
              f"{plan.microbatches} micro-batches")
        print(f"iteration time {result.iteration_time:.4g} {unit} ({row['vs_lower_bound']:.3f}x the lower bound), "
              f"throughput {result.throughput:,.0f} tokens/s, mean bubble {100 * result.mean_bubble:.1f}%")
        for d in range(plan.devices):
            print(f"  device {d}: bubble {100 * result.bubble[d]:5.1f}%  peak memory "
                  f"{result.peak_memory_gb[d]:7.2f} / {result.memory_limit[d] / 2**30:.1f} GiB usable "
                  f"({cluster.memory_reserve_gb:g} GiB reserved)")
        print("feasible" if result.feasible else "INFEASIBLE: over the memory limit")
        if args.text:
            print(gantt_text(result.timeline_dict()))
    return 0 if result.valid else 1
