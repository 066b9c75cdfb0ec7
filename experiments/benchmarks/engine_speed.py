"""The compiled engine against the Python reference, measured side by side in one run.

Rows:

* ``schedule+simulate``: list-schedule one candidate and simulate it, the tuner's unit of work,
  on the large case (16 devices, 64 micro-batches, 128 layers) and a small one (4, 16, 32), for
  ZB-V and ZB-H1 knobs. ``python`` is the reference (the facade's :func:`list_schedule` and the
  simulation under :func:`pipeline.engine.python_reference`); ``native`` is the search path
  (:func:`pipeline.engine.schedule_and_simulate`: one compiled call, no Python plan); ``native-api``
  goes through :func:`list_schedule` and :func:`simulate` compiled (actions built in Python).
* ``simulate``: a fixed order (1F1B, interleaved 1F1B) simulated without validation.
* ``tuner``: the full 400-call AdaPtis tuner on gemma-large (h100 costs, 4k sequence) at 16
  devices/64 micro-batches and 32/256, native; ``--tuner-python`` adds the reference at 16/64
  (about a minute).

Each figure is the median of ``--repeats`` timings; ``ratio`` is python / native from the same
run. The machine is noisy: read the ratios.

``--against SO`` also times another build of the compiled engine in the same process (its
``_engine*.so``, e.g. an older checkout's after ``make engine`` there): the ``against`` column,
and ``gain`` = against / native. Its timing windows alternate with the native ones so both share
the machine's load; the tuner rows then take the median of 3 alternating runs of each build, and
check that both end on the same plan time. A build of the last commit's engine, for example:

  rm -rf /tmp/old_engine && mkdir /tmp/old_engine && cp -r pipeline /tmp/old_engine/
  git show HEAD:pipeline/_native/engine.cpp > /tmp/old_engine/pipeline/_native/engine.cpp
  (cd /tmp/old_engine && python -m pipeline._native.build --force)

  python -m experiments.benchmarks.engine_speed [--repeats 5] [--tuner-python] [--against SO] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pipeline import engine
from pipeline.engine import list_schedule, schedule_and_simulate
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, even_partition, sequential_placement, v_placement
from pipeline.schedules import activation_budgets
from pipeline.simulator import simulate, stage_costs
from pipeline.spec import Cluster, LayerCost, ModelProfile

__all__ = ["main", "bench_profile"]

CASES = {"small": (4, 16, 32), "large": (16, 64, 128)}
KNOBS = {
    "zbv": (v_placement, ListSchedulerConfig()),
    "zb-h1": (sequential_placement, ListSchedulerConfig(cap_counts_w=False)),
}


def bench_profile(layers: int) -> ModelProfile:
    """An embedding, ``layers - 2`` dense blocks with slightly different costs, a heavy head."""
    body = [LayerCost(f"layer{i}", "attention+mlp", 1.0 + 0.01 * (i % 7), 1.0 + 0.01 * (i % 5), 0.9,
                      50_000_000, 200_000_000, 12_582_912) for i in range(layers - 2)]
    return ModelProfile("bench", tuple([LayerCost("embed", "embedding", 0.05, 0.0, 0.08, 400_000_000, 12_582_912,
                                                  12_582_912)] + body +
                                       [LayerCost("head", "head", 4.0, 4.0, 3.6, 400_000_000, 1 << 30, 0)]))


def _median_seconds(fn: Callable[[], Any], repeats: int, min_time: float = 0.2) -> float:
    """Median over ``repeats`` windows of the mean time of one call (each window >= ``min_time``)."""
    fn()  # warm caches
    return statistics.median(_window(fn, min_time) for _ in range(repeats))


def _window(fn: Callable[[], Any], min_time: float) -> float:
    """The mean time of one call of ``fn`` over a window of at least ``min_time`` seconds."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return elapsed / n


def _build(against: str | None) -> contextlib.AbstractContextManager[None]:
    """The block that runs ``against``'s compiled engine (this checkout's when None)."""
    return engine.compiled_build(against) if against else contextlib.nullcontext()


