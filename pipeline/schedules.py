"""The named pipeline schedules: which placement and which order each method uses.

Every method works for any partition. :func:`build_plan` puts a partition, a placement and a
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

The fixed orders live in :mod:`pipeline.orders`, the list scheduler that yields the zero-bubble
family in :mod:`pipeline.list_scheduler`, Megatron's split in :mod:`pipeline.megatron`.
:data:`ACTIVATION_BUDGETS` is the one table of each schedule's activation budget in micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from pipeline.engine import list_schedule, schedule_and_simulate
from pipeline.errors import PlanError
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps
from pipeline.megatron import megatron_chunk_counts, megatron_partition
from pipeline.orders import gpipe_order, interleaved_order, looped_bfs_order, one_f_one_b_order, zbv_order
from pipeline.plan import Action, Plan, interleaved_placement, sequential_placement, v_placement
from pipeline.simulator import StageCosts, simulate, simulate_order, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = [
    "NAMED_METHODS",
    "ACTIVATION_BUDGETS",
    "activation_budgets",
    "build_plan",
    "method_placement",
]

NAMED_METHODS = ("gpipe", "1f1b", "i1f1b-v2", "looped-bfs", "zb-h1", "zb-h2", "zbv", "v-half", "v-min",
                 "dualpipev", "megatron")

#: Activation budget of device ``d`` of ``p``, in micro-batches of the stages it holds, for each
#: schedule that has one (Zero Bubble; Pipeline Parallelism with Controllable Memory).
ACTIVATION_BUDGETS: dict[str, Callable[[int, int], float]] = {
    "1f1b": lambda p, d: float(p - d),
    "zb-h1": lambda p, d: float(p - d),
    "zb-h2": lambda p, d: float(2 * (p - d) - 1),
    "zbv": lambda p, d: float(p),
    "v-half": lambda p, d: (p + 2) / 2,
    "v-min": lambda p, d: (p + 4) / 3,
    "dualpipev": lambda p, d: p + 1.0,
}


def activation_budgets(name: str, devices: int) -> tuple[float, ...]:
    """Per-device activation budgets (micro-batches) of a schedule in :data:`ACTIVATION_BUDGETS`."""
    try:
        rule = ACTIVATION_BUDGETS[name]
    except KeyError:
        raise PlanError(f"no activation budget for {name!r}; use one of {', '.join(ACTIVATION_BUDGETS)}",
                        field="budgets") from None
    return tuple(rule(devices, d) for d in range(devices))


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


def build_plan(method: str, profile: ModelProfile, cluster: Cluster, *, microbatches: int,
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
    elif method in ACTIVATION_BUDGETS:
        costs = stage_costs(profile, cluster, part, placement=placement, training=training)
        caps = budget_caps(costs, placement, P, microbatches_per_device=activation_budgets(method, P))
        order = _best_list_schedule(method, costs, placement, P, microbatches, caps)
    else:
        raise PlanError(f"unknown method {method!r}; use one of {', '.join(NAMED_METHODS)}", field="method")
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
    """The fastest order within the caps among the method's list-scheduler variants (and the
    hand-built ZB-V order for ``zbv``); only the winner is turned into actions."""
    variants = [replace(variant, caps=caps) for variant in _list_variants(method, devices)]
    makers: list[Callable[[], tuple[tuple[Action, ...], ...]]] = [
        lambda v=v: list_schedule(costs, placement, devices, microbatches=microbatches, config=v) for v in variants]
    scores = [_score_list(costs, placement, devices, microbatches, v) for v in variants]
    if method == "zbv" and microbatches >= 2 * devices - 1:
        order = zbv_order(devices, microbatches)
        makers.append(lambda: order)
        scores.append(simulate_order(order, costs, devices, microbatches=microbatches))
    best, best_key = 0, None
    for k, (t, peaks) in enumerate(scores):
        over = sum(max(0.0, pk - cap) for pk, cap in zip(peaks, caps))
        key = (over > 1e-6 * max(caps), t)
        if best_key is None or key < best_key:
            best, best_key = k, key
    return makers[best]()


def _score_list(costs: StageCosts, placement: Sequence[int], devices: int, microbatches: int,
                config: ListSchedulerConfig) -> tuple[float, tuple[float, ...]]:
    """(iteration time, peak activations per device) of a list-scheduled order."""
    _, t, _, peaks = schedule_and_simulate(costs, placement, devices, microbatches=microbatches, config=config)
    return t, peaks


def _megatron_plan(profile: ModelProfile, cluster: Cluster, microbatches: int,
                   training: TrainingConfig) -> Plan:
    best_plan, best_time = None, math.inf
    P = cluster.devices
    for v in megatron_chunk_counts(profile, P, microbatches):
        name = "1f1b" if v == 1 else f"i1f1b-v{v}"
        plan = build_plan(name, profile, cluster, microbatches=microbatches,
                          partition=megatron_partition(profile, P * v), training=training)
        t = simulate(plan, profile, cluster, training=training, validate=False, record_timeline=False).iteration_time
        if t < best_time:
            best_plan, best_time = plan, t
    assert best_plan is not None
    return Plan(best_plan.devices, best_plan.microbatches, best_plan.partition, best_plan.placement,
                best_plan.schedule, {"method": "megatron", "chunks": best_plan.num_stages // P})
