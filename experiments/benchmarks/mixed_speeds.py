"""What ordering devices by speed buys the tuner on clusters of mixed speeds.

Draws scenarios from the held-out distribution (env.scenarios.HELDOUT_SCENARIO: hybrid-mamba
models of 56-96 blocks and the held-out zoo models, 2-32 devices, multi-node links, tight memory)
with every cluster of mixed speeds (half the devices at 0.5, 0.65 or 0.8 of the others), and runs
the AdaPtis tuner twice on each at the same budget: in index order only
(``AdaptisTuner(speed_order=False)``) and with its seeds and placement moves also ordering the
devices slowest first, fastest last (the default, :func:`pipeline.candidates.slow_first`). Prints one
JSON line per scenario and a summary: geometric mean and maximum of index-order time over
speed-order time, and how many scenarios gained or lost more than 0.5%.

  python -m experiments.benchmarks.mixed_speeds                      # 24 scenarios, 400 calls each
  python -m experiments.benchmarks.mixed_speeds --scenarios 8 --budget 200
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Sequence

import numpy as np

from agents.base import Budget
from agents.tuner import AdaptisTuner
from env.scenarios import HELDOUT_MIXED_SPEEDS, sample_scenario
from experiments.common import positive_int

__all__ = ["scenario_rows", "summary", "main"]


def scenario_rows(scenarios: int, *, seed: int = 50_000, budget: int = 400) -> Iterator[dict]:
    """One row per drawn scenario with mixed speeds, as it is searched: the tuner's time in index
    order and in speed order and their ratio (unrounded), or which of the two found no feasible plan
    (``feasible``); draws whose devices all have one speed are left out."""
    for i in range(scenarios):
        scenario = sample_scenario(np.random.default_rng(seed + i), HELDOUT_MIXED_SPEEDS)
        speeds = scenario.cluster.speeds
        if max(speeds) == min(speeds):  # every device drew the same speed: nothing to order
            continue
        times = {}
        for speed_order in (False, True):
            found = AdaptisTuner(speed_order=speed_order).search(scenario, budget=Budget(budget), seed=0)
            times[speed_order] = found.iteration_time if found.feasible else math.inf
        row = {"scenario": f"{scenario.profile.name}#{i}", "devices": scenario.devices}
        if not math.isfinite(times[False]) or not math.isfinite(times[True]):
            yield {**row, "feasible": [math.isfinite(times[False]), math.isfinite(times[True])]}
            continue
        yield {**row, "microbatches": scenario.microbatches, "slowest": min(speeds), "index_order_ms": times[False],
               "speed_order_ms": times[True], "ratio": times[False] / times[True]}


def summary(rows: Sequence[dict], *, budget: int) -> dict | None:
    """Geometric mean, maximum and minimum of the rows' ratios and how many gained or lost more than
    0.5% (unrounded); None when no row has a ratio."""
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if not ratios:
        return None
    return {"scenarios": len(ratios), "budget_calls": budget,
            "geomean_index_over_speed_order": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "max": max(ratios), "min": min(ratios),
            "gained_over_0.5pct": sum(r > 1.005 for r in ratios), "lost_over_0.5pct": sum(r < 0.995 for r in ratios)}


def _printed(row: dict, digits: dict[str, int]) -> dict:
    return {k: round(v, digits[k]) if k in digits else v for k, v in row.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", type=positive_int, default=24, help="held-out scenarios to draw")
    p.add_argument("--seed", type=int, default=50_000, help="seed of the first draw")
    p.add_argument("--budget", type=positive_int, default=400, help="the tuner's simulator calls per run")
    args = p.parse_args(argv)
    rows = []
    for row in scenario_rows(args.scenarios, seed=args.seed, budget=args.budget):
        rows.append(row)
        print(json.dumps(_printed(row, {"index_order_ms": 1, "speed_order_ms": 1, "ratio": 4})), flush=True)
    total = summary(rows, budget=args.budget)
    if total is None:
        print(json.dumps({"summary": "no scenario with a feasible plan both ways"}))
        return 1
    print(json.dumps({"summary": _printed(total, {"geomean_index_over_speed_order": 4, "max": 4, "min": 4})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
