"""The whole-job model on the paper's grid and at scale: what data parallelism changes.

``memory``: the paper-grid cases that were memory-bound (pipeline only, 16 H100s, 64 micro-batches,
4k tokens: gemma-large and deepseek-large, the ``reproduce`` settings) re-run with each device's
weights and optimizer state as a data-parallel job holds them: ``--dp`` replicas of the pipeline
with Megatron's distributed optimizer (ZeRO-1: ``6 + 12/dp`` bytes per parameter instead of 18).
Each method's iteration time, peak memory and whether it fits, before and after.

``scaling``: the job search (:mod:`agents.job_search`) for one model family at 8, 16, 32, 64 and
128 GPUs with a fixed global batch (strong scaling, as the AdaPtis paper's series): the chosen
degrees, the best plan's step and its speedup over Megatron's best even-split configuration.

  python -m experiments.benchmarks.whole_job memory [--dp 8] [--budget 1000]
  python -m experiments.benchmarks.whole_job scaling --model gemma-large [--gpus 8,16,32,64,128] [--pp 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from agents.base import Budget
from agents.job_search import JobConfig, search_job
from agents.registry import make_searcher
from pipeline.candidates import Scenario
from pipeline.hardware import build_cluster
from pipeline.spec import TrainingConfig
from pipeline.zoo import load_zoo_architecture, zoo_profile

__all__ = ["main", "memory_rows", "scaling_rows"]

#: The grid cases ``reproduce`` found memory-bound (docs/results/reproduce.md).
MEMORY_CASES = (("gemma-large", 4096), ("deepseek-large", 4096))
METHODS = ("megatron", "1f1b", "zb-h1", "zb-h2", "zbv", "adaptis")


def memory_rows(*, dp: int, budget: int, runtime: str = "ideal") -> list[dict]:
    rows = []
    for model, seq in MEMORY_CASES:
        profile = zoo_profile(model, gpu="h100", seq_len=seq)
        cluster = build_cluster("h100", devices=16)
        for label, training in (("pipeline only (18 B/param)", TrainingConfig(runtime=runtime)),
                                (f"dp={dp}, distributed optimizer",
                                 TrainingConfig(runtime=runtime, data_parallel=dp, zero_stage=1))):
            scenario = Scenario(profile, cluster, 64, training)
            for method in METHODS:
                found = make_searcher(method).search(scenario, budget=Budget(sim_calls=budget), seed=0)
                res = found.result
                rows.append({"model": model, "seq_len": seq, "memory": label, "method": method,
                             "iteration_ms": res.iteration_time if res is not None and res.valid else None,
                             "peak_gib": max(res.peak_memory) / 2**30 if res is not None else None,
                             "fits": bool(found.feasible)})
    return rows


def scaling_rows(*, model: str, gpus: Sequence[int], global_batch: int, seq_len: int, workers: int,
                 pp: int | None = None) -> list[dict]:
    arch = load_zoo_architecture(model)
    rows = []
    for n in gpus:
        t0 = time.perf_counter()
        cfg = JobConfig(arch=arch, gpus=n, global_batch=global_batch, seq_len=seq_len,
                        pp_choices=None if pp is None else (min(pp, n),))
        found = search_job(cfg, workers=workers)
        best, base = found.best, found.megatron_best
        rows.append({"model": model, "gpus": n, "seconds": time.perf_counter() - t0,
                     "best": best.as_dict() if best else None, "megatron_best": base.as_dict() if base else None,
                     "speedup": found.speedup})
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("memory", "scaling"))
    parser.add_argument("--dp", type=int, default=8, help="memory: data-parallel replicas")
    parser.add_argument("--budget", type=int, default=1000, help="memory: the tuner's simulator calls")
    parser.add_argument("--model", default="gemma-large", help="scaling: zoo model")
    parser.add_argument("--gpus", type=_ints, default=[8, 16, 32, 64, 128], help="scaling: GPU counts")
    parser.add_argument("--global-batch", type=int, default=256, help="scaling: sequences per iteration")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pp", type=int, default=None,
                        help="scaling: fix the pipeline degree (min(pp, GPUs)) instead of searching it")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "memory":
        rows = memory_rows(dp=args.dp, budget=args.budget)
        if args.json:
            print("\n".join(json.dumps(r) for r in rows))
            return 0
        print(f"{'model':15} {'memory':32} {'method':9} {'ms':>8} {'peak GiB':>8} fits")
        for r in rows:
            ms = "-" if r["iteration_ms"] is None else f"{r['iteration_ms']:.1f}"
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
            print(f"{r['model']:15} {r['memory']:32} {r['method']:9} {ms:>8} {peak:>8} {'yes' if r['fits'] else 'NO'}")
        return 0
    rows = scaling_rows(model=args.model, gpus=args.gpus, global_batch=args.global_batch, seq_len=args.seq_len,
                        workers=args.workers, pp=args.pp)
    if args.json:
        print("\n".join(json.dumps(r) for r in rows))
        return 0
    print(f"{'gpus':>5} {'best degrees':34} {'ms':>8} {'Megatron best degrees':34} {'ms':>8} speedup   s")
    for r in rows:
        b, m = r["best"], r["megatron_best"]

        def deg(x: dict | None) -> str:
            return "-" if x is None else (f"tp{x['tp']} pp{x['pp']} dp{x['dp']} cp{x['cp']} ep{x['ep']} "
                                          f"mbs{x['microbatch_size']}")
        bms = "-" if b is None else f"{b['iteration_ms']:.1f}"
        mms = "-" if m is None else f"{m['iteration_ms']:.1f}"
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        print(f"{r['gpus']:5} {deg(b):34} {bms:>8} {deg(m):34} {mms:>8} {sp:>7} {r['seconds']:4.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
