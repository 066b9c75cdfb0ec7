"""Starting plans, one recipe a function: what the searches simulate before they edit anything.

The tuner's seeds (:func:`agents.tuner.seed_candidates`), the start ranker's arms
(:mod:`agents.rl.starts`), the RL searcher's hand-written starts, the deployment-target search and
the named baselines build their starting plans with these, so a recipe means the same everywhere:

* :data:`PLACEMENT_CHOICES`: the placement families searched (kind, chunks per device);
* :func:`split_sizes` (:func:`megatron_sizes`): a placement's split, DP-balanced, Megatron's even
  one or device-balanced;
* :func:`preset_candidate`: list-scheduled under a named schedule's activation budgets;
* :func:`with_filled_budgets`, :func:`with_roomy_budgets`: budgets that fill each device's memory,
  or deeper ones sized by the activations alone;
* :func:`fit_candidate`: a named schedule's budgets cut to the memory left after the static share;
* :func:`recompute_candidate`: every stage recomputing, budgets cut to fit;
* :func:`fixed_order_candidate`: the placement's hand-built order (1F1B, ZB-V, interleaved 1F1B);
* :func:`named_schedule_plan`: a named schedule's plan at Megatron's or the DP-balanced split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pipeline.budgets import cut_budgets, preset_budgets
from pipeline.candidates import Candidate, by_position
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.megatron import megatron_partition
from pipeline.plan import Plan, interleaved_placement, partition_from_sizes, v_placement
from pipeline.schedules import build_plan, method_placement
from pipeline.spec import ModelProfile

__all__ = ["PLACEMENT_CHOICES", "SPLITS", "SEED_PRESETS", "megatron_sizes", "split_sizes", "preset_candidate",
           "with_filled_budgets", "with_roomy_budgets", "fit_candidate", "recompute_candidate",
           "fixed_order_candidate", "named_schedule_plan"]

#: (placement kind, chunks per device) pairs that random search, the tuner and the start ranker draw from.
PLACEMENT_CHOICES = (("sequential", 1), ("interleaved", 2), ("interleaved", 3), ("interleaved", 4), ("v", 2),
                     ("wave", 3), ("wave", 4))
#: The splits :func:`split_sizes` knows: DP-balanced, Megatron's even one, device-balanced.
SPLITS = ("dp", "megatron", "devbal")
#: The named schedules whose activation budgets seed a search (:func:`preset_candidate`; None: unlimited).
SEED_PRESETS = ("zb-h1", "zb-h2", "zbv", "v-half", None)


def megatron_sizes(profile: ModelProfile, stages: int) -> tuple[int, ...]:
    """Layers per stage of Megatron's even split into ``stages`` stages."""
    return tuple(b - a for a, b in megatron_partition(profile, stages))


def split_sizes(ev: Evaluator, placement: tuple[int, ...], split: str) -> tuple[int, ...] | None:
    """Layers per stage of ``placement`` on ``ev``'s scenario under ``split`` (one of :data:`SPLITS`):
    ``dp`` the DP-balanced split, ``megatron`` Megatron's even one, ``devbal`` the device-balanced
    one (:mod:`pipeline.balance`; None with one stage per device, where it is the DP-balanced one)."""
    if split == "dp":
        return ev.balanced_sizes(placement)
    if split == "megatron":
        return megatron_sizes(ev.scenario.profile, len(placement))
    if split == "devbal":
        return ev.device_balanced_sizes(placement) if len(placement) > ev.scenario.devices else None
    raise PlanError(f"unknown split {split!r}; use one of {SPLITS}", field="split")


def preset_candidate(sizes: tuple[int, ...], placement: tuple[int, ...], preset: str | None, *,
                     devices: int, device_order: Sequence[int] | None = None) -> Candidate:
    """List-scheduled under the activation budgets of the named schedule ``preset`` (None or a name
    without budgets: unlimited). ZB-H1's and ZB-H2's budgets leave W's activations out and keep at
    most ``devices`` W pending, as those schedules do; the others count W against the budget.
    ``device_order``: the devices in pipeline order (:func:`pipeline.candidates.slow_first`), the
    budgets given by position moved to the devices holding those positions."""
    budgets = _preset_budgets(preset, devices) if preset else None
    if budgets is not None and device_order is not None:
        budgets = by_position(budgets, device_order)
    counts_w = preset not in ("zb-h1", "zb-h2")
    return Candidate(sizes, placement, "list", budgets, cap_counts_w=counts_w,
                     max_pending_w=None if counts_w else devices)


#: :func:`preset_budgets` by ``(preset, devices)`` (tuples: shared; emptied past 1024 entries).
_PRESET_BUDGETS: dict[tuple[str, int], tuple[float, ...] | None] = {}


