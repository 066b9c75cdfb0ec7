"""The paper's grid in simulation: Gemma, DeepSeek-style and Nemotron-H-style models, small /
medium / large on 4 / 8 / 16 devices, 2k and 4k sequence length, every baseline and the tuner.

Writes OUT/reproduce.md (a table with our speedups over the Megatron baseline beside the paper's
reported ones), OUT/reproduce.jsonl (every method of every case) and OUT/reproduce.png (a bar
chart). The paper reports 1.42x mean and 2.14x max over Megatron-LM's interleaved 1F1B.

With ``--granularity sublayer`` and/or ``--head-shards K|auto`` it also searches the richer plan
space (blocks cut between mixer and MLP/MoE, the head cut into K units over the tokens, per-stage
recomputation) with the tuner, and prints its result and its ceiling beside the whole-layer ones.

Example:
  python -m experiments reproduce                       # the full grid, ~5 minutes
  python -m experiments reproduce --families gemma --sizes small --seq-lens 2048 --budget 100
  python -m experiments reproduce --granularity sublayer --head-shards auto --methods megatron,adaptis
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from agents.base import DEFAULT_CALLS, Budget
from agents.run_methods import Interrupted, run_methods, with_baseline
from experiments.common import check_microbatches, interrupted, non_negative_float, output_folder, positive_int
from experiments.tracking.hooks import tracked_run
from pipeline.bounds import lower_bound
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError
from pipeline.hardware import build_cluster
from pipeline.runtime import RUNTIMES
from pipeline.spec import TrainingConfig
from pipeline.zoo import PAPER_MODELS, PAPER_SIZES, auto_head_shards, zoo_profile

NAME = "reproduce"
HELP = "run the paper's grid (3 families x 3 sizes x 2 sequence lengths) and compare with its figures"

SIZES = PAPER_SIZES
#: AdaPtis speedups over I-1F1B from the authors' published plotting data: (family, seq) -> small/medium/large.
PAPER = {
    ("gemma", 2048): (1.16, 1.33, 1.43), ("gemma", 4096): (1.20, 1.37, 1.68),
    ("deepseek", 2048): (1.27, 1.39, 1.42), ("deepseek", 4096): (1.26, 1.31, 1.45),
    ("nemotronh", 2048): (1.25, 1.59, 1.68), ("nemotronh", 4096): (1.38, 1.64, 1.75),
}
DEFAULT_METHODS = ("megatron", "i1f1b-v2", "1f1b", "zb-h1", "zb-h2", "zbv", "v-half", "v-min", "dualpipev",
                   "zb-h1+dp", "zbv+dp", "adaptis")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--families", default=",".join(PAPER_MODELS), help="comma-separated model families")
    parser.add_argument("--sizes", default=",".join(SIZES), help="small (4 devices), medium (8), large (16)")
    parser.add_argument("--seq-lens", default="2048,4096", help="comma-separated sequence lengths")
    parser.add_argument("--gpu", default="h100", help="GPU preset for the analytic costs")
    parser.add_argument("--microbatches", type=positive_int, default=64)
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="methods besides the Megatron baseline")
    parser.add_argument("--budget", default=str(DEFAULT_CALLS),
                        help=f"tuner budget per case: simulator calls ({DEFAULT_CALLS}) or seconds (30s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--granularity", choices=("layer", "sublayer"), default="layer",
                        help="also search plans over blocks cut between mixer and MLP/MoE (sublayer)")
    parser.add_argument("--head-shards", default="1", metavar="K|auto",
                        help="also search plans with the head cut into K units over the tokens; auto: the head "
                             "in units no heavier than the heaviest other unit (at most 16)")
    parser.add_argument("--runtime", choices=tuple(RUNTIMES), default="ideal",
                        help="runtime model every plan and the baseline are predicted on (pipeline.runtime; "
                             "default ideal: the performance model alone)")
    parser.add_argument("--prove", type=non_negative_float, default=0.0, metavar="SECONDS",
                        help="also prove the tuner's plan of each case for this long (pipeline.exact: the best order "
                             "of its partition and placement and a lower bound on every order) and add the proven "
                             "gap (default 0: off; see docs/prove.md)")
    parser.add_argument("--out", default="docs/results", help="folder for reproduce.md/.jsonl/.png")
    parser.add_argument("--wandb-project", default="adaptis")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _head_shards(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"expected a whole number >= 1 or 'auto', got {text!r}", field="--head-shards")
    return value


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run(args: argparse.Namespace) -> int:
    families = _split(args.families)
    sizes = _split(args.sizes)
    for f in families:
        if f not in PAPER_MODELS:
            raise ConfigError(f"unknown family {f!r}; use {', '.join(PAPER_MODELS)}", field="--families")
    for s in sizes:
        if s not in SIZES:
            raise ConfigError(f"unknown size {s!r}; use {', '.join(SIZES)}", field="--sizes")
    try:
        seq_lens = [int(x) for x in _split(args.seq_lens)]
        budget = Budget.parse(args.budget)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--seq-lens/--budget") from None
    shards = _head_shards(args.head_shards)
    richer = args.granularity != "layer" or shards != 1
    methods = with_baseline(_split(args.methods))
    for s in sizes:
        check_microbatches(args.microbatches, SIZES[s])
    out = output_folder(args.out, command=NAME, inputs=args)
    cases = [(f, s, q) for f in families for s in sizes for q in seq_lens]
    from tqdm import tqdm

    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    bar = tqdm(cases, desc="reproduce", unit="case", file=sys.stderr, disable=None)
    rows_file = out / "reproduce.jsonl"
    rows_file.write_text("")  # each case's rows are added as it ends: an interrupted run keeps them
    try:
        for family, size, seq in bar:
            first = len(rows)
            devices = SIZES[size]
            model = f"{family}-{size}"
            bar.set_postfix_str(f"{model} {seq}")
            profile = zoo_profile(model, gpu=args.gpu, seq_len=seq)
            cluster = build_cluster(args.gpu, devices=devices, gpus_per_node=8)
            training = TrainingConfig(runtime=args.runtime)
            scenario = Scenario(profile, cluster, args.microbatches, training)
            bound = lower_bound(profile, cluster, args.microbatches, runtime=args.runtime).value
            results = dict(zip(methods, run_methods(scenario, methods, budget=budget, seed=args.seed)))
            mega = results["megatron"]
            rich: dict[str, Any] = {}
            if richer:
                k = shards if isinstance(shards, int) else auto_head_shards(
                    zoo_profile(model, gpu=args.gpu, seq_len=seq, granularity=args.granularity))
                fine = zoo_profile(model, gpu=args.gpu, seq_len=seq, granularity=args.granularity, head_shards=k)
                # the richer space holds the whole-layer plans too (blocks kept together), but a head
                # cut into shards costs a little more than the whole head: bound the union by the lower
                fine_bound = min(bound, lower_bound(fine, cluster, args.microbatches, runtime=args.runtime).value)
                found, = run_methods(Scenario(fine, cluster, args.microbatches, training), ["adaptis"],
                                     budget=budget, seed=args.seed)
                ok = found.ok and found.result.feasible and mega.ok
                rows.append({"model": model, "seq_len": seq, "devices": devices, "method": "adaptis-richer",
                             "granularity": args.granularity, "head_shards": k,
                             "iteration_time": found.iteration_time if found.ok else None, "feasible": bool(ok),
                             "speedup": mega.iteration_time / found.iteration_time if ok else None,
                             "vs_lower_bound": found.iteration_time / fine_bound if found.ok else None,
                             "sim_calls": found.sim_calls, "seconds": round(found.seconds, 3),
                             "recompute": bool(found.plan and found.plan.recompute)})
                rich = {"richer": found.iteration_time if ok else None,
                        "richer_speedup": mega.iteration_time / found.iteration_time if ok else None,
                        "richer_ceiling": mega.iteration_time / fine_bound if mega.ok else None,
                        "head_shards": k, "richer_recompute": bool(found.plan and found.plan.recompute)}
            for m, r in results.items():
                rows.append({"model": model, "seq_len": seq, "devices": devices, "method": m,
                             "iteration_time": r.iteration_time if r.ok else None,
                             "feasible": bool(r.ok and r.result.feasible),
                             "speedup": mega.iteration_time / r.iteration_time if r.ok and mega.ok else None,
                             "vs_lower_bound": r.iteration_time / bound if r.ok else None,
                             "sim_calls": r.sim_calls, "seconds": round(r.seconds, 3),
                             "chunks": (r.plan.meta.get("chunks") if r.plan else None)})
            baselines = [r for m, r in results.items() if m != "adaptis" and r.ok and r.result.feasible]
            best_base = min(baselines, key=lambda r: r.iteration_time) if baselines else None
            tuned = results.get("adaptis")
            proven: dict[str, Any] = {}
            if args.prove > 0 and tuned is not None and tuned.feasible:
                from pipeline.exact import prove

                proof = prove(tuned.plan, profile, cluster, training=training, seconds=args.prove)
                proven = {"proven_best": proof.best_time, "proven_bound": proof.bound, "proven_gap": proof.gap,
                          "tuner_vs_best": proof.plan_time / proof.best_time - 1, "proven_status": proof.status}
            summary.append({
                "model": model, "seq_len": seq, "devices": devices,
                "megatron": mega.iteration_time, "megatron_chunks": mega.plan.meta.get("chunks") if mega.plan else None,
                "best_baseline": best_base.method if best_base else None,
                "best_baseline_speedup": mega.iteration_time / best_base.iteration_time if best_base else None,
                "adaptis": tuned.iteration_time if tuned and tuned.ok else None,
                "speedup": mega.iteration_time / tuned.iteration_time if tuned and tuned.ok else None,
                "speedup_vs_v2": (results["i1f1b-v2"].iteration_time / tuned.iteration_time
                                  if tuned and tuned.ok and "i1f1b-v2" in results and results["i1f1b-v2"].ok else None),
                "vs_lower_bound": tuned.iteration_time / bound if tuned and tuned.ok else None,
                "ceiling": mega.iteration_time / bound if mega.ok else None,
                "paper": PAPER[(family, seq)][list(SIZES).index(size)] if (family, seq) in PAPER else None,
                "tuner_seconds": round(tuned.seconds, 2) if tuned else None,
                **rich, **proven,
            })
            with open(rows_file, "a") as fh:
                fh.writelines(json.dumps(row) + "\n" for row in rows[first:])
    except (KeyboardInterrupt, SystemExit, Interrupted) as caught:  # Ctrl-C, or SIGTERM (made SystemExit)
        stop = caught.stop if isinstance(caught, Interrupted) else caught  # mid-case: that case is not kept
        bar.close()
        if not summary:
            return interrupted(stop, f"no case of {len(cases)} had finished; {rows_file} is empty")
        _write_markdown(out / "reproduce.md", summary, args)
        return interrupted(stop, f"kept the rows of {len(summary)} finished case{'s' if len(summary) > 1 else ''} of "
                           f"{len(cases)} in {rows_file} and their table in {out / 'reproduce.md'}")
    bar.close()
    _write_markdown(out / "reproduce.md", summary, args)
    _bar_chart(out / "reproduce.png", summary)
    speedups = [s["speedup"] for s in summary if s["speedup"]]
    papers = [s["paper"] for s in summary if s["paper"]]
    with tracked_run(args, command=NAME, config={"cases": len(cases), "methods": methods}) as tracker:
        tracker.log_table("reproduce", summary)
        tracker.log_image("speedups", out / "reproduce.png")
        tracker.summary({"geomean_speedup": _geomean(speedups), "max_speedup": max(speedups, default=None),
                         "geomean_ceiling": _geomean([s["ceiling"] for s in summary if s["ceiling"]])})
    print((out / "reproduce.md").read_text())
    ceilings = [s["ceiling"] for s in summary if s["ceiling"]]
    print(f"geometric-mean speedup over megatron: {_geomean(speedups):.3f}x (paper {_geomean(papers):.2f}x on "
          f"the same cases), max {max(speedups, default=float('nan')):.3f}x; ceiling (megatron / lower bound) "
          f"{_geomean(ceilings):.3f}x")
    if richer:
        rs = [s["richer_speedup"] for s in summary if s.get("richer_speedup")]
        rc = [s["richer_ceiling"] for s in summary if s.get("richer_ceiling")]
        print(f"richer plan space (granularity {args.granularity}, head shards {args.head_shards}, recompute): "
              f"geometric-mean speedup {_geomean(rs):.3f}x, max {max(rs, default=float('nan')):.3f}x; ceiling "
              f"{_geomean(rc):.3f}x")
    return 0


def _usable_gib(gpu: str) -> str:
    cluster = build_cluster(gpu, devices=1)
    return (f"{cluster.memory_gb:g} GiB per device less a {cluster.memory_reserve_gb:g} GiB reserve, "
            f"{cluster.memory_gb - cluster.memory_reserve_gb:g} GiB usable")


def _write_markdown(path: Path, summary: list[dict[str, Any]], args: argparse.Namespace) -> None:
    def f(x: Any, nd: int = 2) -> str:
        return "—" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    speedups = [s["speedup"] for s in summary if s["speedup"]]
    papers = [s["paper"] for s in summary if s["paper"]]
    bounds = [s["vs_lower_bound"] for s in summary if s["vs_lower_bound"]]
    over_v2 = [s["speedup_vs_v2"] for s in summary if s["speedup_vs_v2"]]
    ceilings = [s["ceiling"] for s in summary if s.get("ceiling")]
    lines = [
        "# The paper's grid in simulation",
        "",
        f"Command: `python -m experiments reproduce --budget {args.budget} --microbatches {args.microbatches} "
        f"--gpu {args.gpu} --seed {args.seed}" + (f" --runtime {args.runtime}" if args.runtime != "ideal" else "")
        + f"` (analytic {args.gpu.upper()} costs, {args.microbatches} "
        f"micro-batches, {_usable_gib(args.gpu)}, runtime model `{args.runtime}`: see docs/fidelity.md). Speedups "
        "are over the Megatron baseline: interleaved 1F1B at "
        "Megatron's even split and its **best** chunk count (1-8). Times in ms per iteration.",
        "",
        "| model | seq | devices | megatron (v) | best baseline | adaptis | speedup | paper | vs i1f1b-v2 "
        "| vs lower bound | ceiling | tuner s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['model']} | {s['seq_len']} | {s['devices']} | {f(s['megatron'], 1)} ({s['megatron_chunks']}) | "
            f"{s['best_baseline']} {f(s['best_baseline_speedup'])}x | {f(s['adaptis'], 1)} | "
            f"**{f(s['speedup'])}x** | {f(s['paper'])}x | {f(s['speedup_vs_v2'])}x | {f(s['vs_lower_bound'], 3)} | "
            f"{f(s.get('ceiling'))}x | {f(s['tuner_seconds'])} |")
    if any(s.get("richer_ceiling") for s in summary):
        lines += _richer_table(summary, args)
    if any(s.get("proven_gap") is not None for s in summary):
        lines += _proven_table(summary, args)
    lines += [
        "",
        f"Geometric mean speedup **{_geomean(speedups):.3f}x** (paper on the same cases: {_geomean(papers):.2f}x; "
        f"paper overall: 1.42x mean, 2.14x max); max {max(speedups, default=float('nan')):.3f}x; "
        f"mean distance to the lower bound {sum(bounds) / max(1, len(bounds)):.3f}x, worst "
        f"{max(bounds, default=float('nan')):.3f}x."
        + (f" Over Megatron at 2 chunks (`i1f1b-v2`, what most users run, likely closer to the paper's baseline): "
           f"geometric mean {_geomean(over_v2):.3f}x, max {max(over_v2):.3f}x." if over_v2 else ""),
        "",
        f"**Ceiling.** The lower bound (`pipeline/bounds.py`: the packing bound, whole layers spread over the "
        f"devices in the best possible way, and the critical-layer bound, a layer's device waiting for the "
        f"forward chain before it) holds for every plan in our space, so no plan can beat Megatron by more than "
        f"the 'ceiling' column: geometric mean **{_geomean(ceilings):.3f}x** on these cases. The tuner reaches "
        f"{_geomean(speedups) / _geomean(ceilings):.1%} of it."
        + (" The paper's 1.42x mean over this (best-chunk) baseline is therefore out of reach for any plan on "
           "this grid: a bound, not a search failure." if _geomean(ceilings) < 1.42 else ""),
        "",
        "## Where ours differ from the paper, and why",
        "",
        "- Our figures are simulated with analytic costs (docs/cost-model.md), not measured on GPUs; the "
        "paper measures real runs. Communication is overlapped and contention-free in our model.",
        "- Our Megatron baseline is stronger than the paper's: it takes the best of 1-8 chunks and allows uneven "
        "splits, so speedups over it are conservative.",
        "- The zoo configs approximate the paper's models (same hidden sizes, vocabularies and depths; our own "
        "choices of MoE and hybrid patterns, see experiments/configs/models/).",
        "- Most of the gain over Megatron comes from the cost-balanced partition: the best named schedule "
        "with the DP split (`+dp`, the 'best baseline' column) is within a few percent of the tuner. The "
        "tuner adds placement and schedule changes on top; where it ties a `+dp` baseline, that baseline "
        "was its best starting point.",
    ]
    path.write_text("\n".join(lines) + "\n")


def _proven_table(summary: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The tuner's plans proven (``--prove``): best order found, proven bound, gap, per case."""
    lines = ["", f"## Proven gaps (`--prove {args.prove:g}`: docs/prove.md)", "",
             "For the tuner's partition and placement: the best order found (simulated), a lower bound on every "
             "order of its actions, the gap (best / bound - 1) and how far the tuner's own order was from the best.",
             "", "| model | seq | adaptis | best order | bound | gap | tuner vs best | solver |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s.get("proven_gap") is None:
            continue
        lines.append(f"| {s['model']} | {s['seq_len']} | {s['adaptis']:.1f} | {s['proven_best']:.1f} | "
                     f"{s['proven_bound']:.1f} | {100 * s['proven_gap']:.2f}% | {100 * s['tuner_vs_best']:.2f}% | "
                     f"{s['proven_status']} |")
    return lines


def _richer_table(summary: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Whole-layer against richer plans: results and ceilings, case by case."""
    def f(x: Any) -> str:
        return "—" if x is None else f"{x:.2f}"

    lines = [
        "",
        f"## Richer plan space: granularity `{args.granularity}`, head shards `{args.head_shards}`, recompute",
        "",
        "Speedups over the same Megatron baseline (whole layers). Ceiling = Megatron / the lower bound of "
        "that plan space (richer: the lower of the finer units' bound and the whole-layer one, since the "
        "richer space also holds the whole-layer plans). 'richer' is the tuner on the finer units, with "
        "per-stage recomputation available.",
        "",
        "| model | seq | devices | paper | whole-layer | whole-layer ceiling | richer | richer ceiling "
        "| head shards | recompute |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(f"| {s['model']} | {s['seq_len']} | {s['devices']} | {f(s['paper'])}x | {f(s['speedup'])}x | "
                     f"{f(s.get('ceiling'))}x | **{f(s.get('richer_speedup'))}x** | {f(s.get('richer_ceiling'))}x | "
                     f"{s.get('head_shards', '—')} | {'yes' if s.get('richer_recompute') else 'no'} |")
    cols = [("paper", "paper"), ("speedup", "whole-layer"), ("ceiling", "whole-layer ceiling"),
            ("richer_speedup", "richer"), ("richer_ceiling", "richer ceiling")]
    means = ", ".join(f"{label} {_geomean([s[k] for s in summary if s.get(k)]):.3f}x" for k, label in cols)
    lines += ["", f"Geometric means: {means}."]
    return lines


def _bar_chart(path: Path, summary: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['model']} {s['seq_len'] // 1024}k" for s in summary]
    ours = [s["speedup"] or 0 for s in summary]
    paper = [s["paper"] or 0 for s in summary]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(labels) + 2), 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], ours, width=0.4, label="ours (simulated)", color="#4C72B0")
    ax.bar([x + 0.2 for x in xs], paper, width=0.4, label="paper (measured)", color="#DD8452")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("speedup over Megatron interleaved 1F1B")
    ax.legend(fontsize=8)
    ax.set_title("AdaPtis grid: speedup over the Megatron baseline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
