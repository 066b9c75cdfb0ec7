"""A learned order of the tuner's starting plans: which of them to simulate first.

Before its local search the AdaPtis tuner (:class:`agents.tuner.AdaptisTuner`) simulates about 20
named schedules (1F1B, ZB-H1, ZB-V... at Megatron's split and at the DP-balanced one) and 50-200
seeds (every placement family under several activation budgets), always in the same order. On a
third to a half of held-out scenarios the best of them is already the search's answer, and the
plain order reaches it at call 13-60 (the balanced named plans come after the Megatron-split ones,
which on heterogeneous models are rarely the best).

:class:`StartPrior` scores every start from numbers that need no simulation (what it is: a named
method or a seed of a placement family; its split; its budgets' depth against what memory holds;
how uneven the devices' loads are; and those against a few numbers of the scenario: how tight its
memory is, micro-batches per device, mixed speeds, how heavy the head is) and the tuner, given one
(``AdaptisTuner(start_prior=...)``, part of ``learned``), simulates its starts best-scored first.
It simulates the same starts, and starts its local search from the same one (the best, ties to the
tuner's own order), so under a budget in calls the search after the starts is the plain path call
for call: only the order of the first calls changes. Under a budget in seconds only the named
plans are reordered (built in Python, they are the dear starts, and they stop at a quarter of the
budget); the seeds keep the tuner's order (listing every seed before the first call would spend a
short budget's time on their splits).

The prior is a linear score fitted by a listwise cross-entropy (softmax over the scenario's starts
against ``softmax(log(best / time) / TAU)`` over the starts that fit) on draws of
:data:`env.scenarios.TRAIN_SCENARIO`, never the held-out family or sizes:
``python -m experiments train --prior starts --out agents/policies`` writes
``agents/policies/learned_starts.json`` (:func:`agents.tuner.start_training.train_start_prior`, deterministic
by seed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.balance import device_loads
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.errors import ConfigError, PlanError
from pipeline.evaluator import Evaluator
from pipeline.plan import Plan
from pipeline.schedules import NAMED_METHODS, method_placement
from pipeline.start_recipes import PLACEMENT_CHOICES, named_schedule_plan, split_sizes

__all__ = ["NamedStart", "START_FEATURES", "DEFAULT_START_PRIOR", "TAU", "StartPrior", "named_starts",
           "start_features", "load_start_prior", "read_linear_prior", "named_plan", "ordered_starts"]

#: The shipped prior.
DEFAULT_START_PRIOR = Path(__file__).parents[1] / "policies" / "learned_starts.json"
START_PRIOR_VERSION = 1
#: Temperature of the training target (log-time units: 0.005 puts most of the weight within ~0.5% of the best;
#: 0.005 had the best validation figure of 0.005, 0.02 and 0.05).
TAU = 0.005
_KINDS = ("sequential", "interleaved", "v", "wave")
_OWN = ("is_named", *(f"named:{m}" for m in NAMED_METHODS), "split_dp", "log_stages_per_device",
        *(f"placement:{k}" for k in (*_KINDS, "other")), "fixed_order", "budgets_none", "budget_depth",
        "budget_over_memory", "cap_counts_w", "max_pending_w", "imbalance")
#: Start features that meet the scenario's (:data:`_SCENARIO`) in products.
_CROSSED = ("is_named", "split_dp", "log_stages_per_device", "fixed_order", "budget_depth", "budget_over_memory",
            "imbalance")
_SCENARIO = ("static_share", "log_fit", "log_mb_per_device", "mixed_speeds", "head_weight")
#: The prior's input, one number each (see :func:`start_features`).
START_FEATURES = (*_OWN, *(f"{a}*{s}" for a in _CROSSED for s in _SCENARIO))


@dataclass(frozen=True)
class NamedStart:
    """A named schedule the tuner simulates as a plan (``balanced``: at the DP-balanced split, else
    Megatron's)."""

    method: str
    balanced: bool

    def describe(self) -> str:
        return f"{self.method}+dp" if self.balanced else self.method


def named_starts(scenario: Scenario) -> list[NamedStart]:
    """The named schedules the tuner starts with, in its own order (Megatron's split first; megatron
    only at its own split)."""
    return [NamedStart(m, b) for b in (False, True) for m in NAMED_METHODS if not (b and m == "megatron")]


def _scenario_row(scenario: Scenario) -> list[float]:
    prof, cl = scenario.profile, scenario.cluster
    P, M = scenario.devices, scenario.microbatches
    cost = np.array([x.f + x.b + x.w for x in prof.layers], dtype=np.float64)
    stage = max(float(cost.sum()) / P, 1e-12)
    act = float(sum(x.act_bytes for x in prof.layers))
    static = sum(x.params for x in prof.layers) * scenario.training.bytes_per_param / P
    limit = float(np.mean(cl.memory_limits_bytes))
    fit = (limit - static) / max(act / P, 1.0) if limit > static else 0.0
    speeds = np.asarray(cl.speeds, dtype=np.float64)
    return [min(2.0, static / limit), math.log2(max(fit, 0.5) / P) / 4, math.log2(M / P) / 4,
            float(speeds.max() / speeds.min() - 1.0), min(4.0, float(cost[-1]) / stage)]


def _placement_kind(placement: tuple[int, ...], refs: dict[tuple[int, ...], str]) -> str:
    return refs.get(placement, "other")


def start_features(scenario: Scenario, ev: Evaluator, starts: Sequence[NamedStart | Candidate]) -> np.ndarray:
    """:data:`START_FEATURES` of each start (rows), from the scenario and the start alone: no simulation
    (the seeds' stage costs and DP splits, which the search computes anyway, are read from ``ev``)."""
    P = scenario.devices
    cost = [x.f + x.b + x.w for x in scenario.profile.layers]
    speeds = scenario.cluster.speeds
    refs: dict[tuple[int, ...], str] = {}
    for kind, chunks in reversed(PLACEMENT_CHOICES):  # sequential last: chunks 1 of any kind is sequential
        try:
            refs[make_placement(kind, P, chunks)] = kind
        except PlanError:
            continue
    scen = _scenario_row(scenario)
    rows = []
    for s in starts:
        f = dict.fromkeys(_OWN, 0.0)
        if isinstance(s, NamedStart):
            f["is_named"] = 1.0
            f[f"named:{s.method}"] = 1.0
            placement = tuple(method_placement("1f1b" if s.method == "megatron" else s.method, P))
            try:
                sizes = split_sizes(ev, placement, "dp" if s.balanced else "megatron")
            except PlanError:  # more stages than layers: it will not build either
                sizes = ()
            f["split_dp"] = float(s.balanced)
        else:
            placement, sizes = s.placement, s.sizes
            f["split_dp"] = float(sizes == ev.balanced_sizes(placement))
            f["fixed_order"] = float(s.order != "list")
            if s.order == "list":
                if s.budgets is None:
                    f["budgets_none"] = 1.0
                    f["budget_depth"] = f["budget_over_memory"] = 4.0
                else:
                    room = ev.memory_budgets(s)
                    f["budget_depth"] = min(4.0, float(np.mean(s.budgets)) / P)
                    f["budget_over_memory"] = min(4.0, max(b / r if r > 0 else 4.0 for b, r in zip(s.budgets, room)))
                f["cap_counts_w"] = float(s.cap_counts_w)
                f["max_pending_w"] = 0.0 if s.max_pending_w is None else min(4.0, s.max_pending_w / P)
        f["log_stages_per_device"] = math.log2(max(1, len(placement)) / P)
        f[f"placement:{_placement_kind(tuple(placement), refs)}"] = 1.0
        if sizes:
            loads = device_loads(cost, sizes, placement, devices=P, speeds=speeds)
            f["imbalance"] = min(4.0, float(loads.max() / max(loads.mean(), 1e-12)) - 1.0)
        else:
            f["imbalance"] = 4.0
        own = [f[k] for k in _OWN]
        rows.append(own + [f[a] * v for a in _CROSSED for v in scen])
    return np.asarray(rows, dtype=float).reshape(-1, len(START_FEATURES))


@dataclass
class StartPrior:
    """A linear score of a start's standardised :data:`START_FEATURES` (higher: simulate earlier)."""

    weights: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def scores(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.mean) / self.std) @ self.weights

    def order(self, X: np.ndarray) -> list[int]:
        """Indices of the rows of ``X``, best-scored first (ties: in the given order)."""
        s = self.scores(X)
        return sorted(range(len(s)), key=lambda i: (-s[i], i))

    def to_json(self) -> dict[str, Any]:
        return {"version": START_PRIOR_VERSION, "features": list(START_FEATURES),
                "weights": [round(float(x), 6) for x in self.weights], "mean": [round(float(x), 6) for x in self.mean],
                "std": [round(float(x), 6) for x in self.std], "meta": self.meta}

    @classmethod
    def random(cls, seed: int = 0) -> StartPrior:
        """A prior of random weights (the ablation)."""
        rng = np.random.default_rng(seed)
        n = len(START_FEATURES)
        return cls(rng.normal(size=n), np.zeros(n), np.ones(n), {"random_seed": seed})


