"""Calls to the tuner's quality: ``learned`` (the tuner with learned move guidance) against ``adaptis``.

On held-out scenarios (the zoo's held-out models on 8 devices, 32 micro-batches; ``--draws`` draws
of :data:`env.scenarios.HELDOUT_SCENARIO`; ``--large`` scenarios of 32 devices, 256 micro-batches
and sub-layer units), every method runs ``--seeds`` times with ``--calls`` simulator calls:

* reference: the median over seeds of ``adaptis``'s final iteration time;
* calls to quality: the first simulator call at which a run's best plan that fits in memory is
  within ``--within`` (0.5%) of the reference, read from the run's improvements (the calls of
  its ``history``, with the seconds and whether the plan fits recorded beside them; a run that
  never gets there counts its whole budget, marked ``>``); per scenario the median over seeds;
  the geometric mean over scenarios; and the same in seconds since the search began (the
  prior's and the bandit's time is in them);
* final quality: each method's median final time over the reference (above 1 = slower; a plan
  that does not fit counts as infinitely slow);
* the same ratios over the scenarios decided in the local search (``adaptis`` needs more than
  :data:`LOCAL_CALLS` calls): elsewhere the named plans or the seeds reach the target and every
  method ties by construction;
* equal wall time: ``adaptis`` and ``learned`` with ``--walls`` budgets in seconds (0.25 s, 1 s),
  median over seeds, ``learned``'s time over ``adaptis``'s.

The criterion's own noise: ``adaptis-reseeded`` is the plain tuner again with seeds
:data:`RESEED` on (the same method, other paths), so its calls and finals against the reference show
how far another draw of seeds alone moves them; a worst final below what it reaches cannot be
told apart from path noise at that many seeds.

Ablations: ``learned-random`` (the same policy with priors of random weights, for the moves and
the starts), ``learned-no-bandit`` (families in the tuner's order), ``learned-no-prior`` (the
tuner's own order of neighbours), ``learned-no-starts`` (the starts in the tuner's own order),
``learned-bandit-only`` (every descent's families by the bandit: ``learned`` before 2 Dec afternoon).
The shipped priors are made by a command, not by this benchmark:
``python -m experiments train --prior moves|starts --seed 0 --out agents/policies``.

  python -m experiments.benchmarks.learned_tuner [--draws 3] [--large 1] [--seeds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agents.base import Budget, SearchResult
from agents.tuner import AdaptisTuner, Progress
from agents.tuner.learned import MovePrior, learned_tuner, load_prior, random_prior_tuner
from env.scenarios import HELDOUT_SCENARIO, sample_scenario
from pipeline import zoo
from pipeline.candidates import Scenario
from pipeline.hardware import build_cluster
from pipeline.simulator import Result

__all__ = ["METHODS", "scenarios", "calls_to", "measure", "main"]

#: Scenarios where ``adaptis`` needs more calls than this are decided in its local search (its named
#: plans and seeds take ~20-200 calls); the summary's ``local`` ratios are over those alone.
LOCAL_CALLS = 200
#: Large held-out scenarios (devices, micro-batches, sub-layer units), in the order --large takes them.
LARGE = (("gemma-large", 32, 256), ("nemotronh-large", 32, 256), ("deepseek-large", 32, 256))


#: How far ``adaptis-reseeded`` shifts the seeds (beyond any ``--seeds`` count used).
RESEED = 1000


@dataclass
class ReseededTuner(AdaptisTuner):
    """The plain tuner with every seed shifted by :data:`RESEED`: the reference's own noise floor."""

    name: str = "adaptis-reseeded"

    def search(self, scenario: Scenario, *, seed: int = 0, **kwargs) -> SearchResult:
        return super().search(scenario, seed=seed + RESEED, **kwargs)


def _methods(prior: MovePrior) -> dict[str, Callable[[], AdaptisTuner]]:
    return {
        "adaptis": AdaptisTuner,
        "adaptis-reseeded": ReseededTuner,
        "learned": lambda: learned_tuner(prior=prior),
        "learned-random": random_prior_tuner,
        "learned-no-bandit": lambda: learned_tuner(prior=prior, bandit=False, name="learned-no-bandit"),
        "learned-no-prior": lambda: learned_tuner(prior=None, name="learned-no-prior"),
        "learned-no-starts": lambda: learned_tuner(prior=prior, starts=None, name="learned-no-starts"),
        "learned-bandit-only": lambda: learned_tuner(prior=prior, descents="bandit", name="learned-bandit-only"),
    }


METHODS = ("adaptis", "learned", "learned-random", "learned-no-bandit", "learned-no-prior", "learned-no-starts",
           "learned-bandit-only")