def _paired_median_seconds(fn: Callable[[], Any], repeats: int, builds: Sequence[str | None],
                           min_time: float = 0.2) -> list[float]:
    """:func:`_median_seconds` of ``fn`` on each build, their windows interleaved (alternating which
    goes first) so that all share the machine's load."""
    windows: list[list[float]] = [[] for _ in builds]
    for k in range(repeats + 1):  # the first round warms caches
        for b in (range(len(builds)) if k % 2 else reversed(range(len(builds)))):
            with _build(builds[b]):
                mean = _window(fn, min_time)
            if k:
                windows[b].append(mean)
    return [statistics.median(w) for w in windows]


def _schedule_timings(profile: ModelProfile, cluster: Cluster, partition: tuple[tuple[int, int], ...],
                      placement: tuple[int, ...], config: ListSchedulerConfig, M: int, repeats: int, *,
                      against: str | None = None) -> tuple[float, float, float, float | None]:
    """Median seconds of one list-schedule + simulation: reference, native search path, native public
    API, and the search path on the ``against`` build (None without one)."""
    P = cluster.devices
    costs = stage_costs(profile, cluster, partition, placement=placement)

    def reference() -> None:
        with engine.python_reference():
            order = list_schedule(costs, placement, P, microbatches=M, config=config)
            simulate(Plan(P, M, partition, placement, order), profile, cluster, costs=costs, validate=False,
                     record_timeline=False)

    def native() -> None:
        schedule_and_simulate(costs, placement, P, microbatches=M, config=config)

    def native_api() -> None:
        order = list_schedule(costs, placement, P, microbatches=M, config=config)
        simulate(Plan(P, M, partition, placement, order), profile, cluster, costs=costs, validate=False,
                 record_timeline=False)

    t_against = None
    if against:
        t_nat, t_against = _paired_median_seconds(native, repeats, (None, against))
    else:
        t_nat = _median_seconds(native, repeats)
    return _median_seconds(reference, repeats), t_nat, _median_seconds(native_api, repeats), t_against


