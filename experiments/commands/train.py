"""Train a plan-editing policy in adaptis/Pipeline-v0 (MaskablePPO or PPO), with checkpoints.

Writes OUT/checkpoints/model_<steps>.zip (every --checkpoint-every steps and on Ctrl-C/SIGTERM),
OUT/eval.jsonl (held-out evaluation every --eval-every steps), OUT/learning_curve.png, and the
final OUT/policy.pth + OUT/policy.json (use with: search --method rl --policy OUT/policy.pth).
SB3's metrics and the evaluation curves go to W&B (offline by default). Policy files are
pickles: load only your own or trusted ones.

Examples:
  python -m experiments train --ranker-scenarios 9000 --imitation-states 20000 --timesteps 102400 \
      --learning-rate 1e-4 --seed 0 --eval-every 51200 --checkpoint-every 51200 --out runs/default-policy
                                                    # the shipped default policy and start ranker
  python -m experiments train --timesteps 20000 --seed 0 --vec subproc --out runs/ppo  # PPO alone
  python -m experiments train --out runs/train --resume                     # after an interruption
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from experiments.common import (
    add_output_args,
    interrupted,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
    seed_int,
)
from pipeline.errors import ConfigError

NAME = "train"
HELP = "train an RL policy that edits pipeline plans (MaskablePPO / PPO)"


def _train_seed(text: str) -> int:
    return seed_int(text, most=(2**32 - 1) // 1000 - 1)  # environment i gets seed 1000 x seed + i


def _learning_rate(text: str) -> float:
    """PPO's step size: above 0 and at most 1 (beyond, the policy's weights blow up to NaN in one update)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be at most 1 (e.g. 5e-4), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", choices=("maskable-ppo", "ppo"), default="maskable-ppo")
    parser.add_argument("--timesteps", type=positive_int, default=20_000, help="environment steps in total")
    parser.add_argument("--seed", type=_train_seed, default=0,
                        help="seed (0 to 4294966: environment i is seeded 1000 x seed + i)")
    parser.add_argument("--n-envs", type=positive_int, default=8, help="parallel environments")
    parser.add_argument("--vec", choices=("dummy", "subproc"), default="subproc",
                        help="vectorisation (subproc: one process per environment, all cores step)")
    parser.add_argument("--network", choices=("entity", "mlp"), default="entity",
                        help="entity: per-stage/per-device network for any size (maskable-ppo); mlp: SB3's MLP")
    parser.add_argument("--out", default="runs/train", help="output folder")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--eval-every", type=non_negative_int, default=5_000,
                        help="steps between evaluations (0: none)")
    parser.add_argument("--eval-scenarios", type=positive_int, default=6, help="held-out scenarios per evaluation")
    parser.add_argument("--checkpoint-every", type=positive_int, default=10_000)
    parser.add_argument("--n-steps", type=positive_int, default=128, help="PPO rollout length per environment")
    parser.add_argument("--imitation-states", type=non_negative_int, default=0,
                        help="states labelled by the one-step look-ahead oracle before PPO (0: PPO alone)")
    parser.add_argument("--imitation-epochs", type=positive_int, default=12, help="passes over the labelled states")
    parser.add_argument("--ranker-scenarios", type=non_negative_int, default=0,
                        help="training scenarios labelled for the start ranker, saved as OUT/starts.pt (0: none)")
    parser.add_argument("--learning-rate", type=_learning_rate, default=5e-4, help="PPO's learning rate (0, 1]")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_output_args(parser)


def run(args: argparse.Namespace) -> int:
    from agents.rl_train import TrainConfig, train
    from experiments.tracking_hooks import tracked_run
    from experiments.tracking_sb3 import make_sb3_logger

    if args.n_steps * args.n_envs < 2:  # PPO normalises advantages over a batch: one sample gives NaN
        raise ConfigError(f"a rollout of --n-steps {args.n_steps} x --n-envs {args.n_envs} is one step; PPO needs at "
                          "least 2 per update: use --n-steps 2 or more", field="--n-steps")
    output_folder(args.out)
    config = TrainConfig(algo=args.algo, timesteps=args.timesteps, seed=args.seed, n_envs=args.n_envs, vec=args.vec,
                         network=args.network if args.algo == "maskable-ppo" else "mlp",
                         out=args.out, eval_every=args.eval_every, eval_scenarios=args.eval_scenarios,
                         checkpoint_every=args.checkpoint_every, n_steps=args.n_steps, resume=args.resume,
                         imitation_states=args.imitation_states, imitation_epochs=args.imitation_epochs,
                         ranker_scenarios=args.ranker_scenarios, learning_rate=args.learning_rate,
                         progress_bar=not args.no_progress and sys.stderr.isatty())
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
    if not summary["interrupted"]:
        return 0
    return 128 + summary["signal"] if summary.get("signal") else 130


def kept_checkpoints(out: Path) -> str:
    """What an interrupted training left in ``out``: its latest checkpoint and how to resume, or that there is none."""
    from agents.rl_train import latest_checkpoint

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
    ax[0].plot(x, [r["eval/gain_over_start"] for r in rows], marker="o")
    ax[0].set_title("held-out: speedup over the starting plan")
    for key, label in (("eval/quality_vs_tuner", "rl (<= 40 calls)"), ("eval/zero_shot_quality", "zero-shot (<= 5)"),
                       ("eval/min_quality_vs_tuner", "rl, worst scenario")):
        ax[1].plot(x, [r.get(key, float("nan")) for r in rows], marker="o", label=label)
    for phase, style in (("random-edits", ":"), ("untrained", "--")):
        if phase in marks:
            for a, key in ((ax[0], "eval/gain_over_start"), (ax[1], "eval/quality_vs_tuner")):
                a.axhline(marks[phase].get(key, float("nan")), color="grey", ls=style, lw=0.8,
                          label=f"{phase} (rl)" if a is ax[1] else None)
    ax[1].set_title("held-out: throughput / tuner's (geo-mean)")
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
