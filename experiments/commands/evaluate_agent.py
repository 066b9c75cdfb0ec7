"""Compare the RL policy (40 calls, zero-shot), rl+tuner and the AdaPtis tuner on held-out scenarios.

The scenarios are ones the shipped policy never trained on: by default the zoo's held-out models
(--models heldout: the Nemotron-H hybrids, a family left out of training, and gemma-large and
deepseek-large, deeper than any training model) on --devices, plus --heldout N synthetic
scenarios drawn from env.scenarios.HELDOUT_SCENARIO (the hybrid-mamba family at 56-96 blocks,
2-32 devices, 8-256 micro-batches, tight memory, multi-node links, mixed speeds).

Methods: rl (the ranker's starts and the edit policy, at most 40 calls), rl-random (random
allowed edits from the same starts with the same calls: what the edit policy must beat),
no-learning (random edits from the hand-written starts: neither learned part), rl-zero
(zero-shot: the ranker's top 4 recipes and a greedy edit, at most 5 calls), rl+tuner (the
policy proposes and the tuner refines from its plans and the ranker's recipes instead of its own
seeds, run with the tuner's own wall time as its budget when adaptis runs too) and adaptis (the
tuner, --budget calls), random, rl-index-order (rl without the slow-first twins of its
starts on mixed device speeds: what ordering devices by speed buys the policy) and adaptis@N
(the tuner with N calls: what more search time buys the tuner itself, the yardstick for
rl+tuner's wins), adaptis-no-named (the tuner without its named-schedule phase, built in Python,
at the tuner's own wall time like rl+tuner, which skips that phase too: what rl+tuner's policy
adds beyond the time that saves), learned (the tuner with learned guidance of its start order and
its moves, --budget calls: agents.tuner.learned, agents.tuner.start_prior) and learned-random-w (the same with
priors of random weights, --budget calls: what the trained weights add).
quality = tuner's iteration time / method's (feasible plans; 1.0 = as fast, above 1.0 faster).
With --repeats N every search runs N times per scenario and each method's median run is kept
(wall-time budgets make rl+tuner's result vary with the machine's load).
--budget may list several budgets ('300,1000,3000', '0.25s,1s'): every method runs at each, and
OUT/anytime.png plots quality against wall time (each run's best plan so far, from the
[calls, seconds, best_time] history every row carries, and each budget's final plans).
Writes OUT/results.jsonl, OUT/summary.json, OUT/quality.png, OUT/anytime.png and, given --train-dir,
OUT/learning_curve.png from that run's eval.jsonl. Logs the table and figures to W&B (offline by
default).

Examples:
  python -m experiments evaluate-agent --heldout 12                      # held-out zoo models + 12 draws
  python -m experiments evaluate-agent --models none --heldout 24 --mixed-speeds --heldout-seed 50000 \
      --methods rl,rl-index-order,rl-zero,adaptis                        # what ordering devices by speed buys
  python -m experiments evaluate-agent --models gemma-small --devices 4 --budget 100 --policy runs/t/policy.pth
  python -m experiments evaluate-agent --heldout 12 --methods adaptis,adaptis@800,adaptis@1600,rl+tuner
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.run_methods import Interrupted
from experiments.common import (
    add_output_args,
    add_runtime_arg,
    check_microbatches,
    interrupted,
    non_negative_int,
    output_folder,
    positive_int,
    print_json_lines,
    print_table,
    resolve_training,
    seed_int,
)
from pipeline.errors import ConfigError

NAME = "evaluate-agent"
HELP = "compare the RL policy with the tuner on held-out scenarios (quality, calls, wall time)"
COLUMNS = ("scenario", "devices", "mb", "method", "iteration_time", "feasible", "quality", "tuner_vs_bound",
           "sim_calls", "seconds", "note")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help="policy file (default: the shipped policy)")
    parser.add_argument("--ranker", default=None, help="start ranker file (default: the shipped one)")
    parser.add_argument("--heldout-seed", type=seed_int, default=20_000,
                        help="seed of the first synthetic held-out draw (20000; another range gives fresh scenarios)")
    parser.add_argument("--models", default="heldout",
                        help="comma-separated zoo models, 'heldout' (models training never saw), 'all' or 'none'")
    parser.add_argument("--hf-config", action="append", default=[], help="extra HF config.json files")
    parser.add_argument("--devices", default="8,16", help="comma-separated device counts for the zoo models")
    parser.add_argument("--microbatches", type=positive_int, default=32)
    parser.add_argument("--heldout", type=non_negative_int, default=0,
                        help="synthetic held-out scenarios to draw as well")
    parser.add_argument("--mixed-speeds", action="store_true",
                        help="draw every synthetic held-out scenario on devices of mixed speeds (default: a quarter)")
    parser.add_argument("--gpu", default="h100")
    add_runtime_arg(parser)
    parser.add_argument("--budget", default="400",
                        help="simulator calls of the tuner, random and learned ('400'), or seconds ('1s'); several, "
                             "comma-separated ('300,1000,3000' or '0.25s,1s'), run every method at each and plot "
                             "quality against wall time (OUT/anytime.png)")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="cap in seconds per search, besides its simulator-call budget")
    parser.add_argument("--methods", default="rl,rl-random,no-learning,rl-zero,adaptis,rl+tuner")
    parser.add_argument("--samples", type=positive_int, default=4, help="K: sampled rollouts of the policy (method rl)")
    parser.add_argument("--rl-tuner-order", choices=("tuner-first", "policy-first"), default=None,
                        help="rl+tuner's order (default: RLTunerSearcher's)")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="run every search this many times per scenario and keep each method's median run "
                             "(the slower middle one for an even count): wall-time budgets are noisy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-dir", default=None, help="a training run's folder: plot its learning curve")
    parser.add_argument("--out", default="runs/evaluate-agent")
    add_output_args(parser)


def _scenarios(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(name, Scenario) of every held-out scenario the arguments ask for."""
    import numpy as np

    from env.scenarios import HELDOUT_MIXED_SPEEDS, HELDOUT_SCENARIO, sample_scenario
    from pipeline.candidates import Scenario
    from pipeline.costs import profile_from_architecture
    from pipeline.hardware import build_cluster
    from pipeline.hf import load_hf_config
    from pipeline.zoo import list_models, zoo_profile

    if args.models == "heldout":
        names = list(HELDOUT_SCENARIO.zoo_models)
    elif args.models == "all":
        names = [m for m in list_models() if m != "tiny-hybrid"]
    elif args.models == "none":
        names = []
    else:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
    profiles = [(name, zoo_profile(name, gpu=args.gpu)) for name in names]
    for path in args.hf_config:
        profiles.append((Path(path).stem, profile_from_architecture(load_hf_config(path), gpu=args.gpu)))
    devices = _device_counts(args.devices)
    check_microbatches(args.microbatches, max(devices, default=1))
    out = [(name, Scenario(prof, build_cluster(args.gpu, devices=P), args.microbatches))
           for name, prof in profiles for P in devices if prof.num_layers >= P]
    config = HELDOUT_MIXED_SPEEDS if args.mixed_speeds else HELDOUT_SCENARIO
    for i in range(args.heldout):
        p = sample_scenario(np.random.default_rng(args.heldout_seed + i), config)
        out.append((f"{p.profile.name}#{i}", p))
    training = resolve_training(args)  # every method and yardstick priced on the same runtime
    return [(name, replace(p, training=training)) for name, p in out]


