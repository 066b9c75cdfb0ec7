"""Fixed pipeline orders: GPipe, 1F1B, Megatron-LM's interleaved 1F1B, looped BFS and ZB-V.

Each generator returns one tuple of :class:`~pipeline.plan.Action` per device for any number of
devices and micro-batches; stage ``s`` of chunk ``c`` sits where the named placement puts it
(:mod:`pipeline.plan`). The zero-bubble family comes from the list scheduler instead
(:mod:`pipeline.list_scheduler`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from pipeline.engine import OP_CODES, actions_from_arrays
from pipeline.errors import PlanError
from pipeline.plan import Action, Schedule

__all__ = ["gpipe_order", "one_f_one_b_order", "interleaved_order", "looped_bfs_order", "zbv_order"]


def gpipe_order(devices: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """Every forward, then every backward, one stage per device."""
    return tuple(tuple([Action(d, "F", m) for m in range(microbatches)] +
                       [Action(d, "B", m) for m in range(microbatches)]) for d in range(devices))


@lru_cache(maxsize=8)
def one_f_one_b_order(devices: int, microbatches: int) -> Schedule:
    """1F1B: device ``d`` runs ``p - d - 1`` warm-up forwards, then alternates F and B (one object per
    size, kept for the next caller: a schedule is immutable)."""
    return _schedule([_warm_then_steady(devices, 1, 1, min(devices - d - 1, microbatches), microbatches, d)
                      for d in range(devices)])


def _warm_then_steady(devices: int, chunks: int, group: int, warm: int, total: int, d: int) -> np.ndarray:
    """Device ``d``'s ``(stage, op code, micro-batch)`` rows of a one-forward-one-backward order over
    ``total`` forward slots: ``warm`` forwards, then F and B alternating, then the last backwards.
    Slot ``k`` runs chunk ``(k // group) % chunks`` (backwards: in reverse) of micro-batch
    ``(k // (group * chunks)) * group + k % group``, Megatron-LM's interleaving (1F1B: one chunk)."""
    steady = total - warm
    k = np.empty(2 * total, dtype=np.int64)
    backward = np.zeros(2 * total, dtype=bool)
    k[:warm] = np.arange(warm)
    k[warm:warm + 2 * steady:2] = np.arange(warm, total)
    k[warm + 1:warm + 2 * steady:2] = np.arange(steady)
    backward[warm + 1:warm + 2 * steady:2] = True
    k[warm + 2 * steady:] = np.arange(steady, total)
    backward[warm + 2 * steady:] = True
    chunk = (k // group) % chunks
    rows = np.empty((2 * total, 3), dtype=np.int32)
    rows[:, 0] = np.where(backward, chunks - 1 - chunk, chunk) * devices + d
    rows[:, 1] = np.where(backward, OP_CODES["B"], OP_CODES["F"])
    rows[:, 2] = (k // (group * chunks)) * group + k % group
    return rows


def _schedule(per_device: list[np.ndarray]) -> Schedule:
    """The per-device actions of the rows, carrying the engine's flat arrays (built once, not per simulation)."""
    offsets = [0]
    for rows in per_device:
        offsets.append(offsets[-1] + len(rows))
    return actions_from_arrays(np.concatenate(per_device), offsets)


def _interleaved_group(devices: int, microbatches: int) -> int:
    """Micro-batches per group: the devices when they divide the micro-batches (Megatron-LM),
    otherwise the smallest divisor of the micro-batches that is at least the devices (Megatron-core's
    ``microbatch_group_size_per_vp_stage``)."""
    if microbatches % devices == 0:
        return devices
    return next((g for g in range(devices, microbatches + 1) if microbatches % g == 0), microbatches)


@lru_cache(maxsize=8)
def interleaved_order(devices: int, chunks: int, microbatches: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B; stage ``c * p + d`` (chunk ``c``) sits on device ``d``.

    Micro-batches go in groups of ``g`` (= p when p divides m): a device runs ``g`` of them
    through chunk 0, then chunk 1, ...; warm-up is ``2(p - d - 1) + (v - 1) g`` forwards.
    """
    if chunks == 1:
        return one_f_one_b_order(devices, microbatches)
    g = _interleaved_group(devices, microbatches)
    total = microbatches * chunks
    return _schedule([_warm_then_steady(devices, chunks, g, min(2 * (devices - d - 1) + (chunks - 1) * g, total),
                                        total, d) for d in range(devices)])


def looped_bfs_order(devices: int, chunks: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """Breadth-first looping: every micro-batch through chunk 0, then chunk 1, ...; backward in
    reverse chunk order."""
    out = []
    for d in range(devices):
        stages = [c * devices + d for c in range(chunks)]
        acts = [Action(s, "F", m) for s in stages for m in range(microbatches)]
        acts += [Action(s, "B", m) for s in reversed(stages) for m in range(microbatches)]
        out.append(tuple(acts))
    return tuple(out)


def _appender(acts: list[Action]):
    def add(stage: int, op: str, mb: int) -> None:
        acts.append(Action(stage, op, mb))

    return add


def zbv_order(devices: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """The hand-built ZB-V order (Qi et al., "Pipeline Parallelism with Controllable Memory"):
    V placement, device ``d`` holds chunk 0 = stage ``d`` and chunk 1 = stage ``2p - 1 - d``.

    Phases on device ``d``: ``2(p - d) - 1`` chunk-0 forwards; ``d`` pairs (chunk-1 F, chunk-0 F);
    ``p - d`` triples (chunk-1 F, I, W); then steady rounds of (chunk-0 F, I, W, chunk-1 F, I, W);
    cool-down I's in pairs with W's trailing to fill the drain. Needs ``m >= 2p - 1``.
    """
    P, M = devices, microbatches
    if M < 2 * P - 1:
        raise PlanError(f"the ZB-V order needs at least {2 * P - 1} micro-batches, got {M}", field="microbatches")
    out = []
    for d in range(P):
        c0, c1 = d, 2 * P - 1 - d
        acts: list[Action] = []
        f0 = f1 = b0 = b1 = 0
        add = _appender(acts)

        for _ in range(2 * (P - d) - 1):
            add(c0, "F", f0)
            f0 += 1
        for _ in range(d):
            add(c1, "F", f1)
            f1 += 1
            add(c0, "F", f0)
            f0 += 1
        for _ in range(P - d):
            add(c1, "F", f1)
            f1 += 1
            add(c1, "I", b1)
            add(c1, "W", b1)
            b1 += 1
        while f1 < f0 or f0 < M:
            if f0 < M:
                add(c0, "F", f0)
                f0 += 1
            add(c0, "I", b0)
            add(c0, "W", b0)
            b0 += 1
            add(c1, "F", f1)
            f1 += 1
            add(c1, "I", b1)
            add(c1, "W", b1)
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(d):
            add(c0, "I", b0)
            b0 += 1
            add(c1, "I", b1)
            b1 += 1
        for _ in range(P - d):
            add(c0, "I", b0)
            b0 += 1
            add(c0, "W", w0)
            w0 += 1
        while w1 < b1:
            add(c1, "W", w1)
            w1 += 1
        while w0 < b0:
            add(c0, "W", w0)
            w0 += 1
        out.append(tuple(acts))
    return tuple(out)


