"""Proven schedules: the best order of a plan's actions, and a proven lower bound on every order.

For a plan's partition and placement, :func:`prove` searches the per-device orders of its F / I / W
(or fused B) actions with a CP-SAT model (:mod:`pipeline.exact_model`; OR-Tools is imported only
when a model is solved) and proves a lower bound on the iteration time of every such order:

* one interval per action on its stage's device, ``NoOverlap`` per device (a device runs one action
  at a time), durations those of :func:`pipeline.simulator.stage_costs` for the training's runtime
  (compute scale, per-action overhead, transfer overheads, blocking transfers moved onto the
  sending action), so the model sees exactly the simulator's durations;
* the simulator's data dependencies with its transfer latencies: ``F(s,m)`` after ``F(s-1,m)`` plus
  ``comm[s-1]``; ``I/B(s,m)`` after ``F(s,m)`` and after ``I/B(s+1,m)`` plus ``comm[s]``;
  ``W(s,m)`` after ``I(s,m)`` (no link contention, as in the simulator);
* the memory limit as a ``Cumulative`` per device: ``F`` holds the stage's activations until its
  ``I`` (or ``B``) starts, ``I`` holds what ``W`` frees until ``W`` starts, exactly the level the
  simulator's order-based accounting reaches after each action (actions on a device never
  overlap, so the level at an action's start is the level after it in list order);
* each stage runs its F's, I's and W's in micro-batch order (no schedule is lost: micro-batches of
  a stage are identical, :func:`pipeline.exact_model.symmetry_pairs`);
* the makespan (plus the runtime's step and the shared weights' all-reduce, a constant).

When the full model does not close within :data:`FULL_MODEL_SHARE` of the time, plans up to
:data:`pipeline.exact_model.RELAX_ACTIONS` actions spend the rest on one-device relaxations (only
that device keeps ``NoOverlap`` and its memory limit), each a valid bound. The whole proof keeps to
``seconds``: the solver stops at 95% of it (a timer calls ``stop_search`` as well).

Integer time: durations and latencies are rounded **down** to ticks of 0.1 microseconds, and memory
demands rounded down (capacities up) to a unit of at most a millionth of the capacity. Rounding
down only relaxes the model: the floor of every start time of any real schedule is a schedule of
the rounded model (``floor(a + b) >= floor(a) + floor(b)``) with no larger makespan, so the
solver's proven bound, divided back, is a lower bound of the simulator's time over every order of
the same actions. It is combined with :func:`pipeline.bounds.lower_bound` (every plan) and the
partition's own device-load bound; the largest is reported.

Honesty: the reported best time is never the solver's objective. Each solution's start times are
turned into per-device orders (sorted by start), written as a plan and simulated by
:func:`pipeline.simulator.simulate`; the fastest order that the simulator finds valid and within
the memory limit wins, and the plan's own order and the list scheduler's orders compete too, so
the best is never worse than either. Where the simulated time differs from the solver's makespan
(the rounding only), both are reported.

What the bound covers: orders of the plan's own actions, i.e. its partition, placement, micro-batch
count, and per stage its choice of split (I/W) or fused (B) backward and of recomputation. The
schedules the list scheduler and the fixed orders produce are such orders.

Runtimes whose iterations overlap (``zb``: the steady-state period of back-to-back iterations)
are searched by the single-iteration makespan, a proxy; their simulated time is the period. One
iteration's makespan does not bound the period, so there only :func:`pipeline.bounds.lower_bound`
bounds it (``formulation`` says so).

Size: above ``max_actions`` actions the model is not built (``formulation`` says so) and the bound
is the analytic one; the best stays the best of the plan's and the list scheduler's orders.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.bounds import lower_bound
from pipeline.engine import list_schedule
from pipeline.errors import ConfigError, PlanError
from pipeline.event_sim import StageCosts
from pipeline.exact_model import (
    RELAX_ACTIONS,
    STOPPED,
    STOPPED_BY,
    backward_kinds,
    build_actions,
    dependency_edges,
    relaxation_bounds,
    solve,
    symmetry_pairs,
)
from pipeline.list_scheduler import ListSchedulerConfig
from pipeline.plan import Action, Plan
from pipeline.runtime import runtime_named
from pipeline.simulator import Result, simulate, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = ["TICKS_PER_SECOND", "DEFAULT_MAX_ACTIONS", "Proof", "prove", "plan_caps", "device_load_bound"]

#: Integer time of the model: ticks per second (0.1 microseconds).
TICKS_PER_SECOND = 10_000_000
#: The most actions (F, I, W, B of every stage and micro-batch) the exact model is built for.
DEFAULT_MAX_ACTIONS = 16_384
#: Relative amount taken off the float-summed load bound, so that rounding in its sums cannot lift it
#: above the simulator's time of an order that meets it exactly.
_FLOAT_SLACK = 1e-9
#: Share of the time the full model gets before the one-device relaxations (when it does not close).
FULL_MODEL_SHARE = 0.6


@dataclass
class Proof:
    """What :func:`prove` found (times in the profile's unit)."""

    plan: Plan
    """The best plan found (the input plan when nothing beat it)."""
    result: Result
    """Its simulation."""
    plan_time: float
    """The input plan's simulated time."""
    best_time: float
    """The best plan's simulated time (the toolkit's own simulator, never the solver's objective)."""
    bound: float
    """The largest valid lower bound: of ``solver_bound``, ``analytic_bound`` and ``load_bound``."""
    solver_bound: float | None
    """The solver's proven bound, in the profile's unit (``None``: no valid solver bound)."""
    analytic_bound: float
    """:func:`pipeline.bounds.lower_bound` (every plan of the profile and cluster)."""
    load_bound: float
    """:func:`device_load_bound` of this partition and placement (0 where iterations overlap)."""
    formulation: str
    """``exact``, or what was relaxed or left out, in words."""
    status: str
    """The solver's status (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, or ``not run``)."""
    source: str
    """Where the best order came from: ``solver``, ``plan`` or ``list scheduler``."""
    solver_makespan: float | None = None
    """The solver's makespan of its best solution, in the profile's unit (rounded-down durations),
    beside the simulated time of the same order."""
    solver_order_time: float | None = None
    """The simulated time of the solver's best order (``None`` when it had none, or it was not valid)."""
    plan_fits: bool = True
    """The input plan is valid and within the memory caps (when not, a best that fits may be slower)."""
    seconds: float = 0.0
    actions: int = 0
    candidates: dict[str, float] = field(default_factory=dict)
    """Simulated time of each starting order tried (plan, list scheduler variants)."""
    interrupted: BaseException | None = None
    """The Ctrl-C (KeyboardInterrupt) or SIGTERM (SystemExit) that stopped the solver early, if any:
    the proof then holds the best order and bound found until then."""

    @property
    def gap(self) -> float:
        """``best / bound - 1`` (how far the best found can be from the optimum)."""
        return self.best_time / self.bound - 1.0 if self.bound > 0 else math.inf

    def summary(self) -> dict[str, Any]:
        return {"plan_ms": self.plan_time * self.result.seconds_per_unit * 1e3,
                "best_ms": self.best_time * self.result.seconds_per_unit * 1e3,
                "bound_ms": self.bound * self.result.seconds_per_unit * 1e3,
                "gap": self.gap,
                "plan_vs_best": self.plan_time / self.best_time - 1.0, "plan_fits": self.plan_fits,
                "formulation": self.formulation, "status": self.status, "source": self.source,
                "solver_bound_ms": _ms(self.solver_bound, self.result),
                "analytic_bound_ms": _ms(self.analytic_bound, self.result),
                "load_bound_ms": _ms(self.load_bound, self.result),
                "solver_makespan_ms": _ms(self.solver_makespan, self.result),
                "solver_order_ms": _ms(self.solver_order_time, self.result),
                "actions": self.actions, "seconds": round(self.seconds, 3),
                "feasible": self.result.feasible}


def _ms(value: float | None, result: Result) -> float | None:
    return None if value is None else value * result.seconds_per_unit * 1e3


def plan_caps(costs: StageCosts) -> tuple[float, ...]:
    """Activation bytes each device may hold: its memory limit less its static memory."""
    return tuple(lim - st for lim, st in zip(costs.memory_limit, costs.static_bytes))


def device_load_bound(costs: StageCosts, plan: Plan) -> float:
    """A lower bound on one iteration's makespan of every order of ``plan``'s actions: per device, the
    earliest any of its actions can start (the forward chain from stage 0 to its first stage) plus
    all the work it must run, plus the post-step time (less a relative 1e-9 for the float sums)."""
    kinds = backward_kinds(plan)
    S, M = plan.num_stages, plan.microbatches
    bwd = costs.backward
    head = [0.0] * S
    for s in range(1, S):
        head[s] = head[s - 1] + costs.f[s - 1] + costs.comm[s - 1]
    best = 0.0
    for d in range(plan.devices):
        stages = [s for s in range(S) if plan.placement[s] == d]
        if not stages:
            continue
        work = 0.0
        for s in stages:
            for m in range(M):
                work += costs.f[s] + (bwd[s] if kinds.get((s, m)) == "fused" else costs.i[s] + costs.w[s])
        best = max(best, min(head[s] for s in stages) + work)
    return (best + costs.post_step) * (1 - _FLOAT_SLACK)


def _with_order(plan: Plan, order: Sequence[Sequence[Action]], method: str) -> Plan:
    return Plan(plan.devices, plan.microbatches, plan.partition, plan.placement,
                tuple(tuple(acts) for acts in order), {**plan.meta, "method": method}, recompute=plan.recompute)


def _fits(result: Result, costs: StageCosts, caps: Sequence[float]) -> bool:
    if not result.valid:
        return False
    return all(p - st <= c * (1 + 1e-9) + 1.0 for p, st, c in zip(result.peak_memory, costs.static_bytes, caps))


def _list_orders(plan: Plan, costs: StageCosts, caps: Sequence[float]) -> list[tuple[str, tuple]]:
    """Orders of the list scheduler for this partition and placement, at a few knob settings, under
    the activation caps (when the plan splits its backward) or fused."""
    split = any(op in ("I", "W") for acts in plan.schedule for _, op, _ in acts)
    out = []
    P = plan.devices
    for counts_w in (True, False):
        for pending in (None, 1, 2, P):
            for depth in (True, False):
                config = ListSchedulerConfig(caps=tuple(caps), split_backward=split, cap_counts_w=counts_w,
                                             max_pending_w=pending, depth_first=depth)
                try:
                    order = list_schedule(costs, plan.placement, P, microbatches=plan.microbatches, config=config)
                except PlanError:
                    continue
                out.append((f"list scheduler (counts_w={counts_w}, max_pending_w={pending}, depth_first={depth})",
                            order))
                if not split:
                    return out
    return out


def _check_room(plan: Plan, costs: StageCosts, caps: Sequence[float]) -> None:
    """Refuse at once a plan that no order can fit: a device whose room for activations is below
    what one micro-batch of one of its stages holds at its fullest (F's activations, or what I keeps)."""
    for d in range(plan.devices):
        need = max((max(costs.act[s], costs.w_keep[s]) for s in plan.stages_of(d)), default=0.0)
        if caps[d] < need:
            room = caps[d] / 2**30
            raise PlanError(f"no order of this plan fits device {d}'s memory: it has {room:.2f} GiB for activations "
                            f"(the limit less {costs.static_bytes[d] / 2**30:.2f} GiB of weights and optimizer state) "
                            f"and one micro-batch of one of its stages holds {need / 2**30:.2f} GiB; raise --memory-gb "
                            "or change the partition/placement", field="memory")


def prove(plan: Plan, profile: ModelProfile, cluster: Cluster, *, training: TrainingConfig = TrainingConfig(),
          seconds: float = 10.0, caps: Sequence[float] | None = None, workers: int | None = None,
          max_actions: int = DEFAULT_MAX_ACTIONS, seed: int = 0) -> Proof:
    """The best order of ``plan``'s actions found within ``seconds`` and a proven lower bound on every
    order (see the module docstring). ``caps``: activation bytes per device (default: the memory
    limit less static memory, :func:`plan_caps`). Raises ConfigError for ``seconds <= 0`` and
    PlanError for a plan the simulator refuses."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"must be a number of seconds above 0, got {seconds!r}", field="--seconds")
    if profile.compute_contention:
        raise ConfigError(f"the profile prices compute contention between devices ({profile.compute_contention:g}), "
                          "which the exact model does not; prove a plan on a profile without it "
                          "(compute_contention 0, as GPU profiles are)", field="compute_contention")
    t0 = time.perf_counter()
    STOPPED.clear()
    STOPPED_BY.clear()
    base = simulate(plan, profile, cluster, training=training, record_timeline=False)
    if not base.valid:
        raise PlanError(base.error or "invalid plan", field="schedule")
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training,
                        recompute=plan.recompute)
    caps = tuple(plan_caps(costs) if caps is None else caps)
    if len(caps) != plan.devices:
        raise ConfigError(f"caps: give one per device ({plan.devices}), got {len(caps)}", field="caps")
    _check_room(plan, costs, caps)
    rt = runtime_named(training.runtime)
    overlap = rt.overlap_iterations
    analytic = lower_bound(profile, cluster, plan.microbatches, runtime=training.runtime).value
    load = 0.0 if overlap else device_load_bound(costs, plan)

    # Starting orders: the plan's own and the list scheduler's; the fastest that fits is the hint.
    candidates: dict[str, float] = {"plan": base.iteration_time}
    best: tuple[float, Plan, Result, str] | None = None
    if _fits(base, costs, caps):
        best = (base.iteration_time, plan, base, "plan")
    hint_order = plan.schedule
    for name, order in _list_orders(plan, costs, caps):
        cand = _with_order(plan, order, plan.method)
        res = simulate(cand, profile, cluster, training=training, validate=False, record_timeline=False)
        if not res.valid:
            continue
        candidates[name] = res.iteration_time
        if _fits(res, costs, caps) and (best is None or res.iteration_time < best[0]):
            best = (res.iteration_time, cand, res, "list scheduler")
    if best is not None:
        hint_order = best[1].schedule

    spu = profile.seconds_per_unit
    tick = spu * TICKS_PER_SECOND  # ticks per profile time unit
    acts, index = build_actions(plan, costs, tick)
    status, solver_bound, solver_makespan, solver_order_time = "not run", None, None, None
    deadline = t0 + 0.95 * seconds - 0.1  # what is left is for simulating the solutions and the winner
    if len(acts) > max_actions:
        formulation = (f"not solved: {len(acts)} actions is above the exact model's limit of {max_actions}; "
                       "bound analytic only (pipeline.bounds and the device-load bound)")
    else:
        edges = dependency_edges(plan, costs, index, tick=tick)
        symmetry = symmetry_pairs(plan, acts, index)
        common = dict(symmetry=symmetry, costs=costs, caps=caps, devices=plan.devices, hint_order=hint_order,
                      hint_fits=best is not None, workers=workers, seed=seed)
        # The full model first; if it does not close, per-device relaxations with the time left.
        share = 1.0 if overlap or len(acts) > RELAX_ACTIONS else FULL_MODEL_SHARE
        now = time.perf_counter()
        status, cp_bound, cp_obj, orders = solve(acts, index, edges, deadline=now + share * (deadline - now),
                                                  **common)  # type: ignore[arg-type]
        if status == "INFEASIBLE" and not overlap:
            raise PlanError("no order of this plan's actions fits the memory limit (proven by the solver); "
                            "raise the limit or change the partition/placement", field="memory")
        if cp_obj is not None:
            solver_makespan = cp_obj / tick + costs.post_step
        for k, order in enumerate(orders):  # the solver's last solutions, best first
            cand = _with_order(plan, order, plan.method)
            res = simulate(cand, profile, cluster, training=training, record_timeline=False)
            if not res.valid:
                continue
            if k == 0:
                solver_order_time = res.iteration_time
            if _fits(res, costs, caps):
                candidates.setdefault("solver", res.iteration_time)
                if best is None or res.iteration_time < best[0] - 1e-12 * abs(best[0]):
                    best = (res.iteration_time, cand, res, "solver")
                break
        exact = ("exact model (memory limit, transfer latencies; no link contention, as in the simulator; "
                 "durations rounded down to 0.1 us)")
        if overlap:
            formulation = ("proxy: the solver minimises one iteration's makespan, but runtime "
                           f"{rt.name!r} overlaps iterations (steady period); bound from pipeline.bounds only")
        elif status == "OPTIMAL":
            formulation = "exact: " + exact + ", solved to optimality"
            solver_bound = cp_bound / tick + costs.post_step if cp_bound is not None else None
        else:
            ticks = cp_bound or 0
            target = (best[0] - costs.post_step) * tick if best else None
            relaxed = {} if len(acts) > RELAX_ACTIONS else relaxation_bounds(
                acts, index, edges, plan=plan, costs=costs, deadline=deadline, common=common, target=target)
            if relaxed:
                formulation = (f"{exact}, not closed in time ({status}); the bound is the largest of its own and of "
                               f"{len(relaxed)} one-device relaxations (only that device runs one action at a time "
                               "and keeps its memory limit, every other device runs any number at once)")
            else:
                formulation = f"{exact}, not closed in time ({status}); the bound is its own"
            ticks = max([ticks, *relaxed.values()])
            solver_bound = ticks / tick + costs.post_step if ticks else None
    if best is None:  # nothing fits the caps: keep the plan as it is
        best = (base.iteration_time, plan, base, "plan")
    bound = max(analytic, load, solver_bound or 0.0)
    final = simulate(best[1], profile, cluster, training=training)
    return Proof(best[1], final, base.iteration_time, final.iteration_time, bound, solver_bound, analytic, load,
                 formulation, status, best[3], solver_makespan, solver_order_time, _fits(base, costs, caps),
                 time.perf_counter() - t0, len(acts), candidates, STOPPED_BY[0] if STOPPED_BY else None)

