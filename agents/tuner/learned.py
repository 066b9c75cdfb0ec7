"""Learned guidance inside the AdaPtis tuner: which move family next, which neighbours first, how many.

The plain tuner (:class:`agents.tuner.AdaptisTuner`) runs its three phases in a fixed order and
simulates every neighbour of each. ``learned`` (``search --method learned``) is the same tuner
(same seeds, named plans, perturbations, budgets) with a :class:`MovePolicy` in its local search:

* the neighbours of a phase are grouped in four **move families**: ``partition`` (stage sizes),
  ``placement`` (stages moved to other devices, other placement families), ``budget`` (the list
  scheduler's per-device activation budgets) and ``schedule`` (W deferral, fused B, forward
  priority, recomputation, deferred-W limit);
* an online **bandit** (:class:`FamilyBandit`, UCB1 on improvements per simulator call, adapted
  within one search; a move back to a plan already simulated counts as none) picks the family to
  try next; after the first local optimum, every other descent from a perturbation takes the
  families in the tuner's order instead (:attr:`MovePolicy.descents`);
* an offline **prior** (:class:`MovePrior`, a logistic regression on 30 cheap features of a move:
  its family and size, the change of the heaviest device's load it makes, the bottleneck device's
  bubble and memory share, stages per device...) ranks the family's neighbours, and only the next
  ``chunk`` of them is simulated; the best one that improves the plan is taken at once.
* A family whose every neighbour was simulated without a gain is closed until the plan changes;
  a round ends (and the tuner perturbs, as it does) only when all four are closed, so the local
  optimum it stops at is one the plain tuner would stop at too.

Before the local search, ``learned`` also simulates the tuner's starting plans (named schedules and
seeds) in a learned order (:mod:`agents.tuner.start_prior`): the same starts and the same local search
under a budget in calls, the best start sooner.

The prior is trained on the plain tuner's own accepted and rejected moves on draws of
:data:`env.scenarios.TRAIN_SCENARIO` (never the held-out family or sizes):
``python -m experiments train --prior moves --out agents/policies`` writes ``agents/policies/learned_prior.json``
(:func:`train_prior`, deterministic by seed). Its features and its dot product are computed in the
search, so their time is part of the method's wall time.
"""

from __future__ import annotations

import json
import math
import operator
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agents.tuner.start_prior import StartPrior, load_start_prior, read_linear_prior
from pipeline.balance import device_loads
from pipeline.candidates import Candidate, Scenario, objective_key
from pipeline.errors import ConfigError
from pipeline.evaluator import Evaluator
from pipeline.simulator import Result

__all__ = ["MOVE_FAMILIES", "DESCENTS", "FEATURES", "DEFAULT_PRIOR", "FamilyBandit", "MovePrior", "MovePolicy",
           "move_family", "move_features", "load_prior", "learned_tuner", "random_prior_tuner", "collect_moves",
           "fit_prior", "train_prior"]

#: The move families, in the plain tuner's order.
MOVE_FAMILIES = ("partition", "placement", "budget", "schedule")
#: What :attr:`MovePolicy.descents` takes.
DESCENTS = ("alternate", "bandit")
#: The phase of :class:`agents.tuner.AdaptisTuner` each family's neighbours come from.
_PHASE = {"partition": 0, "placement": 1, "budget": 2, "schedule": 2}
_KNOBS = ("split_backward", "eager_w", "depth_first", "cap_counts_w", "max_pending_w", "recompute", "budgets_none",
          "order")
#: The prior's input, one number each (see :func:`move_features`).
FEATURES = (
    *(f"family:{f}" for f in MOVE_FAMILIES), "position", "log_neighbours", "units_moved", "d_max_load", "d_load_sq",
    "load_better", "load_worse", "stages_ratio", "budget_delta", "budget_devices", "budget_up_full",
    *(f"knob:{k}" for k in _KNOBS), "bubble_max", "bubble_mean", "memory_max", "stages_per_device", "overflow",
    "fixed_order", "placement_family")
#: The shipped prior.
DEFAULT_PRIOR = Path(__file__).parents[1] / "policies" / "learned_prior.json"
PRIOR_VERSION = 1