def read_linear_prior(path: Path, *, version: int, features: Sequence[str], what: str, field: str
                      ) -> tuple[list[np.ndarray], dict[str, Any]]:
    """(weights, mean, std) and the whole JSON of a saved linear prior; anything unreadable, of another
    version or other features, or not finite is one ConfigError naming ``field``."""
    n = len(features)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("version") != version:
            raise ValueError(f"expected a JSON object with version {version}")
        if list(data.get("features", ())) != list(features):
            raise ValueError("its features are not this version's (retrain it)")
        arrays = [np.asarray(data[k], dtype=float) for k in ("weights", "mean", "std")]
        if any(a.shape != (n,) or not np.isfinite(a).all() for a in arrays) or (arrays[2] <= 0).any():
            raise ValueError(f"weights, mean and std must be {n} finite numbers (std > 0)")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc}", field=field) from None
    return arrays, data


def load_start_prior(path: str | Path | None = None) -> StartPrior:
    """The prior saved at ``path`` (default: the shipped one); anything unreadable is one ConfigError
    (retrain with ``python -m experiments train --prior starts``)."""
    arrays, data = read_linear_prior(Path(path) if path is not None else DEFAULT_START_PRIOR,
                                     version=START_PRIOR_VERSION, features=START_FEATURES, what="start prior",
                                     field="starts")
    meta = data.get("meta", {})
    return StartPrior(*arrays, meta=meta if isinstance(meta, dict) else {})


