"""Train a plan-editing policy in adaptis/Pipeline-v0 (MaskablePPO or PPO), with checkpoints.

Every field of agents.rl.train.PPOConfig is a flag (its docstring is the help below).
Writes OUT/checkpoints/model_<steps>.zip (every --checkpoint-every steps and on Ctrl-C/SIGTERM),
OUT/eval.jsonl (held-out evaluation every --eval-every steps), OUT/learning_curve.png, and the
final OUT/policy.pth + OUT/policy.json (use with: search --method rl --policy OUT/policy.pth).
SB3's metrics and the evaluation curves go to W&B (offline by default). Policy files are
pickles: load only your own or trusted ones.

Examples:
  python -m experiments train --ranker-scenarios 9000 --imitation-states 20000 --timesteps 102400 \\
      --learning-rate 1e-4 --seed 0 --eval-every 51200 --checkpoint-every 51200 --out runs/default-policy
                                                    # the shipped default policy and start ranker
  python -m experiments train --timesteps 20000 --seed 0 --envs 8 --out runs/ppo  # PPO alone (batched envs)
  python -m experiments train --out runs/train --resume                     # after an interruption
  python -m experiments train --gamma 0.99 --batch-size 128 --hidden 128 --out runs/wide  # PPO's knobs
  python -m experiments train --prior moves --seed 0 --out agents/policies   # the shipped move prior
  python -m experiments train --prior starts --seed 0 --out agents/policies  # the shipped start prior
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import (
    add_output_args,
    interrupted,
    non_negative_float,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
    seed_int,
    share,
)
from experiments.dataclass_args import add_dataclass_arguments, dataclass_from_args, int_list
from pipeline.errors import ConfigError

NAME = "train"
HELP = "train an RL policy that edits pipeline plans (MaskablePPO / PPO)"


def _train_seed(text: str) -> int:
    from agents.rl.train import MAX_SEED

    return seed_int(text, most=MAX_SEED)  # environment i gets seed 1000 x seed + i


def _at_most_one(text: str) -> float:
    """Above 0 and at most 1: PPO's step size (beyond 1 the policy's weights blow up to NaN in one
    update) and the discount factor."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text!r}")
    return value


def _width(text: str) -> int:
    """A layer width: a whole number from 1 to :data:`agents.rl.train.MAX_WIDTH`."""
    from agents.rl.train import MAX_WIDTH

    value = positive_int(text)
    if value > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_WIDTH}, got {value}")
    return value


def _widths(text: str) -> list[int]:
    return [_width(str(w)) for w in int_list(text)]


#: Fields whose values are not "a whole number >= 1" / "a positive number" (the types' checks).
PARSERS = {"seed": _train_seed, "eval_every": non_negative_int, "imitation_states": non_negative_int,
           "ranker_scenarios": non_negative_int, "learning_rate": _at_most_one, "gamma": _at_most_one,
           "single_start_share": share, "ent_coef": non_negative_float, "hidden": _width, "net_arch": _widths}
