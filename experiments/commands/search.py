"""Find the fastest plan that fits in memory: the AdaPtis tuner beside every baseline.

Prints a table (method, iteration time, throughput, bubble, peak memory, speedup over the
Megatron baseline, distance to the lower bound, simulator calls, search seconds) and writes
OUT/plan.json (the best feasible plan, rewritten as the search improves it), OUT/plan.csv (for
torch.distributed.pipelining / torchtitan), OUT/gantt_best.png, OUT/gantt_megatron.png (one time
axis; each chart ends at the printed iteration time) and OUT/results.jsonl. Logs everything to
W&B (offline by default). When no plan fits in memory it exits 3 with advice, and the fastest plan
that does not fit is OUT/infeasible_plan.json (meta.feasible false), never plan.json. An OUT that
holds an earlier search's output is replaced whole; a folder of your own is written into, never
emptied; one another search is still writing is refused. rl and rl+tuner plan up to 32 devices:
beyond, their rows say skipped.

--target {executor,torchtitan,megatron} keeps the best plan inside what that runtime runs (its own
search method joins the others: megatron+layout, adaptis@torchtitan) and prints, per target, the
fastest plan it can run and its speedup over the Megatron baseline; OUT/megatron_args.txt and
OUT/torchtitan.toml carry those plans in Megatron-LM's and torchtitan's own terms (or a one-line
reason). --trace FILE.json writes the best plan's predicted timeline for Perfetto.

Examples:
  python -m experiments search                                  # default heterogeneous case
  python -m experiments search --model deepseek-medium --devices 8 --method adaptis,zbv,random
  python -m experiments search --profile P.json --cluster C.json --memory-gb 40 --json
  python -m experiments search --model gemma-medium --target megatron --out runs/gemma-mega

The whole job: --gpus N --global-batch B (instead of --devices) chooses the tensor, pipeline, data,
context and expert parallel degrees, the micro-batch size and count, and the pipeline plan inside
(agents.job_search; docs/whole-job.md), beside Megatron's best even-split configuration:
  python -m experiments search --model gemma-large --gpus 64 --global-batch 256 --seq-len 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from agents.base import DEFAULT_CALLS, Budget, SearchResult
from agents.registry import all_methods
from agents.run_methods import Interrupted, run_methods, with_baseline
from experiments.best_plan import INFEASIBLE_PLAN, BestPlanWriter
from experiments.commands.job_search import add_job_arguments, run_job
from experiments.common import (
    DEFAULT_MODEL,
    add_cluster_args,
    add_model_args,
    add_output_args,
    add_runtime_arg,
    check_file_path,
    check_microbatches,
    interrupted,
    memory_advice,
    non_negative_float,
    output_folder,
    positive_int,
    prediction_meta,
    print_json_lines,
    print_table,
    resolve_scenario,
    resolve_training,
)
from experiments.deploy import (
    add_target_arguments,
    add_trace_argument,
    best_for,
    print_targets,
    with_target_method,
    write_exports,
    write_plan_trace,
)
from experiments.results import MethodRow, method_rows
from experiments.tracking.hooks import tracked_run
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError
from pipeline.render import axis_end, gantt_side_by_side
from pipeline.simulator import Result
from pipeline.spec import GIB, Cluster, ModelProfile
from pipeline.targets import model_reason, target_reason

NAME = "search"
#: Pipeline devices when --devices is not given (and no --cluster, --gpus).
DEFAULT_DEVICES = 8
HELP = "search the fastest feasible plan (AdaPtis tuner, baselines, random, RL)"
DEFAULT_METHODS = ("megatron,i1f1b-v2,1f1b,zb-h1,zb-h2,zbv,v-half,dualpipev,zbv+dp,random,rl,megatron+layout,"
                   "adaptis")
COLUMNS = ("method", "iter_time", "tokens_per_s", "bubble_pct", "peak_mem_gb", "speedup", "vs_bound", "sim_calls",
           "seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser, default_devices=8)
    parser.set_defaults(devices=None)  # 8 (DEFAULT_DEVICES) unless given; given beside --gpus, refused
    parser.add_argument("--microbatches", type=positive_int, default=32, help="micro-batches per iteration")
    parser.add_argument("--method", default=DEFAULT_METHODS,
                        help="comma-separated methods (README's method names), or 'all': every named schedule, "
                             "each with +dp, random, rl, rl+tuner and adaptis")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tuner and random search")
    parser.add_argument("--budget", default=str(DEFAULT_CALLS),
                        help=f"per search method: simulator calls ({DEFAULT_CALLS}) or seconds (30s)")
    parser.add_argument("--out", default=None, help="output folder (default runs/search-<model>)")
    parser.add_argument("--policy", default=None, help="RL policy file for --method rl / rl+tuner")
    parser.add_argument("--ranker", default=None,
                        help="start ranker file for --method rl / rl+tuner (default: the shipped one; 'none': the "
                             "hand-written starts)")
    add_target_arguments(parser)
    add_trace_argument(parser, "the best plan's predicted timeline")
    add_runtime_arg(parser)
    parser.add_argument("--prove", type=non_negative_float, default=0.0, metavar="SECONDS",
                        help="then prove the best plan for this long (pipeline.exact: the best order of its partition "
                             "and placement, a lower bound on every order, the proven gap; writes OUT/proven_plan.json "
                             "when it found a faster order; default 0: off; see docs/prove.md)")
    add_output_args(parser)
    add_job_arguments(parser)


def _keep_interrupted(stop: BaseException, out: Path, results: list[SearchResult], writer: BestPlanWriter,
                      bound: float, *, args: argparse.Namespace, title: str) -> int:
    """What an interrupted search keeps: the finished methods' rows (OUT/results.jsonl, and printed as
    the finished search prints them) and the best plan so far (OUT/plan.json, already written); one
    line says what and where. Exit 130 (Ctrl-C) or 143."""
    rows = method_rows(results, bound)
    kept = []
    if rows:
        _write_rows(out, rows)
        _print_rows(rows, args=args, title=f"{title} (interrupted: the finished methods only)")
        kept.append(f"the rows of {len(rows)} finished method{'s' if len(rows) > 1 else ''} "
                    f"({', '.join(r.method for r in results)}) in {out / 'results.jsonl'}")
    if writer.best_method is not None:
        kept.append(f"the best plan so far ({writer.best_method}) in {writer.path}")
    return interrupted(stop, f"kept {' and '.join(kept)}" if kept else "no method had finished or found a plan; "
                       "nothing written")


def _write_rows(out: Path, rows: list[MethodRow]) -> None:
    with open(out / "results.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row.as_dict()) + "\n")


def _print_rows(rows: list[MethodRow], *, args: argparse.Namespace, title: str) -> None:
    """The rows on stdout: JSON lines with --json, else the table."""
    if args.json:
        print_json_lines([r.as_dict() for r in rows])
        return
    print_table([r.cells() for r in rows], COLUMNS, title=title)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    check_file_path(args.trace, "--trace")  # before the search, not after it
    if not [m for m in args.method.split(",") if m.strip()]:
        raise ConfigError(f"names no method ({args.method!r}); give e.g. adaptis, megatron,zbv or all",
                          field="--method")
    if args.gpus is not None or args.global_batch is not None:  # the whole job: degrees with the pipeline inside
        if getattr(args, "devices", None) is not None:
            raise ConfigError("--gpus sizes the whole job (the pipeline's devices are --gpus / (tp x dp x cp)); "
                              "give --gpus or --devices, not both", field="--devices")
        if args.out:
            output_folder(args.out, command=NAME, inputs=args)  # an earlier search's files are not this one's
        return run_job(args)
    if args.devices is None:
        args.devices = DEFAULT_DEVICES
    profile, cluster = resolve_scenario(args)
    if args.profile and profile.extra.get("measured") and "runtime_scales" not in profile.extra:
        print(f"note: {args.profile} is measured but not calibrated (profile --calibrate N, or run's "
              "calibrated_profile.json): it leaves out the runtime's overheads and contention, which put one "
              "prediction at 114 ms against 293 ms measured (tiny-hybrid, 2 CPU ranks; issue 47)", file=sys.stderr)
    check_microbatches(args.microbatches, cluster.devices)
    try:
        budget = Budget.parse(args.budget)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--budget") from None
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    if methods == ["all"]:
        methods = all_methods()
    methods = with_target_method(with_baseline(methods), args.target)
    out = output_folder(args.out or
                        f"runs/search-{args.model or (Path(args.profile).stem if args.profile else DEFAULT_MODEL)}",
                        command=NAME, inputs=args)
    scenario = Scenario(profile, cluster, args.microbatches, resolve_training(args, target=args.target))
    bound = lower_bound(profile, cluster, args.microbatches, runtime=scenario.training.runtime)
    def predicted(result: Result) -> dict:
        return prediction_meta(result.iteration_time, profile=profile, cluster=cluster,
                               runtime=scenario.training.runtime, profile_file=args.profile)

    writer = BestPlanWriter(out, lambda plan: target_reason(args.target, plan, profile) is None, predicted)
    title = (f"{profile.name}: {len(profile.layers)} layers on {cluster.devices} devices, {args.microbatches} "
             f"micro-batches, {cluster.memory_gb:g} GiB per device ({cluster.memory_reserve_gb:g} GiB reserved) "
             f"(time in {profile.time_unit}; lower bound {bound.value:.4g}, {bound.binding})")
    try:
        results = run_methods(scenario, methods, budget=budget, seed=args.seed, policy=args.policy,
                              ranker=args.ranker, on_improve=writer, progress="search")
    except Interrupted as stop:
        return _keep_interrupted(stop.stop, out, stop.results, writer, bound.value, args=args, title=title)

    mega = next((r for r in results if r.method == "megatron" and r.ok), None)
    reference = mega.iteration_time if mega else None
    rows = method_rows(results, bound.value)
    best = best_for(args.target, results, profile)

    config = {"profile": profile.name, "devices": cluster.devices, "microbatches": args.microbatches,
              "memory_gb": cluster.memory_gb, "memory_reserve_gb": cluster.memory_reserve_gb, "methods": methods,
              "budget": args.budget, "seed": args.seed}
    # gantt_best.png and gantt_megatron.png share one time axis (they are looked at side by side)
    xmax = axis_end([r.result.timeline_dict() for r in (best, mega) if r is not None])
    with tracked_run(args, command=NAME, config=config) as tracker:
        tracker.log_table("search", [{k: v for k, v in r.as_dict().items() if k != "history"} for r in rows])
        if best is not None:
            best.plan = replace(best.plan, meta={**best.plan.meta, "method": best.method,
                                                 "predicted": predicted(best.result)})
            best.plan.save(out / "plan.json")
            best.plan.save_csv(out / "plan.csv")
            gantt_side_by_side([best.result.timeline_dict()], [f"best: {best.method} on {profile.name}"],
                               out / "gantt_best.png", xmax=xmax)
            tracker.log_image("gantt/best", out / "gantt_best.png")
            tracker.log_plan(best.plan, name=f"plan-{profile.name}",
                             metadata=MethodRow.of(best, reference, bound.value).as_dict())
        if mega is not None:
            gantt_side_by_side([mega.result.timeline_dict()], [f"megatron on {profile.name}"],
                               out / "gantt_megatron.png", xmax=xmax)
            tracker.log_image("gantt/megatron", out / "gantt_megatron.png")
        if best is not None and mega is not None:
            tracker.summary({"best_method": best.method, "best_iteration_time": best.iteration_time,
                             "speedup_over_megatron": reference / best.iteration_time,
                             "vs_lower_bound": best.iteration_time / bound.value})
    targets = write_exports(out, results, profile, best=best, reference=reference)
    if args.trace and best is not None:
        write_plan_trace(args.trace, best.plan, profile, cluster=cluster, predicted=best.result.timeline_dict(),
                         title=f"{best.method} on {profile.name}")
    _write_rows(out, rows)
    _print_rows(rows, args=args, title=title)
    if not args.json:
        print_targets(targets, args.target, profile.time_unit)
    cannot = model_reason(args.target, profile)
    if best is None and cannot:
        print(f"no plan for --target {args.target}: {cannot}; use --target executor", file=sys.stderr)
        return 3
    if best is None:
        smallest = min((r for r in results if r.ok), key=lambda r: max(r.result.peak_memory), default=None)
        msg = "no plan fits in memory" + (f" among those {args.target} runs" if args.target != "executor" else "")
        if (out / INFEASIBLE_PLAN).is_file():
            msg += f"; the fastest plan that does not fit is in {out / INFEASIBLE_PLAN} (not plan.json)"
        if smallest is not None:  # last: the same words as a sweep trial's reason (experiments.sweeps)
            peak = max(smallest.result.peak_memory) / GIB
            msg += (f"; the smallest peak found is {peak:.2f} GiB ({smallest.method}) "
                    f"{memory_advice(cluster, profile, scenario.training)}")
        print(msg, file=sys.stderr)
        return 3
    if not args.json:
        speed = f", {reference / best.iteration_time:.2f}x megatron" if reference else ""
        print(f"\nbest: {best.method} {best.iteration_time:.4g} {profile.time_unit}{speed}, "
              f"{best.iteration_time / bound.value:.3f}x the lower bound -> {out / 'plan.json'}, {out / 'plan.csv'}, "
              f"{out / 'gantt_best.png'}")
    if args.prove > 0 and best.feasible:
        _print_proof(best, profile, cluster, scenario, seconds=args.prove, out=out, as_json=args.json)
    return 0


def _print_proof(best: SearchResult, profile: ModelProfile, cluster: Cluster, scenario: Scenario, *, seconds: float,
                 out: Path, as_json: bool) -> None:
    """``--prove``: the best plan's proven gap (pipeline.exact), one line (or one JSON object)."""
    from pipeline.exact import prove

    proof = prove(best.plan, profile, cluster, training=scenario.training, seconds=seconds)
    summary = {"proof": True, "method": best.method, **proof.summary()}
    if proof.best_time < proof.plan_time * (1 - 1e-6):  # a faster order, not rounding
        proof.plan.save(out / "proven_plan.json")
        summary["proven_plan"] = str(out / "proven_plan.json")
    if as_json:
        print(json.dumps(summary))
        return
    faster = (f"; a {100 * summary['plan_vs_best']:.2f}% faster order -> {summary['proven_plan']}"
              if "proven_plan" in summary else "; no faster order found")
    print(f"proven ({proof.formulation}, {proof.status}, {summary['seconds']:.0f} s): best order "
          f"{summary['best_ms']:.4g} ms, every order of this partition and placement >= {summary['bound_ms']:.4g} ms, "
          f"gap {100 * proof.gap:.2f}%{faster}")