def move_family(c: Candidate, n: Candidate) -> str:
    """The family of the move from ``c`` to ``n`` (one of :data:`MOVE_FAMILIES`)."""
    if n.placement != c.placement:
        return "placement"
    if n.sizes != c.sizes:
        return "partition"
    if n.order == c.order == "list" and n.budgets is not None and c.budgets is not None and n.budgets != c.budgets \
            and (n.split_backward, n.eager_w, n.depth_first, n.cap_counts_w, n.max_pending_w, n.recompute) == \
            (c.split_backward, c.eager_w, c.depth_first, c.cap_counts_w, c.max_pending_w, c.recompute):
        return "budget"
    return "schedule"


@dataclass
class _Context:
    """What the features of one state's moves share (computed once per state)."""

    costs: np.ndarray
    speeds: Any
    devices: int
    loads: np.ndarray
    row: list[float]
    memory_full: int
    prefix: list[float] = field(default_factory=list)
    """``costs``' prefix sums from 0, as :func:`device_loads` computes them (for :meth:`loads_of`)."""
    loads_sq: float = 0.0
    """``(loads ** 2).sum()``."""
    top: float = 0.0
    """``loads.max()``."""

    @classmethod
    def of(cls, c: Candidate, result: Result, scenario: Scenario) -> _Context:
        costs = np.array([x.f + x.b + x.w for x in scenario.profile.layers])
        P = scenario.devices
        speeds = scenario.cluster.speeds
        loads = device_loads(costs, c.sizes, c.placement, devices=P, speeds=speeds)
        prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))]).tolist()
        if result.valid:
            bubble = result.bubble
            mem = [p / m if m > 0 else 0.0 for p, m in zip(result.peak_memory, result.memory_limit)]
            row = [max(bubble), float(np.mean(bubble)), min(2.0, max(mem))]
            full = int(np.argmax(mem))
        else:
            row, full = [0.0, 0.0, 1.0], 0
        key = objective_key(result)
        row += [len(c.sizes) / P, float(key[0] != 0), float(c.order != "list")]
        return cls(costs, speeds, P, loads, row, full, prefix, float((loads ** 2).sum()), float(loads.max()))

    def loads_of(self, sizes: tuple[int, ...], placement: tuple[int, ...]) -> list[float]:
        """:func:`device_loads` of a neighbour, bit for bit (the same sums and quotients, in the same
        order, in plain floats: a few microseconds where numpy takes ~15 for a few dozen stages)."""
        P, pre = self.devices, self.prefix
        if len(sizes) != len(placement) or not placement or min(placement) < 0 or max(placement) >= P \
                or min(sizes) < 0 or sum(sizes) >= len(pre) or (self.speeds is not None and len(self.speeds) < P):
            return device_loads(self.costs, sizes, placement, devices=P, speeds=self.speeds).tolist()  # or its error
        out = [0.0] * P
        b = 0
        for d, k in zip(placement, sizes):
            out[d] += pre[b + k] - pre[b]
            b += k
        if self.speeds is not None:
            out = [x / float(v) for x, v in zip(out, self.speeds[:P])]
        return out


def move_features(c: Candidate, n: Candidate, family: str, *, position: float, count: int, ctx: _Context
                  ) -> list[float]:
    """The numbers :class:`MovePrior` scores a move by, in :data:`FEATURES` order; no simulation."""
    f = [float(family == x) for x in MOVE_FAMILIES]
    f += [position, math.log1p(count)]
    moved = 0.5 * sum(map(abs, map(operator.sub, n.sizes, c.sizes))) if len(n.sizes) == len(c.sizes) else 0.0
    top = ctx.top
    if n.sizes != c.sizes or n.placement != c.placement:
        new = ctx.loads_of(n.sizes, n.placement)
        d_max = (max(new) - top) / max(top, 1e-12)
        d_sq = (float((np.array(new) ** 2).sum()) - ctx.loads_sq) / max(top * top * ctx.devices, 1e-12)
    else:
        d_max = d_sq = 0.0
    f += [math.log1p(moved), 10 * d_max, 10 * d_sq, float(d_max < -1e-9), float(d_max > 1e-9),
          math.log(len(n.sizes) / len(c.sizes))]
    delta, changed, up_full = 0.0, 0.0, 0.0
    if family == "budget":
        d = [b - a for a, b in zip(c.budgets, n.budgets)]
        delta = sum(d) / len(d)
        changed = sum(1 for x in d if x) / len(d)
        up_full = float(d[ctx.memory_full] > 0) * ctx.row[2]
    f += [max(-4.0, min(4.0, delta)), changed, up_full]
    knobs = [float(n.split_backward != c.split_backward), float(n.eager_w != c.eager_w),
             float(n.depth_first != c.depth_first), float(n.cap_counts_w != c.cap_counts_w),
             float(n.max_pending_w != c.max_pending_w), float(n.recompute != c.recompute),
             float(n.budgets is None and c.budgets is not None), float(n.order != c.order)]
    f += knobs if family == "schedule" else [0.0] * len(knobs)
    f += ctx.row
    f.append(float(family == "placement" and len(n.sizes) != len(c.sizes)))
    return f