Key = tuple[int, float, float]


def named_plan(scenario: Scenario, ev: Evaluator, start: NamedStart, *, chunks: int | None = None,
               allowed: Callable[[Candidate], bool] | None = None) -> Plan | None:
    """The plan of a named start (:func:`pipeline.start_recipes.named_schedule_plan`; megatron at
    ``chunks`` chunks per device, None: its own choice); None where it cannot be built or ``allowed``
    refuses its sizes and placement."""
    try:  # megatron one chunk count at a time (see NamedTimer)
        plan = named_schedule_plan(ev, start.method, balanced=start.balanced, chunks=chunks)
    except PlanError:
        return None
    if allowed is not None and not allowed(Candidate(plan.stage_sizes, plan.placement)):
        return None
    return plan


def ordered_starts(prior: StartPrior, named: Sequence[NamedStart], seeds: Sequence[Candidate], *, scenario: Scenario,
                   ev: Evaluator, state: Any, clock: Any, build: Callable[[NamedStart], Any]
                   ) -> tuple[Candidate | None, Key | None]:
    """Simulate ``named`` (``build`` makes each one's plan, None if it cannot be built or is not allowed)
    and ``seeds`` in the order of ``prior``, offering each to the tuner's ``state``; return the best seed
    and its key, and leave ``state``'s best as the tuner's own order would (the first best named plan
    unless a seed is strictly better; ties to the first in each list), so the local search and its
    perturbations start where the plain tuner's do. Stops when the budget is spent once a seed has
    been simulated."""
    items: list[NamedStart | Candidate] = [*named, *seeds]
    first_index: dict[Candidate, int] = {}
    for i, c in enumerate(seeds):
        first_index.setdefault(c, i)
    order = prior.order(start_features(scenario, ev, items)) if items else []
    current: tuple[Key, int, Candidate] | None = None  # the best seed, valid or not: where the search starts
    best_seed: tuple[Key, int, Candidate] | None = None  # the best valid seed
    best_named: tuple[Key, int, Any, str] | None = None
    i = 0
    while i < len(order) and not (clock.spent() and current is not None):
        item = items[order[i]]
        if isinstance(item, NamedStart):
            i += 1
            plan = build(item)
            if plan is not None:
                result = ev.simulate_plan(plan)
                key = state.offer_plan(plan, result, note=item.describe())
                rank = (key, order[i - 1])
                if result.valid and (best_named is None or rank < best_named[:2]):
                    best_named = (key, order[i - 1], plan, item.describe())
            continue
        batch = []
        while i < len(order) and not isinstance(items[order[i]], NamedStart):
            batch.append(items[order[i]])
            i += 1
        for c, key in state.offer_all(batch, clock, at_least_one=current is None):
            rank = (key, first_index[c], c)
            if current is None or rank[:2] < current[:2]:
                current = rank
            if ev.result(c).valid and (best_seed is None or rank[:2] < best_seed[:2]):
                best_seed = rank
    if best_seed is not None and (best_named is None or best_seed[0] < best_named[0]):
        state.set_best(best_seed[0], note=best_seed[2].describe(), plan=best_named and best_named[2],
                       candidate=best_seed[2])
    elif best_named is not None:
        state.set_best(best_named[0], note=best_named[3], plan=best_named[2])
    return (None, None) if current is None else (current[2], current[0])