def _device_counts(text: str) -> list[int]:
    """``"8,16"`` -> [8, 16]; anything but whole numbers >= 1 is one error naming --devices."""
    try:
        counts = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        counts = [0]
    if not counts or min(counts) < 1:
        raise ConfigError(f"expected comma-separated whole numbers >= 1 (e.g. 8,16), got {text!r}", field="--devices")
    return counts


def _tuner_calls(method: str) -> int | None:
    """N of an ``adaptis@N`` method (the tuner with N simulator calls), None for other methods."""
    if not method.startswith("adaptis@"):
        return None
    calls = method.removeprefix("adaptis@")
    if not calls.isdigit() or int(calls) < 1:
        raise ConfigError(f"method {method!r}: write adaptis@N with N a positive number of simulator calls, "
                          "e.g. adaptis@800", field="--methods")
    return int(calls)


def _searcher(method: str) -> Any:
    """The searcher of ``method``: a registry name or one of this command's variants."""
    from agents.registry import make_searcher
    from agents.rl.searchers import RLSearcher

    if _tuner_calls(method) is not None:
        return make_searcher("adaptis")
    if method == "learned-random-w":  # learned with a prior of random weights: what the trained weights add
        from agents.tuner.learned import random_prior_tuner

        return random_prior_tuner(name="learned-random-w")
    if method == "adaptis-no-named":
        from agents.tuner import AdaptisTuner

        return AdaptisTuner(name="adaptis-no-named", named_plans=False)
    if method == "rl-zero":
        searcher = RLSearcher(name="rl-zero", zero_shot=True)
    elif method == "rl-random":
        searcher = RLSearcher(name="rl-random", random_edits=True)
    elif method == "rl-index-order":  # rl without the devices-by-speed twins of its starts
        searcher = RLSearcher(name="rl-index-order", speed_twins=False)
    elif method == "no-learning":  # random edits from the hand-written starts: neither learned part
        return RLSearcher(name="no-learning", random_edits=True, ranker_path="none")
    else:
        searcher = make_searcher(method)
    return searcher