def scenarios(*, draws: int, large: int, draw_seed: int = 20_000) -> list[tuple[str, Scenario]]:
    """The held-out zoo models on 8 devices (32 micro-batches), ``draws`` held-out draws, ``large`` large ones."""
    out = [(f"{name}/8", Scenario(zoo.zoo_profile(name, gpu="h100"), build_cluster("h100", devices=8), 32))
           for name in HELDOUT_SCENARIO.zoo_models]
    for i in range(draws):
        p = sample_scenario(np.random.default_rng(draw_seed + i), HELDOUT_SCENARIO)
        out.append((f"{p.profile.name}#{i}/{p.devices}", p))
    for name, P, M in LARGE[:large]:
        prof = zoo.zoo_profile(name, gpu="h100", granularity="sublayer")
        out.append((f"{name}/{P}/{M}/sublayer", Scenario(prof, build_cluster("h100", devices=P), M)))
    return out


Improvement = tuple[int, float, float, bool]
"""(simulator calls, seconds since the search began, iteration time, fits in memory) of one improvement."""


def _improvements(log: list[Improvement]) -> Progress:
    """A tuner's :attr:`~agents.tuner.AdaptisTuner.on_progress` that records every improvement of its
    search with its seconds and whether it fits: the search's ``history`` has (calls, time) only, and
    under tight memory its first entries are plans that do not fit (a plan that fits beats any that
    does not, however fast)."""
    t0 = time.perf_counter()

    def improved(calls: int, result: Result) -> None:
        log.append((calls, time.perf_counter() - t0, result.iteration_time, bool(result.feasible)))

    return improved


def calls_to(log: list[Improvement], target: float) -> tuple[int | None, float | None]:
    """(calls, seconds) at which the best plan that fits was first at most ``target`` (None: never)."""
    for calls, seconds, t, fits in log:
        if fits and t <= target:
            return calls, seconds
    return None, None


def _run(make: Callable[[], AdaptisTuner], scenario: Scenario, budget: Budget, seed: int
         ) -> tuple[SearchResult, float, list[Improvement]]:
    log: list[Improvement] = []
    progress = _improvements(log)  # its seconds count from before the tuner is made, the wall from the search
    tuner = make()
    tuner.on_progress = progress
    t0 = time.perf_counter()
    res = tuner.search(scenario, budget=budget, seed=seed)
    wall = time.perf_counter() - t0
    return res, wall, log


def _final(res: SearchResult) -> float:
    return res.iteration_time if res.feasible else math.inf


def measure(name: str, scenario: Scenario, *, methods: dict[str, Callable[[], AdaptisTuner]], seeds: int, calls: int,
            within: float, walls: list[float]) -> dict:
    """One scenario's row (see the module docstring)."""
    runs = {m: [_run(f, scenario, Budget(sim_calls=calls), s) for s in range(seeds)] for m, f in methods.items()}
    finals = {m: [_final(r) for r, _, _ in rs] for m, rs in runs.items()}
    ref = statistics.median(finals["adaptis"])
    row: dict = {"scenario": name, "devices": scenario.devices, "microbatches": scenario.microbatches,
                 "reference": round(ref, 4), "time_unit": scenario.profile.time_unit}
    if not math.isfinite(ref):
        row["note"] = "no feasible adaptis plan"
        return row
    target = ref * (1 + within)
    for m, rs in runs.items():
        reached = [calls_to(log, target) for _, _, log in rs]
        row[m] = {"calls": statistics.median(c if c is not None else calls for c, _ in reached),
                  "reached": sum(c is not None for c, _ in reached),
                  "seconds": round(statistics.median(wall if s is None else s
                                                     for (_, s), (_, wall, _) in zip(reached, rs)), 4),
                  "final": round(statistics.median(finals[m]) / ref, 5),
                  "wall": round(statistics.median(w for _, w, _ in rs), 3)}
    for w in walls:
        budget = Budget(sim_calls=None, seconds=w)
        times = {m: statistics.median(_final(_run(methods[m], scenario, budget, s)[0]) for s in range(seeds))
                 for m in ("adaptis", "learned") if m in methods}
        if len(times) == 2:
            a, b = times["adaptis"], times["learned"]
            row[f"at_{w:g}s"] = round(b / a, 5) if math.isfinite(a) and math.isfinite(b) else None
    return row


def _geo(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)) if values else float("nan")


