"""The Zero Bubble fork's own V-Half / V-Min orders ("Pipeline Parallelism with Controllable Memory").

The fork (sail-sg/zero-bubble-pipeline-parallelism, ``zerobubble/scheduler/zbv_greedy.py``) does
not search: it lays a fixed *building block* on a grid of unit time slots, repeats it every six
slots for each micro-batch, and then "squeezes" the repetition greedily. This module rebuilds that
procedure (our code, the same decisions) so that a V-Half / V-Min row is predicted with the order the
runtime runs, not with an order of ours.

Each device ``d`` holds two chunks of the V. The fork names six kinds of pass per device, which map
to our stages (:func:`pipeline.plan.v_placement`: stage ``d`` and stage ``2p - 1 - d`` on device ``d``):

====  =========================  =====================
kind  the fork                    our action
====  =========================  =====================
0     forward of chunk 0          ``F`` of stage ``d``
1     forward of chunk 1          ``F`` of stage ``2p-1-d``
2     backward of chunk 1         ``I`` of stage ``2p-1-d``
3     backward of chunk 0         ``I`` of stage ``d``
4     weight pass of kind 2       ``W`` of stage ``2p-1-d``
5     weight pass of kind 3       ``W`` of stage ``d``
====  =========================  =====================

Kinds 0 and 2 flow from device ``d - 1`` to ``d``, kinds 1 and 3 from ``d + 1`` to ``d``.

The procedure (:func:`v_greedy`):

1. the building block (:func:`building_block`): the slot of kinds 0-3 of micro-batch 0 on each device;
   micro-batch ``k`` uses the same slots plus ``6 k``;
2. weight passes are put into free slots (:func:`put_weight_passes`), and the per-device activation
   peak of the result is the memory bound (:func:`activation_peak`; one unit per chunk forward, freed
   by its weight pass);
3. squeeze with the weight passes in place: every pass, in slot order, moves to the first free slot
   after its dependencies that keeps the device within the bound, except those between the first
   chunk-0 backward on device 0 and the last chunk-0 forward, which stay (:func:`_squeeze`);
   then an eager unit-time replay renumbers the slots (:func:`eager_execution`);
4. the weight passes are dropped and the squeeze is repeated without them (now the warm-up stays as well,
   and a pending weight pass counts as freed at the first free slot), then replayed again;
5. the weight passes are dropped once more and put back, one list per chunk, into the free slots;
   the per-device order is the slot order.

The fork's runtime computes the order with ``F = B = W = 1000`` and ``comm = 1`` whatever it
profiled; the order does not depend on the times at all (only the fork's printed estimate does).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import PlanError
from pipeline.plan import Action, Plan, v_placement

__all__ = ["V_KINDS", "VGreedyResult", "building_block", "put_weight_passes", "activation_peak",
           "eager_execution", "v_greedy", "v_greedy_plan", "fork_actions"]

#: The two memory setups of the fork's ``zero_bubble_v_schedule_mem_setup``.
V_KINDS = ("half", "min")

Slots = list[list[int]]
"""Per kind of pass, the slot of each micro-batch (one device)."""

_UNIT_MEMORY = (1, 1, 0, 0, -1, -1)  # a chunk forward holds one unit; a weight pass frees it


@dataclass(frozen=True)
class VGreedyResult:
    """Per-device orders (our actions on the V placement), the fork's own estimate of the longest
    device (first forward start to last chunk-0 weight pass end), its bubble rate
    ``(longest - 2 M (f + b + w)) / longest`` and the eager makespan (first start to last end)."""

    orders: tuple[tuple[Action, ...], ...]
    longest_stage: float
    bubble_rate: float
    makespan: float


def building_block(kind: str, devices: int) -> Slots:
    """Slots of kinds 0-3 (chunk-0 F, chunk-1 F, chunk-1 B, chunk-0 B) of micro-batch 0, per device."""
    p = devices
    if kind == "half":
        gap = 3 if p % 2 == 0 else 0
        return [[2 * d, 3 * p - d - 2, 3 * p + gap + 2 * d - 1, 6 * p + gap - d - 2] for d in range(p)]
    if kind == "min":
        gap = 2 if p % 3 == 0 else 0
        return [[d, 2 * p - d - 1, 2 * p + gap + d, 4 * p + gap - d - 1] for d in range(p)]
    raise PlanError(f"unknown V schedule {kind!r}; use one of {', '.join(V_KINDS)}", field="schedule")


def _next_head(lists: Sequence[Sequence[int]], heads: Sequence[int], kinds: int) -> tuple[int, int]:
    """(slot, kind) of the earliest unplaced pass among the first ``kinds`` lists (ties: lowest kind);
    slot ``-1`` when all are placed."""
    best = (-1, -1)
    for k in range(kinds):
        if heads[k] < len(lists[k]):
            slot = lists[k][heads[k]]
            if best[0] < 0 or slot < best[0]:
                best = (slot, k)
    return best


def put_weight_passes(slots: Slots, *, split: bool) -> Slots:
    """Kinds 0-3 plus weight passes in the free slots, oldest backward first: one list (kind 4) or,
    with ``split``, one per chunk (kind 4 after kind 2, kind 5 after kind 3); where free slots run out,
    the rest follow the last pass."""
    out = [list(s) for s in slots[:4]] + [[] for _ in range(2 if split else 1)]
    last = max(s[-1] for s in out[:4])
    pending = [0, 0]
    heads = [0] * 4
    for slot in range(last + 1):
        at, kind = _next_head(out, heads, 4)
        if at == slot:
            heads[kind] += 1
            if kind >= 2:
                pending[kind - 2 if split else 0] += 1
            continue
        for w in range(2):
            if pending[w]:
                out[4 + w].append(slot)
                pending[w] -= 1
                break
    slot = last
    for w in range(2):
        for _ in range(pending[w]):
            slot += 1
            out[4 + w].append(slot)
    return out


def activation_peak(slots: Slots) -> int:
    """Peak chunk activations one device holds in slot order (the fork's units: a chunk forward adds
    one, its weight pass frees it; without weight passes, a pending one frees at each free slot)."""
    has_w = len(slots) > 4
    last = max(s[-1] for s in slots if s)
    heads = [0] * len(slots)
    held = peak = pending = 0
    for slot in range(last + 1):
        at, kind = _next_head(slots, heads, len(slots))
        if at == slot:
            heads[kind] += 1
            held += _UNIT_MEMORY[kind]
            if kind in (2, 3):
                pending += 1
        elif not has_w and pending:
            held -= 1
            pending -= 1
        peak = max(peak, held)
    return peak


def _global_order(grid: Sequence[Slots]) -> list[tuple[int, int, int]]:
    """(device, kind, micro-batch) of every pass, by (slot, device, kind, micro-batch)."""
    keyed = [(slot, d, k, mb) for d, slots in enumerate(grid) for k, lst in enumerate(slots)
             for mb, slot in enumerate(lst)]
    keyed.sort()
    return [(d, k, mb) for _, d, k, mb in keyed]


def _check_sorted(grid: Sequence[Slots]) -> None:
    for d, slots in enumerate(grid):
        for k, lst in enumerate(slots):
            if any(b <= a for a, b in zip(lst, lst[1:])):
                raise PlanError(f"device {d} kind {k}: slots not increasing {lst}", field="schedule")


def eager_execution(grid: Sequence[Slots], cost: Sequence[float], comm: float
                    ) -> tuple[float, float, list[Slots], list[list[tuple[int, int]]]]:
    """Run every pass as early as its inputs and its device allow, devices taking passes in slot
    order: (the fork's longest device: first chunk-0 forward start to last pass of the last kind's
    end, the makespan, start times per device and kind, per-device order of (kind, micro-batch))."""
    _check_sorted(grid)
    kinds, devices = len(cost), len(grid)
    if any(len(s) != kinds for s in grid):
        raise PlanError(f"eager_execution needs {kinds} kinds per device", field="cost")
    end: dict[tuple[int, int, int], float] = {}
    order: list[list[tuple[int, int]]] = [[] for _ in range(devices)]
    for d, k, mb in _global_order(grid):
        ready = 0.0
        if k in (0, 2) and d > 0:
            ready = max(ready, end[(d - 1, k, mb)] + comm)
        if k in (1, 3) and d + 1 < devices:
            ready = max(ready, end[(d + 1, k, mb)] + comm)
        if 0 < k < 4:
            ready = max(ready, end[(d, k - 1, mb)])
        if mb > 0:
            ready = max(ready, end[(d, k, mb - 1)])
        if order[d]:
            ready = max(ready, end[(d, *order[d][-1])])
        end[(d, k, mb)] = ready + cost[k]
        order[d].append((k, mb))
    starts = [[[end[(d, k, mb)] - cost[k] for mb in range(len(grid[d][k]))] for k in range(kinds)]
              for d in range(devices)]
    longest = max(end[(d, kinds - 1, len(grid[d][kinds - 1]) - 1)] - end[(d, 0, 0)] + cost[0]
                  for d in range(devices))
    return longest, max(end.values()), starts, order


def _squeeze(grid: list[Slots], *, with_w: bool) -> list[Slots]:
    """One squeeze pass (see the module docstring), replayed eagerly at unit times; slots as ints."""
    grid = [put_weight_passes(s, split=False) if with_w else [list(lst) for lst in s] for s in grid]
    bound = max(activation_peak(s) for s in grid)
    last_mb = len(grid[0][0]) - 1
    taken = [set() for _ in grid]
    phase = 0  # 0: warm-up, 1: the steady part that stays, 2: the tail that is squeezed
    for d, k, mb in _global_order(grid):
        slot = grid[d][k][mb]
        if k == 3 and d == 0 and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and k == 0 and mb == last_mb:
                phase = 2
            taken[d].add(slot)
            continue
        after = -1
        if k in (0, 2) and d > 0:
            after = max(after, grid[d - 1][k][mb])
        if k in (1, 3) and d + 1 < len(grid):
            after = max(after, grid[d + 1][k][mb])
        if 0 < k < 4:
            after = max(after, grid[d][k - 1][mb])
        if k == 4:
            after = max(after, sorted(grid[d][2] + grid[d][3])[mb])
        if mb > 0:
            after = max(after, grid[d][k][mb - 1])
        assert after < slot, (d, k, mb)
        grid[d][k][mb] = slot
        for earlier in range(after + 1, slot):
            if earlier in taken[d]:
                continue
            grid[d][k][mb] = earlier
            if activation_peak(grid[d]) <= bound:
                break
            grid[d][k][mb] = slot
        taken[d].add(grid[d][k][mb])
    if not with_w:
        grid = [put_weight_passes(s, split=False) for s in grid]
    _, _, starts, _ = eager_execution(grid, [1.0] * 5, 0.0)
    return [[[int(round(t)) for t in lst] for lst in s] for s in starts]


def fork_actions(order: Sequence[tuple[int, int]], device: int, devices: int) -> tuple[Action, ...]:
    """One device's (kind, micro-batch) order as our actions on the V placement."""
    mirror = 2 * devices - 1 - device
    table = {0: (device, "F"), 1: (mirror, "F"), 2: (mirror, "I"), 3: (device, "I"), 4: (mirror, "W"),
             5: (device, "W")}
    return tuple(Action(table[k][0], table[k][1], mb) for k, mb in order)


