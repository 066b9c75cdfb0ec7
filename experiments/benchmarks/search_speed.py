"""Search time of the AdaPtis tuner and the distance of its plan to the lower bound.

Cases after the paper's timing table: small (gemma-small, 4 devices), medium (gemma-medium, 8),
large (gemma-large, 16), at 64 and 256 micro-batches. For each: the Megatron baseline, the tuner
at two budgets, the seconds it took, and the seconds until it was within 1% of its final plan.
The paper's tuner needed 0.56 s / 1.64 s / 6.65 s at 64 micro-batches.

  python -m experiments.benchmarks.search_speed [--budgets 100,400] [--microbatches 64,256] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from agents.base import Budget
from agents.baselines import NamedSearcher
from agents.tuner import AdaptisTuner
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.hardware import build_cluster
from pipeline.zoo import zoo_profile

CASES = {"small": ("gemma-small", 4), "medium": ("gemma-medium", 8), "large": ("gemma-large", 16)}
PAPER_SECONDS_AT_64 = {"small": 0.56, "medium": 1.64, "large": 6.65}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="100,400", help="tuner budgets in simulator calls")
    parser.add_argument("--microbatches", default="64,256")
    parser.add_argument("--cases", default="small,medium,large")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for case in args.cases.split(","):
        model, devices = CASES[case]
        profile = zoo_profile(model, seq_len=args.seq_len)
        cluster = build_cluster("h100", devices=devices)
        for mbs in (int(x) for x in args.microbatches.split(",")):
            scenario = Scenario(profile, cluster, mbs)
            bound = lower_bound(profile, cluster, mbs).value
            mega = NamedSearcher("megatron").search(scenario).iteration_time
            for calls in (int(x) for x in args.budgets.split(",")):
                stamps: list[tuple[float, float]] = []
                t0 = time.perf_counter()
                res = AdaptisTuner().search(scenario, budget=Budget(sim_calls=calls),
                                            on_improve=lambda _p, r, s=stamps, t0=t0: s.append(
                                                (time.perf_counter() - t0, r.iteration_time)))
                seconds = time.perf_counter() - t0
                within = next(t for t, it in stamps if it <= 1.01 * res.iteration_time)
                rows.append({"case": case, "model": model, "devices": devices, "microbatches": mbs,
                             "budget_calls": calls, "search_s": round(seconds, 2),
                             "s_to_within_1pct": round(within, 2),
                             "paper_s": PAPER_SECONDS_AT_64[case] if mbs == 64 else None,
                             "speedup_vs_megatron": round(mega / res.iteration_time, 3),
                             "vs_lower_bound": round(res.iteration_time / bound, 3)})
                if args.json:
                    print(json.dumps(rows[-1]), flush=True)
                else:
                    r = rows[-1]
                    print(f"{case:6} {model:13} P={devices:<2} M={mbs:<4} calls={calls:<4} search {r['search_s']:7.2f}s"
                          f"  within 1% after {r['s_to_within_1pct']:6.2f}s  (paper {r['paper_s'] or '-'}s)"
                          f"  speedup {r['speedup_vs_megatron']:.3f}x  vs bound {r['vs_lower_bound']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
