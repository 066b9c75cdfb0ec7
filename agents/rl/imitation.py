"""Imitation of a one-step look-ahead oracle: how the shipped policy starts learning.

PPO from scratch, rewarded edit by edit, learned nothing in 409,600 steps (docs/rl.md): most
edits are rolled back, so the reward is sparse, and a random allowed edit scored as well as the
policy's. Here the simulator labels every decision instead: at each visited state, every
allowed edit is simulated (one batched native call, on a separate :class:`Evaluator`, so the
episode's own call count and masks are untouched) and the policy is trained, by cross-entropy
over the allowed edits, to put its probability on the edits that improve the plan, the bigger
the gain the more (``exp(-(best - gain) / (temperature * best))``). States where no edit
improves are skipped (any choice there is as good).

The visited states come from rollouts on :data:`env.scenarios.TRAIN_SCENARIO` that follow the
oracle's best edit with probability ``oracle_share`` and a uniformly random allowed edit
otherwise (so the policy also sees the states its own mistakes lead to), in ``workers``
processes. PPO then fine-tunes the result (:func:`agents.rl.train.train`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ImitationConfig", "collect_states", "imitation_targets", "fit_policy", "pretrain"]


@dataclass(frozen=True)
class ImitationConfig:
    """Knobs of the imitation phase (saved in the policy's metadata with the training config)."""

    states: int = 0
    """Labelled states to collect (0: no imitation phase)."""
    epochs: int = 12
    """Passes over the labelled states."""
    batch_size: int = 256
    learning_rate: float = 1e-3
    temperature: float = 0.25
    """Width of the target distribution, as a share of the state's best gain."""
    oracle_share: float = 0.5
    """Share of collection steps that take the oracle's best edit (the rest: a random allowed edit)."""
    workers: int = 2
    """Collection processes (each draws its own scenarios)."""


def imitation_targets(gains: np.ndarray, temperature: float) -> np.ndarray:
    """Target distribution over actions from one-step gains (rows: states; gain <= 0: never chosen)."""
    best = gains.max(axis=1, keepdims=True)
    width = np.maximum(temperature * best, 1e-12)
    w = np.where(gains > 0, np.exp(-(best - gains) / width), 0.0)
    return w / np.maximum(w.sum(axis=1, keepdims=True), 1e-30)


def collect_states(n_states: int, *, seed: int, oracle_share: float = 0.5, max_steps: int = 24,
                   max_calls: int = 40, repeat_scenario: int = 4, single_start_share: float = 0.3,
                   progress: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """``n_states`` labelled states from rollouts on the training scenarios: observation arrays,
    action masks and each allowed action's one-step gain (``score`` after the edit minus before,
    0 where the edit would be rolled back)."""
    from env.editor import score
    from env.pipeline_env import PipelineEnv
    from env.scenarios import TRAIN_SCENARIO
    from pipeline.candidates import objective_key
    from pipeline.evaluator import Evaluator

    env = PipelineEnv(max_steps=max_steps, max_calls=max_calls, scenario=TRAIN_SCENARIO,
                      repeat_scenario=repeat_scenario, single_start_share=single_start_share, allow_stop=False)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows: dict[str, list[np.ndarray]] = {"stages": [], "devices": [], "plan": [], "mask": [], "gains": []}
    oracle: Evaluator | None = None
    while len(rows["mask"]) < n_states:
        ed = env.editor
        if oracle is None or oracle.scenario is not ed.scenario:
            oracle = Evaluator(ed.scenario)
        mask = env.action_masks()
        allowed = np.flatnonzero(mask[1:]) + 1
        if not len(allowed):
            obs, _ = env.reset()
            continue
        targets = ed.targets()
        results = oracle.results([targets[a] for a in allowed])
        before = score(ed.result, env.reference)
        gains = np.zeros(mask.shape[0], dtype=np.float32)
        for a, res in zip(allowed, results):
            if objective_key(res) < ed.key:
                gains[a] = max(score(res, env.reference) - before, 1e-9)
        if gains.max() > 0:
            for k in ("stages", "devices", "plan"):
                rows[k].append(obs[k])
            rows["mask"].append(mask)
            rows["gains"].append(gains)
            if progress is not None:
                progress(1)
        follow = gains.max() > 0 and rng.random() < oracle_share
        action = int(np.argmax(gains)) if follow else int(rng.choice(allowed))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return {k: np.stack(v) for k, v in rows.items()}


def _collect_worker(args: tuple[int, int, dict[str, Any]]) -> dict[str, np.ndarray]:
    n, seed, kwargs = args
    return collect_states(n, seed=seed, **kwargs)


def fit_policy(policy: Any, data: dict[str, np.ndarray], *, config: ImitationConfig, seed: int = 0,
               log: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Train ``policy`` (an SB3 actor-critic whose ``action_net`` gives the logits) by cross-entropy
    against :func:`imitation_targets`; returns per-epoch metrics (loss, agreement of the argmax
    with an improving edit on a held-back tenth of the states)."""
    import torch as th

    n = len(data["mask"])
    gen = np.random.default_rng(seed)
    order = gen.permutation(n)
    held = order[: max(1, n // 10)]
    train_idx = order[max(1, n // 10):]
    target = imitation_targets(data["gains"].astype(np.float64), config.temperature).astype(np.float32)
    opt = th.optim.Adam(policy.parameters(), lr=config.learning_rate)

    def batch(idx: np.ndarray) -> tuple[dict[str, th.Tensor], th.Tensor, th.Tensor]:
        obs = {k: th.as_tensor(data[k][idx]) for k in ("stages", "devices", "plan")}
        return obs, th.as_tensor(data["mask"][idx]), th.as_tensor(target[idx])

    def logits(obs: dict[str, th.Tensor], mask: th.Tensor) -> th.Tensor:
        latent = policy.mlp_extractor.forward_actor(policy.extract_features(obs, policy.pi_features_extractor))
        return policy.action_net(latent).masked_fill(~mask, -1e9)

    history = []
    policy.set_training_mode(True)
    for epoch in range(config.epochs):
        gen.shuffle(train_idx)
        total, count = 0.0, 0
        for i in range(0, len(train_idx), config.batch_size):
            obs, mask, tgt = batch(train_idx[i:i + config.batch_size])
            logp = th.log_softmax(logits(obs, mask), dim=1)
            loss = -(tgt * logp).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            total += float(loss.detach()) * len(mask)
            count += len(mask)
        with th.no_grad():
            obs, mask, tgt = batch(held)
            pick = logits(obs, mask).argmax(dim=1)
            improves = (th.as_tensor(data["gains"][held]).gather(1, pick[:, None])[:, 0] > 0).float().mean()
            top = (tgt.gather(1, pick[:, None])[:, 0] >= tgt.max(dim=1).values - 1e-6).float().mean()
        row = {"imitation/epoch": epoch + 1, "imitation/loss": total / max(count, 1),
               "imitation/held_pick_improves": float(improves), "imitation/held_pick_is_best": float(top)}
        history.append(row)
        if log is not None:
            log(row)
    policy.set_training_mode(False)
    return history


def pretrain(policy: Any, config: ImitationConfig, *, seed: int, max_steps: int = 24, max_calls: int = 40,
             repeat_scenario: int = 4, single_start_share: float = 0.3, progress_bar: bool = True,
             log: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Collect ``config.states`` labelled states in ``config.workers`` processes and fit ``policy``
    to them; returns a summary (states, seconds of collection and fitting, the last epoch's metrics)."""
    import multiprocessing as mp

    from tqdm import tqdm

    kwargs = {"oracle_share": config.oracle_share, "max_steps": max_steps, "max_calls": max_calls,
              "repeat_scenario": repeat_scenario, "single_start_share": single_start_share}
    workers = max(1, config.workers)
    shares = [config.states // workers + (i < config.states % workers) for i in range(workers)]
    jobs = [(n, seed * 1000 + 500 + i, kwargs) for i, n in enumerate(shares) if n]
    t0 = time.perf_counter()
    with tqdm(total=config.states, desc="imitation: label states", unit="state", disable=not progress_bar) as bar:
        if len(jobs) == 1:
            parts = [collect_states(jobs[0][0], seed=jobs[0][1], progress=bar.update, **kwargs)]
        else:
            with mp.get_context("spawn").Pool(len(jobs)) as pool:
                parts = pool.map(_collect_worker, jobs)
            bar.update(config.states)
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    collected = time.perf_counter() - t0
    history = fit_policy(policy, data, config=config, seed=seed, log=log)
    fitted = time.perf_counter() - t0 - collected
    last = history[-1] if history else {}
    return {"states": int(len(data["mask"])), "collect_seconds": round(collected, 1),
            "fit_seconds": round(fitted, 1), **{k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                                                 for k, v in last.items()}}