def _schedule_rows(repeats: int, against: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for case, (P, M, L) in CASES.items():
        profile, cluster = bench_profile(L), Cluster(devices=P)
        for name, (make_placement, knobs) in KNOBS.items():
            placement = make_placement(P)
            partition = even_partition(L, len(placement))
            costs = stage_costs(profile, cluster, partition, placement=placement)
            caps = budget_caps(costs, placement, P, microbatches_per_device=activation_budgets(name, P))
            config = ListSchedulerConfig(caps=caps, split_backward=knobs.split_backward,
                                         cap_counts_w=knobs.cap_counts_w,
                                         max_pending_w=P if name == "zb-h1" else None)

            t_py, t_nat, t_api, t_against = _schedule_timings(profile, cluster, partition, placement, config, M,
                                                              repeats, against=against)
            actions = len(placement) * M * 3
            row = {"row": "schedule+simulate", "case": case, "method": name, "actions": actions,
                   "python_ms": 1e3 * t_py, "native_ms": 1e3 * t_nat, "native_api_ms": 1e3 * t_api,
                   "ratio": t_py / t_nat, "ratio_api": t_py / t_api}
            if t_against is not None:
                row.update(against_ms=1e3 * t_against, gain=t_against / t_nat)
            rows.append(row)
    return rows


def _simulate_rows(repeats: int) -> list[dict[str, Any]]:
    rows = []
    P, M, L = CASES["large"]
    profile, cluster = bench_profile(L), Cluster(devices=P)
    for name, order, stages in (("1f1b", one_f_one_b_order(P, M), P), ("i1f1b-v2", interleaved_order(P, 2, M), 2 * P)):
        placement = tuple(s % P for s in range(stages))
        plan = Plan(P, M, even_partition(L, stages), placement, order)
        costs = stage_costs(profile, cluster, plan.partition, placement=placement)

        def reference(plan: Plan = plan, costs: Any = costs) -> None:
            with engine.python_reference():
                simulate(plan, profile, cluster, costs=costs, validate=False, record_timeline=False)

        def native(plan: Plan = plan, costs: Any = costs) -> None:
            simulate(plan, profile, cluster, costs=costs, validate=False, record_timeline=False)

        t_py, t_nat = _median_seconds(reference, repeats), _median_seconds(native, repeats)
        rows.append({"row": "simulate", "case": "large", "method": name, "actions": sum(map(len, order)),
                     "python_ms": 1e3 * t_py, "native_ms": 1e3 * t_nat, "ratio": t_py / t_nat})
    return rows


def _tuner_rows(with_python: bool, against: str | None = None) -> list[dict[str, Any]]:
    from agents.base import Budget
    from agents.tuner import AdaptisTuner
    from pipeline.candidates import Scenario
    from pipeline.hardware import build_cluster
    from pipeline.zoo import zoo_profile

    rows = []
    profile = zoo_profile("gemma-large", gpu="h100", seq_len=4096)
    for P, M in ((16, 64), (32, 256)):
        scenario = Scenario(profile, build_cluster("h100", devices=P, gpus_per_node=8), M)

        def run(scenario: Scenario = scenario) -> tuple[float, float]:
            t0 = time.perf_counter()
            found = AdaptisTuner().search(scenario, budget=Budget(sim_calls=400), seed=0)
            return time.perf_counter() - t0, found.iteration_time

        if against:
            runs: dict[str | None, list[tuple[float, float]]] = {None: [], against: []}
            for k in range(3):
                for build in ((None, against) if k % 2 == 0 else (against, None)):
                    with _build(build):
                        runs[build].append(run())
            t_nat, best = statistics.median(t for t, _ in runs[None]), runs[None][0][1]
        else:
            t_nat, best = run()
        row: dict[str, Any] = {"row": "tuner", "case": f"gemma-large P={P} M={M}", "method": "adaptis-400",
                               "native_s": t_nat, "iteration_time": best}
        if against:
            t_against = statistics.median(t for t, _ in runs[against])
            row.update(against_s=t_against, gain=t_against / t_nat,
                       same_plan_time_against=all(b == best for _, b in runs[None] + runs[against]))
        if with_python and P == 16:
            with engine.python_reference():
                t_py, best_py = run()
            row.update(python_s=t_py, ratio=t_py / t_nat, same_plan_time=best_py == best)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timing windows per figure (median)")
    parser.add_argument("--tuner-python", action="store_true", help="also time the 400-call tuner on the reference")
    parser.add_argument("--no-tuner", action="store_true", help="skip the tuner rows")
    parser.add_argument("--against", metavar="SO",
                        help="another build's compiled engine (an _engine*.so) to time beside this one")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)
    if not engine.compiled():
        parser.error("the compiled engine is not built (or ADAPTIS_ENGINE=python): run 'make engine' first")
    if args.against:
        try:
            with engine.compiled_build(args.against):
                pass
        except (OSError, ImportError, ValueError) as exc:
            parser.error(f"--against {exc}")
    rows = _schedule_rows(args.repeats, args.against) + _simulate_rows(args.repeats)
    if not args.no_tuner:
        rows += _tuner_rows(args.tuner_python, args.against)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    extra = f" {'against':>11} {'gain':>6}" if args.against else ""
    print(f"{'row':18} {'case':24} {'method':11} {'python':>10} {'native':>10} {'ratio':>7} "
          f"{'native-api':>11} {'ratio':>7}{extra}")
    for r in rows:
        vs = ""
        if "gain" in r:
            unit = f"{r['against_s']:8.2f} s " if r["row"] == "tuner" else f"{r['against_ms']:8.3f} ms"
            vs = f" {unit:>11} {r['gain']:5.2f}x"
        elif args.against:
            vs = f" {'-':>11} {'-':>6}"
        if r["row"] == "tuner":
            py = f"{r['python_s']:.2f} s" if "python_s" in r else "-"
            ratio = f"{r['ratio']:.1f}x" if "ratio" in r else "-"
            print(f"{r['row']:18} {r['case']:24} {r['method']:11} {py:>10} {r['native_s']:8.2f} s {ratio:>7} "
                  f"{'-':>11} {'-':>7}{vs}")
            continue
        api = f"{r['native_api_ms']:8.2f} ms" if "native_api_ms" in r else "-"
        ratio_api = f"{r['ratio_api']:.1f}x" if "ratio_api" in r else "-"
        print(f"{r['row']:18} {r['case']:24} {r['method']:11} {r['python_ms']:7.2f} ms {r['native_ms']:7.3f} ms "
              f"{r['ratio']:6.1f}x {api:>11} {ratio_api:>7}{vs}")
    same = [r["same_plan_time_against"] for r in rows if "same_plan_time_against" in r]
    if same:
        print("tuner: both builds end on the same plan time" if all(same) else
              "tuner: THE BUILDS END ON DIFFERENT PLAN TIMES (see --json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
