"""Fidelity of the performance model: predicted vs measured iteration time, plan by plan.

One torchrun job (2 ranks, one thread each by default) measures the gloo link and profiles the
model on every rank at once, then runs several plans round-robin (1F1B, interleaved 1F1B,
ZB-H1, ZB-V and a hand-made plan with an uneven partition and a non-sequential placement that
stands in for a searched plan) and the plans the AdaPtis tuner and the RL policy pick
(``--tuner-calls``). The plans are built from a first quick profile of this machine.
The same job also replays --calibration-plans random plans (random partitions and placements) and two
with every layer a stage of its own (pipeline.calibration.fidelity.unit_plans: each layer timed alone in the pipeline).
Each plan's time is the median of its timed steps, each over how slow its round of the round-robin
ran (pipeline.calibration.drift; --raw-times: the steps as measured).
Prints per plan the prediction error, then the median error and whether the model ranks the
plans in the measured order (every pair, and the pairs the measurement itself resolves: ordered alike
by each third of the timed steps), twice: from the per-layer profile alone ("profile"), and calibrated
on the random plans' replays only ("calibrated": a factor per kind of operation and the
per-action and per-transfer overheads, pipeline.calibration.fidelity.calibrate; "+ per kind": the same with a
factor per operation and layer kind as well, fit_kind_scales, off by default; "+ contention": the
same with the compute contention between the ranks fitted with the overheads; "+ per layer": that and
each layer's own factor from the stages of one layer, fit_layer_scales; the benchmark plans never inform
their own predictions).

  python -m experiments.benchmarks.predicted_vs_measured [--microbatches 8] [--steps 30] [--calibration-plans 8]
      [--tuner-calls 400] [--lowering early|torch] [--stage-factors] [--raw-times] [--json]
      [--save FILE | --from FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from executor.replay import ReplayOptions, run_job  # noqa: E402
from experiments.common import print_table  # noqa: E402
from pipeline.calibration.agreement import (  # noqa: E402
    PlanComparison,
    block_medians,
    compare_plans,
    cross_validated,
    fidelity_summary,
)
from pipeline.calibration.drift import adjust_runs, restore_raw  # noqa: E402
from pipeline.calibration.fidelity import calibrate, calibration_plans, measured_cluster  # noqa: E402
from pipeline.engine import list_schedule  # noqa: E402
from pipeline.list_scheduler import ListSchedulerConfig  # noqa: E402
from pipeline.plan import Plan, partition_from_sizes  # noqa: E402
from pipeline.schedules import build_plan  # noqa: E402
from pipeline.simulator import stage_costs  # noqa: E402
from pipeline.spec import Cluster, ModelProfile  # noqa: E402

__all__ = ["main", "benchmark_plans"]

METHODS = ("1f1b", "i1f1b-v2", "zb-h1", "zbv")


def benchmark_plans(profile: ModelProfile, cluster: Cluster, microbatches: int, *,
                    tuner_calls: int = 0, copy_of: str | None = None) -> list[tuple[str, Plan]]:
    """The named plans, a hand-made uneven one (3/1/2/2 layers, placement 1, 0, 0, 1), with
    ``tuner_calls`` the AdaPtis tuner's plan and the RL policy's (the plans a search picks, which
    exploit whatever the model gets wrong), and last a second replay of ``copy_of``
    (``"1f1b-copy"``): how far apart the same job measures one plan twice."""
    plans = [(m, build_plan(m, profile, cluster, microbatches=microbatches)) for m in METHODS]
    if tuner_calls:
        from agents.base import Budget
        from agents.registry import make_searcher
        from pipeline.candidates import Scenario

        scenario = Scenario(profile, cluster, microbatches)
        for method in ("adaptis", "rl"):
            found = make_searcher(method).search(scenario, budget=Budget(sim_calls=tuner_calls), seed=0)
            if found.ok and found.plan is not None:
                plans.append((method, replace(found.plan, meta={**found.plan.meta, "method": method})))
    partition = partition_from_sizes([3, 1, 2, 2]) if profile.num_layers == 8 else None
    if partition is not None:
        placement = (1, 0, 0, 1)
        costs = stage_costs(profile, cluster, partition, placement=placement)
        order = list_schedule(costs, placement, 2, microbatches=microbatches, config=ListSchedulerConfig())
        plans.append(("uneven-custom", Plan(2, microbatches, partition, placement, order,
                                            {"method": "uneven-custom"})))
    if copy_of:
        named = dict(plans)
        if copy_of not in named:
            raise ValueError(f"copy_of {copy_of!r} is not one of the benchmark's plans {sorted(named)}")
        plans.append((f"{copy_of}-copy", named[copy_of]))
    return plans


def stage_factors(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile,
                  runs: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per plan, per stage and operation (``"2F[3:5]"``: stage 2's F over layers 3-4): the median
    measured compute time of that action over its profiled time (the per-layer profile as PyTorch's
    runtime spends it, no calibration). The same stage of different plans in one job shows how far
    an action's compute depends on what else runs at the same time."""
    import statistics

    from pipeline.calibration.fidelity import profiled_time, runtime_profile, stage_durations

    out: dict[str, dict[str, float]] = {}
    for (name, plan), run in zip(named_plans, runs):
        base = runtime_profile(profile, plan)
        row = {}
        for (s, op), times in sorted(stage_durations(run).items()):
            a, b = plan.partition[s]
            profiled = profiled_time(base.layers[a:b], op)
            if profiled > 0:
                row[f"{s}{op}[{a}:{b}]"] = statistics.median(times) / (profiled * profile.seconds_per_unit * 1e3)
        out[name] = row
    return out