#: ``progress_bar`` is on by default: its switch is ``--no-progress``.
RENAME = {"progress_bar": "progress", "n_envs": "envs"}
#: ``--envs`` was ``--n-envs`` until 6 Dec 2026: the old spelling still parses.
OLD_FLAGS = {"n_envs": "--n-envs"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`agents.rl.train.PPOConfig` field (:mod:`experiments.dataclass_args`)."""
    from agents.rl.train import PPOConfig

    add_dataclass_arguments(parser, PPOConfig, rename=RENAME, parsers=PARSERS, old_flags=OLD_FLAGS)
    # --network's default (entity) is MaskablePPO's; PPO trains the mlp unless --network is given (see run)
    net = next(a for a in parser._actions if a.dest == "network")
    net.__class__ = type("NetworkGiven", (type(net),), {"__call__": _note_network})
    add_prior_arguments(parser)
    add_output_args(parser)


def add_prior_arguments(parser: argparse.ArgumentParser) -> None:
    """``--prior`` and its two settings: the tuner's priors, trained instead of a policy."""
    priors = parser.add_argument_group("the tuner's priors (trained instead of a policy)")
    priors.add_argument("--prior", choices=PRIORS, default=None,
                        help="train the tuner's move prior ('moves': agents.tuner.learned) or start prior ('starts': "
                        "agents.tuner.start_prior) instead of a policy; writes OUT/learned_prior.json or "
                        "OUT/learned_starts.json (--out agents/policies remakes the shipped files)")
    priors.add_argument("--prior-scenarios", type=positive_int, default=None,
                        help="training draws for --prior (default: 40 for moves, 300 for starts)")
    priors.add_argument("--prior-calls", type=positive_int, default=1000,
                        help="simulator calls per draw for --prior moves (default: 1000)")


def _note_network(self, parser, namespace, values, option_string=None) -> None:
    namespace._network_given = True
    setattr(namespace, self.dest, values)


#: ``--prior`` kinds: the file each writes and its default number of training draws.
PRIORS = ("moves", "starts")
PRIOR_FILES = {"moves": ("learned_prior.json", 40), "starts": ("learned_starts.json", 300)}


def train_tuner_prior(args: argparse.Namespace) -> int:
    """``train --prior moves|starts``: fit the tuner's move or start prior and write it under --out."""
    from tqdm import tqdm

    name, default_draws = PRIOR_FILES[args.prior]
    draws = args.prior_scenarios or default_draws
    out = output_folder(args.out) / name
    calls = f" --prior-calls {args.prior_calls}" if args.prior == "moves" else ""
    command = (f"python -m experiments train --prior {args.prior} --prior-scenarios {draws}{calls} "
               f"--seed {args.seed} --out {shlex.quote(str(args.out))}")
    t0 = time.perf_counter()
    try:
        if args.prior == "starts":
            from agents.tuner.start_training import train_start_prior

            with tqdm(total=draws, desc="start phases", unit="scenario", file=sys.stderr,
                      disable=not sys.stderr.isatty()) as bar:
                meta = train_start_prior(scenarios=draws, seed=args.seed, out=out, command=command,
                                         progress=lambda k: bar.update(k - bar.n)).meta
        else:
            from agents.tuner.learned import train_prior

            meta = train_prior(scenarios=draws, calls=args.prior_calls, seed=args.seed, out=out,
                               command=command).meta
    except KeyboardInterrupt as stop:
        return interrupted(stop, f"nothing written to {out} (a prior is written only when it is complete)")
    summary = {**meta, "seconds": round(time.perf_counter() - t0, 1), "out": str(out)}
    print(json.dumps(summary) if args.json else f"done: {args.prior} prior from {draws} draws in "
          f"{summary['seconds']:.0f} s -> {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.prior:
        return train_tuner_prior(args)
    from agents.rl.train import PPOConfig, check_config, train
    from experiments.tracking.hooks import tracked_run
    from experiments.tracking.sb3 import make_sb3_logger

    # PPO has no masks: it trains the MLP (the entity network scores only allowed actions).
    given = getattr(args, "_network_given", False)
    if given and args.network == "entity" and args.algo != "maskable-ppo":
        raise ConfigError("the entity network scores only the allowed actions, which needs MaskablePPO's masks; "
                          "use --algo maskable-ppo, or --network mlp (PPO's default)", field="--network")
    network = args.network if given or args.algo == "maskable-ppo" else "mlp"
    config = dataclass_from_args(PPOConfig, args, network=network,
                                 progress_bar=args.progress_bar and sys.stderr.isatty())
    check_config(config)
    import_training_stack(config.algo)
    output_folder(args.out)
    command = "python -m experiments train " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    try:
        with tracked_run(args, command=NAME, config=asdict(config)) as tracker:
            logger = make_sb3_logger(tracker, formats=("stderr",) if args.json else ())
            summary = train(config, tracker=tracker, logger=logger, command=command)
            out = Path(args.out)
            png = learning_curve(out / "eval.jsonl", out / "learning_curve.png")
            if png is not None:
                tracker.log_image("learning_curve", png)
            tracker.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, bool))})
            summary["wandb_run"] = str(tracker.run_dir) if tracker.run_dir else None
            summary["eval"] = last_evaluation(out / "eval.jsonl")
    except (KeyboardInterrupt, SystemExit) as stop:  # before or after PPO's own stop-and-save (SIGTERM: SystemExit)
        return interrupted(stop, kept_checkpoints(Path(args.out)))
    if args.json:
        print(json.dumps(summary))
    elif summary["interrupted"]:
        print(f"interrupted: {summary['timesteps']} steps in {summary['seconds']:.0f} s; checkpoint saved "
              f"-> {summary['checkpoint']}, policy -> {summary['policy']} (resume: --resume --out {args.out})",
              file=sys.stderr)
    else:
        print(f"done: {summary['timesteps']} steps in {summary['seconds']:.0f} s -> {summary['policy']} "
              f"(resume: --resume --out {args.out})")
        print(quality_line(summary["eval"]))
        if summary["wandb_run"]:
            print(f"W&B run (offline unless WANDB_MODE=online): {summary['wandb_run']}; learning curve: "
                  f"{Path(args.out) / 'learning_curve.png'}")
    if not summary["interrupted"]:
        return 0
    return 128 + summary["signal"] if summary.get("signal") else 130


