"""Training of plan-editing policies (MaskablePPO or PPO) with checkpoints, evaluation and resume.

Reads top to bottom: a :class:`PPOConfig`, vectorised environments (by default
``gymnasium.make_vec``'s batched vector env, each step's simulations one native batch; one process
each with ``vec="subproc"``), the model (MaskablePPO with the
size-independent :class:`agents.rl.net.EntityPolicy` by default), callbacks (periodic
checkpoint, stop-and-save on SIGINT/SIGTERM, periodic evaluation on held-out scenarios
(:data:`env.scenarios.HELDOUT_SCENARIO`: families and sizes training never sees) against the
tuner, written to ``OUT/eval.jsonl`` and to W&B with the training steps/s), ``learn``, and the
final policy saved as ``OUT/policy.pth`` + ``OUT/policy.json``.

Resume (``resume=True``) loads the latest ``OUT/checkpoints/model_<steps>.zip`` and trains to
the same total. What SB3 restores: weights, optimizer state, ``num_timesteps`` and the
learning-rate schedule position. What it does not: the environments' random state and the
half-collected rollout, so a resumed run continues with fresh episodes and is not
bit-identical to an uninterrupted one from the checkpoint on (the policy before it is).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agents.rl.bootstrap import batched_bootstrap
from agents.rl.policy import ALGOS, save_policy
from agents.rl.threads import learner_threads_callback
from env.scenarios import HELDOUT_SCENARIO, TRAIN_SCENARIO, sample_scenario
from env.vector_env import check_room
from pipeline.errors import ConfigError

__all__ = ["PPOConfig", "TRAIN_SCENARIO", "HELDOUT_SCENARIO", "MAX_SEED", "MAX_WIDTH", "check_config", "fit_rollout",
           "train", "evaluate_policy_on", "latest_checkpoint", "tuner_times", "silent_sb3_logger"]


#: The largest seed: environment i is seeded 1000 x seed + i, and NumPy's seeds end at 2**32 - 1.
MAX_SEED = (2**32 - 1) // 1000 - 1
#: The widest layer ``hidden`` and ``net_arch`` may ask for (the defaults are 64; wider is a typo, and
#: a width in the billions fails deep inside torch instead of here).
MAX_WIDTH = 8192


@dataclass
class PPOConfig:
    """Everything a PPO training run depends on (saved in the policy's metadata). Each field is a flag of
    ``python -m experiments train`` (its docstring is the flag's help)."""

    algo: Literal["maskable-ppo", "ppo"] = "maskable-ppo"
    """``maskable-ppo`` (sb3-contrib, reads ``action_masks()``) or ``ppo`` (no masks: masked
    actions are no-ops with a small penalty)."""
    timesteps: int = 20_000
    """Environment steps in total (a resumed run trains up to the same total)."""
    seed: int = 0
    """Seed of the model, the environments (environment i is seeded 1000 x seed + i) and the
    scenario draws."""
    n_envs: int = 8
    """Parallel environments (their steps are batched through the network)."""
    vec: Literal["dummy", "subproc", "batched"] = "batched"
    """``dummy`` (one process), ``subproc`` (one process per environment: every core steps) or
    ``batched`` (``gymnasium.make_vec``'s vector env in this process: every step's simulations in
    one native batch on the engine's threads, :mod:`env.vector_env`)."""
    network: Literal["entity", "mlp"] = "entity"
    """``entity`` (:class:`agents.rl.net.EntityPolicy`, any size; MaskablePPO only) or ``mlp``
    (SB3's MLP over the flattened, padded observation)."""
    hidden: int = 64
    """Units per token of the entity network."""
    repeat_scenario: int = 4
    """Episodes per drawn scenario (its preparation is paid once)."""
    single_start_share: float = 0.3
    """Share of episodes that start from one plan (zero-shot practice) instead of the portfolio."""
    allow_stop: bool = False
    """Whether the policy may stop an episode early (off: every episode spends its budget, so the
    policy cannot learn to give up; the searchers read this from the policy's metadata)."""
    torch_threads: int | None = None
    """Torch threads of PPO's updates. None: chosen by timing the updates on 1 and on the machine's
    cores (at most 2), the faster kept and the other retried now and then (:mod:`agents.rl.threads`:
    a second thread speeds an idle machine's updates ~30% and halves them beside a busy process);
    rollouts then run on one. A number fixes the count for both."""
    engine_threads: int = 2
    """Threads of the compiled engine that steps the batched environments (``--vec batched``; at most
    the machine's cores): the learner's torch thread waits while they step. 1: on the training thread."""
    out: str = "runs/train"
    """Output folder: checkpoints/, eval.jsonl, policy.pth/json, learning_curve.png."""
    eval_every: int = 5_000
    """Evaluate every this many steps (0: never)."""
    eval_scenarios: int = 6
    """Held-out scenarios per evaluation (:data:`HELDOUT_SCENARIO`, seeds 10_000 + i)."""
    eval_tuner_calls: int = 200
    """Simulator calls of the tuner that held-out quality is measured against."""
    checkpoint_every: int = 10_000
    """Checkpoint every this many steps."""
    max_steps: int = 24
    """Edits per episode."""
    max_calls: int = 40
    """Simulator calls per episode (portfolio included), as the RL searcher spends."""
    n_steps: int = 128
    """PPO rollout length per environment (cut, and said, where one rollout would be longer than
    ``--timesteps``: PPO trains whole rollouts)."""
    batch_size: int | None = None
    """PPO minibatch size, at most ``n_steps`` x ``n_envs`` (a whole rollout); None: 256, or the whole
    rollout where that is smaller (only a size given by hand is refused for exceeding it)."""
    n_epochs: int = 2
    """PPO passes over each rollout."""
    learning_rate: float = 5e-4
    """PPO's step size, in (0, 1] (5e-4 from scratch; 1e-4 to fine-tune the imitation policy)."""
    gamma: float = 0.95
    """Discount factor of future rewards, in (0, 1]."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus in PPO's loss (>= 0; more explores more)."""
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the ``mlp`` network (the entity network's width is ``hidden``)."""
    resume: bool = False
    """Continue from the latest checkpoint in ``out``."""
    progress_bar: bool = True
    """Show a progress bar (only on a terminal)."""
    imitation_states: int = 0
    """States labelled by the one-step oracle before PPO (:mod:`agents.rl.imitation`; 0: none)."""
    imitation_epochs: int = 12
    """Passes of the imitation phase over its labelled states."""
    ranker_scenarios: int = 0
    """Training scenarios to label for the start ranker (:mod:`agents.rl.starts`, saved as
    ``OUT/starts.pt``; 0: none)."""


def latest_checkpoint(out: str | Path) -> Path | None:
    """The checkpoint with the most steps in ``OUT/checkpoints``, or None."""
    folder = Path(out) / "checkpoints"
    found = sorted(folder.glob("model_*.zip"), key=lambda p: int(p.stem.split("_")[1]))
    return found[-1] if found else None


def _make_env(config: PPOConfig, rank: int) -> Callable[[], Any]:
    def thunk():
        from env.pipeline_env import PipelineEnv

        env = PipelineEnv(max_steps=config.max_steps, max_calls=config.max_calls, scenario=TRAIN_SCENARIO,
                          repeat_scenario=config.repeat_scenario, single_start_share=config.single_start_share,
                          allow_stop=config.allow_stop)
        env.reset(seed=config.seed * 1000 + rank)
        return env

    return thunk


class _QuietWorker:
    """An environment factory for a SubprocVecEnv worker that ignores SIGINT and SIGTERM: Ctrl-C in a
    terminal reaches the whole process group, and only the parent should act on it (it stops
    training, saves, then closes the workers; a worker whose parent is gone ends at its pipe's EOF)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self) -> Any:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return self.fn()


def _subproc_vec_env(fns: list[Callable[[], Any]]) -> Any:
    """A SubprocVecEnv whose workers ignore SIGINT from birth: multiprocessing's fork server is
    started with SIGINT ignored (its children inherit that), and each worker ignores it again
    (:class:`_QuietWorker`) in case the fork server was already running."""
    import multiprocessing as mp

    from stable_baselines3.common.vec_env import SubprocVecEnv

    if "forkserver" in mp.get_all_start_methods():
        from multiprocessing import forkserver

        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, old)
    return SubprocVecEnv([_QuietWorker(fn) for fn in fns])


#: What a SubprocVecEnv raises when a worker is gone (e.g. killed by a signal meant for the parent).
_WORKER_GONE = (EOFError, ConnectionResetError, BrokenPipeError)


def tuner_times(scenarios: list, *, calls: int, seed: int = 0) -> list[float]:
    """Iteration time of the AdaPtis tuner's plan for each scenario (``inf`` when none fits)."""
    from agents.base import Budget
    from agents.tuner import AdaptisTuner

    out = []
    for p in scenarios:
        r = AdaptisTuner().search(p, budget=Budget(calls), seed=seed)
        out.append(r.iteration_time if r.feasible else float("inf"))
    return out


def evaluate_policy_on(policy: Any, scenarios: list, *, max_calls: int = 40, max_steps: int = 24,
                       tuner: list[float] | None = None, allow_stop: bool = True) -> dict[str, float]:
    """Deterministic rollouts on ``scenarios`` from the hand-written starts
    (:func:`agents.rl.searchers.start_candidates`, no ranker: the edits alone): the mean gain over the
    best start where both fit, and, given the tuner's times, over the scenarios where the tuner's plan
    fits: the share where the policy's plan fits too (``eval/fits``; ``eval/zero_shot_fits``) and the
    geometric-mean quality (tuner time / policy time) over those, at ``max_calls`` calls and zero-shot
    (one start plan, at most 5 calls). A plan that does not fit is counted in the shares, not priced
    into the mean (a floor such as 1e-3 in a geometric mean of six turned 0.96 into 0.24)."""
    from agents.rl.searchers import rollout, start_candidates
    from env.editor import SharedEvaluator
    from env.pipeline_env import PipelineEnv
    from pipeline.evaluator import Evaluator

    env = PipelineEnv(max_steps=max_steps, allow_stop=allow_stop)
    gains, calls, quality, zero = [], [], [], []
    for i, p in enumerate(scenarios):
        starts = start_candidates(p)  # the hand-written, memory-aware starts (no ranker: the edits alone)
        first = SharedEvaluator(p)
        env.reset(options={"scenario": p, "evaluator": first, "max_calls": max_calls, "start": starts})
        start = env.editor.result
        # The rollout's own evaluator: the starts come from ``first``'s memo, counted as its calls, so the
        # rollout starts from the plan ``start`` measured. (Reusing ``first``, whose calls the starts had
        # spent already, cut the rollout's start short when the budget is below the starts' count, and
        # its result could be slower than ``start``.)
        ev = SharedEvaluator(p, share=first)
        _, _, res = rollout(policy, env, scenario=p, evaluator=ev, max_calls=max_calls, deterministic=True,
                            start=starts)
        if res.feasible and start.feasible:
            gains.append(start.iteration_time / res.iteration_time)
        calls.append(ev.calls)
        if tuner is not None and np.isfinite(tuner[i]):
            quality.append(tuner[i] / res.iteration_time if res.feasible else None)
            ev0 = Evaluator(p)
            _, _, res0 = rollout(policy, env, scenario=p, evaluator=ev0, max_calls=5, deterministic=True,
                                 start="single")
            zero.append(tuner[i] / res0.iteration_time if res0.feasible else None)
    out = {"eval/sim_calls": float(np.mean(calls))}
    if gains:
        out["eval/gain_over_start"] = float(np.mean(gains))
    if quality:
        fit, fit0 = [q for q in quality if q is not None], [q for q in zero if q is not None]
        out["eval/fits"] = len(fit) / len(quality)
        out["eval/zero_shot_fits"] = len(fit0) / len(zero)
        if fit:
            out["eval/quality_vs_tuner"] = float(np.exp(np.mean(np.log(fit))))
            out["eval/min_quality_vs_tuner"] = float(np.min(fit))
        if fit0:
            out["eval/zero_shot_quality"] = float(np.exp(np.mean(np.log(fit0))))
    return out


_HELD_OUT: dict[tuple[int, int], tuple[list, list[float] | None]] = {}


def _held_out(config: PPOConfig) -> tuple[list, list[float] | None]:
    """The evaluation scenarios (seeds 10_000 + i of :data:`HELDOUT_SCENARIO`) and the tuner's times on them."""
    if not config.eval_every:
        return [], None
    key = (config.eval_scenarios, config.eval_tuner_calls)
    if key not in _HELD_OUT:
        scenarios = [sample_scenario(np.random.default_rng(10_000 + i), HELDOUT_SCENARIO)
                     for i in range(config.eval_scenarios)]
        _HELD_OUT[key] = (scenarios, tuner_times(scenarios, calls=config.eval_tuner_calls))
    return _HELD_OUT[key]


def _imitate(policy: Any, config: PPOConfig, tracker: Any, out: Path) -> dict[str, Any]:
    """The imitation phase (:func:`agents.rl.imitation.pretrain`) with held-out evaluations before
    and after it, and of random edits, written to ``eval.jsonl`` (``phase`` column) and W&B."""
    from agents.rl.imitation import ImitationConfig, pretrain

    scenarios, tuner = _held_out(config)

    def record(phase: str, who: Any) -> None:
        if not scenarios:
            return
        metrics = evaluate_policy_on(who, scenarios, max_calls=config.max_calls, max_steps=config.max_steps,
                                     tuner=tuner, allow_stop=config.allow_stop)
        with open(out / "eval.jsonl", "a") as fh:
            fh.write(json.dumps({"timesteps": 0, "phase": phase, **metrics}) + "\n")
        if tracker is not None:
            # step 0: before PPO's steps (W&B drops logs at a step below one already used)
            tracker.log_metrics({f"{phase}/{k}": v for k, v in metrics.items()}, step=0)

    record("random-edits", None)
    record("untrained", policy)
    icfg = ImitationConfig(states=config.imitation_states, epochs=config.imitation_epochs)
    epochs: list[dict[str, float]] = []
    summary = pretrain(policy, icfg, seed=config.seed, max_steps=config.max_steps, max_calls=config.max_calls,
                       repeat_scenario=config.repeat_scenario, single_start_share=config.single_start_share,
                       progress_bar=config.progress_bar, log=epochs.append)
    if tracker is not None and epochs:
        tracker.log_table("imitation_epochs", epochs, step=0)
    record("imitation", policy)
    return summary


def _callbacks(config: PPOConfig, tracker: Any, out: Path, stop: dict[str, bool]):
    from stable_baselines3.common.callbacks import BaseCallback

    scenarios, tuner = _held_out(config)

    class Periodic(BaseCallback):
        """Checkpoints, evaluation and the stop flag set by SIGINT/SIGTERM."""

        def __init__(self) -> None:
            super().__init__()
            self.next_ckpt = 0
            self.next_eval = 0
            self.first_step = 0
            self.eval_seconds = 0.0

        def _on_training_start(self) -> None:
            n = self.first_step = self.model.num_timesteps
            self.next_ckpt = n + config.checkpoint_every
            self.next_eval = n if n == 0 else n + config.eval_every

        def save(self) -> Path:
            path = out / "checkpoints" / f"model_{self.model.num_timesteps}.zip"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.model.save(str(path))
            return path

        def evaluate(self) -> None:
            metrics = evaluate_policy_on(self.model.policy, scenarios, max_calls=config.max_calls,
                                         max_steps=config.max_steps, tuner=tuner, allow_stop=config.allow_stop)
            elapsed = time.perf_counter() - t0
            steps = self.model.num_timesteps - self.first_step
            metrics["train/steps_per_s"] = steps / max(elapsed - self.eval_seconds, 1e-9)
            t_eval = time.perf_counter()
            row = {"timesteps": int(self.model.num_timesteps), "time_s": round(elapsed, 2), **metrics}
            with open(out / "eval.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            for k, v in metrics.items():
                self.logger.record(k, v)
            if tracker is not None:
                tracker.log_metrics(metrics, step=int(self.model.num_timesteps))
            self.eval_seconds += time.perf_counter() - t_eval

        def _on_step(self) -> bool:
            n = self.model.num_timesteps
            if config.eval_every and n >= self.next_eval:
                self.evaluate()
                self.next_eval = n + config.eval_every
            if n >= self.next_ckpt:
                self.save()
                self.next_ckpt = n + config.checkpoint_every
            return not stop["now"]

    t0 = time.perf_counter()
    return Periodic()


#: PPO's minibatch when ``--batch-size`` is not given (or the whole rollout, where that is smaller).
DEFAULT_BATCH_SIZE = 256


def fit_rollout(config: PPOConfig) -> PPOConfig:
    """``config`` with ``n_steps`` cut so that one rollout (``n_steps`` x ``n_envs``) is no longer than
    ``timesteps``, and a line saying so: SB3 collects and trains whole rollouts, so ``--timesteps 8
    --envs 4096`` trained 524,288 steps. At least 2 samples a rollout (PPO normalises over them)."""
    rollout = config.n_steps * config.n_envs
    if config.timesteps >= rollout:
        return config
    n_steps = max(-(-config.timesteps // config.n_envs), 2 if config.n_envs == 1 else 1)
    if n_steps >= config.n_steps:
        return config
    print(f"--timesteps {config.timesteps} is less than one rollout of --n-steps {config.n_steps} x --envs "
          f"{config.n_envs} = {rollout} steps, which PPO would train in full: --n-steps cut to {n_steps}")
    return replace(config, n_steps=n_steps)


def minibatch_size(config: PPOConfig) -> int:
    """The minibatch PPO trains on: ``--batch-size`` as given, else 256 capped at one rollout (one less
    while the epoch's last minibatch would hold a single sample, e.g. 255 for a rollout of 257)."""
    if config.batch_size is not None:
        return config.batch_size
    rollout = config.n_steps * config.n_envs
    size = min(DEFAULT_BATCH_SIZE, rollout)
    while size > 2 and rollout % size == 1:
        size -= 1
    return size


#: Processes ``vec="subproc"`` may start (one per environment).
MAX_SUBPROC_ENVS = 256


def check_config(config: PPOConfig) -> None:
    """Refuse a config that cannot train, before anything starts: a ConfigError naming the flag of
    ``python -m experiments train`` (each field's flag is ``--`` and its name with ``-``)."""
    if config.algo not in ALGOS:
        raise ConfigError(f"unknown algo {config.algo!r}; use one of {sorted(ALGOS)}", field="--algo")
    if config.network not in ("entity", "mlp"):
        raise ConfigError(f"unknown network {config.network!r}; use entity or mlp", field="--network")
    if config.vec not in ("dummy", "subproc", "batched"):
        raise ConfigError(f"unknown vectorisation {config.vec!r}; use dummy, subproc or batched", field="--vec")
    if config.vec == "subproc" and config.n_envs > MAX_SUBPROC_ENVS:
        raise ConfigError(f"--vec subproc starts one process per environment: at most {MAX_SUBPROC_ENVS}, got "
                          f"{config.n_envs}; use --vec batched for more", field="--envs")
    try:
        check_room(config.n_envs)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--envs") from None
    for name in ("imitation_states", "ranker_scenarios", "eval_every"):
        if getattr(config, name) < 0:
            raise ConfigError(f"must be >= 0 (0: skip it), got {getattr(config, name)}",
                              field="--" + name.replace("_", "-"))
    if not 0 <= config.seed <= MAX_SEED:
        raise ConfigError(f"must be a whole number from 0 to {MAX_SEED} (environment i is seeded 1000 x seed + i), "
                          f"got {config.seed}", field="--seed")
    for name in ("timesteps", "n_envs", "hidden", "repeat_scenario", "torch_threads", "engine_threads",
                 "eval_scenarios", "eval_tuner_calls", "checkpoint_every", "max_steps", "max_calls", "n_steps",
                 "batch_size", "n_epochs", "imitation_epochs"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            flag = "--envs" if name == "n_envs" else "--" + name.replace("_", "-")
            raise ConfigError(f"must be >= 1, got {getattr(config, name)}", field=flag)
    if not config.net_arch or min(config.net_arch) < 1 or max(config.net_arch) > MAX_WIDTH:
        raise ConfigError(f"needs one or more widths from 1 to {MAX_WIDTH}, got {config.net_arch}", field="--net-arch")
    if config.hidden > MAX_WIDTH:
        raise ConfigError(f"must be at most {MAX_WIDTH}, got {config.hidden}", field="--hidden")
    for name, low, high in (("learning_rate", 0.0, 1.0), ("gamma", 0.0, 1.0)):
        if not low < getattr(config, name) <= high:
            raise ConfigError(f"must be above {low:g} and at most {high:g}, got {getattr(config, name)}",
                              field="--" + name.replace("_", "-"))
    if not 0.0 <= config.single_start_share <= 1.0:
        raise ConfigError(f"must be from 0 to 1, got {config.single_start_share}", field="--single-start-share")
    if not config.ent_coef >= 0.0:
        raise ConfigError(f"must be >= 0, got {config.ent_coef}", field="--ent-coef")
    if config.n_steps * config.n_envs < 2:  # PPO normalises advantages over a batch: one sample gives NaN
        raise ConfigError(f"a rollout of --n-steps {config.n_steps} x --envs {config.n_envs} is one step; PPO "
                          "needs at least 2 per update: use --n-steps 2 or more", field="--n-steps")
    batch_size = minibatch_size(config)
    if batch_size < 2:  # the same per minibatch: SB3 normalises each minibatch's advantages
        raise ConfigError(f"must be at least 2 (PPO normalises each minibatch's advantages; one sample gives NaN), "
                          f"got {batch_size}", field="--batch-size")
    rollout = config.n_steps * config.n_envs
    if batch_size > rollout:  # SB3 would silently use the whole rollout as one minibatch
        raise ConfigError(f"a minibatch of {batch_size} is larger than a rollout of {rollout} steps "
                          f"(--n-steps {config.n_steps} x --envs {config.n_envs}); use --batch-size {rollout} "
                          "or less, or a longer --n-steps", field="--batch-size")
    if rollout % min(batch_size, rollout) == 1:  # the epoch's last minibatch would be one sample
        raise ConfigError(f"a rollout of {rollout} steps in minibatches of {batch_size} leaves a last "
                          "minibatch of one sample (NaN advantages); pick a batch size that divides "
                          "--n-steps x --envs", field="--batch-size")
    if config.imitation_states > 0 and config.network != "entity":
        raise ConfigError("the imitation phase trains the entity network; use --network entity",
                          field="--imitation-states")
    if config.network == "entity" and config.algo != "maskable-ppo":
        raise ConfigError("the entity network needs --algo maskable-ppo (it scores only allowed actions)",
                          field="--network")


def silent_sb3_logger() -> Any:
    """An SB3 ``Logger`` that writes nothing. Without a logger of its own, every ``learn()`` makes SB3
    configure one whose folder is a new empty ``SB3-<date>`` directory in the system's temp folder."""
    from stable_baselines3.common.logger import Logger

    return Logger(folder=None, output_formats=[])


def train(config: PPOConfig, *, tracker: Any = None, logger: Any = None, command: str = "",
          env_fn: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Train (or resume) a policy; returns a summary (timesteps, seconds, paths).

    ``tracker`` (an ``experiments.tracking.Tracker``) receives the evaluation curves and
    ``logger`` (an SB3 ``Logger``, e.g. ``experiments.tracking.sb3.make_sb3_logger(tracker)``) SB3's
    own metrics; both are optional. ``env_fn(rank)`` replaces the training environments
    (e.g. one fixed scenario); by default they draw from :data:`TRAIN_SCENARIO`.
    """
    import importlib

    import torch as th
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    config = fit_rollout(config)
    check_config(config)
    th.set_num_threads(max(1, config.torch_threads or 1))
    out = Path(config.out)
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not config.resume:  # an earlier run's checkpoints: never overwritten silently
        raise ConfigError(f"{out} holds an earlier run's checkpoint ({ckpt.name}): pass --resume to continue it, "
                          "or choose another --out (or delete that folder) to start over", field="--out")
    out.mkdir(parents=True, exist_ok=True)
    module, cls_name = ALGOS[config.algo]
    algo_cls = getattr(importlib.import_module(module), cls_name)
    if config.vec == "batched" and env_fn is None:
        from agents.vec_adapter import make_vec_env

        vec = make_vec_env(config.n_envs, max_steps=config.max_steps, max_calls=config.max_calls,
                           scenario=TRAIN_SCENARIO, repeat_scenario=config.repeat_scenario,
                           single_start_share=config.single_start_share, allow_stop=config.allow_stop,
                           engine_threads=min(config.engine_threads, os.cpu_count() or 1))
    else:
        fns = [_make_env(config, i) if env_fn is None else (lambda i=i: env_fn(i)) for i in range(config.n_envs)]
        vec = _subproc_vec_env(fns) if config.vec == "subproc" and config.n_envs > 1 else DummyVecEnv(fns)
    vec = VecMonitor(vec)
    vec.seed(config.seed)
    if ckpt is not None:
        try:
            model = algo_cls.load(str(ckpt), env=vec, device="cpu")
        except Exception as exc:  # a checkpoint cut short (disk full, killed mid-write) raises anything
            vec.close()
            raise ConfigError(f"checkpoint {ckpt} cannot be read ({type(exc).__name__}): it is corrupt or truncated; "
                              "delete it to resume from the one before, or drop --resume", field="--resume") from None
    else:
        if config.resume:
            print(f"no checkpoint in {out / 'checkpoints'}; starting from scratch")
        if not config.resume and (out / "eval.jsonl").exists():
            (out / "eval.jsonl").unlink()
        if config.network == "entity":
            from agents.rl.net import EntityPolicy

            policy, policy_kwargs = EntityPolicy, {"hidden": config.hidden}
        else:
            policy, policy_kwargs = "MultiInputPolicy", {"net_arch": list(config.net_arch)}
        model = algo_cls(policy, vec, seed=config.seed, device="cpu", n_steps=config.n_steps,
                         batch_size=minibatch_size(config), n_epochs=config.n_epochs,
                         learning_rate=config.learning_rate,
                         gamma=config.gamma, ent_coef=config.ent_coef, verbose=0, policy_kwargs=policy_kwargs)
    model.set_logger(logger if logger is not None else silent_sb3_logger())
    ranker = None
    if config.ranker_scenarios > 0 and not (out / "starts.pt").is_file():
        from agents.rl.starts import train_ranker

        ranker = train_ranker(config.ranker_scenarios, seed=config.seed, out=out / "starts.pt",
                              progress_bar=config.progress_bar)[1]
        if tracker is not None:
            tracker.log_metrics({f"ranker/{k}": v for k, v in ranker.items() if isinstance(v, (int, float))}, step=0)
    imitation = None
    if ckpt is None and config.imitation_states > 0:
        imitation = _imitate(model.policy, config, tracker, out)
    stop: dict[str, Any] = {"now": False, "signal": None}

    def on_signal(signum, frame):  # noqa: ARG001
        stop["now"], stop["signal"] = True, signum

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, on_signal)
    callback = _callbacks(config, tracker, out, stop)
    threads = learner_threads_callback() if config.torch_threads is None else None
    # the bootstrap last (its docstring)
    callbacks = ([threads] if threads is not None else []) + [callback, batched_bootstrap()]
    t0 = time.perf_counter()
    remaining = max(0, config.timesteps - model.num_timesteps)
    try:
        if remaining:
            model.learn(total_timesteps=remaining, callback=callbacks,
                        reset_num_timesteps=ckpt is None,
                        progress_bar=config.progress_bar)
        else:  # resumed at its total already: nothing to learn, still save the policy
            callback.init_callback(model)
    except _WORKER_GONE:
        if not stop["now"]:  # a worker died on its own: not an interruption
            raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        try:
            vec.close()
        except _WORKER_GONE:
            if not stop["now"]:
                raise
    seconds = time.perf_counter() - t0
    if getattr(callback, "model", None) is None:  # stopped before learn() set the callback up
        callback.init_callback(model)
    ckpt_path = callback.save()
    interrupted = stop["now"]
    if not interrupted and config.eval_every:
        callback.evaluate()
    meta = {"config": asdict(config), "command": command, "seed": config.seed, "train_seconds": round(seconds, 1),
            "interrupted": interrupted, "imitation": imitation, "ranker": ranker}
    if threads is not None:  # how many updates ran on each thread count
        meta["learner_threads"] = {str(k): v for k, v in threads.chooser.counts.items()}
    policy_path = save_policy(model, out / "policy.pth", algo=config.algo, extra=meta)
    return {"timesteps": int(model.num_timesteps), "seconds": seconds, "checkpoint": str(ckpt_path),
            "policy": str(policy_path), "interrupted": interrupted, "signal": stop["signal"],
            "eval_log": str(out / "eval.jsonl")}
