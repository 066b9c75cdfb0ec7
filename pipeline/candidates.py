"""The plan space's values: a scenario (:class:`Scenario`) and a compact, editable plan description
(:class:`Candidate`), the plan a candidate describes (:func:`materialize`) and the search's goal
(:func:`objective_key`).

A :class:`Candidate` fixes the partition (layers per stage), the placement (device per stage) and
how the schedule is generated: a fixed order (``1f1b``, ``interleaved``, ``gpipe``,
``looped-bfs``, ``zbv``) or the memory-aware list scheduler with its knobs (per-device
activation budgets in micro-batches, I/W split, deferred or eager W, depth-first forwards).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.engine import list_schedule
from pipeline.errors import PlanError
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps
from pipeline.orders import gpipe_order, interleaved_order, looped_bfs_order, one_f_one_b_order, zbv_order
from pipeline.plan import (
    Plan,
    interleaved_placement,
    partition_from_sizes,
    sequential_placement,
    v_placement,
    wave_placement,
)
from pipeline.simulator import Result, StageCosts, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = ["ORDERS", "PLACEMENT_KINDS", "Scenario", "Candidate", "recompute_for", "slow_first", "by_position",
           "make_placement", "move_layers", "list_config", "materialize", "objective_key"]

ORDERS = ("list", "1f1b", "gpipe", "interleaved", "looped-bfs", "zbv")
PLACEMENT_KINDS = ("sequential", "interleaved", "v", "wave")


@dataclass(frozen=True)
class Scenario:
    """One scenario: a model's profile, a cluster, micro-batches per iteration, training settings."""

    profile: ModelProfile
    cluster: Cluster
    microbatches: int
    training: TrainingConfig = TrainingConfig()

    @property
    def devices(self) -> int:
        return self.cluster.devices