def import_training_stack(algo: str) -> None:
    """Import what training runs on (torch, SB3, the algorithm, our RL modules) before the output
    folder appears. Startup is mostly imports, and a Ctrl-C that lands inside one can be lost
    (CPython reports a KeyboardInterrupt raised in an import lock's callback as "Exception ignored"
    and goes on); once the folder exists, a Ctrl-C stops the run (tests/experiments/test_interrupt.py
    interrupts right after the folder appears)."""
    import importlib

    import stable_baselines3.common.vec_env  # noqa: F401
    import torch  # noqa: F401

    from agents.rl.policy import ALGOS

    importlib.import_module(ALGOS[algo][0])
    for module in ("agents.vec_adapter", "agents.rl.net", "agents.rl.starts", "agents.rl.imitation"):
        importlib.import_module(module)


def last_evaluation(eval_log: Path) -> dict | None:
    """The last PPO-phase row of the evaluation log (held-out quality figures), None without one."""
    if not eval_log.is_file():
        return None
    rows = [json.loads(line) for line in eval_log.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if not r.get("phase")] or rows
    return rows[-1] if rows else None


def quality_line(row: dict | None) -> str:
    """What the trained policy achieves on the held-out scenarios, in one line."""
    if row is None:
        return "held-out quality: not evaluated (--eval-every 0)"
    parts = [f"{label} {row[key]:.3f}" for key, label in (
        ("eval/quality_vs_tuner", "throughput / tuner's (geo-mean)"),
        ("eval/min_quality_vs_tuner", "worst scenario"),
        ("eval/gain_over_start", "speedup over the starting plan"),
        ("eval/zero_shot_quality", "zero-shot"),
        ("eval/fits", "share of plans that fit where the tuner's does")) if isinstance(row.get(key), (int, float))]
    return f"held-out quality at {row.get('timesteps', '?')} steps: " + (", ".join(parts) or "no figures")


def kept_checkpoints(out: Path) -> str:
    """What an interrupted training left in ``out``: its latest checkpoint and how to resume, or that there is none."""
    from agents.rl.train import latest_checkpoint

    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return (f"stopped before the first checkpoint; nothing to resume from in {out / 'checkpoints'} "
                "(run the same command again to start over)")
    return f"checkpoints kept in {out / 'checkpoints'}, latest {ckpt.name} (resume: --resume --out {out})"


def learning_curve(eval_log: Path, png: Path) -> Path | None:
    """Plot the evaluation log (gain over the starting plan and speedup over Megatron vs steps)."""
    if not eval_log.is_file():
        return None
    rows = [json.loads(line) for line in eval_log.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Rows with a "phase" are reference points of the imitation phase (random edits, the policy
    # before and after imitation); the curve is the PPO phase.
    marks = {r["phase"]: r for r in rows if r.get("phase")}
    rows = [r for r in rows if not r.get("phase")] or rows
    x = [r["timesteps"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.2))
    ax[0].plot(x, [r.get("eval/gain_over_start", float("nan")) for r in rows], marker="o")
    ax[0].set_title("held-out: speedup over the starting plan")
    for key, label in (("eval/quality_vs_tuner", "rl (<= 40 calls)"), ("eval/zero_shot_quality", "zero-shot (<= 5)"),
                       ("eval/min_quality_vs_tuner", "rl, worst scenario")):
        ax[1].plot(x, [r.get(key, float("nan")) for r in rows], marker="o", label=label)
    for phase, style in (("random-edits", ":"), ("untrained", "--")):
        if phase in marks:
            for a, key in ((ax[0], "eval/gain_over_start"), (ax[1], "eval/quality_vs_tuner")):
                a.axhline(marks[phase].get(key, float("nan")), color="grey", ls=style, lw=0.8,
                          label=f"{phase} (rl)" if a is ax[1] else None)
    fits = rows[-1].get("eval/fits")
    ax[1].set_title("held-out: throughput / tuner's (geo-mean" + (f", {fits:.0%} of plans fit)" if fits is not None
                                                                  else ")"))
    ax[1].legend(fontsize=7)
    ax[2].plot(x, [r.get("train/steps_per_s", float("nan")) for r in rows], marker="o", color="C2")
    ax[2].set_title("training environment steps/s")
    for a in ax:
        a.set_xlabel("environment steps")
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
