"""Megatron-LM's pipeline policy: its even layer split and the chunk counts it can run.

Megatron puts the blocks as evenly as possible on the stages, the embedding with the first and
the head with the last; interleaved 1F1B needs micro-batches divisible by the devices. The
baseline every speedup in this project is measured against (``megatron`` in
:mod:`pipeline.schedules`) tries each chunk count this module allows.
"""

from __future__ import annotations

from pipeline.plan import even_partition
from pipeline.spec import ModelProfile

__all__ = ["HEAD_KINDS", "MAX_MEGATRON_CHUNKS", "core_range", "megatron_partition", "megatron_chunk_counts"]

HEAD_KINDS = ("head", "mtp")
#: Largest chunk count the Megatron baseline tries (more chunks mean more transfers; users rarely go past 8).
MAX_MEGATRON_CHUNKS = 8


def core_range(profile: ModelProfile) -> tuple[int, int]:
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
    lo, hi = core_range(profile)
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
    lo, hi = core_range(profile)
    blocks = hi - lo
    counts = [1]
    if devices < 2 or microbatches % devices:
        return counts
    counts.extend(range(2, min(MAX_MEGATRON_CHUNKS, blocks // devices) + 1))
    return counts
