"""Lower bounds on iteration time from the profile and the cluster alone (no plan)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.spec import Cluster, ModelProfile

__all__ = ["LowerBound", "lower_bound", "packing_load"]

#: States the packing bound's dynamic program may hold before it merges layer costs (see
#: :func:`packing_load`).
MAX_PACKING_STATES = 50_000


@dataclass(frozen=True)
class LowerBound:
    """Each bound holds for every plan; ``value`` is the largest."""

    work: float
    """All work of all micro-batches spread perfectly over every device's speed."""
    heaviest_layer: float
    """A layer is never split: its device runs it for every micro-batch."""
    chain: float
    """One micro-batch's forward through every layer, then its input-gradient back, plus one W."""
    critical_layer: float = 0.0
    """A layer's device waits for one micro-batch's forward through the layers before it, runs the
    layer's F and I for every micro-batch, then either its W's or the input-gradient chain back
    through the layers before it: ``max over layers of fpre + M(f+b) + max(M w, bpre)``."""
    packing: float = 0.0
    """Layers are indivisible: the least possible load of the busiest device over every way of
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


def lower_bound(profile: ModelProfile, cluster: Cluster, microbatches: int, *, packing: bool = True) -> LowerBound:
    """Lower bounds on iteration time, in the profile's time unit; communication counts as free.

    ``packing=False`` skips the packing and critical-layer bounds (the first three only, which the
    RL environment's observation was trained on)."""
    speeds = cluster.speeds
    fastest = max(speeds)
    per_mb = [layer.f + layer.b + layer.w for layer in profile.layers]
    work = microbatches * sum(per_mb) / sum(speeds)
    heaviest = microbatches * max(per_mb) / fastest
    chain = (sum(layer.f + layer.b for layer in profile.layers) + min(layer.w for layer in profile.layers)) / fastest
    critical, f_before, b_before = 0.0, 0.0, 0.0
    for layer in profile.layers:
        own = microbatches * (layer.f + layer.b) + max(microbatches * layer.w, b_before)
        critical = max(critical, (f_before + own) / fastest)
        f_before += layer.f
        b_before += layer.b
    pack = microbatches * packing_load(per_mb, speeds) if packing else 0.0
    return LowerBound(work=work, heaviest_layer=heaviest, chain=chain, critical_layer=critical if packing else 0.0,
                      packing=pack)


def packing_load(costs: Sequence[float], speeds: Sequence[float]) -> float:
    """A lower bound on the busiest device's time per micro-batch when whole layers of ``costs``
    are spread over devices of ``speeds`` in any way (makespan scheduling, ``P||Cmax``).

    Exact by bisection on the load with a dynamic program over layer-cost types (few distinct
    costs: a model repeats its blocks). When the program's states grow past
    :data:`MAX_PACKING_STATES`, costs within 5%, then 20%, then 50% of each other are merged into
    their group's smallest cost, which can only lower the result: it stays a valid bound."""
    for tol in (0.0, 0.05, 0.2, 0.5):
        load = _packing_load(costs, speeds, tol)
        if load is not None:
            return load
    return max(sum(costs) / sum(speeds), max(costs) / max(speeds))


def _packing_load(costs: Sequence[float], speeds: Sequence[float], tol: float) -> float | None:
    ordered = sorted((round(float(c), 12) for c in costs), reverse=True)
    merged: list[float] = []
    group: list[float] = []
    for c in ordered:
        if group and c < group[0] * (1 - tol):
            merged += [group[-1]] * len(group)
            group = []
        group.append(c)
    merged += [group[-1]] * len(group)
    count = Counter(merged)
    types = sorted(count, reverse=True)
    counts = [count[t] for t in types]
    caps = sorted((float(s) for s in speeds), reverse=True)
    lo = max(sum(merged) / sum(caps), max(merged) / caps[0])
    hi = sum(merged) / caps[-1]
    first = _fits(types, counts, [lo * s for s in caps])
    if first is None:
        return None
    if first:
        return lo
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        ok = _fits(types, counts, [mid * s for s in caps])
        if ok is None:
            return None
        lo, hi = (lo, mid) if ok else (mid, hi)
    return lo


def _maximal_configs(types: list[float], counts: list[int], cap: float) -> np.ndarray:
    """Count vectors of layer types that fit under ``cap`` and admit no further layer."""
    out: list[tuple[int, ...]] = []

    def rec(i: int, cur: list[int], load: float) -> None:
        if i == len(types):
            if all(cur[j] == counts[j] or load + types[j] > cap for j in range(len(types))):
                out.append(tuple(cur))
            return
        k = 0
        while k <= counts[i] and load + k * types[i] <= cap:
            rec(i + 1, [*cur, k], load + k * types[i])
            k += 1

    rec(0, [], 0.0)
    return np.array(out, dtype=np.int64).reshape(-1, len(types))


def _fits(types: list[float], counts: list[int], caps: list[float]) -> bool | None:
    """Whether devices of capacities ``caps`` can hold every layer; ``None`` if too many states."""
    need = np.array(counts, dtype=np.int64)
    radix = np.cumprod([1] + [c + 1 for c in counts[:-1]]).astype(np.int64)
    reached = np.zeros((1, len(types)), dtype=np.int64)
    configs: dict[float, np.ndarray] = {}
    for cap in caps:
        if cap not in configs:
            configs[cap] = _maximal_configs(types, counts, cap * (1 + 1e-12))
        cfg = configs[cap]
        if len(reached) * len(cfg) > 20 * MAX_PACKING_STATES:
            return None
        sums = np.minimum(reached[:, None, :] + cfg[None, :, :], need).reshape(-1, len(types))
        _, first = np.unique(sums @ radix, return_index=True)
        reached = sums[first]
        if (reached == need).all(axis=1).any():
            return True
        if len(reached) > MAX_PACKING_STATES:
            return None
    return False
