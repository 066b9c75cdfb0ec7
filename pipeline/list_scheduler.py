"""The memory-aware list scheduler: per-device orders built by simulating time.

At each step the device that can start earliest runs its best action: a ready backward (which
frees memory), then a forward whose activations fit under the device's cap, then a deferred W
(as the zero-bubble paper's own heuristic scheduler does). The caps express a schedule's
activation budget (:func:`budget_caps`); the knobs (:class:`ListSchedulerConfig`) are what the
tuner turns. It yields ZB-H1/H2, ZB-V, V-Half, V-Min and DualPipeV (:mod:`pipeline.schedules`).

:func:`list_schedule_python` is the readable reference; :func:`pipeline.engine.list_schedule` runs
the compiled engine when it is built, with identical results.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.errors import PlanError
from pipeline.event_sim import StageCosts
from pipeline.plan import Action

__all__ = ["ListSchedulerConfig", "list_schedule_python", "budget_caps"]


def _sum_in_order(values: Iterable[float]) -> float:
    """Left-to-right float sum (what the compiled engine does; ``sum`` compensates on Python 3.12+)."""
    total = 0.0
    for v in values:
        total += v
    return total


@dataclass(frozen=True)
class ListSchedulerConfig:
    """Knobs of the memory-aware list scheduler (what the tuner turns)."""

    caps: tuple[float, ...] | None = None
    """Activation bytes each device may hold; a forward waits while it would exceed its cap.
    ``None``: unlimited."""
    split_backward: bool = True
    """Split backward into I and W (zero-bubble); ``False`` uses fused B."""
    eager_w: bool = False
    """Run each W right after its I instead of deferring it into bubbles."""
    depth_first: bool = True
    """Among ready forwards, prefer the later stage (pushes micro-batches towards the loss)."""
    max_pending_w: int | None = None
    """When this many W's wait on a device, W goes before forwards (bounds deferred memory)."""
    cap_counts_w: bool = True
    """Count the activations that deferred W's still hold against the cap; ``False`` caps only
    micro-batches whose I has not run (ZB-H1's rule: W may trail, memory grows by W's share)."""


