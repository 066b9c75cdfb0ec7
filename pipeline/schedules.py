"""Generators of the named pipeline schedules and a memory-aware list scheduler.

Every generator works for any partition: it takes the number of stages, their placement and
(for the list scheduler) their costs. ``build_plan`` puts a partition, a placement and a
schedule together for a method name:

=============== ========================= ==================================================
method          placement                 order
=============== ========================= ==================================================
gpipe           sequential                all F, then all B
1f1b            sequential                warm-up F, then one F one B (PipeDream-Flush)
i1f1b-vN        interleaved, N chunks     Megatron-LM's interleaved 1F1B order
looped-bfs      interleaved, 2 chunks     breadth-first: every F of a chunk, then the next
zb-h1           sequential                list scheduler, I/W split, 1F1B's memory
zb-h2           sequential                list scheduler, I/W split, 2p-1 micro-batches
zbv             V-shape                   list scheduler, I/W split, p micro-batches
v-half          V-shape                   list scheduler, I/W split, (p+2)/2 micro-batches
v-min           V-shape                   list scheduler, I/W split, (p+4)/3 micro-batches
dualpipev       V-shape                   list scheduler, I/W split, p+1 micro-batches; the
                                          F/B overlap of DualPipe is modelled as sequential
megatron        interleaved (best v)      i1f1b at Megatron's even split, best chunk count
=============== ========================= ==================================================

The zero-bubble family is produced by the list scheduler (as the zero-bubble paper's own
heuristic scheduler does): at each step the device that can start earliest runs, preferring
a backward (which frees memory), then a forward if its activations fit under the device's
cap, then a deferred W. The caps express each schedule's activation budget in micro-batches.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import PlanError
from pipeline.plan import (
    Action,
    Plan,
    even_partition,
    interleaved_placement,
    sequential_placement,
    v_placement,
)
from pipeline.simulator import StageCosts, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = [
    "NAMED_METHODS",
    "ListSchedulerConfig",
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_order",
    "looped_bfs_order",
    "zbv_order",
    "list_schedule",
    "megatron_partition",
    "megatron_chunk_counts",
    "budget_caps",
    "build_plan",
    "method_placement",
]

NAMED_METHODS = ("gpipe", "1f1b", "i1f1b-v2", "looped-bfs", "zb-h1", "zb-h2", "zbv", "v-half", "v-min",
                 "dualpipev", "megatron")
HEAD_KINDS = ("head", "mtp")
#: Largest chunk count the Megatron baseline tries (more chunks mean more transfers; users rarely go past 8).
MAX_MEGATRON_CHUNKS = 8


# ------------------------------------------------------------------ fixed orders

def gpipe_order(devices: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """Every forward, then every backward, one stage per device."""
    return tuple(tuple([Action(d, "F", m) for m in range(microbatches)] +
                       [Action(d, "B", m) for m in range(microbatches)]) for d in range(devices))


def one_f_one_b_order(devices: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """1F1B: device ``d`` runs ``p - d - 1`` warm-up forwards, then alternates F and B."""
    out = []
    for d in range(devices):
        warm = min(devices - d - 1, microbatches)
        acts = [Action(d, "F", m) for m in range(warm)]
        for k in range(microbatches - warm):
            acts.append(Action(d, "F", warm + k))
            acts.append(Action(d, "B", k))
        acts.extend(Action(d, "B", m) for m in range(microbatches - warm, microbatches))
        out.append(tuple(acts))
    return tuple(out)


def _interleaved_group(devices: int, microbatches: int) -> int:
    """Micro-batches per group: the devices when they divide the micro-batches (Megatron-LM),
    otherwise the smallest divisor of the micro-batches that is at least the devices (Megatron-core's
    ``microbatch_group_size_per_vp_stage``)."""
    if microbatches % devices == 0:
        return devices
    return next((g for g in range(devices, microbatches + 1) if microbatches % g == 0), microbatches)


def interleaved_order(devices: int, chunks: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """Megatron-LM's interleaved 1F1B; stage ``c * p + d`` (chunk ``c``) sits on device ``d``.

    Micro-batches go in groups of ``g`` (= p when p divides m): a device runs ``g`` of them
    through chunk 0, then chunk 1, ...; warm-up is ``2(p - d - 1) + (v - 1) g`` forwards.
    """
    if chunks == 1:
        return one_f_one_b_order(devices, microbatches)
    g = _interleaved_group(devices, microbatches)
    total = microbatches * chunks

    def fwd(d: int, k: int) -> Action:
        c = (k // g) % chunks
        return Action(c * devices + d, "F", (k // (g * chunks)) * g + k % g)

    def bwd(d: int, k: int) -> Action:
        c = chunks - 1 - (k // g) % chunks
        return Action(c * devices + d, "B", (k // (g * chunks)) * g + k % g)

    out = []
    for d in range(devices):
        warm = min(2 * (devices - d - 1) + (chunks - 1) * g, total)
        acts = [fwd(d, k) for k in range(warm)]
        for k in range(total - warm):
            acts.append(fwd(d, warm + k))
            acts.append(bwd(d, k))
        acts.extend(bwd(d, k) for k in range(total - warm, total))
        out.append(tuple(acts))
    return tuple(out)


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


# ------------------------------------------------------------------ list scheduler

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


def list_schedule(costs: StageCosts, placement: Sequence[int], devices: int, microbatches: int,
                  config: ListSchedulerConfig = ListSchedulerConfig()) -> tuple[tuple[Action, ...], ...]:
    """Build per-device orders by simulating time: the action that can start earliest runs next.

    On a device, a ready backward (I or B) comes first, then a ready forward whose activations
    fit under the cap, then a deferred W. Caps are soft: when every device is stuck on its cap,
    the earliest forward runs anyway, so the scheduler always finishes.
    """
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
    need = [sum(ACT[x] for x in range(s, S) if placement[x] == placement[s]) for s in range(S)]
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


# ------------------------------------------------------------------ partitions and caps

def _core_range(profile: ModelProfile) -> tuple[int, int]:
    """Indices ``[lo, hi)`` of the repeated blocks: leading embeddings and trailing heads excluded."""
    layers = profile.layers
    lo = 0
    while lo < len(layers) - 1 and layers[lo].kind == "embedding":
        lo += 1
    hi = len(layers)
    while hi > lo + 1 and layers[hi - 1].kind in HEAD_KINDS:
        hi -= 1
    return lo, hi


def megatron_partition(profile: ModelProfile, stages: int) -> tuple[tuple[int, int], ...]:
    """Megatron-LM's split: blocks as even as possible, the embedding joins the first stage and
    the head the last. Falls back to an even split of all layers when blocks < stages."""
    lo, hi = _core_range(profile)
    blocks = hi - lo
    if blocks < stages:
        return even_partition(profile.num_layers, stages)
    core = even_partition(blocks, stages)
    out = [(a + lo, b + lo) for a, b in core]
    out[0] = (0, out[0][1])
    out[-1] = (out[-1][0], profile.num_layers)
    return tuple(out)


def megatron_chunk_counts(profile: ModelProfile, devices: int, microbatches: int) -> list[int]:
    """Chunk counts the Megatron baseline tries: every ``v`` with at least one block per chunk
    (``devices * v <= blocks``); ``v > 1`` needs micro-batches divisible by the devices, as
    Megatron-LM's interleaved schedule does. Uneven splits are allowed (Megatron-core's
    ``num_layers_in_first/last_pipeline_stage``), which makes the baseline stronger, not weaker."""
    lo, hi = _core_range(profile)
    blocks = hi - lo
    counts = [1]
    if devices < 2 or microbatches % devices:
        return counts
    counts.extend(range(2, min(MAX_MEGATRON_CHUNKS, blocks // devices) + 1))
    return counts


def budget_caps(costs: StageCosts, placement: Sequence[int], devices: int,
                microbatches_per_device: Sequence[float]) -> tuple[float, ...]:
    """Caps in bytes from budgets in micro-batches: one micro-batch on device ``d`` holds the
    activations of every stage ``d`` runs."""
    per_mb = [0.0] * devices
    for s, d in enumerate(placement):
        per_mb[d] += costs.act[s]
    return tuple(max(1.0, k) * per_mb[d] for d, k in enumerate(microbatches_per_device))


# ------------------------------------------------------------------ named methods

def method_placement(method: str, devices: int) -> tuple[int, ...]:
    """The placement a named method uses."""
    if method in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        return sequential_placement(devices)
    if method in ("zbv", "v-half", "v-min", "dualpipev"):
        return v_placement(devices)
    if method == "looped-bfs":
        return interleaved_placement(devices, 2)
    if method.startswith("i1f1b-v"):
        return interleaved_placement(devices, _chunks_of(method))
    raise PlanError(f"unknown method {method!r}; use one of {', '.join(NAMED_METHODS)} or i1f1b-vN",
                    field="method")


def _chunks_of(method: str) -> int:
    try:
        v = int(method.removeprefix("i1f1b-v"))
    except ValueError:
        raise PlanError(f"bad chunk count in {method!r}; write e.g. i1f1b-v2", field="method") from None
    if v < 1:
        raise PlanError(f"chunk count must be >= 1 in {method!r}", field="method")
    return v


_V_BUDGETS = {
    "zbv": lambda p: float(p),
    "v-half": lambda p: (p + 2) / 2,
    "v-min": lambda p: (p + 4) / 3,
    "dualpipev": lambda p: p + 1.0,
}


def build_plan(method: str, profile: ModelProfile, cluster: Cluster, microbatches: int, *,
               partition: Sequence[tuple[int, int]] | None = None,
               training: TrainingConfig = TrainingConfig()) -> Plan:
    """The plan of a named method. ``partition`` defaults to Megatron's even split for the
    method's number of stages; ``megatron`` picks its best chunk count by simulation."""
    P = cluster.devices
    if method == "megatron":
        return _megatron_plan(profile, cluster, microbatches, training)
    placement = method_placement(method, P)
    stages = len(placement)
    if stages > profile.num_layers:
        raise PlanError(f"{method} needs {stages} stages but the model has only {profile.num_layers} layers",
                        field="method")
    part = tuple(partition) if partition is not None else megatron_partition(profile, stages)
    if len(part) != stages:
        raise PlanError(f"{method} on {P} devices needs {stages} stages, the partition has {len(part)}",
                        field="partition")
    meta = {"method": method}
    if method == "gpipe":
        order = gpipe_order(P, microbatches)
    elif method == "1f1b":
        order = one_f_one_b_order(P, microbatches)
    elif method.startswith("i1f1b-v"):
        order = interleaved_order(P, _chunks_of(method), microbatches)
    elif method == "looped-bfs":
        order = looped_bfs_order(P, 2, microbatches)
    else:
        costs = stage_costs(profile, cluster, part, placement, training)
        if method == "zb-h1":
            budgets = [P - d for d in range(P)]
        elif method == "zb-h2":
            budgets = [2 * (P - d) - 1 for d in range(P)]
        elif method in _V_BUDGETS:
            budgets = [_V_BUDGETS[method](P)] * P
        else:
            raise PlanError(f"unknown method {method!r}; use one of {', '.join(NAMED_METHODS)}",
                            field="method")
        caps = budget_caps(costs, placement, P, budgets)
        order = _best_list_schedule(method, costs, placement, P, microbatches, caps)
    return Plan(P, microbatches, part, placement, order, meta)