def v_greedy(kind: str, devices: int, microbatches: int, *, f: float = 1.0, b: float = 1.0, w: float = 1.0,
             comm: float = 0.0) -> VGreedyResult:
    """The fork's V-Half (``kind="half"``) or V-Min (``"min"``) order for ``devices`` devices and
    ``microbatches`` micro-batches; ``f``, ``b``, ``w`` (one chunk's times) and ``comm`` only price
    the fork's estimate, never the order."""
    if devices < 1 or microbatches < 1:
        raise PlanError(f"v_greedy needs devices >= 1 and microbatches >= 1, got {devices} and {microbatches}",
                        field="microbatches")
    block = building_block(kind, devices)
    grid = [[list(range(s, s + 6 * microbatches, 6)) for s in per_device] for per_device in block]
    grid = _squeeze(grid, with_w=True)
    grid = _squeeze([s[:4] for s in grid], with_w=False)
    grid = [put_weight_passes(s[:4], split=True) for s in grid]
    longest, makespan, _, order = eager_execution(grid, [f, f, b, b, w, w], comm)
    work = 2 * microbatches * (f + b + w)
    orders = tuple(fork_actions(o, d, devices) for d, o in enumerate(order))
    return VGreedyResult(orders, longest, (longest - work) / longest, makespan)


@functools.lru_cache(maxsize=64)
def _fork_orders(kind: str, devices: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """:func:`v_greedy`'s orders, which depend on nothing else (seconds each at p = 32, m = 128)."""
    return v_greedy(kind, devices, microbatches).orders


def v_greedy_plan(method: str, devices: int, microbatches: int, *, partition: Sequence[tuple[int, int]]) -> Plan:
    """A ``v-half`` / ``v-min`` plan with the fork's order on the V placement (``partition``: ``2 p`` stages)."""
    if method not in ("v-half", "v-min"):
        raise PlanError(f"v_greedy_plan builds v-half or v-min, not {method!r}", field="method")
    if len(partition) != 2 * devices:
        raise PlanError(f"{method} on {devices} devices needs {2 * devices} stages, the partition has "
                        f"{len(partition)}", field="partition")
    order = _fork_orders(method.removeprefix("v-"), devices, microbatches)
    return Plan(devices, microbatches, tuple(partition), v_placement(devices), order, {"method": method})