@dataclass
class MovePrior:
    """A logistic regression over :data:`FEATURES`: the log-odds that a move improves the plan."""

    weights: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    bias: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def scores(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.mean) / self.std) @ self.weights + self.bias

    def to_json(self) -> dict[str, Any]:
        return {"version": PRIOR_VERSION, "features": list(FEATURES),
                "weights": [round(float(w), 6) for w in self.weights],
                "mean": [round(float(m), 6) for m in self.mean], "std": [round(float(s), 6) for s in self.std],
                "bias": round(float(self.bias), 6), **self.meta}

    @classmethod
    def random(cls, seed: int = 0) -> MovePrior:
        """Weights drawn from a standard normal (the ablation: a prior that knows nothing)."""
        rng = np.random.default_rng(seed)
        k = len(FEATURES)
        return cls(rng.standard_normal(k), np.zeros(k), np.ones(k), meta={"random_seed": seed})


def load_prior(path: str | Path | None = None) -> MovePrior:
    """The prior saved at ``path`` (default: the shipped one); anything unreadable is one ConfigError."""
    path = Path(path) if path is not None else DEFAULT_PRIOR
    arrays, data = read_linear_prior(path, version=PRIOR_VERSION, features=FEATURES, what="learned tuner prior",
                                     field="--prior")
    try:
        bias = float(data.get("bias", 0.0))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"learned tuner prior {path} cannot be read: bias: {exc}", field="--prior") from None
    meta = {k: v for k, v in data.items() if k not in ("version", "features", "weights", "mean", "std", "bias")}
    return MovePrior(*arrays, bias=bias, meta=meta)


class FamilyBandit:
    """UCB1 over the move families: the mean is improvements per simulator call (with one prior
    success in two calls), the bonus ``c * sqrt(ln N / n)`` over calls spent; deterministic."""

    def __init__(self, families: Sequence[str] = MOVE_FAMILIES, *, c: float = 1.0) -> None:
        self.c = c
        self.calls = {f: 0 for f in families}
        self.wins = {f: 0.0 for f in families}

    def pick(self, open_families: Sequence[str]) -> str:
        total = sum(self.calls.values()) + 1
        return max(open_families, key=lambda f: (self.score(f, total), -MOVE_FAMILIES.index(f)))

    def score(self, family: str, total: int | None = None) -> float:
        total = total if total is not None else sum(self.calls.values()) + 1
        n = self.calls[family]
        return (self.wins[family] + 1) / (n + 2) + self.c * math.sqrt(math.log(total + 1) / (n + 1))

    def update(self, family: str, *, calls: int, gain: float) -> None:
        """``calls`` new simulator calls spent on ``family``; ``gain`` > 0 when they improved the plan."""
        self.calls[family] += calls
        self.wins[family] += float(gain > 0)


