"""Activation budgets of the list scheduler, per device in micro-batches: a named schedule's
(:func:`preset_budgets`), cut to what memory holds (:func:`cut_budgets`), or filling it
(:func:`memory_budgets`, :func:`roomy_budgets`), and what one micro-batch holds on each device
(:func:`microbatch_bytes`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.schedules import ACTIVATION_BUDGETS, activation_budgets
from pipeline.simulator import StageCosts

__all__ = ["preset_budgets", "cut_budgets", "memory_budgets", "roomy_budgets", "microbatch_bytes"]

def preset_budgets(name: str | None, devices: int) -> tuple[float, ...] | None:
    """Per-device activation budgets (micro-batches) of a named schedule's memory
    (:data:`pipeline.schedules.ACTIVATION_BUDGETS`); ``None`` for any other name (unlimited)."""
    return activation_budgets(name, devices) if name in ACTIVATION_BUDGETS else None


def cut_budgets(costs: StageCosts, placement: Sequence[int], budgets: Sequence[float], *,
                split_backward: bool = True) -> tuple[float, ...] | None:
    """``budgets`` cut to the whole micro-batches each device's memory holds after its static
    share (:func:`microbatch_bytes` per micro-batch), at least one; None when one micro-batch does
    not fit on some device."""
    held = microbatch_bytes(costs, placement, len(budgets), split_backward=split_backward)
    out = []
    for d, b in enumerate(budgets):
        fit = (costs.memory_limit[d] - costs.static_bytes[d]) / held[d] if held[d] > 0 else math.inf
        if fit < 1.0:
            return None
        out.append(max(1.0, min(b, float(int(fit)))) if math.isfinite(fit) else max(1.0, b))
    return tuple(out)


def memory_budgets(costs: StageCosts, placement: Sequence[int], devices: int, *,
                   split_backward: bool = True) -> tuple[float, ...]:
    """Per-device activation budgets (micro-batches of the stages it holds) that fill each device's
    memory: what is left of its limit after the static memory, over the most one micro-batch holds
    there at once (:func:`microbatch_bytes`: its activations, or with a split backward what ``I``
    leaves for ``W`` where that is more, as PyTorch's ``I`` does). The list scheduler's cap counts a
    micro-batch's activations until its ``I`` and what it keeps for ``W`` after, so under these
    budgets (with ``cap_counts_w``) no device's peak exceeds its limit; where memory, not the
    schedule, limits how deep the warm-up may run, this is the deepest that surely fits. Sized by
    the activations alone, ``I`` lifting the kept bytes over the cap would overflow the device."""
    held = microbatch_bytes(costs, placement, devices, split_backward=split_backward)
    return tuple(max(1.0, (costs.memory_limit[d] - costs.static_bytes[d]) / held[d]) if held[d] > 0 else 1.0
                 for d in range(devices))


def roomy_budgets(costs: StageCosts, placement: Sequence[int], devices: int) -> tuple[float, ...]:
    """Per-device budgets deeper than :func:`memory_budgets`: a micro-batch sized by its
    activations alone, with the most one stage keeps for ``W`` held back once. That fills memory
    where ``W`` follows ``I`` closely enough that few micro-batches hold kept bytes at once; where
    it does not, the plan overflows (the simulator's peak decides, so use it as a candidate, not
    a guarantee). Where memory binds the warm-up, this is often the faster side of the line."""
    act = [0.0] * devices
    kept = [0.0] * devices
    for s, d in enumerate(placement):
        act[d] += costs.act[s]
        kept[d] = max(kept[d], costs.w_keep[s])
    return tuple(max(1.0, (costs.memory_limit[d] - costs.static_bytes[d] - kept[d]) / act[d]) if act[d] > 0 else 1.0
                 for d in range(devices))


def microbatch_bytes(costs: StageCosts, placement: Sequence[int], devices: int, *,
                     split_backward: bool = True) -> list[float]:
    """Bytes one micro-batch can hold on each device at once: its stages' activations, or with a
    split backward what ``I`` leaves for ``W`` where that is more (PyTorch keeps the graph and
    W's gradients: ``TrainingConfig.input_backward_keeps_graph``)."""
    out = [0.0] * devices
    for s, d in enumerate(placement):
        out[d] += max(costs.act[s], costs.w_keep[s]) if split_backward else costs.act[s]
    return out
