"""The Zero Bubble fork's own ZB-1p / ZB-2p schedule: its greedy F/B/W placement under a memory cap.

The fork (sail-sg/zero-bubble-pipeline-parallelism, ``zerobubble/scheduler/zb.py``) does not run
an ILP at training time: it builds the per-stage order of a one-chunk pipeline greedily from the
profiled ``T_F``, ``T_B``, ``T_W``, ``T_comm`` and a per-stage activation cap (``p`` micro-batches
of forward activations for ZB-1p, ``2p`` for ZB-2p), tries eight variants of the greedy, and runs
the one whose own estimate of the longest stage is shortest. This module rebuilds that procedure
(our code, the same decisions) so that a ZB-1p / ZB-2p row is predicted with the order the runtime
runs, not with an order of ours.

The greedy, per micro-batch ``i``:

* ``i = 0`` (warm-up): one forward on every stage; then, from the last stage back, as many extra
  forwards as fit in memory and in the time until the stage's first backward can start (with
  ``allow_bubble_before_first_b`` a forward may run past that time); a stage never warms up more
  forwards than the stage before it; then the backward of micro-batch 0 on every stage, last first.
* ``i > 0``: a stage takes its next forward unless (with ``prioritize_b``) it is two forwards
  ahead of the next stage and that forward would delay the backward the next stage is about to
  send; a stage takes a forward only where every later stage takes one. Before each forward and
  each backward it runs pending weight-gradient passes ``W``: those memory needs, those that fit
  before the input arrives, and, where waiting for the input would leave a gap no larger than the
  widest bubble any stage already has, one more (always with ``no_bubble_greedy``).
* At the end every stage runs its remaining ``W``.

Memory counts in the fork's units: a forward adds ``mem_f``, a backward ``mem_b`` and a ``W``
``mem_w`` (:func:`fork_memory`: ``34 h + 5 a s``, ``-(2 h + 5 a s)``, ``-32 h`` per layer).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import PlanError
from pipeline.plan import Action

__all__ = ["ZBGreedyVariant", "ZBGreedyResult", "VARIANTS", "fork_memory", "zb_greedy", "zb_greedy_best"]

_F, _B, _W = 0, 1, 2
_OPS = ("F", "I", "W")


@dataclass(frozen=True)
class ZBGreedyVariant:
    """One of the fork's eight greedy variants (its ``manual_order`` flags)."""

    allow_bubble_before_first_b: bool
    prioritize_b: bool
    no_bubble_greedy: bool


#: The variants in the order the fork tries them; it keeps the first of the shortest.
VARIANTS = tuple(ZBGreedyVariant(a, p, n) for a, p, n in itertools.product((True, False), repeat=3))


@dataclass(frozen=True)
class ZBGreedyResult:
    """Per-device orders (``I`` is the fork's ``B``), the greedy's own estimate of the longest
    stage (first forward start to last ``W`` end) and the variant that made them."""

    orders: tuple[tuple[Action, ...], ...]
    longest_stage: float
    variant: ZBGreedyVariant


def fork_memory(hidden: int, heads: int, seq_len: int) -> tuple[float, float, float]:
    """(mem_f, mem_b, mem_w) per layer in the fork's units: activations a forward saves, what the
    input-gradient pass frees, and what the weight-gradient pass frees."""
    mem_f = 34.0 * hidden + 5.0 * heads * seq_len
    mem_w = -32.0 * hidden
    return mem_f, -mem_w - mem_f, mem_w