@dataclass(frozen=True)
class Candidate:
    """An editable plan description (see the module docstring)."""

    sizes: tuple[int, ...]
    """Layers per stage, in order."""
    placement: tuple[int, ...]
    """Device of each stage."""
    order: str = "list"
    """How the schedule is generated: one of ORDERS."""
    budgets: tuple[float, ...] | None = None
    """List scheduler: activation budget per device, in micro-batches of that device's stages."""
    split_backward: bool = True
    eager_w: bool = False
    depth_first: bool = True
    max_pending_w: int | None = None
    cap_counts_w: bool = True
    recompute: tuple[bool, ...] | None = None
    """Per stage: recompute its activations in the backward (see ``Plan.recompute``); None: none."""

    def __hash__(self) -> int:
        """The dataclass's own hash (of every field, in order), computed once and kept beside the
        fields: searches and the environments look each candidate up in several caches. A copy that
        changes a field must not carry it (``env.editor._with`` drops it; pickles leave it out)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.sizes, self.placement, self.order, self.budgets,
                                               self.split_backward, self.eager_w, self.depth_first,
                                               self.max_pending_w, self.cap_counts_w, self.recompute))
        return h

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # strings hash differently in another process
        return state

    @property
    def num_stages(self) -> int:
        return len(self.sizes)

    def describe(self) -> str:
        knobs = ""
        if self.order == "list":
            b = "inf" if self.budgets is None else ",".join(f"{x:g}" for x in self.budgets)
            knobs = (f" budgets=[{b}] {'I/W' if self.split_backward else 'B'}"
                     f"{' eager-W' if self.eager_w else ''}{'' if self.depth_first else ' breadth'}")
        if self.recompute is not None and any(self.recompute):
            knobs += f" recompute={[s for s, r in enumerate(self.recompute) if r]}"
        return f"{self.order} sizes={list(self.sizes)} placement={list(self.placement)}{knobs}"


def recompute_for(c: Candidate, stages: int) -> tuple[bool, ...] | None:
    """``c``'s recompute flags carried to a layout of ``stages`` stages: every stage when ``c``
    recomputes every stage, else none (per-stage flags mean nothing for other stages)."""
    if c.recompute is None or len(c.recompute) == stages:
        return c.recompute
    return (True,) * stages if all(c.recompute) else None


def slow_first(speeds: Sequence[float]) -> tuple[int, ...] | None:
    """Devices in pipeline order, slowest first and fastest last (devices of one speed keep their
    index order); ``None`` when every device is as fast. On mixed clusters this order puts the
    heaviest unit a split cannot spread, the LM head on the last stage, on the fastest device,
    while the split gives the slow ones fewer layers. It ignores node boundaries: the simulator
    prices the links it crosses."""
    if max(speeds) == min(speeds):
        return None
    return tuple(sorted(range(len(speeds)), key=lambda d: (speeds[d], d)))


def by_position(values: Sequence[float], order: Sequence[int]) -> tuple[float, ...]:
    """Per-device ``values`` given by pipeline position (a named schedule's budgets: deepest
    first) moved to the devices that hold those positions under ``order``."""
    out = [0.0] * len(values)
    for p, d in enumerate(order):
        out[d] = values[p]
    return tuple(out)


def move_layers(sizes: Sequence[int], src: int, dst: int, *, n: int = 1) -> tuple[int, ...] | None:
    """Stage sizes after ``n`` layers leave stage ``src`` for stage ``dst``, or None where ``src``
    would be left empty. The stages between keep their sizes, so every boundary between shifts by
    ``n``: the one move of a layer across stage boundaries that the searchers and the env share."""
    if src == dst or sizes[src] <= n:
        return None
    out = list(sizes)
    out[src] -= n
    out[dst] += n
    return tuple(out)


def make_placement(kind: str, devices: int, chunks: int) -> tuple[int, ...]:
    """A named placement of ``devices * chunks`` stages."""
    if kind == "sequential" or chunks == 1:
        return sequential_placement(devices)
    if kind == "interleaved":
        return interleaved_placement(devices, chunks)
    if kind == "v":
        if chunks != 2:
            return wave_placement(devices, chunks)
        return v_placement(devices)
    if kind == "wave":
        return wave_placement(devices, chunks)
    raise PlanError(f"unknown placement {kind!r}; use one of {PLACEMENT_KINDS}", field="placement")


def _fixed_order(c: Candidate, devices: int, microbatches: int):
    S, P = c.num_stages, devices
    if c.order in ("1f1b", "gpipe"):
        if c.placement != sequential_placement(P):
            raise PlanError(f"{c.order} needs one stage per device in order", field="placement")
        return (one_f_one_b_order if c.order == "1f1b" else gpipe_order)(P, microbatches)
    if c.order in ("interleaved", "looped-bfs"):
        chunks = S // P
        if S % P or c.placement != interleaved_placement(P, chunks):
            raise PlanError(f"{c.order} needs the interleaved placement", field="placement")
        return (interleaved_order if c.order == "interleaved" else looped_bfs_order)(P, chunks, microbatches)
    if c.order == "zbv":
        if c.placement != v_placement(P):
            raise PlanError("the ZB-V order needs the V placement", field="placement")
        return zbv_order(P, microbatches)
    raise PlanError(f"unknown order {c.order!r}; use one of {ORDERS}", field="order")


def list_config(c: Candidate, costs: StageCosts, devices: int) -> ListSchedulerConfig:
    """The list scheduler's knobs for a ``list`` candidate (budgets turned into byte caps)."""
    caps = None if c.budgets is None else budget_caps(costs, c.placement, devices, microbatches_per_device=c.budgets)
    return ListSchedulerConfig(caps=caps, split_backward=c.split_backward, eager_w=c.eager_w,
                               depth_first=c.depth_first, max_pending_w=c.max_pending_w, cap_counts_w=c.cap_counts_w)


def materialize(c: Candidate, scenario: Scenario, *, costs: StageCosts | None = None) -> Plan:
    """The plan a candidate describes (``costs``: its stage costs, when already known)."""
    P, M = scenario.devices, scenario.microbatches
    partition = partition_from_sizes(c.sizes)
    if c.recompute is not None and len(c.recompute) != c.num_stages:
        raise PlanError(f"has {len(c.recompute)} entries for {c.num_stages} stages", field="recompute")
    if c.order == "list":
        if costs is None:
            costs = stage_costs(scenario.profile, scenario.cluster, partition, placement=c.placement,
                                training=scenario.training, recompute=c.recompute)
        order = list_schedule(costs, c.placement, P, microbatches=M, config=list_config(c, costs, P))
    else:
        order = _fixed_order(c, P, M)
    return Plan(P, M, partition, c.placement, order, {"method": "candidate", "candidate": c.describe()},
                recompute=c.recompute)


def objective_key(result: Result) -> tuple[int, float, float]:
    """Lexicographic goal: feasible first, then least memory overflow, then fastest."""
    if not result.valid:
        return (2, math.inf, math.inf)
    # (each term is max(0.0, p - lim), without the call: the same number, summed in the same order)
    over = sum([d if (d := p - lim) > 0.0 else 0.0 for p, lim in zip(result.peak_memory, result.memory_limit)])
    return (0 if over <= 0 else 1, over, result.iteration_time)