def _settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The searchers' settings from the command line (:func:`agents.run_methods.configure`)."""
    out: dict[str, dict[str, Any]] = {m: {"samples": args.samples} for m in ("rl", "rl-index-order")}
    if args.rl_tuner_order:
        out["rl+tuner"] = {"order": args.rl_tuner_order}
    return out


def run(args: argparse.Namespace) -> int:
    from experiments.anytime import anytime_figure, parse_budgets
    from experiments.tracking.hooks import tracked_run

    out = output_folder(args.out, command=NAME, inputs=args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        _tuner_calls(m)  # a malformed adaptis@N fails before any search
    # The tuner runs before rl+tuner (and adaptis-no-named), which then get the tuner's own wall time.
    timed = ("rl+tuner", "adaptis-no-named")
    methods.sort(key=lambda m: m in timed)
    budgets = parse_budgets(args.budget, max_seconds=args.max_seconds)
    rows: list[dict[str, Any]] = []
    scenarios = _scenarios(args)
    try:
        for label, budget in budgets:
            _evaluate(scenarios, methods, timed, budget, args, rows, out / "results.jsonl", label=label)
    except (KeyboardInterrupt, SystemExit, Interrupted) as stop:  # Ctrl-C, or SIGTERM (SystemExit: experiments.cli)
        return interrupted(stop, _keep_finished(out, rows, methods, len(scenarios)))
    summary = _summary_of(rows, methods, [label for label, _ in budgets])
    with open(out / "results.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    last = budgets[-1][0]
    figures = {"quality": _quality_figure([r for r in rows if r["budget"] == last], methods, out / "quality.png"),
               "anytime": anytime_figure(rows, methods, out / "anytime.png")}
    if args.train_dir:
        from experiments.commands.train import learning_curve

        figures["learning_curve"] = learning_curve(Path(args.train_dir) / "eval.jsonl", out / "learning_curve.png")
    config = {"methods": methods, "budget": args.budget, "policy": args.policy or "default", "repeats": args.repeats}
    flat = summary if len(budgets) == 1 else {f"{b}/{m}": s for b, per in summary.items() for m, s in per.items()}
    with tracked_run(args, command=NAME, config=config) as tracker:
        tracker.log_table("evaluate_agent", [{k: v for k, v in r.items() if k != "history"} for r in rows])
        tracker.summary({f"{m}/{k}": v for m, s in flat.items() for k, v in s.items() if v is not None})
        for key, png in figures.items():
            if png is not None:
                tracker.log_image(key, png)
    if args.json:
        print_json_lines(rows)
    else:
        print_table(rows, COLUMNS, title=f"quality = tuner's iteration time / method's at the same budget (feasible "
                    f"plans; budget {args.budget}; rl+tuner and adaptis-no-named get the tuner's wall time)")
        for label, _ in budgets:
            print()
            per = summary if len(budgets) == 1 else summary[label]
            print_table([{"budget": label, "method": m, **s} for m, s in per.items()],
                        ("budget", "method", "geomean_quality", "min_quality", "feasible", "wins", "ties", "losses",
                         "wins_where_tuner_gap_over_1pct", "mean_calls", "mean_seconds"))
    return 0


def _keep_finished(out: Path, rows: list[dict[str, Any]], methods: list[str], total: int) -> str:
    """Write the finished scenarios' rows (OUT/results.jsonl) and their summary (OUT/summary.json);
    what was kept and where, for the line an interrupted evaluation ends with."""
    if not rows:
        return f"no scenario of {total} had finished; nothing written to {out}"
    with open(out / "results.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    labels = list(dict.fromkeys(r["budget"] for r in rows))
    (out / "summary.json").write_text(json.dumps(_summary_of(rows, methods, labels), indent=1) + "\n")
    done = len(dict.fromkeys((r["scenario"], r["devices"]) for r in rows))
    return (f"kept the rows of {done} finished scenario{'s' if done > 1 else ''} of {total} in {out / 'results.jsonl'} "
            f"and their summary in {out / 'summary.json'}")


def _evaluate(scenarios: list[tuple[str, Any]], methods: list[str], timed: tuple[str, ...], budget: Any,
              args: argparse.Namespace, rows: list[dict[str, Any]], log: Path, *, label: str) -> None:
    """Search every scenario with every method at ``budget`` (named ``label`` in the rows), appending each
    finished scenario's rows to ``rows`` and to the file ``log`` (so a killed evaluation keeps them too)."""
    from tqdm import tqdm

    from agents.base import Budget
    from agents.run_methods import run_methods
    from experiments.results import MethodRow
    from pipeline.bounds import lower_bound

    def spend(m: str, done: Sequence[Any]) -> Budget:
        calls = _tuner_calls(m)
        if calls is not None:  # adaptis@N: N calls at every budget
            return Budget(calls, args.max_seconds)
        ran = methods[:len(done)]  # by method name: adaptis@N's results are named adaptis too
        if m in timed and "adaptis" in ran:  # the tuner's wall time in this repeat
            return Budget(sim_calls=None, seconds=done[ran.index("adaptis")].seconds)
        return budget

    settings = _settings(args)
    for name, scenario in tqdm(scenarios, desc=f"evaluate-agent {label}", unit="scenario", file=sys.stderr,
                               disable=None):
        runs: dict[str, list] = {m: [] for m in methods}
        for _ in range(args.repeats):
            done = run_methods(scenario, methods, budget=spend, seed=args.seed, settings=settings, policy=args.policy,
                               ranker=args.ranker, make=_searcher)
            for m, r in zip(methods, done):
                runs[m].append(r)
        results = {m: _median_run(rs) for m, rs in runs.items()}
        ref = results.get("adaptis")
        bound = lower_bound(scenario.profile, scenario.cluster, scenario.microbatches).value
        scenario_rows = []
        for m, r in results.items():
            row = {"scenario": name, "devices": scenario.devices, "mb": scenario.microbatches, "budget": label,
                   **MethodRow.of(r, None, bound).as_dict(), "method": m}
            skipped = r.result is None and r.note.startswith("skipped")  # e.g. rl past its device limit
            if ref is not None and ref.feasible:
                row["tuner_vs_bound"] = round(ref.iteration_time / bound, 4)
                # a skipped method has no quality (it is no loss to the tuner: it did not run)
                row["quality"] = None if skipped else ref.iteration_time / r.iteration_time if r.feasible else 0.0
            scenario_rows.append(row)
        rows.extend(scenario_rows)  # whole scenarios only: an interruption keeps no half of one
        with open(log, "a" if len(rows) > len(scenario_rows) else "w") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in scenario_rows)


def _median_run(runs: list) -> Any:
    """The median of a method's runs on one scenario by iteration time (infeasible last; the
    slower of the middle two for an even count)."""
    return sorted(runs, key=lambda r: r.iteration_time if r.feasible else math.inf)[len(runs) // 2]


def _summary_of(rows: list[dict[str, Any]], methods: list[str], labels: list[str]) -> dict[str, Any]:
    """:func:`_summarise` of the rows; with several budgets, one per budget label."""
    if len(labels) == 1:
        return _summarise(rows, methods)
    return {b: _summarise([r for r in rows if r["budget"] == b], methods) for b in labels}


def _summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method: geometric-mean and worst quality, feasible plans, wins/ties/losses against the
    tuner (0.5% either way), wins where the tuner is more than 1% above the lower bound."""
    out = {}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        q = [r["quality"] for r in mine if r.get("quality") is not None]
        gap = [r for r in mine if r.get("quality") is not None and r["tuner_vs_bound"] > 1.01]
        out[m] = {
            "geomean_quality": math.exp(sum(math.log(max(x, 1e-3)) for x in q) / len(q)) if q else None,
            "min_quality": min(q) if q else None,
            "feasible": sum(r["feasible"] for r in mine),
            "wins": sum(x >= 1.005 for x in q), "ties": sum(0.995 < x < 1.005 for x in q),
            "losses": sum(x <= 0.995 for x in q),
            "wins_where_tuner_gap_over_1pct": f"{sum(r['quality'] >= 1.005 for r in gap)}/{len(gap)}",
            "mean_calls": sum(r["sim_calls"] for r in mine) / max(1, len(mine)),
            "mean_seconds": sum(r["seconds"] for r in mine) / max(1, len(mine)),
        }
    return out


def _quality_figure(rows: list[dict[str, Any]], methods: list[str], png: Path) -> Path | None:
    """Per-scenario quality of every method against the tuner (the must-show figure)."""
    shown = [m for m in methods if m != "adaptis"]
    scen = list(dict.fromkeys((r["scenario"], r["devices"]) for r in rows if r.get("quality") is not None))
    if not scen or not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = {(r["scenario"], r["devices"], r["method"]): r.get("quality") for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(scen) * len(shown) / 2), 3.6))
    width = 0.8 / len(shown)
    for k, m in enumerate(shown):
        ys = [q.get((s, d, m)) or 0.0 for s, d in scen]
        ax.bar([i + k * width for i in range(len(scen))], ys, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(min(0.9, min((r.get("quality") or 1.0) for r in rows if r["method"] in shown) - 0.01), None)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scen))])
    ax.set_xticklabels([f"{s}/{d}" for s, d in scen], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("throughput / tuner's")
    ax.set_title("held-out scenarios: quality against the tuner")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