def zb_greedy(*, f: Sequence[float], b: Sequence[float], w: Sequence[float], comm: float, microbatches: int,
              mem: tuple[float, float, float], max_mem: Sequence[float],
              variant: ZBGreedyVariant) -> ZBGreedyResult:
    """The order of one greedy variant for ``len(f)`` stages, one per device; PlanError where a
    stage cannot fit the memory cap."""
    P, M = len(f), microbatches
    cost = (tuple(f), tuple(b), tuple(w))
    mem_of = mem
    done = [[0] * P for _ in range(3)]  # passes put so far, by kind and stage
    end = [0.0] * P  # the stage's clock
    used = [0.0] * P
    bubble = [0.0] * P
    finish: dict[tuple[int, int, int], float] = {}
    orders: list[list[Action]] = [[] for _ in range(P)]

    def t(kind: int, stage: int, mb: int) -> float:
        return finish.get((kind, stage, mb), 0.0)

    def put(stage: int, kind: int) -> None:
        mb = done[kind][stage]
        alone = end[stage] + cost[kind][stage]
        at = alone
        if kind == _F and stage > 0:
            at = max(at, t(_F, stage - 1, mb) + comm + cost[kind][stage])
        if kind == _B and stage < P - 1:
            at = max(at, t(_B, stage + 1, mb) + comm + cost[kind][stage])
        if done[_F][stage] > 0:
            bubble[stage] += at - alone
        end[stage] = at
        finish[(kind, stage, mb)] = at
        used[stage] += mem_of[kind]
        done[kind][stage] += 1
        orders[stage].append(Action(stage, _OPS[kind], mb))

    def make_room(stage: int, need: float) -> None:
        while used[stage] + need > max_mem[stage]:
            if done[_W][stage] >= done[_B][stage]:
                raise PlanError(f"stage {stage} cannot fit the memory cap {max_mem[stage]:g} "
                                f"(a forward needs {mem_of[_F]:g})", field="memory")
            put(stage, _W)

    def fill_with_w(stage: int, ready: float) -> None:
        """W passes that end before the input is ready, and one more where the gap is small."""
        while done[_W][stage] < done[_B][stage] and end[stage] + cost[_W][stage] <= ready:
            put(stage, _W)
        if done[_W][stage] < done[_B][stage] and end[stage] < ready:
            if ready - end[stage] <= max(bubble) - bubble[stage]:
                if variant.no_bubble_greedy:
                    put(stage, _W)
            else:
                put(stage, _W)

    for i in range(M):
        if i == 0:
            for j in range(P):
                put(j, _F)
            extra = [0] * P
            last = t(_F, P - 1, 0) + cost[_B][P - 1]
            for j in range(P - 2, -1, -1):
                room, clock = used[j], end[j]
                while done[_F][j] + extra[j] < M and room + mem_of[_F] <= max_mem[j]:
                    if variant.allow_bubble_before_first_b:
                        if clock + cost[_F][j] > last + comm:
                            break
                    elif clock >= last + comm:
                        break
                    room += mem_of[_F]
                    clock += cost[_F][j]
                    extra[j] += 1
                last = max(clock, last + comm) + cost[_B][j]
            for j in range(1, P):
                while extra[j] > 0 and extra[j] >= extra[j - 1] and done[_F][j] + extra[j] < M:
                    extra[j] -= 1
            for j in range(P):
                for _ in range(extra[j]):
                    put(j, _F)
            for j in range(P - 1, -1, -1):
                put(j, _B)
            continue
        take = [0] * P
        for j in range(P):
            if done[_F][j] >= M:
                continue
            if variant.prioritize_b and j + 1 < P and done[_F][j] >= done[_F][j + 1] + 2:
                next_ready = end[j + 1] + cost[_F][j + 1] + cost[_B][j + 1] + comm
                if end[j] >= next_ready:
                    continue
                w_time, w_count, room = 0.0, 0, used[j] + mem_of[_F]
                while room > max_mem[j] and done[_W][j] + w_count < done[_B][j]:
                    w_time += cost[_W][j]
                    room += mem_of[_W]
                    w_count += 1
                if end[j] + cost[_F][j] + w_time <= next_ready:
                    take[j] = 1
                    continue
                if next_ready - end[j] <= max(bubble) - bubble[j]:
                    continue
            take[j] = 1
        for j in range(P - 2, -1, -1):
            take[j] = min(take[j], take[j + 1])
        for j in range(P):
            if not take[j]:
                continue
            make_room(j, mem_of[_F])
            if j > 0:
                fill_with_w(j, t(_F, j - 1, done[_F][j]) + comm)
            put(j, _F)
        for j in range(P - 1, -1, -1):
            make_room(j, mem_of[_B])
            if j + 1 < P:
                fill_with_w(j, t(_B, j + 1, i) + comm)
            if j == 0 and done[_F][j] == M:
                while done[_W][j] < done[_B][j]:
                    put(j, _W)
            put(j, _B)
    for j in range(P):
        while done[_W][j] < M:
            put(j, _W)
    longest = max(t(_W, j, M - 1) - t(_F, j, 0) + cost[_F][j] for j in range(P))
    return ZBGreedyResult(tuple(tuple(o) for o in orders), longest, variant)


def zb_greedy_best(*, f: Sequence[float], b: Sequence[float], w: Sequence[float], comm: float, microbatches: int,
                   mem: tuple[float, float, float], max_mem: Sequence[float]) -> ZBGreedyResult:
    """The variant the fork runs: the first of the eight whose longest stage is shortest (variants
    that cannot fit the cap are skipped; PlanError where none fits)."""
    best: ZBGreedyResult | None = None
    errors = []
    for variant in VARIANTS:
        try:
            got = zb_greedy(f=f, b=b, w=w, comm=comm, microbatches=microbatches, mem=mem, max_mem=max_mem,
                            variant=variant)
        except PlanError as exc:
            errors.append(str(exc))
            continue
        if best is None or got.longest_stage < best.longest_stage:
            best = got
    if best is None:
        raise PlanError(f"no ZB greedy variant fits: {errors[0]}", field="memory")
    return best
