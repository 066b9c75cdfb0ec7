"""Proven optimality gaps of the tuner's final plans, and ``zb-opt`` against ``zb-h2``.

For each case the AdaPtis tuner searches a plan (``--budget`` simulator calls, seed 0), then
:func:`pipeline.exact.prove` searches the best order of that plan's partition and placement within
``--seconds`` and proves a lower bound on every order. Printed per case: the tuner's time, the best
found (simulated), the bound, the gap (best / bound - 1), how far the tuner's own schedule was
from the best (tuner / best - 1), the solver's status and which bound won.

Cases:

* ``reproduce``: the three cases of ``python -m experiments reproduce`` (ideal runtime, analytic
  H100 costs, 64 micro-batches, PyTorch's memory accounting) where the tuner stays farthest from
  the lower bound in docs/results/reproduce.md: gemma-large 4k, deepseek-large 4k, gemma-large 2k
  (16 devices);
* ``published``: the Zero Bubble paper's profiled per-stage times (Qi et al. 2024, Table 9, in
  shared/data/published/zero_bubble_qi2024_dev.json), 1.5B and 6.2B at m = 24, 32, 64 on 8
  stages, built as ``experiments.benchmarks.published`` builds them, on the ``zb-sync`` runtime
  (the fitted A100 runtime with the iteration ending at the last action: one iteration's makespan,
  which the solver bounds; ``zb`` overlaps iterations, and the solver cannot bound a steady period).
  Each stage's activations count one unit per micro-batch and each device may hold 2p units:
  ZB-2p's memory limit (the W of a micro-batch frees it, PyTorch's accounting).

``--zb-opt`` also prints, on the published cases, ``zb-h2`` and ``zb-opt`` (the exact schedule at
``zb-h2``'s own peak activation memory, its fullest device's, on every device; the 2p limit is
lifted for this comparison, since ``zb-h2`` itself does not fit in it) and the speedup.

  python -m experiments.benchmarks.prove_gaps                         # both sets, 60 s each
  python -m experiments.benchmarks.prove_gaps --cases published --seconds 20 --zb-opt
  python -m experiments.benchmarks.prove_gaps --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agents.base import Budget
from agents.registry import make_searcher
from agents.zb_opt import ZbOptSearcher
from pipeline.candidates import Scenario
from pipeline.exact import prove
from pipeline.hardware import build_cluster
from pipeline.spec import GIB, Cluster, LayerCost, ModelProfile, TrainingConfig
from pipeline.zoo import zoo_profile

__all__ = ["main", "reproduce_cases", "published_cases", "prove_case"]

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT.parent / "shared" / "data" / "published" / "zero_bubble_qi2024_dev.json"
HARDEST = (("gemma-large", 4096), ("deepseek-large", 4096), ("gemma-large", 2048))
PUBLISHED_ROWS = tuple(f"zb_t4_{m}_m{n}_ZB-2p" for m in ("1.5B", "6.2B") for n in (24, 32, 64))


def reproduce_cases() -> Iterator[tuple[str, Scenario]]:
    """The three hardest cases of ``reproduce`` (see the module docstring)."""
    for model, seq in HARDEST:
        profile = zoo_profile(model, gpu="h100", seq_len=seq)
        cluster = build_cluster("h100", devices=16, gpus_per_node=8)
        yield f"{model} {seq // 1024}k", Scenario(profile, cluster, 64, TrainingConfig(runtime="ideal"))


def published_cases(path: Path = PUBLISHED) -> Iterator[tuple[str, Scenario]]:
    """The Zero Bubble paper's profiled stages (see the module docstring)."""
    rows = {r["id"]: r for r in json.loads(path.read_text())["rows"]}
    for rid in PUBLISHED_ROWS:
        row = rows[rid]
        t = row["profiled_inputs"]
        P, M = int(row["parallel"]["pp"]), int(row["batch"]["num_microbatches"])
        layers = tuple(LayerCost(f"stage{k}", "stage", t["T_F"], t["T_B"], t["T_W"], 0, GIB, 1) for k in range(P))
        profile = ModelProfile(rid, layers, time_unit="ms")
        cluster = Cluster(devices=P, latency_us=1000 * t["T_comm"], p2p_gbps=1e9, memory_gb=2 * P,
                          memory_reserve_gb=0)
        yield f"{row['model']['name'].split()[-1]} m={M}", Scenario(profile, cluster, M,
                                                                 TrainingConfig(runtime="zb-sync"))


def prove_case(name: str, scenario: Scenario, *, seconds: float, budget: int) -> dict[str, Any]:
    """Tune, then prove the tuner's plan: one row of the table."""
    tuned = make_searcher("adaptis").search(scenario, budget=Budget(sim_calls=budget), seed=0)
    if not tuned.feasible:
        return {"case": name, "error": tuned.note or "the tuner found no feasible plan"}
    proof = prove(tuned.plan, scenario.profile, scenario.cluster, training=scenario.training, seconds=seconds)
    s = proof.summary()
    won = max((("solver", proof.solver_bound or 0.0), ("pipeline.bounds", proof.analytic_bound),
               ("device load", proof.load_bound)), key=lambda kv: kv[1])[0]
    return {"case": name, "devices": scenario.devices, "microbatches": scenario.microbatches,
            "stages": tuned.plan.num_stages, "actions": proof.actions, "runtime": scenario.training.runtime,
            "tuner_ms": s["plan_ms"], "best_ms": s["best_ms"], "bound_ms": s["bound_ms"], "gap": s["gap"],
            "tuner_vs_best": s["plan_vs_best"], "status": proof.status, "source": proof.source,
            "bound_from": won, "solver_makespan_ms": s["solver_makespan_ms"], "solver_order_ms": s["solver_order_ms"],
            "seconds": s["seconds"], "formulation": proof.formulation}


