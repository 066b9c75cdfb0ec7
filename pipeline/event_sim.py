"""The readable reference of the event simulation, and the per-stage quantities both engines read.

:class:`StageCosts` is what a simulation needs of a plan's partition and placement (built by
:func:`pipeline.simulator.stage_costs`); :func:`run_reference` is the event loop that the compiled
engine (``pipeline/_native/engine.cpp``) mirrors line by line. Nothing here knows there are two
engines: :mod:`pipeline.engine` chooses.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.plan import Action

__all__ = ["TimelineEntry", "StageCosts", "run_reference", "iteration_time"]


class TimelineEntry(NamedTuple):
    device: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class StageCosts:
    """Per-stage quantities a simulation needs, precomputed from a profile, a partition and a
    placement (reused across schedules of the same partition and placement)."""

    f: tuple[float, ...]
    i: tuple[float, ...]
    w: tuple[float, ...]
    act: tuple[float, ...]
    """Activation bytes ``F`` adds, per stage."""
    w_keep: tuple[float, ...]
    """The bytes ``I`` leaves for ``W`` to free (all of ``act`` on a stage whose backward runs
    entirely at ``W``: the first stage under ``TrainingConfig.first_stage_defers_backward``; more
    than ``act`` where PyTorch's ``I`` keeps gradients for ``W``:
    ``TrainingConfig.input_backward_keeps_graph``)."""
    comm: tuple[float, ...]
    """``comm[s]``: transfer time between stage ``s`` and ``s+1`` (0 on the same device)."""
    static_bytes: tuple[float, ...]
    """Per device."""
    memory_limit: tuple[float, ...]
    """Per device, bytes."""
    fused: tuple[float, ...] | None = None
    """A fused backward B per stage; ``None``: ``i + w`` (see :func:`stage_costs`)."""
    post_step: float = 0.0
    """Time after the last action: the all-reduce of shared weights' gradients across devices
    (head shards on several devices); added to the makespan."""
    contention: float = 0.0
    """The profile's ``compute_contention``: see :func:`iteration_time`."""

    @property
    def backward(self) -> tuple[float, ...]:
        """Duration of each stage's fused backward B (computed once; kept beside the fields)."""
        hit = self.__dict__.get("_backward")
        if hit is None:
            hit = self.__dict__["_backward"] = (self.fused if self.fused is not None
                                                 else tuple(map(operator.add, self.i, self.w)))
        return hit

    def device_activations(self, placement: Sequence[int], devices: int) -> tuple[float, ...]:
        """Activation bytes one micro-batch holds on each device: ``act`` summed, in stage order,
        over the stages the device runs (computed once per placement; kept beside the fields)."""
        memo = self.__dict__.get("_device_activations")
        if memo is None:
            memo = self.__dict__["_device_activations"] = {}
        key = (tuple(placement), devices)
        hit = memo.get(key)
        if hit is None:
            per = [0.0] * devices
            for s, d in enumerate(key[0]):
                per[d] += self.act[s]
            hit = memo[key] = tuple(per)
        return hit


def run_reference(schedule: Sequence[Sequence[Action]], costs: StageCosts, *, devices: int, microbatches: int,
                  record_timeline: bool
                  ) -> tuple[bool, float, list[float], list[float], list[int], list[TimelineEntry]]:
    """The readable reference of the event simulation (the compiled engine mirrors it line by line):
    (completed, makespan, busy per device, peak activations per device, actions run per device,
    timeline sorted by device and start)."""
    P, M = devices, microbatches
    S = len(costs.f)
    F, I, W, ACT, KEEP, COMM = costs.f, costs.i, costs.w, costs.act, costs.w_keep, costs.comm
    BF = costs.backward
    last = S - 1
    n = S * M
    fend: list[float | None] = [None] * n
    iend: list[float | None] = [None] * n
    ptr = [0] * P
    free = [0.0] * P
    busy = [0.0] * P
    mem = [0.0] * P
    peak = [0.0] * P
    lens = [len(acts) for acts in schedule]
    total = sum(lens)
    done = 0
    timeline: list[TimelineEntry] = []
    record = timeline.append if record_timeline else None
    progress = True
    while progress and done < total:
        progress = False
        for d in range(P):
            acts = schedule[d]
            k = ptr[d]
            end_k = lens[d]
            if k >= end_k:
                continue
            t = free[d]
            cur = mem[d]
            pk = peak[d]
            bz = busy[d]
            while k < end_k:
                a = acts[k]
                s, op, m = a
                idx = s * M + m
                if op == "F":
                    if s:
                        prev = fend[idx - M]
                        if prev is None:
                            break
                        ready = prev + COMM[s - 1]
                        start = ready if ready > t else t
                    else:
                        start = t
                    dur = F[s]
                    t = start + dur
                    fend[idx] = t
                    cur += ACT[s]
                    if cur > pk:
                        pk = cur
                elif op == "W":
                    if iend[idx] is None:
                        break
                    start = t
                    dur = W[s]
                    t = start + dur
                    cur -= KEEP[s]
                else:  # I or B
                    f_done = fend[idx]
                    if f_done is None:
                        break
                    if s != last:
                        g = iend[idx + M]
                        if g is None:
                            break
                        ready = g + COMM[s]
                        if f_done > ready:
                            ready = f_done
                    else:
                        ready = f_done
                    start = ready if ready > t else t
                    if op == "I":
                        dur = I[s]
                        cur -= ACT[s] - KEEP[s]
                        if cur > pk:  # PyTorch's I can keep more than F added (gradients for W)
                            pk = cur
                    else:
                        dur = BF[s]
                        cur -= ACT[s]
                    t = start + dur
                    iend[idx] = t
                bz += dur
                if record is not None:
                    record(TimelineEntry(d, a, start, t))
                k += 1
            if k != ptr[d]:
                done += k - ptr[d]
                ptr[d] = k
                free[d] = t
                mem[d] = cur
                peak[d] = pk
                busy[d] = bz
                progress = True
    makespan = max(free) if free else 0.0
    if record_timeline:
        timeline.sort(key=lambda e: (e.device, e.start))
    return done >= total, makespan, busy, peak, ptr, timeline


def iteration_time(costs: StageCosts, makespan: float, busy: Sequence[float]) -> float:
    """The iteration time of a simulated schedule: its makespan, then ``post_step``, plus what
    compute contention between devices of one host adds (``costs.contention``, 0 for GPUs).

    While two devices compute at once each runs ``1 + contention`` times slower. The schedule's
    time when devices compute together, ``sum(busy) - makespan`` over ``devices - 1`` (exact for
    two devices that are never idle together; a mean for more), is stretched by that factor; the
    schedule itself is the uncontended one's (a first-order model: the Gantt chart shows the
    schedule, the iteration time carries the stretch)."""
    if costs.contention <= 0 or len(busy) < 2:
        return makespan + costs.post_step
    together = max(0.0, sum(busy) - makespan) / (len(busy) - 1)
    return makespan + costs.post_step + costs.contention * together