def _preset_budgets(preset: str, devices: int) -> tuple[float, ...] | None:
    if type(devices) is not int:  # (4.0 keys like 4: its own answer, or its error)
        return preset_budgets(preset, devices)
    key = (preset, devices)
    if key in _PRESET_BUDGETS:
        return _PRESET_BUDGETS[key]
    if len(_PRESET_BUDGETS) >= 1024:
        _PRESET_BUDGETS.clear()
    hit = _PRESET_BUDGETS[key] = preset_budgets(preset, devices)
    return hit


def with_filled_budgets(c: Candidate, ev: Evaluator) -> Candidate:
    """``c`` as a list-scheduled plan whose activation budgets fill each device's memory (rounded down
    to 1/100 micro-batch), with W's activations counted against them."""
    budgets = tuple(math.floor(b * 100) / 100 for b in ev.memory_budgets(c))
    return replace(c, order="list", budgets=budgets, cap_counts_w=True)


def with_roomy_budgets(c: Candidate, ev: Evaluator) -> Candidate:
    """``c`` under :func:`pipeline.budgets.roomy_budgets` (activations alone per micro-batch, one
    kept share held back; rounded down to 1/100): deeper than :func:`with_filled_budgets`, may not fit."""
    budgets = tuple(math.floor(b * 100) / 100 for b in ev.roomy_budgets(c))
    return replace(c, order="list", budgets=budgets, cap_counts_w=True)


def fit_candidate(sizes: tuple[int, ...], placement: tuple[int, ...], ev: Evaluator, *, preset: str,
                  device_order: Sequence[int] | None = None) -> Candidate | None:
    """:func:`preset_candidate`'s budgets cut to the micro-batches each device's memory holds after
    its static share, W counted; None when one micro-batch does not fit or nothing needs cutting."""
    budgets = preset_budgets(preset, ev.scenario.devices)
    if budgets is None:
        raise PlanError(f"{preset!r} has no activation budgets to cut", field="preset")
    if device_order is not None:
        budgets = by_position(budgets, device_order)
    cut = cut_budgets(ev.costs(sizes, placement), placement, budgets)
    if cut is None or cut == budgets:
        return None
    return Candidate(sizes, placement, "list", cut, cap_counts_w=True)


def recompute_candidate(sizes: tuple[int, ...], placement: tuple[int, ...], ev: Evaluator) -> Candidate | None:
    """Every stage recomputing its activations (fused B, only the stage inputs kept) under ZB-H1's
    budgets (one stage per device) or ZB-V's, cut to what memory holds: where nothing else fits.
    None when one micro-batch does not fit even so."""
    devices = ev.scenario.devices
    everywhere = (True,) * len(placement)
    preset = preset_budgets("zb-h1" if len(placement) == devices else "zbv", devices)
    cut = cut_budgets(ev.costs(sizes, placement, everywhere), placement, preset, split_backward=False)
    if cut is None:
        return None
    return Candidate(sizes, placement, "list", cut, split_backward=False, cap_counts_w=True, recompute=everywhere)


def fixed_order_candidate(sizes: tuple[int, ...], placement: tuple[int, ...], *, devices: int) -> Candidate:
    """The placement's own hand-built order: 1F1B with one stage per device, interleaved 1F1B on
    the interleaved placement, ZB-V on the V placement (PlanError on any other placement)."""
    if len(placement) == devices:
        return Candidate(sizes, placement, "1f1b")
    if len(placement) % devices == 0 and placement == interleaved_placement(devices, len(placement) // devices):
        return Candidate(sizes, placement, "interleaved")
    if len(placement) == 2 * devices and placement == v_placement(devices):
        return Candidate(sizes, placement, "zbv")
    raise PlanError(f"no hand-built order for placement {list(placement)}; use a list-scheduled candidate",
                    field="placement")


def named_schedule_plan(ev: Evaluator, method: str, *, balanced: bool = False, chunks: int | None = None) -> Plan:
    """The named schedule ``method``'s plan (:func:`pipeline.schedules.build_plan`) on ``ev``'s
    scenario at Megatron's split, or with ``balanced`` at the DP-balanced one; ``chunks``: Megatron's
    plan at that many chunks per device (1F1B or interleaved 1F1B at the even split), not its own
    choice. Raises :class:`~pipeline.errors.PlanError` where the schedule cannot be built."""
    scenario = ev.scenario
    if chunks is not None:
        name = "1f1b" if chunks == 1 else f"i1f1b-v{chunks}"
        plan = build_plan(name, scenario.profile, scenario.cluster, microbatches=scenario.microbatches,
                          partition=megatron_partition(scenario.profile, scenario.devices * chunks),
                          training=scenario.training)
        return replace(plan, meta={"method": "megatron", "chunks": chunks})
    partition = None
    if balanced:
        partition = partition_from_sizes(ev.balanced_sizes(method_placement(method, scenario.devices)))
    return build_plan(method, scenario.profile, scenario.cluster, microbatches=scenario.microbatches,
                      partition=partition, training=scenario.training)
