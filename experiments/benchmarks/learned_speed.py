"""Seconds per simulator call of ``learned`` and ``adaptis`` at a fixed call budget: this tree
against another checkout (``--against``, e.g. a git worktree of an older commit), side by side.

One worker process per tree (its own ``pipeline`` and compiled engine) waits for requests; the
driver sends each (scenario, method, seed) to both in turn, alternating which goes first, and runs
the four (method, tree) searches of a repeat back to back, so they share the machine's load. A
worker times ``search()`` alone (not its imports) and reports the result, which must be the same
in both trees (plan time, calls, history: a speed-up may not change a search). Per scenario and
method: the median seconds per call (wall and CPU time) over the seeds and ``--reps`` repeats;
then ``learned``'s seconds per call over ``adaptis``'s, per tree.

  git worktree add /tmp/old_tree HEAD && ln -s "$PWD/.venv" /tmp/old_tree/.venv
  (cd /tmp/old_tree && .venv/bin/python -m pipeline._native.build)
  python -m experiments.benchmarks.learned_speed --against /tmp/old_tree [--calls 3000] [--reps 3] [--json]

``--anatomy`` instead takes the engine batches of one search of each method in this tree apart
(batches, jobs per batch, stages per job) and replays them: seconds per job on one thread and on
the default threads, what the Python side of a batch costs per job (the placement check, the
argument packing, the result conversion), and the time the prior's move features took in the search:

  python -m experiments.benchmarks.learned_speed --anatomy [--calls 3000] [--scenarios gemma-large/8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: name -> (model or "draw", devices or draw seed, micro-batches); the draws are of HELDOUT_SCENARIO.
SCENARIOS = {"gemma-large/8": ("gemma-large", 8, 32), "nemotronh-large/8": ("nemotronh-large", 8, 32),
             "hybrid-mamba-91#2/18": ("draw", 20_002, 0)}

# Runs in each tree's own interpreter; uses only what both trees have.
_WORKER = r'''
import json, sys, time
import numpy as np
from agents.base import Budget
from agents.tuner import AdaptisTuner
try:
    from agents.tuner.learned import learned_tuner
except ImportError:  # a checkout from before agents/tuner/ (issue 46)
    from agents.learned import learned_tuner
from env.scenarios import HELDOUT_SCENARIO, sample_scenario
from pipeline.hardware import build_cluster
try:
    from pipeline.candidates import Scenario
except ImportError:  # a checkout from before pipeline/candidates.py
    from pipeline.space import Scenario
from pipeline.zoo import zoo_profile
cache = {}
for line in sys.stdin:
    req = json.loads(line)
    key = tuple(req["scenario"])
    if key not in cache:
        model, a, m = key
        cache[key] = (sample_scenario(np.random.default_rng(a), HELDOUT_SCENARIO) if model == "draw" else
                      Scenario(zoo_profile(model, gpu="h100"), build_cluster("h100", devices=a), m))
    make = AdaptisTuner if req["method"] == "adaptis" else learned_tuner
    t0, c0 = time.perf_counter(), time.process_time()
    res = make().search(cache[key], budget=Budget(sim_calls=req["calls"]), seed=req["seed"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"wall": wall, "cpu": cpu, "calls": res.sim_calls, "time": res.iteration_time,
                      "history": [list(map(float, h)) for h in res.history]}), flush=True)
'''


class _Worker:
    def __init__(self, tree: Path) -> None:
        python = tree / ".venv" / "bin" / "python"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen([str(python if python.exists() else sys.executable), "-c", _WORKER], cwd=tree,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, **req) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a benchmark worker died (see its error above)")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _scenario(spec: tuple):
    import numpy as np

    from env.scenarios import HELDOUT_SCENARIO, sample_scenario
    from pipeline.candidates import Scenario
    from pipeline.hardware import build_cluster
    from pipeline.zoo import zoo_profile

    model, a, m = spec
    return (sample_scenario(np.random.default_rng(a), HELDOUT_SCENARIO) if model == "draw" else
            Scenario(zoo_profile(model, gpu="h100"), build_cluster("h100", devices=a), m))


def _best_of(fn, reps: int = 5) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def _batches(make, scenario, calls: int) -> tuple[list[list], float, int]:
    """The engine batches (job lists) of one search, in order; the seconds its move features took, and their count."""
    from agents.base import Budget
    from agents.tuner import learned
    from pipeline import evaluator

    batches: list[list] = []
    features = [0.0, 0]
    original, move_features = evaluator.schedule_and_simulate_many, learned.move_features

    def record(jobs, **kw):
        batches.append(list(jobs))
        return original(jobs, **kw)

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return move_features(*a, **kw)
        finally:
            features[0] += time.perf_counter() - t0
            features[1] += 1

    evaluator.schedule_and_simulate_many, learned.move_features = record, timed
    try:
        make().search(scenario, budget=Budget(sim_calls=calls), seed=0)
    finally:
        evaluator.schedule_and_simulate_many, learned.move_features = original, move_features
    return batches, features[0], features[1]


def _replay(batches: list[list]) -> dict:
    from pipeline import engine

    jobs = [j for b in batches for j in b]
    multi = [b for b in batches if len(b) > 1]
    n = sum(map(len, multi))
    one = _best_of(lambda: [engine.schedule_and_simulate_many(b, threads=1) for b in multi])
    many = _best_of(lambda: [engine.schedule_and_simulate_many(b) for b in multi])
    sample = jobs[:500]
    outcomes = [engine.schedule_and_simulate_many([j])[0] for j in sample]
    python = _best_of(lambda: [engine.pack_job(j) for j in sample])
    convert = _best_of(lambda: [engine.Outcome(o.ok, o.makespan, tuple(o.busy), tuple(o.peak)) for o in outcomes])
    return {"batches": len(batches), "jobs": len(jobs), "jobs_per_batch": round(len(jobs) / len(batches), 2),
            "mean_stages": round(statistics.mean(len(j.placement) for j in jobs), 1),
            "us_per_job_1_thread": round(1e6 * one / n, 1), "us_per_job_default_threads": round(1e6 * many / n, 1),
            "python_us_per_job": round(1e6 * (python + convert) / len(sample), 2)}


def anatomy(name: str, *, calls: int) -> list[dict]:
    """One search per method in this tree, its engine batches recorded and replayed (see the docstring)."""
    from agents.tuner import AdaptisTuner
    from agents.tuner.learned import learned_tuner

    scenario = _scenario(SCENARIOS[name])
    rows = []
    for method, make in (("adaptis", AdaptisTuner), ("learned", learned_tuner)):
        batches, seconds, moves = _batches(make, scenario, calls)
        rows.append({"scenario": name, "method": method, **_replay(batches), "moves_featured": moves,
                     "features_ms": round(1e3 * seconds, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="the other checkout (built engine, .venv)")
    parser.add_argument("--anatomy", action="store_true", help="take this tree's engine batches apart instead")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3, help="repeats of each seed")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.anatomy:
        for name in [s for s in args.scenarios.split(",") if s]:
            for row in anatomy(name, calls=args.calls):
                print(json.dumps(row) if args.json else
                      f"{row['scenario']:22s} {row['method']:8s} {row['batches']:4d} batches, {row['jobs']} jobs "
                      f"({row['jobs_per_batch']:.1f} a batch, {row['mean_stages']:.1f} stages a job): engine "
                      f"{row['us_per_job_1_thread']:.1f} us a job on 1 thread, "
                      f"{row['us_per_job_default_threads']:.1f} on the default threads; Python side "
                      f"{row['python_us_per_job']:.2f} us a job; move features {row['features_ms']:.1f} ms "
                      f"({row['moves_featured']} moves)", flush=True)
        return 0
    if args.against is None:
        parser.error("--against DIR is needed (or --anatomy)")
    trees = {"other": _Worker(args.against.resolve()), "this": _Worker(ROOT)}
    names = [s for s in args.scenarios.split(",") if s]
    load0 = os.getloadavg()[0]
    walls: dict[tuple[str, str, str], list[float]] = {}
    cpus: dict[tuple[str, str, str], list[float]] = {}
    rows = []
    try:
        k = 0
        for name in names:
            for seed in range(args.seeds):
                seen: dict[str, dict] = {}
                for _ in range(args.reps):  # the four runs of a repeat back to back: they share the load
                    for method in ("adaptis", "learned"):
                        order = ("other", "this") if k % 2 == 0 else ("this", "other")
                        k += 1
                        for tree in order:
                            out = trees[tree].run(scenario=SCENARIOS[name], method=method, seed=seed, calls=args.calls)
                            walls.setdefault((name, method, tree), []).append(out["wall"] / out["calls"])
                            cpus.setdefault((name, method, tree), []).append(out["cpu"] / out["calls"])
                            same = {x: out[x] for x in ("calls", "time", "history")}
                            if seen.setdefault(method, same) != same:
                                raise SystemExit(f"{name} {method} seed {seed}: the trees' searches differ")
            med = {(m, t): statistics.median(walls[(name, m, t)]) for m in ("adaptis", "learned")
                   for t in ("other", "this")}
            cpu = {(m, t): statistics.median(cpus[(name, m, t)]) for m in ("adaptis", "learned")
                   for t in ("other", "this")}
            row = {"scenario": name, "calls": args.calls,
                   **{f"{m}_{t}_ms_per_call": round(1e3 * med[(m, t)], 4) for m, t in med},
                   **{f"{m}_{t}_cpu_ms_per_call": round(1e3 * cpu[(m, t)], 4) for m, t in cpu},
                   "cpu_ratio_other": round(cpu[("learned", "other")] / cpu[("adaptis", "other")], 3),
                   "cpu_ratio_this": round(cpu[("learned", "this")] / cpu[("adaptis", "this")], 3),
                   "ratio_other": round(med[("learned", "other")] / med[("adaptis", "other")], 3),
                   "ratio_this": round(med[("learned", "this")] / med[("adaptis", "this")], 3),
                   "learned_this_over_other": round(med[("learned", "this")] / med[("learned", "other")], 3),
                   "adaptis_this_over_other": round(med[("adaptis", "this")] / med[("adaptis", "other")], 3)}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{name:22s} ms/call adaptis {row['adaptis_other_ms_per_call']:.4f} -> "
                      f"{row['adaptis_this_ms_per_call']:.4f}  learned {row['learned_other_ms_per_call']:.4f} -> "
                      f"{row['learned_this_ms_per_call']:.4f}  learned/adaptis {row['ratio_other']:.3f} -> "
                      f"{row['ratio_this']:.3f}  (CPU time: {row['cpu_ratio_other']:.3f} -> "
                      f"{row['cpu_ratio_this']:.3f})", flush=True)
    finally:
        for w in trees.values():
            w.close()
    summary = {"load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
               "ratio_other_geo": round(statistics.geometric_mean([r["ratio_other"] for r in rows]), 3),
               "ratio_this_geo": round(statistics.geometric_mean([r["ratio_this"] for r in rows]), 3),
               "cpu_ratio_other_geo": round(statistics.geometric_mean([r["cpu_ratio_other"] for r in rows]), 3),
               "cpu_ratio_this_geo": round(statistics.geometric_mean([r["cpu_ratio_this"] for r in rows]), 3),
               "identical_results": True}
    print(json.dumps({"summary": summary}) if args.json else
          f"learned/adaptis seconds per call, geo-mean: {summary['ratio_other_geo']} (other tree) -> "
          f"{summary['ratio_this_geo']} (this tree); CPU time {summary['cpu_ratio_other_geo']} -> "
          f"{summary['cpu_ratio_this_geo']}; identical results; load {summary['load_before']} -> "
          f"{summary['load_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
