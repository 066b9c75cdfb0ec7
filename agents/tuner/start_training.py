"""Training of the start prior (:mod:`agents.tuner.start_prior`): every start of the plain tuner simulated on
draws of :data:`env.scenarios.TRAIN_SCENARIO`, and a listwise fit.

``python -m experiments train --prior starts`` runs :func:`train_start_prior`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from agents.listwise import listwise_targets
from agents.tuner.core import iter_seed_candidates
from agents.tuner.start_prior import DEFAULT_START_PRIOR, TAU, StartPrior, named_plan, named_starts, start_features
from env.scenarios import TRAIN_SCENARIO, sample_scenario
from pipeline.candidates import Scenario, objective_key
from pipeline.evaluator import Evaluator

__all__ = ["collect_starts", "fit_start_prior", "first_within", "train_start_prior"]


def collect_starts(scenarios: Sequence[Scenario], *, progress: Callable[[int], None] | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per scenario, (features, times) of every start of the plain tuner (named plans and seeds), each
    simulated; a start that cannot be built or does not fit in memory has time ``inf``."""
    out = []
    for k, scenario in enumerate(scenarios):
        ev = Evaluator(scenario)
        named = named_starts(scenario)
        seeds = list(iter_seed_candidates(scenario, ev))
        times = []
        for s in named:
            plan = named_plan(scenario, ev, s)
            r = ev.simulate_plan(plan) if plan is not None else None
            times.append(r.iteration_time if r is not None and r.valid and r.feasible else math.inf)
        for r in ev.results(seeds):
            times.append(r.iteration_time if r.valid and r.feasible and objective_key(r)[0] == 0 else math.inf)
        out.append((start_features(scenario, ev, [*named, *seeds]), np.asarray(times, dtype=float)))
        if progress is not None:
            progress(k + 1)
    return out


def _targets(times: np.ndarray) -> np.ndarray | None:
    return listwise_targets(times, TAU) if np.isfinite(times).any() else None


def fit_start_prior(groups: Sequence[tuple[np.ndarray, np.ndarray]], *, l2: float = 1e-3, steps: int = 600,
                    lr: float = 0.05) -> StartPrior:
    """The listwise fit (Adam on the mean cross-entropy of the groups, full batch, from zeros:
    deterministic)."""
    data = [(X, q) for X, t in groups if (q := _targets(t)) is not None]
    if not data:
        raise ValueError("no training scenario has a start that fits in memory")
    allX = np.vstack([X for X, _ in data])
    mean = allX.mean(axis=0)
    std = allX.std(axis=0)
    std[std < 1e-9] = 1.0
    Z = [((X - mean) / std, q) for X, q in data]
    w = np.zeros(allX.shape[1])
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for step in range(1, steps + 1):
        grad = l2 * w
        for X, q in Z:
            s = X @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            grad += X.T @ (p - q) / len(Z)
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad ** 2
        w -= lr * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return StartPrior(w, mean, std)


def first_within(order: Sequence[int], times: np.ndarray, *, within: float = 0.005) -> int | None:
    """The 1-based position in ``order`` of the first start within ``within`` of the best (None: none fits)."""
    ok = np.isfinite(times)
    if not ok.any():
        return None
    target = times[ok].min() * (1 + within)
    return next(k + 1 for k, i in enumerate(order) if times[i] <= target)


def train_start_prior(*, scenarios: int = 300, seed: int = 0, out: str | Path | None = DEFAULT_START_PRIOR,
                      command: str = "", progress: Callable[[int], None] | None = None) -> StartPrior:
    """Draw ``scenarios`` training scenarios (:data:`env.scenarios.TRAIN_SCENARIO`, seeds ``seed``...),
    simulate every start of each (:func:`collect_starts`), fit on 90% of them and report, on the
    held-back tenth, the geometric mean of the calls to the first start within 0.5% of the best, the
    prior's order against the tuner's own; write it to ``out``."""
    drawn = [sample_scenario(np.random.default_rng(seed + i), TRAIN_SCENARIO) for i in range(scenarios)]
    groups = collect_starts(drawn, progress=progress)
    cut = max(1, scenarios - max(1, scenarios // 10))
    prior = fit_start_prior(groups[:cut])
    ratios = []
    for X, t in groups[cut:]:
        mine, plain = first_within(prior.order(X), t), first_within(list(range(len(t))), t)
        if mine is not None and plain is not None:
            ratios.append(mine / plain)
    geo = float(np.exp(np.mean(np.log(ratios)))) if ratios else float("nan")
    starts = int(sum(len(t) for _, t in groups))
    prior.meta = {"command": command, "seed": seed, "scenarios": scenarios, "starts": starts,
                  "heldback_scenarios": len(ratios), "heldback_calls_ratio": round(geo, 4)}
    if out is not None:
        Path(out).write_text(json.dumps(prior.to_json(), indent=1) + "\n")
    return prior
