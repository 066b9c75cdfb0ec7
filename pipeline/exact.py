"""Proven schedules: the best order of a plan's actions, and a proven lower bound on every order.

For a plan's partition and placement, :func:`prove` searches the per-device orders of its F / I / W
(or fused B) actions with a CP-SAT model (OR-Tools, imported only here and only when called) and
proves a lower bound on the iteration time of every such order:

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
* the makespan (plus the runtime's step and the shared weights' all-reduce, a constant).

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
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.bounds import lower_bound
from pipeline.engine import list_schedule
from pipeline.errors import ConfigError, PlanError
from pipeline.event_sim import StageCosts
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
_MEMORY_UNITS = 1_000_000  # a device's capacity in at most about this many memory units
#: Relative amount taken off the float-summed load bound, so that rounding in its sums cannot lift it
#: above the simulator's time of an order that meets it exactly.
_FLOAT_SLACK = 1e-9
#: Share of the time the full model gets before the one-device relaxations (when it does not close).
FULL_MODEL_SHARE = 0.6
#: Above this many actions the full model gets all the time and no one-device relaxation runs
#: (on 16-device plans their bounds stayed below the device-load bound).
RELAX_ACTIONS = 3000
#: Share of its time a model above RELAX_ACTIONS gives CP-SAT's own time limit (see :func:`_solve`).
LARGE_LIMIT_SHARE = 0.75
#: CP-SAT subsolvers left out on models above RELAX_ACTIONS (seen running 35 s past a stop request).
LARGE_SKIPPED_SUBSOLVERS = ("quick_restart", "quick_restart_no_lp", "max_lp", "reduced_costs", "default_lp",
                            "lb_tree_search", "probing", "pseudo_costs", "core", "objective_lb_search")
_OPS_RANK = {"F": 0, "I": 1, "B": 1, "W": 2}


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


def _kinds(plan: Plan) -> dict[tuple[int, int], str]:
    """Per (stage, micro-batch): ``"split"`` (I then W) or ``"fused"`` (B), as the plan runs it."""
    kinds: dict[tuple[int, int], str] = {}
    for acts in plan.schedule:
        for s, op, m in acts:
            if op == "B":
                kinds[(s, m)] = "fused"
            elif op in ("I", "W"):
                kinds.setdefault((s, m), "split")
    return kinds


def device_load_bound(costs: StageCosts, plan: Plan) -> float:
    """A lower bound on one iteration's makespan of every order of ``plan``'s actions: per device, the
    earliest any of its actions can start (the forward chain from stage 0 to its first stage) plus
    all the work it must run, plus the post-step time (less a relative 1e-9 for the float sums)."""
    kinds = _kinds(plan)
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


@dataclass(frozen=True)
class _Act:
    device: int
    action: Action
    dur: int


def _build_actions(plan: Plan, costs: StageCosts, tick: float) -> tuple[list[_Act], dict[Action, int]]:
    kinds = _kinds(plan)
    acts: list[_Act] = []
    index: dict[Action, int] = {}
    bwd = costs.backward

    def add(s: int, op: str, m: int, dur: float) -> None:
        a = Action(s, op, m)
        index[a] = len(acts)
        acts.append(_Act(plan.placement[s], a, max(0, math.floor(dur * tick))))

    for s in range(plan.num_stages):
        for m in range(plan.microbatches):
            add(s, "F", m, costs.f[s])
            if kinds.get((s, m)) == "fused":
                add(s, "B", m, bwd[s])
            else:
                add(s, "I", m, costs.i[s])
                add(s, "W", m, costs.w[s])
    return acts, index


def _edges(plan: Plan, costs: StageCosts, index: dict[Action, int], tick: float) -> list[tuple[int, int, int]]:
    """(before, after, lag): ``after`` starts at least ``lag`` ticks after ``before`` ends."""
    S, M = plan.num_stages, plan.microbatches
    out = []

    def grad(s: int, m: int) -> int:
        return index.get(Action(s, "I", m), index.get(Action(s, "B", m), -1))

    for s in range(S):
        for m in range(M):
            f = index[Action(s, "F", m)]
            g = grad(s, m)
            if s:
                out.append((index[Action(s - 1, "F", m)], f, math.floor(costs.comm[s - 1] * tick)))
            out.append((f, g, 0))
            if s < S - 1:
                out.append((grad(s + 1, m), g, math.floor(costs.comm[s] * tick)))
            w = index.get(Action(s, "W", m))
            if w is not None:
                out.append((g, w, 0))
    return out


def _fifo(order: Sequence[Sequence[Action]]) -> tuple[tuple[Action, ...], ...]:
    """The order with each (stage, op)'s micro-batches relabelled in the order they run: the k-th
    ``F`` of a stage on its device becomes micro-batch k, likewise I, W and B. Micro-batches are
    identical, so this never makes an order slower or use more memory (see :func:`_symmetry`)."""
    out = []
    for acts in order:
        seen: dict[tuple[int, str], int] = {}
        row = []
        for s, op, _ in acts:
            k = seen.get((s, op), 0)
            seen[(s, op)] = k + 1
            row.append(Action(s, op, k))
        out.append(tuple(row))
    return tuple(out)


def _symmetry(plan: Plan, acts: list[_Act], index: dict[Action, int]) -> list[tuple[int, int]]:
    """Pairs (a, b): ``b`` starts after ``a`` ends. Each stage runs each kind of action (F, I, W, B)
    in micro-batch order. This loses no schedule's time: micro-batches of a stage cost the same, so
    any schedule's slots of each (stage, kind) can be handed to micro-batches in time order (the
    k-th F slot to micro-batch k, ...). Every dependency still holds (the k-th slot of a kind starts
    after the k-th slot of each kind it needs has ended: a sorted matching is feasible whenever any
    matching is), and a device's memory level at any time counts only how many F, I and W slots of
    each stage have started, not which micro-batch each one serves. Only stages whose micro-batches
    all use the same backward kind are ordered."""
    pairs = []
    for s in range(plan.num_stages):
        for op in ("F", "I", "W", "B"):
            ks = [index.get(Action(s, op, m)) for m in range(plan.microbatches)]
            if any(k is None for k in ks):
                continue
            pairs += [(a, b) for a, b in zip(ks, ks[1:])]  # type: ignore[misc]
    return pairs


def _asap(order: Sequence[Sequence[Action]], acts: list[_Act], index: dict[Action, int],
          edges: list[tuple[int, int, int]]) -> list[int] | None:
    """Start ticks of ``order`` in the rounded model, each action as early as its device and inputs
    allow (the simulator's rule), or ``None`` when it deadlocks or misses actions."""
    preds: list[list[tuple[int, int]]] = [[] for _ in acts]
    for a, b, lag in edges:
        preds[b].append((a, lag))
    start: list[int | None] = [None] * len(acts)
    ptr = [0] * len(order)
    free = [0] * len(order)
    progress = True
    while progress:
        progress = False
        for d, seq in enumerate(order):
            while ptr[d] < len(seq):
                k = index.get(seq[ptr[d]])
                if k is None:
                    return None
                t = free[d]
                ok = True
                for a, lag in preds[k]:
                    if start[a] is None:
                        ok = False
                        break
                    t = max(t, start[a] + acts[a].dur + lag)
                if not ok:
                    break
                start[k] = t
                free[d] = t + acts[k].dur
                ptr[d] += 1
                progress = True
    if any(x is None for x in start):
        return None
    return [int(x) for x in start]  # type: ignore[arg-type]


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


def prove(plan: Plan, profile: ModelProfile, cluster: Cluster, *, training: TrainingConfig = TrainingConfig(),
          seconds: float = 10.0, caps: Sequence[float] | None = None, workers: int | None = None,
          max_actions: int = DEFAULT_MAX_ACTIONS, seed: int = 0) -> Proof:
    """The best order of ``plan``'s actions found within ``seconds`` and a proven lower bound on every
    order (see the module docstring). ``caps``: activation bytes per device (default: the memory
    limit less static memory, :func:`plan_caps`). Raises ConfigError for ``seconds <= 0`` and
    PlanError for a plan the simulator refuses."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"must be a number of seconds above 0, got {seconds!r}", field="--seconds")
    t0 = time.perf_counter()
    base = simulate(plan, profile, cluster, training=training, record_timeline=False)
    if not base.valid:
        raise PlanError(base.error or "invalid plan", field="schedule")
    costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training,
                        recompute=plan.recompute)
    caps = tuple(plan_caps(costs) if caps is None else caps)
    if len(caps) != plan.devices:
        raise ConfigError(f"caps: give one per device ({plan.devices}), got {len(caps)}", field="caps")
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
    acts, index = _build_actions(plan, costs, tick)
    status, solver_bound, solver_makespan, solver_order_time = "not run", None, None, None
    deadline = t0 + 0.95 * seconds - 0.1  # what is left is for simulating the solutions and the winner
    if len(acts) > max_actions:
        formulation = (f"not solved: {len(acts)} actions is above the exact model's limit of {max_actions}; "
                       "bound analytic only (pipeline.bounds and the device-load bound)")
    else:
        edges = _edges(plan, costs, index, tick)
        symmetry = _symmetry(plan, acts, index)
        common = dict(symmetry=symmetry, costs=costs, caps=caps, devices=plan.devices, hint_order=hint_order,
                      hint_fits=best is not None, workers=workers, seed=seed)
        # The full model first; if it does not close, per-device relaxations with the time left.
        share = 1.0 if overlap or len(acts) > RELAX_ACTIONS else FULL_MODEL_SHARE
        now = time.perf_counter()
        status, cp_bound, cp_obj, orders = _solve(acts, index, edges, deadline=now + share * (deadline - now),
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
            relaxed = {} if len(acts) > RELAX_ACTIONS else _relaxation_bounds(
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
                 time.perf_counter() - t0, len(acts), candidates)


def _relaxation_bounds(acts: list[_Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
                       plan: Plan, costs: StageCosts, deadline: float, common: dict[str, Any],
                       target: float | None) -> dict[int, int]:
    """Proven bounds (ticks) of the one-device relaxations (:func:`_solve`'s ``kept``), busiest
    device first, until ``deadline`` or until one reaches ``target`` (the best time found)."""
    load = [0.0] * plan.devices
    for a in acts:
        load[a.device] += a.dur
    out: dict[int, int] = {}
    todo = sorted(range(plan.devices), key=lambda d: -load[d])
    for n, d in enumerate(todo):
        now = time.perf_counter()
        if deadline - now < 0.2:
            break
        share = (deadline - now) / (len(todo) - n)
        _, bound, _, _ = _solve(acts, index, edges, deadline=now + share, kept={d}, **common)
        if bound is not None:
            out[d] = bound
            if target is not None and bound >= target * (1 - 1e-6):
                break
    return out


def _solve(acts: list[_Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
           symmetry: list[tuple[int, int]], costs: StageCosts, caps: Sequence[float], devices: int,
           hint_order: Sequence[Sequence[Action]], hint_fits: bool, deadline: float, workers: int | None,
           seed: int, kept: set[int] | None = None
           ) -> tuple[str, int | None, int | None, list[list[list[Action]]]]:
    """Build and solve the CP-SAT model until ``deadline`` (``time.perf_counter()``): (status, proven
    bound, best makespan, orders of the last solutions found, best first), times in ticks.

    ``kept``: a relaxation. Only these devices run one action at a time and keep their memory
    limit; the others run any number of actions at once (their actions stay, as delays of their
    durations on every path through them). Every schedule of the full model is one of the
    relaxation, so its proven bound bounds the full model's optimum."""
    from ortools.sat.python import cp_model

    hint = _asap(_fifo(hint_order), acts, index, edges)
    horizon = sum(a.dur for a in acts) + sum(lag for _, _, lag in edges) + 1
    if hint is not None and hint_fits:  # a schedule within the limits exists below it: so does the optimum
        horizon = min(horizon, max(h + a.dur for h, a in zip(hint, acts)) + 1)
    model = cp_model.CpModel()
    start = [model.new_int_var(0, horizon, f"s{k}") for k in range(len(acts))]
    for a, b, lag in edges:
        model.add(start[b] >= start[a] + acts[a].dur + lag)
    for a, b in symmetry:
        if kept is None or acts[a].device in kept:
            model.add(start[b] >= start[a] + acts[a].dur)
    devs = range(devices) if kept is None else sorted(kept)
    for d in devs:
        model.add_no_overlap([model.new_fixed_size_interval_var(start[k], a.dur, f"i{k}")
                              for k, a in enumerate(acts) if a.device == d])
    held = _add_memory(model, acts, index, start, costs=costs, caps=caps, devices=devs, horizon=horizon,
                       gaps=_least_gaps(acts, index, edges, stages=1 + max(a.action.stage for a in acts)))
    makespan = model.new_int_var(0, horizon, "makespan")
    for k, a in enumerate(acts):
        if a.action.op in ("W", "B") or (a.action.op == "I" and Action(a.action.stage, "W", a.action.mb) not in index):
            model.add(makespan >= start[k] + a.dur)
    model.minimize(makespan)
    if hint is not None:
        for k, h in enumerate(hint):
            model.add_hint(start[k], h)
        model.add_hint(makespan, max(h + a.dur for h, a in zip(hint, acts)))
        for size, a, b in held:
            model.add_hint(size, hint[b] - hint[a])
    left = deadline - time.perf_counter()
    if left <= 0.05:
        return "UNKNOWN", None, None, []
    solver = cp_model.CpSolver()
    # On large models CP-SAT has stopped up to a quarter of its limit late on a loaded machine: it
    # gets an earlier limit of its own, and the timer stops it at the deadline.
    large = len(acts) > RELAX_ACTIONS
    solver.parameters.max_time_in_seconds = left * (LARGE_LIMIT_SHARE if large else 1.0)
    if large:  # their first propagation alone outlasts a minute's limit here, and stop_search waits for it
        solver.parameters.ignore_subsolvers.extend(LARGE_SKIPPED_SUBSOLVERS)
    solver.parameters.num_workers = workers or 8
    solver.parameters.random_seed = seed
    solver.parameters.relative_gap_limit = 1e-6
    solver.parameters.log_search_progress = bool(os.environ.get("ADAPTIS_CPSAT_LOG"))
    found: list[list[list[Action]]] = []
    keep = kept is None  # a relaxation's solutions are not schedules of the plan

    class _Keep(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if keep:
                found.append(_order_of(acts, [self.value(v) for v in start], devices))
                del found[:-3]

    timer = threading.Timer(left, solver.stop_search)  # CP-SAT's own limit can run late under load
    timer.start()
    try:
        status = solver.solve(model, _Keep())
    finally:
        timer.cancel()
    name = solver.status_name(status)
    bound = solver.best_objective_bound
    proven = int(math.floor(bound)) if status != cp_model.INFEASIBLE and math.isfinite(bound) else None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if keep:
            found.append(_order_of(acts, [solver.value(v) for v in start], devices))
        return name, proven, int(solver.objective_value), found[::-1]
    return name, proven, None, []


def _order_of(acts: list[_Act], starts: Sequence[int], devices: int) -> list[list[Action]]:
    """Per-device orders from start ticks (ties: shorter first, then F before I/B before W)."""
    order: list[list[tuple[int, int, int, int, Action]]] = [[] for _ in range(devices)]
    for a, st in zip(acts, starts):
        order[a.device].append((st, a.dur, _OPS_RANK[a.action.op], a.action.stage, a.action))
    return [[x[-1] for x in sorted(seq)] for seq in order]


def _least_gaps(acts: list[_Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
                stages: int) -> dict[tuple[int, int], int]:
    """The least start-to-start ticks between two actions of one micro-batch that the dependencies
    imply (the longest path between them), for each pair (F, I/B) and (I, W) of a stage: micro-batches
    are identical, so micro-batch 0's are everyone's."""
    job = {k for a, k in index.items() if a.mb == 0}
    out_edges: dict[int, list[tuple[int, int]]] = {}
    for a, b, lag in edges:
        if a in job:
            out_edges.setdefault(a, []).append((b, lag))
    topo = sorted(job, key=lambda k: (_OPS_RANK[acts[k].action.op],
                                      acts[k].action.stage if acts[k].action.op == "F" else -acts[k].action.stage))
    gaps: dict[tuple[int, int], int] = {}
    for s in range(stages):
        src = index[Action(s, "F", 0)]
        dist = {src: 0}
        for k in topo:
            if k in dist:
                for b, lag in out_edges.get(k, ()):
                    dist[b] = max(dist.get(b, 0), dist[k] + acts[k].dur + lag)
        g = index.get(Action(s, "I", 0), index.get(Action(s, "B", 0)))
        w = index.get(Action(s, "W", 0))
        gaps[(src, g)] = dist.get(g, 0)
        if w is not None:
            gaps[(g, w)] = dist.get(w, 0) - dist.get(g, 0)
    return gaps


def _add_memory(model: Any, acts: list[_Act], index: dict[Action, int], start: list[Any], *, costs: StageCosts,
                caps: Sequence[float], devices: Iterable[int], horizon: int,
                gaps: dict[tuple[int, int], int]) -> list[tuple[Any, int, int]]:
    """A Cumulative per device whose memory limit can bind: F holds ``act`` until I/B starts, I holds
    ``w_keep`` until W starts (demands rounded down, capacity up: a relaxation). Each holding lasts at
    least what the dependencies imply (``gaps``, of micro-batch 0's actions: the same for all). Returns each
    holding interval's (size variable, action it starts at, action it ends at), for the hint."""
    sizes: list[tuple[Any, int, int]] = []
    for d in devices:
        mine = [a for a in acts if a.device == d and a.action.op == "F"]
        if not mine:
            continue
        cap = caps[d]
        need = sum(max(costs.act[a.action.stage], costs.w_keep[a.action.stage]) for a in mine)
        if need <= cap:
            continue  # every action's activations at once still fit: the limit cannot bind
        if cap < 0:
            cap = 0.0
        unit = max(1.0, cap / _MEMORY_UNITS)
        intervals, demands = [], []
        for a in mine:
            s, _, m = a.action
            f = index[a.action]
            g = index.get(Action(s, "I", m), index.get(Action(s, "B", m)))
            w = index.get(Action(s, "W", m))
            f0 = index[Action(s, "F", 0)]
            g0 = index.get(Action(s, "I", 0), index.get(Action(s, "B", 0)))
            hold = math.floor(costs.act[s] / unit)
            if hold > 0:
                size = model.new_int_var(min(horizon, gaps.get((f0, g0), 0)), horizon, "")
                intervals.append(model.new_interval_var(start[f], size, start[g], ""))
                demands.append(hold)
                sizes.append((size, f, g))
            keep = math.floor(costs.w_keep[s] / unit)
            if w is not None and keep > 0:
                w0 = index[Action(s, "W", 0)]
                size = model.new_int_var(min(horizon, gaps.get((g0, w0), 0)), horizon, "")
                intervals.append(model.new_interval_var(start[g], size, start[w], ""))
                demands.append(keep)
                sizes.append((size, g, w))
        if intervals:
            model.add_cumulative(intervals, demands, math.ceil(cap / unit))
    return sizes
