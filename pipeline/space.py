"""The plan space that search and RL move in: a compact, editable description of a plan.

A :class:`Candidate` fixes the partition (layers per stage), the placement (device per stage) and
how the schedule is generated: a fixed order (``1f1b``, ``interleaved``, ``gpipe``,
``looped-bfs``, ``zbv``) or the memory-aware list scheduler with its knobs (per-device
activation budgets in micro-batches, I/W split, deferred or eager W, depth-first forwards).
:func:`materialize` turns it into a :class:`~pipeline.plan.Plan`; :class:`Evaluator` simulates
candidates, counts simulator calls and caches repeats.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.errors import PlanError
from pipeline.plan import (
    Plan,
    interleaved_placement,
    partition_from_sizes,
    sequential_placement,
    v_placement,
    wave_placement,
)
from pipeline.schedules import (
    ListSchedulerConfig,
    budget_caps,
    gpipe_order,
    interleaved_order,
    list_schedule,
    looped_bfs_order,
    one_f_one_b_order,
    zbv_order,
)
from pipeline.simulator import Result, simulate, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = [
    "ORDERS",
    "PLACEMENT_KINDS",
    "Candidate",
    "Problem",
    "Evaluator",
    "make_placement",
    "balanced_sizes",
    "materialize",
    "objective_key",
    "preset_budgets",
]

ORDERS = ("list", "1f1b", "gpipe", "interleaved", "looped-bfs", "zbv")
PLACEMENT_KINDS = ("sequential", "interleaved", "v", "wave")


@dataclass(frozen=True)
class Problem:
    """One scenario: a model's profile, a cluster, micro-batches per iteration, training settings."""

    profile: ModelProfile
    cluster: Cluster
    microbatches: int
    training: TrainingConfig = TrainingConfig()

    @property
    def devices(self) -> int:
        return self.cluster.devices


@dataclass(frozen=True)
class Candidate:
    """An editable plan description (see the module docstring)."""

    sizes: tuple[int, ...]
    """Layers per stage, in order."""
    placement: tuple[int, ...]
    """Device of each stage."""
    order: str = "list"
    """How the schedule is generated: one of ORDERS."""
    budgets: tuple[float, ...] | None = None
    """List scheduler: activation budget per device, in micro-batches of that device's stages."""
    split_backward: bool = True
    eager_w: bool = False
    depth_first: bool = True
    max_pending_w: int | None = None
    cap_counts_w: bool = True
    recompute: tuple[bool, ...] | None = None
    """Per stage: recompute its activations in the backward (see ``Plan.recompute``); None: none."""

    @property
    def num_stages(self) -> int:
        return len(self.sizes)

    def describe(self) -> str:
        knobs = ""
        if self.order == "list":
            b = "inf" if self.budgets is None else ",".join(f"{x:g}" for x in self.budgets)
            knobs = (f" budgets=[{b}] {'I/W' if self.split_backward else 'B'}"
                     f"{' eager-W' if self.eager_w else ''}{'' if self.depth_first else ' breadth'}")
        if self.recompute is not None and any(self.recompute):
            knobs += f" recompute={[s for s, r in enumerate(self.recompute) if r]}"
        return f"{self.order} sizes={list(self.sizes)} placement={list(self.placement)}{knobs}"


def preset_budgets(name: str | None, devices: int) -> tuple[float, ...] | None:
    """Per-device activation budgets (micro-batches) of a named schedule's memory: ``zb-h1`` /
    ``1f1b``, ``zb-h2``, ``zbv``, ``v-half``, ``v-min``; ``None`` for any other name (unlimited)."""
    P = devices
    table = {
        "zb-h1": [P - d for d in range(P)],
        "1f1b": [P - d for d in range(P)],
        "zb-h2": [2 * (P - d) - 1 for d in range(P)],
        "zbv": [P] * P,
        "v-half": [(P + 2) / 2] * P,
        "v-min": [(P + 4) / 3] * P,
    }
    return None if name not in table else tuple(float(x) for x in table[name])


def make_placement(kind: str, devices: int, chunks: int) -> tuple[int, ...]:
    """A named placement of ``devices * chunks`` stages."""
    if kind == "sequential" or chunks == 1:
        return sequential_placement(devices)
    if kind == "interleaved":
        return interleaved_placement(devices, chunks)
    if kind == "v":
        if chunks != 2:
            return wave_placement(devices, chunks)
        return v_placement(devices)
    if kind == "wave":
        return wave_placement(devices, chunks)
    raise PlanError(f"unknown placement {kind!r}; use one of {PLACEMENT_KINDS}", field="placement")