def zb_opt_case(name: str, scenario: Scenario, *, seconds: float) -> dict[str, Any]:
    """``zb-h2`` and ``zb-opt`` at ``zb-h2``'s own peak memory (the device limit lifted so that ``zb-h2``,
    whose budget of 2(p - d) - 1 micro-batches counts only those before their I, fits)."""
    sc = scenario
    scenario = Scenario(sc.profile, sc.cluster.with_memory(1000.0), sc.microbatches, sc.training)
    h2 = make_searcher("zb-h2").search(scenario, budget=Budget(sim_calls=1))
    opt = ZbOptSearcher().search(scenario, budget=Budget(sim_calls=None, seconds=seconds))
    unit = scenario.profile.seconds_per_unit * 1e3
    return {"case": name, "zb_h2_ms": h2.iteration_time * unit, "zb_opt_ms": opt.iteration_time * unit,
            "speedup": h2.iteration_time / opt.iteration_time,
            "peak_gib_h2": max(h2.result.peak_memory_gb), "peak_gib_opt": max(opt.result.peak_memory_gb),
            "note": opt.note}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="reproduce,published", help="reproduce, published or both")
    parser.add_argument("--seconds", type=float, default=60.0, help="prove's time per case (default 60)")
    parser.add_argument("--budget", type=int, default=3000, help="the tuner's simulator calls per case")
    parser.add_argument("--zb-opt", action="store_true", help="also zb-opt against zb-h2 on the published cases")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--out", type=Path, help="also write prove_gaps.jsonl and prove_gaps.png (gap per case) here")
    args = parser.parse_args(argv)
    sets = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not sets or any(c not in ("reproduce", "published") for c in sets) or args.seconds <= 0:
        parser.error("--cases: reproduce and/or published; --seconds > 0")
    cases = [*(reproduce_cases() if "reproduce" in sets else ()), *(published_cases() if "published" in sets else ())]
    rows = []
    if not args.json:
        print(f"{'case':18} {'dev':>3} {'M':>3} {'stg':>3} {'acts':>5} {'tuner ms':>10} {'best ms':>10} "
              f"{'bound ms':>10} {'gap':>7} {'tuner/best':>10}  status    bound from")
    for name, scenario in cases:
        row = prove_case(name, scenario, seconds=args.seconds, budget=args.budget)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        elif "error" in row:
            print(f"{name:18} {row['error']}", flush=True)
        else:
            print(f"{name:18} {row['devices']:3d} {row['microbatches']:3d} {row['stages']:3d} {row['actions']:5d} "
                  f"{row['tuner_ms']:10.2f} {row['best_ms']:10.2f} {row['bound_ms']:10.2f} "
                  f"{100 * row['gap']:6.2f}% {100 * row['tuner_vs_best']:9.2f}%  {row['status']:9} {row['bound_from']}",
                  flush=True)
    good = [r for r in rows if "gap" in r]
    if good and not args.json:
        within = sum(r["gap"] <= 0.01 for r in good)
        print(f"\n{within} of {len(good)} cases proven within 1% of the optimum of their partition and placement; "
              f"largest gap {100 * max(r['gap'] for r in good):.2f}%; the tuner's schedule was at most "
              f"{100 * max(r['tuner_vs_best'] for r in good):.2f}% above the best found")
    extra: list[dict[str, Any]] = []
    if args.zb_opt:
        if not args.json:
            print(f"\n{'case':18} {'zb-h2 ms':>10} {'zb-opt ms':>10} {'speedup':>8} {'peak GiB h2/opt':>16}  note")
        for name, scenario in published_cases():
            row = zb_opt_case(name, scenario, seconds=args.seconds)
            extra.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{name:18} {row['zb_h2_ms']:10.2f} {row['zb_opt_ms']:10.2f} {row['speedup']:8.4f} "
                      f"{row['peak_gib_h2']:7.2f}/{row['peak_gib_opt']:<7.2f}  {row['note']}", flush=True)
    if args.out:
        _write(args.out, good, extra, seconds=args.seconds)
    return 0


def _write(out: Path, rows: list[dict[str, Any]], zb: list[dict[str, Any]], *, seconds: float) -> None:
    """prove_gaps.jsonl (every row) and prove_gaps.png: per case, the tuner's time and the best found over
    the proven bound (1 = proven optimal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "prove_gaps.jsonl", "w") as fh:
        for row in [*rows, *({"zb_opt": True, **r} for r in zb)]:
            fh.write(json.dumps(row) + "\n")
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [100 * (r["tuner_ms"] / r["bound_ms"] - 1) for r in rows], 0.4,
           label="tuner's plan / bound - 1")
    ax.bar([i + 0.2 for i in x], [100 * r["gap"] for r in rows], 0.4, label="best found / bound - 1 (gap)")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(list(x), [r["case"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("% above the proven bound")
    ax.set_title(f"prove on the tuner's final plans ({seconds:g} s each): proven optimality gaps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "prove_gaps.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