def overlap_factors(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile,
                    runs: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per kind of operation, the median measured-over-profiled time of the actions the other
    rank computed beside for under 30% of their time (``alone``) and for over 70% (``beside``),
    with their counts: what compute contention between the ranks does to one action."""
    import statistics

    from pipeline.calibration.fidelity import profiled_time, runtime_profile, scale_key, shares_beside
    from pipeline.plan import parse_action

    ratios: dict[str, dict[str, list[float]]] = {}
    ms = profile.seconds_per_unit * 1e3
    for (_, plan), run in zip(named_plans, runs):
        base = runtime_profile(profile, plan)
        events = run["timeline"]["events"]
        for e, beside in zip(events, shares_beside(events, plan.devices)):
            s, op, _ = parse_action(e["action"])
            a, b = plan.partition[s]
            profiled = profiled_time(base.layers[a:b], op) * ms
            dur = e["end"] - e["start"]
            if profiled <= 0 or dur <= 0:
                continue
            bucket = "alone" if beside < 0.3 else "beside" if beside > 0.7 else None
            if bucket:
                ratios.setdefault(scale_key(s, op), {"alone": [], "beside": []})[bucket].append(dur / profiled)
    return {key: {f"{b}": statistics.median(v) for b, v in buckets.items() if v}
            | {f"{b}_n": float(len(v)) for b, v in buckets.items()} for key, buckets in ratios.items()}


def _spread_pct(c: PlanComparison) -> float | None:
    """How far apart the medians of each third of a plan's timed steps are, % of its median: what the
    measurement alone cannot tell apart."""
    blocks = block_medians(c)
    return None if blocks is None else 100 * (max(blocks) - min(blocks)) / c.measured


def replay_set(args: argparse.Namespace) -> tuple[list[tuple[str, Plan]], list[tuple[str, Plan]], dict]:
    """Profile the machine, build the benchmark's and the calibration plans, replay them all in one
    job: the benchmark plans, the calibration plans and the job's result."""
    options = ReplayOptions(model=args.model, seq_len=args.seq_len, microbatch_size=args.microbatch_size,
                            steps=args.steps, warmup=args.warmup, threads=args.threads, lowering=args.lowering)
    first = run_job([], options, measure=True, profile_repeats=3)
    first_profile, first_cluster = ModelProfile.from_dict(first["profile"]), measured_cluster(2, first["p2p"])
    plans = benchmark_plans(first_profile, first_cluster, args.microbatches, tuner_calls=args.tuner_calls,
                            copy_of=args.copy or None)
    calib = calibration_plans(first_profile, first_cluster, args.microbatches, count=args.calibration_plans,
                              seed=args.seed, units=True)
    return plans, calib, run_job([plan for _, plan in plans + calib], options, measure=True)


def save_replay_set(path: Path, plans: Sequence[tuple[str, Plan]], calib: Sequence[tuple[str, Plan]], *,
                    result: dict) -> None:
    """Write a replay set: the named benchmark and calibration plans and the job's result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "plans": [[n, plan.to_dict()] for n, plan in plans],
                                "calibration": [[n, plan.to_dict()] for n, plan in calib], "result": result}))


def load_replay_set(path: Path) -> tuple[list[tuple[str, Plan]], list[tuple[str, Plan]], dict]:
    """Read what :func:`save_replay_set` wrote."""
    raw = json.loads(path.read_text())
    if raw.get("version") != 1:
        raise ValueError(f"version {raw.get('version')!r}, expected 1")
    plans = [(n, Plan.from_dict(d, source=f"{path}: plan {n}")) for n, d in raw["plans"]]
    calib = [(n, Plan.from_dict(d, source=f"{path}: plan {n}")) for n, d in raw["calibration"]]
    return plans, calib, raw["result"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-hybrid")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatch-size", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=30, help="timed steps per plan (the median is its time; "
                   "each third of them is also timed alone, to tell which pairs the measurement resolves)")
    p.add_argument("--calibration-plans", type=int, default=8, help="random plans replayed to calibrate (>= 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration plans")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tuner-calls", type=int, default=400,
                   help="also replay the tuner's and the RL policy's plans searched with this many calls (0: none)")
    p.add_argument("--lowering", choices=("early", "torch"), default="early",
                   help="receives posted at the start of the step (early) or where PyTorch's lowering puts them")
    p.add_argument("--stage-factors", action="store_true",
                   help="also print, per plan (calibration plans too), each stage's measured compute over its "
                        "profile, per operation")
    p.add_argument("--copy", default="1f1b", metavar="PLAN",
                   help="replay this benchmark plan twice (PLAN-copy): the gap between the two is the job's "
                        "noise floor, and pairs within it are not counted as resolved ('' for no copy)")
    p.add_argument("--raw-times", action="store_true",
                   help="time each plan by the median of its steps as measured, without taking out the rounds' "
                        "drift (pipeline.calibration.drift: by default each step is divided by how slow its round ran)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", type=Path, default=None, metavar="FILE",
                   help="also write the replay set (plans, profile, link, every run's timeline) to FILE, "
                        "to analyse again with --from")
    p.add_argument("--from", dest="from_file", type=Path, default=None, metavar="FILE",
                   help="analyse a replay set written by --save instead of replaying (no torchrun job)")
    args = p.parse_args(argv)
    if args.calibration_plans < 1:
        p.error("--calibration-plans must be at least 1")
    names = (*METHODS, "uneven-custom", *(("adaptis", "rl") if args.tuner_calls else ()))
    if args.copy and args.copy not in names:
        p.error(f"--copy {args.copy!r}: not one of the benchmark's plans ({', '.join(names)}; '' for none)")
    if args.from_file is not None:
        try:
            plans, calib, result = load_replay_set(args.from_file)
        except (OSError, ValueError, KeyError) as exc:
            p.error(f"--from {args.from_file}: not a replay set written by --save ({exc})")
    else:
        plans, calib, result = replay_set(args)
        if args.save is not None:
            save_replay_set(args.save, plans, calib, result={**result, "job": {"model": args.model,
                                                                        "lowering": args.lowering}})
    if args.raw_times:
        restore_raw(result["runs"])
        result["round_factors"] = None
    elif args.from_file is not None and result.get("round_factors") is None:
        result["round_factors"] = adjust_runs(result["runs"])  # a set saved before the adjustment
    profile = ModelProfile.from_dict(result["profile"])
    cluster = measured_cluster(2, result["p2p"])
    runs, calib_runs = result["runs"][:len(plans)], result["runs"][len(plans):]
    comps = compare_plans(plans, profile, cluster, runs=runs)
    summary = fidelity_summary(comps)
    cv = cross_validated(plans, profile, cluster, runs=runs, calibration=(calib, calib_runs))
    cv_summary = fidelity_summary(cv)
    per_kind = cross_validated(plans, profile, cluster, runs=runs, calibration=(calib, calib_runs), kinds=True)
    per_kind_summary = fidelity_summary(per_kind)
    contended = cross_validated(plans, profile, cluster, runs=runs, calibration=(calib, calib_runs), contention=True)
    contended_summary = fidelity_summary(contended)
    per_layer = cross_validated(plans, profile, cluster, runs=runs, calibration=(calib, calib_runs), contention=True,
                                layers=True)
    per_layer_summary = fidelity_summary(per_layer)
    fitted = calibrate(calib, profile, cluster, runs=calib_runs, contention=True)
    factors = stage_factors(plans + calib, profile, result["runs"]) if args.stage_factors else None
    if args.json:
        overlap = {"overlap_factors": overlap_factors(plans + calib, profile, result["runs"])} if factors else {}
        print(json.dumps({"plans": [c.row() for c in comps], **summary, **({"stage_factors": factors} if factors
                                                                           else {}), **overlap,
                          "calibrated": {"plans": [c.row() for c in cv], **cv_summary},
                          "calibrated_per_kind": {"plans": [c.row() for c in per_kind], **per_kind_summary},
                          "calibrated_contention": {"plans": [c.row() for c in contended], **contended_summary,
                                                    "contention": fitted.get("contention")},
                          "calibrated_layers": {"plans": [c.row() for c in per_layer], **per_layer_summary},
                          "p2p": result["p2p"], "round_factors": result.get("round_factors")}))
        return 0
    job = result.get("job", {"model": args.model, "lowering": args.lowering})
    print(f"{job['model']}: 2 ranks ({result['backend']}, {result['threads']} thread each, "
          f"{job['lowering']} receives), {plans[0][1].microbatches} "
          f"micro-batches of {args.microbatch_size}x{args.seq_len} tokens; p2p latency "
          f"{cluster.latency_us:.0f} us, {cluster.p2p_gbps:.2f} GB/s")
    rounds = result.get("round_factors")
    print(f"each step over how slow its round ran (pipeline.calibration.drift: {min(rounds):.2f}-"
          f"{max(rounds):.2f} of the median round)" if rounds
          else "every step as measured (no rounds' drift taken out)")
    rows = [{**a.row(), "spread_pct": _spread_pct(a), "calibrated_ms": b.predicted,
             "calibrated_error_pct": 100 * b.error, "contention_ms": c.predicted, "contention_error_pct": 100 * c.error,
             "layers_ms": d.predicted, "layers_error_pct": 100 * d.error}
            for a, b, c, d in zip(comps, cv, contended, per_layer)]
    print_table(rows, ["plan", "measured_ms", "spread_pct", "predicted_ms", "error_pct", "calibrated_ms",
                       "calibrated_error_pct", "contention_ms", "contention_error_pct", "layers_ms",
                       "layers_error_pct"])
    units = sum(1 for name, _ in calib if name.startswith("unit-"))
    print(f"calibrated on {len(calib) - units} random plans and {units} with every layer a stage of its own, replayed "
          f"in the same job; + contention: compute contention {fitted.get('contention', 0):.2f} between the two ranks, "
          "fitted on the same replays; + per layer: with it, each layer's own factor from the stages of one layer")
    if factors:
        print("measured compute / profiled, per stage and operation (stage s, op, layers a:b):")
        for name, row in factors.items():
            print(f"  {name:14} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))
        print("measured compute / profiled, median over the actions the other rank computed beside for under 30% "
              "(alone) and over 70% (beside) of their time:")
        for key, row in overlap_factors(plans + calib, profile, result["runs"]).items():
            print(f"  {key:3} alone {row.get('alone', float('nan')):.2f} (n={row['alone_n']:.0f})  "
                  f"beside {row.get('beside', float('nan')):.2f} (n={row['beside_n']:.0f})")
    print(f"measured order  {' < '.join(summary['measured_order'])}")
    if summary["copy_gap_pct"] is not None:
        print(f"the same plan replayed twice in this job measured {summary['copy_gap_pct']:.1f}% apart (its noise "
              f"floor); pairs further apart than that and than 2%: {summary['pairs_beyond_copies']}")
    for label, s in (("profile", summary), ("calibrated", cv_summary), ("+ per kind", per_kind_summary),
                     ("+ contention", contended_summary), ("+ per layer", per_layer_summary)):
        print(f"{label:16} median |error| {s['median_abs_error_pct']:.1f}%, max {s['max_abs_error_pct']:.1f}%; "
              f"predicted order {' < '.join(s['predicted_order'])} "
              f"({s['concordant_pairs']}/{s['pairs']} pairs agree, ties within 2% skipped; "
              f"{s['concordant_resolved']}/{s['resolved_pairs']} of the pairs every third of the steps orders alike; "
              f"{s['concordant_beyond_copies']}/{s['pairs_beyond_copies']} beyond the copies' gap)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