def balanced_sizes(profile: ModelProfile, placement: Sequence[int], cluster: Cluster,
                   weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """Layers per stage minimising the heaviest stage's time (cost-aware dynamic program).

    A stage's time is its layers' ``f + b + w`` over its device's speed (``weights`` overrides
    the per-layer cost). Exact DP over prefix sums, vectorised over split points.
    """
    S, L = len(placement), profile.num_layers
    if S > L:
        raise PlanError(f"{S} stages need at least {S} layers; the model has {L}", field="partition")
    cost = np.asarray(weights if weights is not None else
                      [x.f + x.b + x.w for x in profile.layers], dtype=float)
    pre = np.concatenate([[0.0], np.cumsum(cost)])
    speeds = cluster.speeds
    inf = math.inf
    # best[s][j]: minimal max stage time covering layers [0, j) with stages 0..s.
    best = np.full((S, L + 1), inf)
    arg = np.zeros((S, L + 1), dtype=int)
    best[0, 1:] = pre[1:] / speeds[placement[0]]
    for s in range(1, S):
        sp = speeds[placement[s]]
        for j in range(s + 1, L - (S - 1 - s) + 1):
            i = np.arange(s, j)
            vals = np.maximum(best[s - 1, i], (pre[j] - pre[i]) / sp)
            k = int(np.argmin(vals))
            best[s, j] = vals[k]
            arg[s, j] = i[k]
    sizes, j = [], L
    for s in range(S - 1, 0, -1):
        i = int(arg[s, j])
        sizes.append(j - i)
        j = i
    sizes.append(j)
    return tuple(reversed(sizes))


def _fixed_order(c: Candidate, devices: int, microbatches: int):
    S, P = c.num_stages, devices
    if c.order in ("1f1b", "gpipe"):
        if c.placement != sequential_placement(P):
            raise PlanError(f"{c.order} needs one stage per device in order", field="placement")
        return (one_f_one_b_order if c.order == "1f1b" else gpipe_order)(P, microbatches)
    if c.order in ("interleaved", "looped-bfs"):
        chunks = S // P
        if S % P or c.placement != interleaved_placement(P, chunks):
            raise PlanError(f"{c.order} needs the interleaved placement", field="placement")
        return (interleaved_order if c.order == "interleaved" else looped_bfs_order)(P, chunks, microbatches)
    if c.order == "zbv":
        if c.placement != v_placement(P):
            raise PlanError("the ZB-V order needs the V placement", field="placement")
        return zbv_order(P, microbatches)
    raise PlanError(f"unknown order {c.order!r}; use one of {ORDERS}", field="order")


def materialize(c: Candidate, problem: Problem) -> Plan:
    """The plan a candidate describes."""
    P, M = problem.devices, problem.microbatches
    partition = partition_from_sizes(c.sizes)
    if c.recompute is not None and len(c.recompute) != c.num_stages:
        raise PlanError(f"has {len(c.recompute)} entries for {c.num_stages} stages", field="recompute")
    if c.order == "list":
        costs = stage_costs(problem.profile, problem.cluster, partition, c.placement, problem.training,
                            c.recompute)
        caps = None if c.budgets is None else budget_caps(costs, c.placement, P, c.budgets)
        config = ListSchedulerConfig(caps=caps, split_backward=c.split_backward, eager_w=c.eager_w,
                                     depth_first=c.depth_first, max_pending_w=c.max_pending_w,
                                     cap_counts_w=c.cap_counts_w)
        order = list_schedule(costs, c.placement, P, M, config)
    else:
        order = _fixed_order(c, P, M)
    return Plan(P, M, partition, c.placement, order, {"method": "candidate", "candidate": c.describe()},
                recompute=c.recompute)


def objective_key(result: Result) -> tuple[int, float, float]:
    """Lexicographic goal: feasible first, then least memory overflow, then fastest."""
    if not result.valid:
        return (2, math.inf, math.inf)
    over = sum(max(0.0, p - lim) for p, lim in zip(result.peak_memory, result.memory_limit))
    return (0 if over <= 0 else 1, over, result.iteration_time)


class Evaluator:
    """Simulates candidates for one problem; counts simulator calls and caches repeats."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.calls = 0
        self.started = time.perf_counter()
        self._cache: dict[Candidate, tuple[Plan, Result]] = {}

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def evaluate(self, c: Candidate) -> tuple[Plan, Result]:
        """(plan, result) of a candidate; an impossible candidate gives an invalid result."""
        hit = self._cache.get(c)
        if hit is not None:
            return hit
        p = self.problem
        try:
            plan = materialize(c, p)
        except PlanError as exc:
            dummy = Plan(p.devices, p.microbatches, ((0, p.profile.num_layers),), (0,), ((),) * p.devices)
            res = simulate(dummy, p.profile, p.cluster, p.training)
            res.error = str(exc)
            self._cache[c] = (dummy, res)
            return dummy, res
        self.calls += 1
        res = simulate(plan, p.profile, p.cluster, p.training, validate=False, record_timeline=False)
        self._cache[c] = (plan, res)
        return plan, res

    def key(self, c: Candidate) -> tuple[int, float, float]:
        return objective_key(self.evaluate(c)[1])

