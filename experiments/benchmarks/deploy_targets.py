"""What each deployment target gains on the paper's grid: Megatron-LM, torchtitan and our executor.

For every case of ``python -m experiments reproduce``'s grid (Gemma, DeepSeek-style, Nemotron-H-style;
small/medium/large on 4/8/16 devices; 2k and 4k tokens) it runs the Megatron baseline (interleaved
1F1B at Megatron's even split, best chunk count), then each target's own search at the same
budget: ``megatron+layout`` (Megatron's order at a searched uneven layout), ``adaptis@torchtitan``
(loop or V placement, any order) and ``adaptis`` (anything). A target's figure is the fastest
feasible plan among all searched plans that it can run (``agents.target_search.target_rows``), so a more
flexible runtime is never shown slower than a stricter one. Prints per-case speedups and the
geometric means, and with ``--out DIR`` writes ``targets.md``, ``targets.jsonl`` and ``targets.png``.

  python -m experiments.benchmarks.deploy_targets [--budget 400] [--families gemma] [--sizes small] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from agents.base import Budget
from agents.baselines import NamedSearcher
from agents.target_search import TARGET_METHODS, target_rows, target_searcher
from pipeline.candidates import Scenario
from pipeline.hardware import build_cluster
from pipeline.targets import TARGETS
from pipeline.zoo import zoo_profile

PAPER_MODELS = ("gemma", "deepseek", "nemotronh")
SIZES = {"small": 4, "medium": 8, "large": 16}


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def run_case(model: str, devices: int, seq_len: int, *, gpu: str, microbatches: int, budget: Budget,
             seed: int) -> dict[str, Any]:
    """One case: the baseline, each target's search, each target's best speedup."""
    profile = zoo_profile(model, gpu=gpu, seq_len=seq_len)
    scenario = Scenario(profile, build_cluster(gpu, devices=devices, gpus_per_node=8), microbatches)
    mega = NamedSearcher("megatron").search(scenario)
    results = [mega]
    seconds = {}
    for target in TARGETS:
        t0 = time.perf_counter()
        results.append(target_searcher(target, devices).search(scenario, budget=budget, seed=seed))
        seconds[target] = round(time.perf_counter() - t0, 2)
    # As in reproduce.md: the baseline's time is the reference even where it overflows memory.
    reference = mega.iteration_time if mega.ok else None
    rows = {r["target"]: r for r in target_rows(results, scenario, reference)}
    return {"model": model, "seq_len": seq_len, "devices": devices, "megatron": reference,
            "megatron_fits": bool(mega.ok and mega.result.feasible),
            **{f"{t}_speedup": rows[t]["speedup"] for t in TARGETS},
            **{f"{t}_method": rows[t]["method"] for t in TARGETS},
            **{f"{t}_seconds": seconds[t] for t in TARGETS}}


def write_outputs(out: Path, cases: list[dict[str, Any]], command: str) -> dict[str, float]:
    """``targets.jsonl``, ``targets.md`` and ``targets.png`` in ``out``; returns the geometric means."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "targets.jsonl", "w") as fh:
        for c in cases:
            fh.write(json.dumps(c) + "\n")
    means = {t: _geomean([c[f"{t}_speedup"] for c in cases if c[f"{t}_speedup"]]) for t in TARGETS}
    order = ("megatron", "torchtitan", "executor")
    lines = ["# What each deployment target gains (simulated)", "",
             f"Command: `{command}`. Speedup of the fastest feasible plan each runtime can run over the "
             "Megatron baseline (interleaved 1F1B, Megatron's even split, best chunk count 1-8). Search "
             f"methods: {', '.join(f'{t}: `{TARGET_METHODS[t]}`' for t in order)}; a runtime may also run "
             "plans another method found (a looped plan runs in all three). Every plan counted fits in memory; "
             "where the baseline itself does not, its time is still the reference, as in reproduce.md.", "",
             "| model | seq | devices | Megatron (uneven layout) | torchtitan (loop/V, any order) "
             "| executor (any plan) |",
             "|---|---|---|---|---|---|"]
    for c in cases:
        cells = " | ".join(f"{c[f'{t}_speedup']:.2f}x" if c[f"{t}_speedup"] else "—" for t in order)
        oom = "" if c.get("megatron_fits", True) else " (baseline over memory)"
        lines.append(f"| {c['model']} | {c['seq_len']} | {c['devices']}{oom} | {cells} |")
    lines += ["", "Geometric mean over the cases: " + ", ".join(f"**{t} {means[t]:.3f}x**" for t in order) + "."]
    (out / "targets.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c['model']} {c['seq_len'] // 1024}k" for c in cases] + ["geomean"]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels) + 2), 4))
    colors = {"megatron": "#55A868", "torchtitan": "#DD8452", "executor": "#4C72B0"}
    for k, t in enumerate(order):
        ys = [c[f"{t}_speedup"] or 0 for c in cases] + [means[t]]
        ax.bar([x + (k - 1) * 0.27 for x in range(len(labels))], ys, width=0.27, label=t, color=colors[t])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(range(len(labels))))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("speedup over the Megatron baseline")
    ax.set_title("Each deployment target's best plan")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "targets.png", dpi=110)
    plt.close(fig)
    return means


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(PAPER_MODELS))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--budget", default="400", help="per target search: simulator calls or seconds (30s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write targets.md/.jsonl/.png here")
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args(argv)
    budget = Budget.parse(args.budget)
    cases = []
    for family in args.families.split(","):
        for size in args.sizes.split(","):
            for seq in (int(x) for x in args.seq_lens.split(",")):
                c = run_case(f"{family}-{size}", SIZES[size], seq, gpu=args.gpu, microbatches=args.microbatches,
                             budget=budget, seed=args.seed)
                cases.append(c)
                if args.json:
                    print(json.dumps(c), flush=True)
                else:
                    print(f"{c['model']:<17} {seq:>5} {c['devices']:>2} dev  " + "  ".join(
                        f"{t} {c[f'{t}_speedup']:.3f}x" if c[f"{t}_speedup"] else f"{t} n/a" for t in TARGETS),
                        file=sys.stdout, flush=True)
    command = "python -m experiments.benchmarks.deploy_targets " + " ".join(argv if argv is not None else sys.argv[1:])
    means = {t: _geomean([c[f"{t}_speedup"] for c in cases if c[f"{t}_speedup"]]) for t in TARGETS}
    if args.out:
        means = write_outputs(Path(args.out), cases, command.strip())
    if not args.json:
        print("geometric mean speedup over Megatron: " + ", ".join(f"{t} {means[t]:.3f}x" for t in TARGETS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