@dataclass
class MovePolicy:
    """The hook :class:`agents.tuner.AdaptisTuner` calls for each round of its local search (see the
    module docstring). ``prior`` None: the tuner's own order of neighbours; ``bandit`` False: the
    families in the tuner's order; ``chunk`` None: every neighbour of a family at once."""

    prior: MovePrior | None = None
    bandit: bool = True
    chunk: int | None = 4
    ucb_c: float = 1.0
    """UCB1's exploration constant (1.0: chosen on draws of the training distribution, 0.3 and 2 tried)."""
    descents: Literal["alternate", "bandit"] = "alternate"
    """How the descents from perturbations (every round after the first one without a gain) pick
    their families: ``"alternate"``, every other one in the tuner's order of families and the rest
    by the bandit (which still counts what the fixed ones spend and win); ``"bandit"``, all by the
    bandit. A hedge: the bandit's families reach the target sooner on most scenarios, the tuner's
    order escapes some local optima that the bandit's keep falling back into."""
    record: Callable[[list[float], bool], None] | None = None
    """Called with (features, improved) for every simulated move (training data)."""
    _ev: Evaluator | None = field(default=None, repr=False)
    _bandit: FamilyBandit | None = field(default=None, repr=False)
    _stalls: int = field(default=0, repr=False)
    """Rounds of this search that ended without a gain."""

    def __post_init__(self) -> None:
        if self.descents not in DESCENTS:
            raise ConfigError(f"descents must be one of {DESCENTS}, got {self.descents!r}", field="descents")

    def round(self, phases: Sequence[Callable], current: Candidate, current_key: tuple, *, scenario: Scenario,
              rng: random.Random, ev: Evaluator, state: Any, clock: Any) -> tuple[Candidate, tuple, bool]:
        """Try families until one move improves ``current`` (returned with its key and True) or every
        family's neighbours are spent without a gain (``current``, its key, False)."""
        if ev is not self._ev or self._bandit is None:  # a new search: a fresh bandit
            self._ev, self._bandit = ev, FamilyBandit(c=self.ucb_c)
            self._stalls = 0
        use_bandit = self.bandit and (self.descents == "bandit" or self._stalls % 2 == 0)
        result = ev.result(current)
        ctx = _Context.of(current, result, scenario)
        made: dict[int, list[Candidate]] = {}
        queues: dict[str, list[Candidate]] = {}
        open_families = list(MOVE_FAMILIES)
        while open_families and not clock.spent():
            family = self._bandit.pick(open_families) if use_bandit else open_families[0]
            if family not in queues:
                queues[family] = self._ranked(family, phases, made, current, result, scenario, rng, ev, ctx)
            queue = queues[family]
            take = len(queue) if self.chunk is None else self.chunk
            batch, new = [], 0
            while queue and new < take:  # known candidates cost no call: they come along for free
                item = queue.pop()
                batch.append(item)
                new += not ev.known(item[0])
            revisits = {n for n, _ in batch if ev.known(n)}
            calls0 = ev.calls
            best_n, best_k = None, current_key
            for n, k in state.offer_all([n for n, _ in batch], clock):
                if k < best_k:
                    best_n, best_k = n, k
            if self.record is not None:  # the tuner's filter (allowed) may have skipped some
                for n, feats in batch:
                    if ev.known(n):
                        self.record(feats, _improves(objective_key(ev.result(n)), current_key))
            # a move back to a plan simulated before is no win of the family's: it costs no call and
            # mostly undoes a perturbation (counted, it drew the bandit to such families)
            won = best_n is not None and best_n not in revisits
            self._bandit.update(family, calls=ev.calls - calls0, gain=float(won))
            if best_n is not None:
                return best_n, best_k, True
            if not queue:
                open_families.remove(family)
        self._stalls += 1
        return current, current_key, False

    def _ranked(self, family: str, phases: Sequence[Callable], made: dict[int, list[Candidate]], current: Candidate,
                result: Result, scenario: Scenario, rng: random.Random, ev: Evaluator, ctx: _Context) -> list:
        """The family's neighbours as a stack (the next to simulate last)."""
        p = _PHASE[family]
        if p not in made:
            made[p] = list(phases[p](current, result, scenario, rng, ev))
        mine, seen = [], set()
        for n in made[p]:
            if n not in seen and move_family(current, n) == family:
                seen.add(n)
                mine.append(n)
        if not mine:
            return []
        count = len(mine)
        feats = [move_features(current, n, family, position=i / count, count=count, ctx=ctx)
                 for i, n in enumerate(mine)]
        if self.prior is None:
            order = list(range(count))
        else:
            s = self.prior.scores(np.asarray(feats))
            order = sorted(range(count), key=lambda i: (-s[i], i))
        return [(mine[i], feats[i]) for i in reversed(order)]


def _improves(key: tuple, current_key: tuple) -> bool:
    """Better beyond rounding (feasibility, overflow, or time by more than one part in 10^9)."""
    if key[0] != current_key[0] or key[1] != current_key[1]:
        return key < current_key
    return key[2] < current_key[2] * (1 - 1e-9)


def learned_tuner(*, prior: MovePrior | str | Path | None = "default", bandit: bool = True, chunk: int | None = 4,
                  starts: StartPrior | str | Path | None = "default",
                  descents: Literal["alternate", "bandit"] = "alternate",
                  name: str = "learned"):
    """The tuner with :class:`MovePolicy` (``prior``: a :class:`MovePrior`, a JSON path, ``"default"``
    for the shipped one, ``None`` for the tuner's own order; ``descents``: see
    :attr:`MovePolicy.descents`) and a learned order of its starting plans (``starts``: a
    :class:`agents.tuner.start_prior.StartPrior`, a JSON path, ``"default"``, ``None`` for the tuner's own
    order)."""
    from agents.tuner.core import AdaptisTuner

    if isinstance(prior, (str, Path)):
        prior = load_prior(None if prior == "default" else prior)
    if isinstance(starts, (str, Path)):
        starts = load_start_prior(None if starts == "default" else starts)
    return AdaptisTuner(name=name, move_policy=MovePolicy(prior=prior, bandit=bandit, chunk=chunk, descents=descents),
                        start_prior=starts)