def _list_variants(method: str, devices: int) -> list[ListSchedulerConfig]:
    """The list-scheduler priorities a named zero-bubble method tries (it keeps the fastest)."""
    if method in ("zb-h1", "zb-h2"):
        # ZB-H1/H2 cap the micro-batches whose I has not run; at most p W's wait.
        return [ListSchedulerConfig(cap_counts_w=False, max_pending_w=devices)]
    return [ListSchedulerConfig(depth_first=depth, max_pending_w=mpw)
            for depth in (True, False) for mpw in (None, 2, devices)]


def _best_list_schedule(method: str, costs: StageCosts, placement: Sequence[int], devices: int,
                        microbatches: int, caps: tuple[float, ...]) -> tuple[tuple[Action, ...], ...]:
    from dataclasses import replace

    from pipeline.simulator import simulate_order

    candidates = [list_schedule(costs, placement, devices, microbatches, replace(variant, caps=caps))
                  for variant in _list_variants(method, devices)]
    if method == "zbv" and microbatches >= 2 * devices - 1:
        candidates.append(zbv_order(devices, microbatches))
    best, best_key = None, None
    for order in candidates:
        t, peaks = simulate_order(order, costs, devices, microbatches)
        over = sum(max(0.0, pk - cap) for pk, cap in zip(peaks, caps))
        key = (over > 1e-6 * max(caps), t)
        if best_key is None or key < best_key:
            best, best_key = order, key
    assert best is not None
    return best


def _megatron_plan(profile: ModelProfile, cluster: Cluster, microbatches: int,
                   training: TrainingConfig) -> Plan:
    from pipeline.simulator import simulate

    best_plan, best_time = None, math.inf
    P = cluster.devices
    for v in megatron_chunk_counts(profile, P, microbatches):
        name = "1f1b" if v == 1 else f"i1f1b-v{v}"
        plan = build_plan(name, profile, cluster, microbatches,
                          partition=megatron_partition(profile, P * v), training=training)
        t = simulate(plan, profile, cluster, training, validate=False, record_timeline=False).iteration_time
        if t < best_time:
            best_plan, best_time = plan, t
    assert best_plan is not None
    return Plan(best_plan.devices, best_plan.microbatches, best_plan.partition, best_plan.placement,
                best_plan.schedule, {"method": "megatron", "chunks": best_plan.num_stages // P})
