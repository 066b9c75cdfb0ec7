"""Lower bounds on iteration time from the profile and the cluster alone (no plan).

Every bound holds for every plan the simulator accepts (:mod:`pipeline.simulator`): any
partition, placement and schedule, split (I then W) or fused (B) backward. Per layer and
micro-batch the simulator charges ``f`` forward and, for the backward, either ``b + w`` (I and W)
or the measured fused time ``b_full`` (B, when every layer carries one), so a layer's backward is
at least ``back = min(b + w, b_full)`` and the input-gradient step that the next micro-batch's
chain waits on at least ``grad = min(b, b_full)``. Durations are divided by the device's speed
(the fastest one bounds them all). The per-action overhead is paid three times per stage and
micro-batch (F, then I and W or a B priced with two), and every used device holds a stage.
Communication and memory limits only add time and are left out.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pipeline.hardware import memory_bandwidth
from pipeline.runtime import Runtime, runtime_named
from pipeline.spec import Cluster, ModelProfile

__all__ = ["LowerBound", "lower_bound", "packing_load", "MAX_PACKING_STATES", "MAX_PACKING_WORK"]

#: States the packing bound's dynamic program may hold after one device (see :func:`packing_load`).
MAX_PACKING_STATES = 20_000
#: State-by-configuration pairs (plus enumerated configurations, and at least ``_STEP_WORK`` per
#: device step) that one :func:`packing_load` call may spend in its dynamic programs before it
#: settles for the best bound proven so far: bounds the time (milliseconds) whatever the costs.
MAX_PACKING_WORK = 200_000
#: Relative widths within which layer costs are merged into their group's smallest cost, tried in
#: turn until a dynamic program completes (the first keeps distinct costs apart).
_MERGE_TOLERANCES = (1e-9, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5)
_PRECISION = 1e-6
#: The least work one device's step of the program is charged (its fixed cost in array calls).
_STEP_WORK = 400


@dataclass(frozen=True)
class LowerBound:
    """Each bound holds for every plan; ``value`` is the largest."""

    work: float
    """All work of all micro-batches spread perfectly over every device's speed, plus the three
    per-action overheads each micro-batch pays on a used device."""
    heaviest_layer: float
    """A layer is never split: its device runs it for every micro-batch."""
    chain: float
    """One micro-batch's forward through every layer, then its input-gradient back, plus the
    weight-gradient part of one layer (``back - grad``)."""
    critical_layer: float = 0.0
    """A layer's device waits for one micro-batch's forward through the layers before it, runs the
    layer's F and input-gradient for every micro-batch, then either the rest of its backward or the
    input-gradient chain back through the layers before it:
    ``max over layers of fpre + M(f + grad) + max(M(back - grad), gradpre)`` (plus overheads)."""
    packing: float = 0.0
    """Layers are indivisible: a lower bound on the busiest device's load over every way of
    assigning layers to devices (partition and placement free), times the micro-batches.
    0 when not computed."""

    @property
    def value(self) -> float:
        return max(self.work, self.heaviest_layer, self.chain, self.critical_layer, self.packing)

    @property
    def binding(self) -> str:
        """Which bound is the largest."""
        return max(("work", self.work), ("heaviest_layer", self.heaviest_layer), ("chain", self.chain),
                   ("critical_layer", self.critical_layer), ("packing", self.packing), key=lambda kv: kv[1])[0]


def _backward_costs(profile: ModelProfile) -> tuple[list[float], list[float]]:
    """Per layer: the least backward the simulator can charge (``back``) and the least
    input-gradient step (``grad``), reading ``b_full`` and ``b_first`` exactly when :func:`stage_costs`
    does (stage 0's whole backward runs as W where the profile carries ``b_first``)."""
    layers = profile.layers
    if layers and all("b_full" in x.extra for x in layers):
        full = [float(x.extra["b_full"]) for x in layers]
        back, grad = [min(x.b + x.w, bf) for x, bf in zip(layers, full)], [min(x.b, bf) for x, bf in zip(layers, full)]
    else:
        back, grad = [x.b + x.w for x in layers], [x.b for x in layers]
    if layers and all("b_first" in x.extra for x in layers):  # the first stage's whole backward, as W
        first = [float(x.extra["b_first"]) for x in layers]
        back, grad = [min(x, y) for x, y in zip(back, first)], [min(x, y) for x, y in zip(grad, first)]
    return back, grad


def lower_bound(profile: ModelProfile, cluster: Cluster, microbatches: int, *, packing: bool = True,
                runtime: str | Runtime = "ideal", optimizer_shards: int = 1) -> LowerBound:
    """Lower bounds on iteration time, in the profile's time unit; communication counts as free.

    ``packing=False`` skips the packing and critical-layer bounds (the first three only, which the
    RL environment's observation was trained on). ``runtime`` (:mod:`pipeline.runtime`) scales the
    compute, adds its per-action overhead and step time; where iterations overlap, the bounds that
    count one micro-batch's path through the pipeline (chain, critical layer) do not hold and are 0.
    ``optimizer_shards``: the data-parallel ranks a sharded optimizer spreads each device's
    optimizer step over (``TrainingConfig.data_parallel`` under ZeRO >= 1; 1 otherwise)."""
    rt = runtime_named(runtime)
    compute = rt.compute_scale_for(profile)
    speeds = [sp / compute for sp in cluster.speeds]
    fastest = max(speeds)
    M = microbatches
    over = profile.action_overhead + rt.action_overhead_s / profile.seconds_per_unit
    optimizer = _optimizer_floor(profile, cluster, rt) / optimizer_shards
    if rt.step_s or rt.overlap_iterations or optimizer:
        base = lower_bound(profile, cluster, microbatches, packing=packing,
                           runtime=replace(rt, step_s=0.0, overlap_iterations=False, optimizer_bytes_per_param=0.0))
        step = rt.step_s / profile.seconds_per_unit + optimizer
        path = not rt.overlap_iterations  # one micro-batch's path bounds a single iteration only
        return LowerBound(work=base.work + step, heaviest_layer=base.heaviest_layer + step,
                          chain=base.chain + step if path else 0.0,
                          critical_layer=base.critical_layer + step if path and base.critical_layer else 0.0,
                          packing=base.packing + step if base.packing else 0.0)
    back, grad = _backward_costs(profile)
    layers = profile.layers
    forward = [x.f for x in layers]
    per_mb = [f + bk for f, bk in zip(forward, back)]
    work = M * sum(per_mb) / sum(speeds) + 3 * over * M
    heaviest = M * max(per_mb) / fastest + 3 * over * M
    tail = min(map(operator.sub, back, grad))
    chain = (sum(forward) + sum(grad) + tail) / fastest + 3 * over
    if not packing:
        return LowerBound(work=work, heaviest_layer=heaviest, chain=chain)
    critical, f_before, g_before = 0.0, 0.0, 0.0
    for x, bk, g in zip(layers, back, grad):
        rest = max(M * (bk - g) / fastest + M * over, g_before / fastest)
        critical = max(critical, (f_before + M * (x.f + g)) / fastest + 2 * M * over + rest)
        f_before += x.f
        g_before += g
    pack = M * packing_load(per_mb, speeds) + 3 * over * M
    return LowerBound(work=work, heaviest_layer=heaviest, chain=chain, critical_layer=critical, packing=pack)


def _optimizer_floor(profile: ModelProfile, cluster: Cluster, rt: Runtime) -> float:
    """The least optimizer step any plan can have (:func:`pipeline.simulator.optimizer_step_seconds`),
    profile time units: every parameter is held by some device, so the busiest holds at least an
    even share of the distinct ones."""
    bandwidth = memory_bandwidth(cluster) if rt.optimizer_bytes_per_param else None
    if bandwidth is None:
        return 0.0
    distinct: dict[str, int] = {}
    total = 0
    for x in profile.layers:
        group = x.extra.get("shared_group")
        if group is None:
            total += x.params
        else:
            distinct[str(group)] = x.params
    total += sum(distinct.values())
    return rt.optimizer_bytes_per_param * total / cluster.devices / bandwidth / profile.seconds_per_unit


def packing_load(costs: Sequence[float], speeds: Sequence[float]) -> float:
    """A lower bound on the busiest device's time per micro-batch when whole layers of ``costs``
    are spread over devices of ``speeds`` in any way (makespan scheduling on uniform machines).

    Closed-form bounds first (the average; the ``k`` largest layers on the ``k`` fastest devices;
    some device holding ``ceil(m / P)`` of the ``m`` largest), then a bisection on the load whose
    feasibility test is an exact dynamic program over layer-cost types (few distinct costs: a model
    repeats its blocks). When the types' count vectors outnumber :data:`MAX_PACKING_STATES` or the
    program runs past the call's :data:`MAX_PACKING_WORK`, costs within 0.2%, 0.5%, ... 50% of
    each other are merged into their group's smallest cost (a merged scenario is never harder, so
    it stays a valid bound), and the best bound proven so far is returned when the work runs out. Exact when the program
    completes on unmerged costs (to a relative ``1e-6``)."""
    c = np.sort(np.asarray(costs, dtype=np.float64))[::-1]
    if len(c) == 0:
        raise ValueError("costs: give at least one layer cost")
    if (c < 0).any() or not np.isfinite(c).all():
        raise ValueError(f"costs: need finite numbers >= 0, got {sorted(c.tolist())}")
    caps = np.sort(np.asarray(speeds, dtype=np.float64))[::-1]
    if len(caps) == 0 or (caps <= 0).any():
        raise ValueError(f"speeds: need at least one speed > 0, got {list(speeds)}")
    c = c[c > 0]
    if len(c) == 0:
        return 0.0
    caps = caps[:len(c)]  # an optimum never needs more devices than layers, nor a slower one
    best = _closed_form(c, caps)
    hi = _greedy_load(c, caps)
    if best >= hi * (1 - _PRECISION):
        return float(best)
    work = [MAX_PACKING_WORK]
    for tol in _MERGE_TOLERANCES:
        types, counts = _merge(c, tol)
        if math.prod(int(n) + 1 for n in counts) > MAX_PACKING_STATES:
            continue  # more count vectors than the program may hold: merge further
        lo, complete = _bisect(types, counts, caps, best, hi, work)
        best = max(best, lo)
        if complete or work[0] <= 0:
            break
    return float(best)


def _closed_form(c: np.ndarray, caps: np.ndarray) -> float:
    """Bounds that need no search (``c`` and ``caps`` sorted largest first)."""
    P = len(caps)
    prefix = np.concatenate(([0.0], np.cumsum(c)))
    k = min(len(c), P)
    top = float(np.max(prefix[1:k + 1] / np.cumsum(caps)[:k]))
    m = np.arange(1, len(c) + 1)
    q = -(-m // P)
    crowd = float(np.max(prefix[m] - prefix[m - q])) / float(caps[0])
    return max(float(prefix[-1]) / float(caps.sum()), top, crowd)


def _greedy_load(c: np.ndarray, caps: np.ndarray) -> float:
    """The busiest device's load of a real assignment (each layer, largest first, to the device
    where it would finish first): an upper bound on the optimum."""
    load = np.zeros(len(caps))
    for x in c:
        d = int(np.argmin((load + x) / caps))
        load[d] += x
    return float(np.max(load / caps))


def _merge(c: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Layer-cost types and their counts after merging, largest first, each group of costs within
    ``tol`` of its largest into its smallest (never rounds a cost up)."""
    types: list[float] = []
    counts: list[int] = []
    start = 0
    for j in range(1, len(c) + 1):
        if j == len(c) or c[j] < c[start] * (1 - tol):
            types.append(float(c[j - 1]))
            counts.append(j - start)
            start = j
    return np.array(types), np.array(counts, dtype=np.int64)


def _bisect(types: np.ndarray, counts: np.ndarray, caps: np.ndarray, lo: float, hi: float,
            work: list[int]) -> tuple[float, bool]:
    """Raise ``lo`` while the merged layers provably do not fit under ``lo`` x speed; ``hi`` fits.
    Returns the raised ``lo`` and whether the bisection finished within the work budget."""
    ok = _fits(types, counts, caps * lo, work)
    if ok is None:
        return lo, False
    if ok:
        return lo, True
    while hi - lo > _PRECISION * hi:
        mid = (lo + hi) / 2
        ok = _fits(types, counts, caps * mid, work)
        if ok is None:
            return lo, False
        lo, hi = (lo, mid) if ok else (mid, hi)
    return lo, True


def _maximal_configs(types: np.ndarray, counts: np.ndarray, cap: float, limit: int) -> tuple[np.ndarray | None, int]:
    """Count vectors of layer types whose load fits under ``cap`` and admit no further layer
    (``None`` when enumerating them would build more than ``limit`` rows in all), and the rows
    built. Errs on the generous side (a tiny relative slack), which can only lower the bound."""
    room = cap * (1 + 1e-9)
    cfg = np.zeros((1, 0), dtype=np.int64)
    load = np.zeros(1)
    built = 0
    for t, n in zip(types, counts):
        kmax = np.minimum(n, np.floor((room - load) / t * (1 + 1e-12))).astype(np.int64)
        reps = np.maximum(kmax, 0) + 1
        total = int(reps.sum())
        built += total
        if built > limit:
            return None, built
        rows = np.repeat(np.arange(len(cfg)), reps)
        k = np.arange(total) - np.repeat(np.cumsum(reps) - reps, reps)
        cfg = np.column_stack([cfg[rows], k])
        load = load[rows] + k * t
    # Drop a configuration only when one more layer of a type not yet exhausted clearly fits.
    smallest_open = np.where(cfg < counts, types, np.inf).min(axis=1)
    return cfg[load + smallest_open >= room * (1 - 1e-10)], built


def _fits(types: np.ndarray, counts: np.ndarray, caps: np.ndarray, work: list[int]) -> bool | None:
    """Whether devices of capacities ``caps`` (largest first) can hold every layer; ``None`` when
    the program would exceed the remaining ``work``. Its states are count vectors of the layers
    placed so far, so at most ``prod(counts + 1)`` (:func:`packing_load` keeps that small)."""
    need = counts
    radix = np.cumprod(np.concatenate(([1], counts[:-1] + 1))).astype(np.int64)
    space = int(radix[-1] * (counts[-1] + 1))
    reached = np.zeros((1, len(types)), dtype=np.int64)
    configs: dict[float, np.ndarray] = {}
    room_after = (np.cumsum(caps[::-1])[::-1] - caps) * (1 + 1e-9)
    for d, cap in enumerate(caps):
        if cap not in configs:
            cfg, built = _maximal_configs(types, counts, float(cap), min(MAX_PACKING_STATES, work[0]))
            work[0] -= built
            if cfg is None:
                return None
            configs[cap] = cfg
        cfg = configs[cap]
        pairs = max(len(reached) * len(cfg), _STEP_WORK)
        if pairs > work[0]:
            return None
        work[0] -= pairs
        keys = (np.minimum(reached[:, None, :] + cfg[None, :, :], need) @ radix).ravel()
        if 16 * len(keys) < space:
            keys = np.unique(keys)
        else:  # dense: mark the count vectors reached instead of sorting
            seen = np.zeros(space, dtype=bool)
            seen[keys] = True
            keys = np.flatnonzero(seen)
        reached = keys[:, None] // radix % (need + 1)
        if (reached == need).all(axis=1).any():
            return True
        # What is left must fit in the devices still to come (their total room).
        reached = reached[(need - reached) @ types <= room_after[d]]
        if len(reached) == 0:
            return False
    return False

