"""Simulations per second of the performance model, on one core.

Cases: small (4 devices, 16 micro-batches, 32 layers) and large (16 devices, 64 micro-batches,
128 layers), for fixed orders (1F1B, interleaved) and list-scheduled ones (ZB-H1, ZB-V).
``search`` mode is what the tuner calls (no validation, no timeline); ``full`` validates the plan
and records the timeline. Medians of repeated one-second windows.

  python -m experiments.benchmarks.simulator_speed [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pipeline.schedules import build_plan
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import Cluster, LayerCost, ModelProfile

CASES = {"small": (4, 16, 32), "large": (16, 64, 128)}
METHODS = ("1f1b", "i1f1b-v2", "zb-h1", "zbv")
TARGETS = {"small": 2000.0, "large": 200.0}


def _profile(layers: int) -> ModelProfile:
    body = [LayerCost(f"layer{i}", "attention+mlp", 1.0, 1.0, 0.9, 50_000_000, 200_000_000, 12_582_912)
            for i in range(layers - 2)]
    return ModelProfile("bench", tuple([LayerCost("embed", "embedding", 0.05, 0.0, 0.08, 400_000_000, 12_582_912,
                                                  12_582_912)] + body +
                                       [LayerCost("head", "head", 4.0, 4.0, 3.6, 400_000_000, 1 << 30, 0)]))


def _rate(fn, repeats: int, window: float) -> float:
    rates = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < window:
            fn()
            n += 1
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=float, default=0.5, help="seconds per measurement window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for case, (devices, mbs, layers) in CASES.items():
        profile, cluster = _profile(layers), Cluster(devices=devices)
        for method in METHODS:
            t0 = time.perf_counter()
            plan = build_plan(method, profile, cluster, mbs)
            gen_ms = 1e3 * (time.perf_counter() - t0)
            costs = stage_costs(profile, cluster, plan.partition, plan.placement)
            fast = _rate(lambda plan=plan, profile=profile, cluster=cluster, costs=costs: simulate(
                plan, profile, cluster, costs=costs, validate=False, record_timeline=False), args.repeats, args.window)
            full = _rate(lambda plan=plan, profile=profile, cluster=cluster: simulate(plan, profile, cluster),
                         args.repeats, args.window)
            rows.append({"case": case, "method": method, "actions": sum(len(r) for r in plan.schedule),
                         "sims_per_s_search": round(fast, 1), "sims_per_s_full": round(full, 1),
                         "generate_ms": round(gen_ms, 2), "target": TARGETS[case],
                         "ratio_to_target": round(fast / TARGETS[case], 2)})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'case':6} {'method':9} {'actions':>7} {'sims/s (search)':>16} {'sims/s (full)':>14} "
          f"{'generate ms':>12} {'x target':>9}")
    for r in rows:
        print(f"{r['case']:6} {r['method']:9} {r['actions']:7d} {r['sims_per_s_search']:16.0f} "
              f"{r['sims_per_s_full']:14.0f} {r['generate_ms']:12.2f} {r['ratio_to_target']:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