def list_schedule_python(costs: StageCosts, placement: Sequence[int], devices: int, *, microbatches: int,
                         config: ListSchedulerConfig = ListSchedulerConfig()) -> tuple[tuple[Action, ...], ...]:
    """The readable reference of :func:`list_schedule` (the compiled engine mirrors it line by line)."""
    S, M = len(placement), microbatches
    last = S - 1
    F, I, W, ACT, KEEP, COMM = costs.f, costs.i, costs.w, costs.act, costs.w_keep, costs.comm
    BF = costs.backward
    caps = config.caps if config.caps is not None else tuple(math.inf for _ in range(devices))
    split, eager, depth = config.split_backward, config.eager_w, config.depth_first
    count_w = config.cap_counts_w
    stages_of = [[s for s in range(S) if placement[s] == d] for d in range(devices)]
    # A forward admits a micro-batch to the rest of its stages on this device: it needs room
    # for all of them, or later chunks of the V/wave could starve under the cap.
    need = [_sum_in_order(ACT[x] for x in range(s, S) if placement[x] == placement[s]) for s in range(S)]
    max_w = config.max_pending_w if config.max_pending_w is not None else 1 << 30
    if depth:
        for lst in stages_of:
            lst.reverse()
    fend = [[-1.0] * M for _ in range(S)]
    iend = [[-1.0] * M for _ in range(S)]
    nf = [0] * S
    nb = [0] * S
    wq: list[deque[tuple[int, int]]] = [deque() for _ in range(devices)]
    free = [0.0] * devices
    mem = [0.0] * devices
    order: list[list[Action]] = [[] for _ in range(devices)]
    remaining = [len(stages_of[d]) * M * (3 if split else 2) for d in range(devices)]
    total = sum(remaining)

    cap_tol = [c * (1 + 1e-9) for c in caps]
    inf = math.inf

    def best(d: int, force: bool) -> tuple[float, int, int, int]:
        """(start, priority, stage, kind) of device d's best next action; kind 0=F 1=bwd 2=W.

        The earliest-starting candidate wins; among those that can start then, the lowest
        priority number: backward 0, forward 1, deferred W 2 (0 once max_pending_w wait)."""
        t = free[d]
        b_st = f_st = inf
        b_s = f_s = -1
        room = cap_tol[d] - mem[d]
        empty = mem[d] < 1.0
        for s in stages_of[d]:
            m = nb[s]
            if m < nf[s]:
                fe = fend[s][m]
                if s == last:
                    ready = fe
                else:
                    g = iend[s + 1][m]
                    ready = -1.0 if g < 0 else (fe if fe > g + COMM[s] else g + COMM[s])
                if ready >= 0:
                    st = ready if ready > t else t
                    if st < b_st:
                        b_st, b_s = st, s
            m = nf[s]
            if m < M:
                if s == 0:
                    ready = 0.0
                else:
                    pe = fend[s - 1][m]
                    ready = -1.0 if pe < 0 else pe + COMM[s - 1]
                if ready >= 0 and (force or need[s] <= room or empty):
                    st = ready if ready > t else t
                    if st < f_st:
                        f_st, f_s = st, s
        q = wq[d]
        w_st = t if q else inf
        start = min(b_st, f_st, w_st)
        if start == inf:
            return (inf, 9, -1, -1)
        choice = (inf, 9, -1, -1)
        if b_st <= start:
            choice = (b_st, 0, b_s, 1)
        if f_st <= start and (1, f_s, 0) < choice[1:]:
            choice = (f_st, 1, f_s, 0)
        if w_st <= start:
            w_prio = 2 if len(q) < max_w else 0
            if (w_prio, q[0][0], 2) < choice[1:]:
                choice = (w_st, w_prio, q[0][0], 2)
        return choice

    heap: list[tuple[float, int, int]] = []
    cache: list[tuple[float, int, int, int] | None] = [None] * devices
    for d in range(devices):
        if remaining[d]:
            cache[d] = best(d, False)
            heapq.heappush(heap, (cache[d][0], d, 0))
    version = [0] * devices
    done = 0
    while done < total:
        pick = None
        while heap:
            st, d, ver = heap[0]
            if ver != version[d] or not remaining[d]:
                heapq.heappop(heap)
                continue
            pick = (cache[d], d)
            break
        if pick is None or pick[0][0] == inf:
            # Every device waits on its memory cap: let the earliest forward through.
            pick = None
            for d in range(devices):
                if remaining[d]:
                    c = best(d, True)
                    if pick is None or c[0] < pick[0][0]:
                        pick = (c, d)
            if pick is None or pick[0][0] == inf:
                raise PlanError("list scheduler is stuck; the placement may not form a pipeline",
                                field="placement")
        (start, _, s, kind), d = pick
        touched = {d}
        if kind == 0:
            m = nf[s]
            nf[s] += 1
            end = start + F[s]
            fend[s][m] = end
            mem[d] += ACT[s]
            order[d].append(Action(s, "F", m))
            if s < last:
                touched.add(placement[s + 1])
        elif kind == 1:
            m = nb[s]
            nb[s] += 1
            if split:
                end = start + I[s]
                mem[d] -= ACT[s] - KEEP[s] if count_w else ACT[s]
                order[d].append(Action(s, "I", m))
                if eager:
                    end += W[s]
                    if count_w:
                        mem[d] -= KEEP[s]
                    order[d].append(Action(s, "W", m))
                    remaining[d] -= 1
                    done += 1
                else:
                    wq[d].append((s, m))
            else:
                end = start + BF[s]
                mem[d] -= ACT[s]
                order[d].append(Action(s, "B", m))
            iend[s][m] = end if not (split and eager) else end - W[s]
            if s > 0:
                touched.add(placement[s - 1])
        else:
            s, m = wq[d].popleft()
            end = start + W[s]
            if count_w:
                mem[d] -= KEEP[s]
            order[d].append(Action(s, "W", m))
        free[d] = end
        remaining[d] -= 1
        done += 1
        for e in touched:
            if remaining[e]:
                version[e] += 1
                c = cache[e] = best(e, False)
                heapq.heappush(heap, (c[0], e, version[e]))
    return tuple(tuple(acts) for acts in order)


def budget_caps(costs: StageCosts, placement: Sequence[int], devices: int, *,
                microbatches_per_device: Sequence[float]) -> tuple[float, ...]:
    """Caps in bytes from budgets in micro-batches: one micro-batch on device ``d`` holds the
    activations of every stage ``d`` runs."""
    per_mb = costs.device_activations(placement, devices)
    return tuple([max(1.0, k) * per_mb[d] for d, k in enumerate(microbatches_per_device)])