def summarise(rows: list[dict], methods: list[str], walls: list[float]) -> dict:
    ok = [r for r in rows if "adaptis" in r]
    out: dict = {}
    for m in methods:
        calls = [r[m]["calls"] for r in ok]
        secs = [r[m]["seconds"] for r in ok]
        out[m] = {"geo_calls": round(_geo(calls), 1), "geo_seconds": round(_geo(secs), 4),
                  "worst_final": round(max(r[m]["final"] for r in ok), 5) if ok else None,
                  "geo_final": round(_geo([r[m]["final"] for r in ok]), 5)}
        if m != "adaptis":
            out[m]["calls_ratio"] = round(_geo([r[m]["calls"] / r["adaptis"]["calls"] for r in ok]), 3)
            out[m]["seconds_ratio"] = round(_geo([r[m]["seconds"] / r["adaptis"]["seconds"] for r in ok]), 3)
    local = [r for r in ok if r["adaptis"]["calls"] > LOCAL_CALLS]
    for m in methods:
        if m != "adaptis":
            out[m]["local_calls_ratio"] = round(_geo([r[m]["calls"] / r["adaptis"]["calls"] for r in local]), 3)
            out[m]["local_seconds_ratio"] = round(_geo([r[m]["seconds"] / r["adaptis"]["seconds"] for r in local]), 3)
    out["local_scenarios"] = len(local)
    for w in walls:
        vals = [r[f"at_{w:g}s"] for r in ok if r.get(f"at_{w:g}s") is not None]
        out[f"learned_at_{w:g}s"] = {"geo": round(_geo(vals), 5), "better": sum(v < 0.998 for v in vals),
                                     "tie": sum(0.998 <= v <= 1.002 for v in vals),
                                     "worse": sum(v > 1.002 for v in vals)}
    return out


def _print(rows: list[dict], summary: dict, methods: list[str], walls: list[float], calls: int) -> None:
    def short(m: str) -> str:  # column names: "no-bandit", "reseeded", "random-w"...
        return {"learned-random": "random-w", "adaptis-reseeded": "reseeded"}.get(m, m.removeprefix("learned-"))

    head = ["scenario"] + [f"{short(m)} calls" for m in methods] + \
        [f"{short(m)} final" for m in methods if m != "adaptis"] + [f"at {w:g}s" for w in walls]
    print(" | ".join(head))
    for r in rows:
        if "adaptis" not in r:
            print(f"{r['scenario']} | {r.get('note', '')}")
            continue
        cells = [r["scenario"]]
        for m in methods:
            c = r[m]["calls"]
            cells.append(f"{'>' if r[m]['reached'] == 0 else ''}{c:g}")
        cells += [f"{r[m]['final']:.4f}" for m in methods if m != "adaptis"]
        cells += ["-" if r.get(f"at_{w:g}s") is None else f"{r[f'at_{w:g}s']:.4f}" for w in walls]
        print(" | ".join(cells))
    print()
    for m in methods:
        s = summary[m]
        extra = "" if m == "adaptis" else (f"  calls ratio {s['calls_ratio']} (local {s['local_calls_ratio']})  "
                                           f"seconds ratio {s['seconds_ratio']} (local {s['local_seconds_ratio']})")
        print(f"{m:18s} geo calls {s['geo_calls']:7.1f}  geo seconds {s['geo_seconds']:.4f}  final geo "
              f"{s['geo_final']:.4f} worst {s['worst_final']:.4f}{extra}")
    for w in walls:
        s = summary[f"learned_at_{w:g}s"]
        print(f"learned at {w:g}s: time / adaptis's geo {s['geo']:.4f}; better {s['better']}, tie {s['tie']}, "
              f"worse {s['worse']} (0.2%)")
    print(f"(calls of a run that never reached the target: its budget, {calls}, marked >; local: the "
          f"{summary['local_scenarios']} scenarios where adaptis needs more than {LOCAL_CALLS} calls)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=3, help="held-out synthetic draws (seeds --draw-seed...)")
    parser.add_argument("--draw-seed", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=1, help=f"large scenarios, of {len(LARGE)}")
    parser.add_argument("--no-zoo", action="store_true", help="leave out the held-out zoo models on 8 devices")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--within", type=float, default=0.005)
    parser.add_argument("--walls", default="0.25,1", help="equal wall-time budgets in seconds ('' for none)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--prior", default=None, help="prior JSON (default: the shipped one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    prior = load_prior(args.prior)
    known = _methods(prior)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "adaptis" not in methods:
        methods.insert(0, "adaptis")
    unknown = [m for m in methods if m not in known]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(known)}")
    walls = [float(w) for w in args.walls.split(",") if w.strip()]
    cases = scenarios(draws=args.draws, large=args.large, draw_seed=args.draw_seed)
    if args.no_zoo:
        cases = [c for c in cases if not c[0].endswith("/8") or "#" in c[0]]
    rows = []
    for name, scenario in cases:
        row = measure(name, scenario, methods={m: known[m] for m in methods}, seeds=args.seeds, calls=args.calls,
                      within=args.within, walls=walls)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"# {name}: done", file=sys.stderr, flush=True)
    summary = summarise(rows, methods, walls)
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        _print(rows, summary, methods, walls, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

