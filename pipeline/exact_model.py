"""The CP-SAT model behind :mod:`pipeline.exact`: a plan's actions as intervals, its dependencies,
memory and the micro-batch symmetry, and the solve itself (OR-Tools, imported only when solving).

See :mod:`pipeline.exact` for what the model is, why its bound is valid and how its solutions are
checked; this module builds and solves it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.event_sim import StageCosts
from pipeline.plan import Action, Plan

__all__ = ["RELAX_ACTIONS", "STOPPED", "STOPPED_BY",
           "LARGE_LIMIT_SHARE", "LARGE_SKIPPED_SUBSOLVERS", "Act", "backward_kinds", "build_actions",
           "dependency_edges", "fifo_order", "symmetry_pairs", "asap_starts", "relaxation_bounds", "solve", "order_of",
           "least_gaps", "add_memory"]

_MEMORY_UNITS = 1_000_000  # a device's capacity in at most about this many memory units
#: Above this many actions the full model gets all the time and no one-device relaxation runs
#: (on 16-device plans their bounds stayed below the device-load bound).
RELAX_ACTIONS = 3000
#: Share of its time a model above RELAX_ACTIONS gives CP-SAT's own time limit (see :func:`solve`).
LARGE_LIMIT_SHARE = 0.75
#: CP-SAT subsolvers left out on models above RELAX_ACTIONS (seen running 35 s past a stop request).
LARGE_SKIPPED_SUBSOLVERS = ("quick_restart", "quick_restart_no_lp", "max_lp", "reduced_costs", "default_lp",
                            "lb_tree_search", "probing", "pseudo_costs", "core", "objective_lb_search")
_OPS_RANK = {"F": 0, "I": 1, "B": 1, "W": 2}


def backward_kinds(plan: Plan) -> dict[tuple[int, int], str]:
    """Per (stage, micro-batch): ``"split"`` (I then W) or ``"fused"`` (B), as the plan runs it."""
    kinds: dict[tuple[int, int], str] = {}
    for acts in plan.schedule:
        for s, op, m in acts:
            if op == "B":
                kinds[(s, m)] = "fused"
            elif op in ("I", "W"):
                kinds.setdefault((s, m), "split")
    return kinds


@dataclass(frozen=True)
class Act:
    device: int
    action: Action
    dur: int


def build_actions(plan: Plan, costs: StageCosts, tick: float) -> tuple[list[Act], dict[Action, int]]:
    kinds = backward_kinds(plan)
    acts: list[Act] = []
    index: dict[Action, int] = {}
    bwd = costs.backward

    def add(s: int, op: str, m: int, dur: float) -> None:
        a = Action(s, op, m)
        index[a] = len(acts)
        acts.append(Act(plan.placement[s], a, max(0, math.floor(dur * tick))))

    for s in range(plan.num_stages):
        for m in range(plan.microbatches):
            add(s, "F", m, costs.f[s])
            if kinds.get((s, m)) == "fused":
                add(s, "B", m, bwd[s])
            else:
                add(s, "I", m, costs.i[s])
                add(s, "W", m, costs.w[s])
    return acts, index


def dependency_edges(plan: Plan, costs: StageCosts, index: dict[Action, int], *,
                     tick: float) -> list[tuple[int, int, int]]:
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


def fifo_order(order: Sequence[Sequence[Action]]) -> tuple[tuple[Action, ...], ...]:
    """The order with each (stage, op)'s micro-batches relabelled in the order they run: the k-th
    ``F`` of a stage on its device becomes micro-batch k, likewise I, W and B. Micro-batches are
    identical, so this never makes an order slower or use more memory (see :func:`symmetry_pairs`)."""
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


def symmetry_pairs(plan: Plan, acts: list[Act], index: dict[Action, int]) -> list[tuple[int, int]]:
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


def asap_starts(order: Sequence[Sequence[Action]], acts: list[Act], index: dict[Action, int], *,
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


def relaxation_bounds(acts: list[Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
                       plan: Plan, costs: StageCosts, deadline: float, common: dict[str, Any],
                       target: float | None) -> dict[int, int]:
    """Proven bounds (ticks) of the one-device relaxations (:func:`solve`'s ``kept``), busiest
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
        _, bound, _, _ = solve(acts, index, edges, deadline=now + share, kept={d}, **common)
        if bound is not None:
            out[d] = bound
            if target is not None and bound >= target * (1 - 1e-6):
                break
    return out


#: Set when a Ctrl-C (or SIGTERM) reaches a solve: that solve stops at once, keeping what it
#: found, and every later one of this proof returns at once (:func:`pipeline.exact.prove` clears it
#: and reports the best order so far). :data:`STOPPED_BY` holds the interruption.
STOPPED = threading.Event()
STOPPED_BY: list[BaseException] = []


def _solve_interruptibly(solver: Any, model: Any, callback: Any) -> Any:
    """``solver.solve`` in a thread, so that the main thread sees a Ctrl-C within 0.1 s and stops
    the search (CP-SAT's own solve would hold the interrupt until its time limit). The wait is on
    an event, not ``Thread.join``: a join a KeyboardInterrupt cut short reports the thread ended."""
    status: list[Any] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            status.append(solver.solve(model, callback))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="cp-sat", daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except (KeyboardInterrupt, SystemExit) as stop:
        STOPPED.set()
        STOPPED_BY.append(stop)
        solver.stop_search()
        done.wait()
    if failed:
        raise failed[0]
    return status[0]


def solve(acts: list[Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
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

    if STOPPED.is_set():
        return "UNKNOWN", None, None, []
    hint = asap_starts(fifo_order(hint_order), acts, index, edges=edges)
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
    held = add_memory(model, acts, index, start=start, costs=costs, caps=caps, devices=devs, horizon=horizon,
                       gaps=least_gaps(acts, index, edges, stages=1 + max(a.action.stage for a in acts)))
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
    # Ctrl-C is Python's to see (:func:`_solve_interruptibly`): CP-SAT's own handler would end this
    # solve only, and the proof would go on with the next
    solver.parameters.catch_sigint_signal = False
    solver.parameters.relative_gap_limit = 1e-6
    solver.parameters.log_search_progress = bool(os.environ.get("ADAPTIS_CPSAT_LOG"))
    found: list[list[list[Action]]] = []
    keep = kept is None  # a relaxation's solutions are not schedules of the plan

    class _Keep(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if keep:
                found.append(order_of(acts, [self.value(v) for v in start], devices))
                del found[:-3]

    timer = threading.Timer(left, solver.stop_search)  # CP-SAT's own limit can run late under load
    timer.start()
    try:
        status = _solve_interruptibly(solver, model, _Keep())
    finally:
        timer.cancel()
    name = solver.status_name(status)
    bound = solver.best_objective_bound
    proven = int(math.floor(bound)) if status != cp_model.INFEASIBLE and math.isfinite(bound) else None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if keep:
            found.append(order_of(acts, [solver.value(v) for v in start], devices))
        return name, proven, int(solver.objective_value), found[::-1]
    return name, proven, None, []


def order_of(acts: list[Act], starts: Sequence[int], devices: int) -> list[list[Action]]:
    """Per-device orders from start ticks (ties: shorter first, then F before I/B before W)."""
    order: list[list[tuple[int, int, int, int, Action]]] = [[] for _ in range(devices)]
    for a, st in zip(acts, starts):
        order[a.device].append((st, a.dur, _OPS_RANK[a.action.op], a.action.stage, a.action))
    return [[x[-1] for x in sorted(seq)] for seq in order]


def least_gaps(acts: list[Act], index: dict[Action, int], edges: list[tuple[int, int, int]], *,
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


def add_memory(model: Any, acts: list[Act], index: dict[Action, int], *, start: list[Any], costs: StageCosts,
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
