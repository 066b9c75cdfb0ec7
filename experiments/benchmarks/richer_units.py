"""Plans over finer units on real layers: gradients against the unpipelined model, and measured
against predicted iteration time after calibration, as ``run`` does.

tiny-hybrid cut into sub-block units with its head in two shards (13 units). One torchrun job
(2 gloo ranks) measures the link and profiles the units on every rank at once, then replays,
each with ``--check``: a plan that cuts inside blocks, a plan whose head shards sit on different
ranks (their gradients are all-reduced after the step), a plan that recomputes both stages
(``torch.utils.checkpoint``), a 1F1B reference over the same units, and --calibration-plans
random plans. Predictions: from the measured per-unit profile ("profile"), and calibrated on the
random plans only ("calibrated", ``pipeline.calibration.fidelity.calibrate``: the checked plans never inform
their own predictions).

  python -m experiments.benchmarks.richer_units [--microbatches 8] [--steps 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from executor.replay import ReplayOptions, run_job  # noqa: E402
from experiments.common import print_table  # noqa: E402
from pipeline.calibration.agreement import compare_plans, cross_validated  # noqa: E402
from pipeline.calibration.fidelity import calibration_plans, measured_cluster  # noqa: E402
from pipeline.plan import Plan, partition_from_sizes  # noqa: E402
from pipeline.schedules import ListSchedulerConfig, build_plan, list_schedule  # noqa: E402
from pipeline.simulator import stage_costs  # noqa: E402
from pipeline.spec import Cluster, ModelProfile  # noqa: E402

__all__ = ["UNITS", "richer_plans", "main"]

#: The units of the plans: tiny-hybrid's blocks cut between mixer and FFN, the head in 2 shards.
UNITS = {"granularity": "sublayer", "head_shards": 2}


def richer_plans(profile: ModelProfile, cluster: Cluster, microbatches: int) -> list[tuple[str, Plan]]:
    """Plans over tiny-hybrid's 13 finer units (embed, 9 mixer / FFN units, head.0, head.1) on two
    ranks, all with the I/W split: cuts inside blocks (layer0 and layer5 are cut between their
    attention and their MLP / MoE), the head's shards on different ranks, both stages recomputed."""
    if profile.num_layers != 13:
        raise ValueError(f"expected tiny-hybrid's 13 finer units, got {profile.num_layers}")
    out = []
    for name, sizes, placement, recompute in (
            ("sublayer-cut", (2, 4, 4, 3), (0, 1, 0, 1), None),
            ("split-head", (6, 6, 1), (0, 1, 0), None),
            ("recompute", (7, 6), (0, 1), (True, True))):
        partition = partition_from_sizes(sizes)
        costs = stage_costs(profile, cluster, partition, placement=placement, recompute=recompute)
        order = list_schedule(costs, placement, 2, microbatches=microbatches,
                              config=ListSchedulerConfig(split_backward=True))
        out.append((name, Plan(2, microbatches, partition, placement, order, {"method": name},
                               recompute=recompute)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--calibration-plans", type=int, default=6, help="random plans replayed to calibrate (>= 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.calibration_plans < 1:
        p.error("--calibration-plans must be at least 1")
    quick = ReplayOptions(model="tiny-hybrid", seq_len=args.seq_len, steps=1, warmup=0, **UNITS)
    first = run_job([], quick, measure=True, profile_repeats=3)
    first_profile, first_cluster = ModelProfile.from_dict(first["profile"]), measured_cluster(2, first["p2p"])
    plans = richer_plans(first_profile, first_cluster, args.microbatches)
    plans.append(("1f1b", build_plan("1f1b", first_profile, first_cluster, microbatches=args.microbatches)))
    calib = calibration_plans(first_profile, first_cluster, args.microbatches, count=args.calibration_plans,
                              seed=args.seed)
    options = ReplayOptions(model="tiny-hybrid", seq_len=args.seq_len, steps=args.steps, warmup=args.warmup,
                            check=True, **UNITS)
    result = run_job([plan for _, plan in plans + calib], options, measure=True)
    profile, cluster = ModelProfile.from_dict(result["profile"]), measured_cluster(2, result["p2p"])
    runs, calib_runs = result["runs"][:len(plans)], result["runs"][len(plans):]
    comps = compare_plans(plans, profile, cluster, runs=runs)
    cv = cross_validated(plans, profile, cluster, runs=runs, calibration=(calib, calib_runs))
    rows = [{**a.row(), "calibrated_ms": b.predicted, "calibrated_error_pct": 100 * b.error,
             "max_grad_error": run["max_grad_error"], "max_weight_error": run["max_weight_error"]}
            for a, b, run in zip(comps, cv, runs)]
    if args.json:
        print(json.dumps({"plans": rows, "p2p": result["p2p"], "units": UNITS}))
        return 0
    print(f"tiny-hybrid in {profile.num_layers} units ({UNITS}): 2 ranks ({result['backend']}), "
          f"{args.microbatches} micro-batches of 1x{args.seq_len} tokens; calibrated on {len(calib)} random plans")
    print_table(rows, ["plan", "max_grad_error", "max_weight_error", "measured_ms", "predicted_ms", "error_pct",
                       "calibrated_ms", "calibrated_error_pct"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
