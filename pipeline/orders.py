"""Fixed pipeline orders: GPipe, 1F1B, Megatron-LM's interleaved 1F1B, looped BFS and ZB-V.

Each generator returns one tuple of :class:`~pipeline.plan.Action` per device for any number of
devices and micro-batches; stage ``s`` of chunk ``c`` sits where the named placement puts it
(:mod:`pipeline.plan`). The zero-bubble family comes from the list scheduler instead
(:mod:`pipeline.list_scheduler`).
"""

from __future__ import annotations

from pipeline.errors import PlanError
from pipeline.plan import Action

__all__ = ["gpipe_order", "one_f_one_b_order", "interleaved_order", "looped_bfs_order", "zbv_order"]


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