def random_prior_tuner(*, seed: int = 0, name: str = "learned-random"):
    """The ablation of ``learned``: the same tuner, bandit and chunks with priors of random weights
    (:meth:`MovePrior.random`, :meth:`agents.tuner.start_prior.StartPrior.random`), so what the trained
    weights add is ``learned`` against it."""
    return learned_tuner(prior=MovePrior.random(seed), starts=StartPrior.random(seed), name=name)


# ------------------------------------------------------------------ training


def collect_moves(scenarios: Sequence[Scenario], *, calls: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(features, improved) of every move the tuner's local search simulates on ``scenarios``: every
    family's neighbours in full, in the tuner's order (no prior, no bandit, no chunks), so each visited
    state labels all its moves."""
    from agents.base import Budget
    from agents.tuner.core import AdaptisTuner

    X: list[list[float]] = []
    y: list[bool] = []
    policy = MovePolicy(prior=None, bandit=False, chunk=None, record=lambda f, ok: (X.append(f), y.append(ok)))
    for i, scenario in enumerate(scenarios):
        AdaptisTuner(move_policy=policy).search(scenario, budget=Budget(sim_calls=calls), seed=seed + i)
    return np.asarray(X, dtype=float).reshape(-1, len(FEATURES)), np.asarray(y, dtype=float)


def fit_prior(X: np.ndarray, y: np.ndarray, *, l2: float = 1e-2, steps: int = 60) -> MovePrior:
    """L2-regularised logistic regression by Newton's method (deterministic)."""
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    std[std < 1e-9] = 1.0
    Z = np.hstack([(X - mean) / std, np.ones((len(X), 1))])
    w = np.zeros(Z.shape[1])
    reg = l2 * len(X) * np.eye(Z.shape[1])
    reg[-1, -1] = 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(Z @ w, -30, 30)))
        grad = Z.T @ (p - y) + reg @ w
        H = (Z * (p * (1 - p))[:, None]).T @ Z + reg + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(H, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return MovePrior(w[:-1], mean, std, bias=float(w[-1]))


def train_prior(*, scenarios: int = 40, calls: int = 1000, seed: int = 0, out: str | Path | None = DEFAULT_PRIOR,
                command: str = "") -> MovePrior:
    """Draw ``scenarios`` training scenarios (:data:`env.scenarios.TRAIN_SCENARIO`, seeds ``seed``...),
    label the tuner's moves on them (:func:`collect_moves`), fit the prior on 90% of the scenarios and
    report its ranking on the held-back tenth; write it to ``out``."""
    from env.scenarios import TRAIN_SCENARIO, sample_scenario

    drawn = [sample_scenario(np.random.default_rng(seed + i), TRAIN_SCENARIO) for i in range(scenarios)]
    cut = max(1, scenarios - max(1, scenarios // 10))
    X, y = collect_moves(drawn[:cut], calls=calls, seed=seed)
    if len(y) == 0 or y.min() == y.max():
        raise ConfigError(f"{scenarios} draws of {calls} calls labelled {len(y)} moves, not both kept and rejected "
                          "ones: raise --prior-scenarios or --prior-calls", field="--prior-calls")
    Xv, yv = collect_moves(drawn[cut:], calls=calls, seed=seed + cut)
    prior = fit_prior(X, y)
    s = prior.scores(Xv) if len(Xv) else np.zeros(0)
    auc = _auc(s, yv) if len(yv) and 0 < yv.sum() < len(yv) else float("nan")
    prior.meta = {"command": command, "seed": seed, "scenarios": scenarios, "calls": calls, "moves": int(len(y)),
                  "improving_share": round(float(y.mean()), 4) if len(y) else 0.0,
                  "heldback_moves": int(len(yv)), "heldback_auc": round(auc, 4)}
    if out is not None:
        Path(out).write_text(json.dumps(prior.to_json(), indent=1) + "\n")
    return prior


def _auc(s: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (ties counted half)."""
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
