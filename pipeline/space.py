"""The plan space that search and RL move in: a compact, editable description of a plan.

A :class:`Candidate` fixes the partition (layers per stage), the placement (device per stage) and
how the schedule is generated: a fixed order (``1f1b``, ``interleaved``, ``gpipe``,
``looped-bfs``, ``zbv``) or the memory-aware list scheduler with its knobs (per-device
activation budgets in micro-batches, I/W split, deferred or eager W, depth-first forwards).
:func:`materialize` turns it into a :class:`~pipeline.plan.Plan`; :class:`Evaluator` simulates
candidates, counts simulator calls and caches repeats.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.balance import device_balanced_sizes
from pipeline.engine import Outcome, ScheduleJob, list_schedule, schedule_and_simulate_many
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
from pipeline.runtime import runtime_named
from pipeline.schedules import ACTIVATION_BUDGETS, activation_budgets
from pipeline.simulator import Result, StageCosts, simulate, stage_costs
from pipeline.spec import Cluster, ModelProfile, TrainingConfig

__all__ = [
    "ORDERS",
    "PLACEMENT_KINDS",
    "Candidate",
    "Problem",
    "Evaluator",
    "make_placement",
    "slow_first",
    "by_position",
    "microbatch_bytes",
    "cut_budgets",
    "recompute_for",
    "balanced_sizes",
    "materialize",
    "list_config",
    "objective_key",
    "preset_budgets",
    "memory_budgets",
    "roomy_budgets",
    "results_across",
]

ORDERS = ("list", "1f1b", "gpipe", "interleaved", "looped-bfs", "zbv")
PLACEMENT_KINDS = ("sequential", "interleaved", "v", "wave")


@dataclass(frozen=True)
class Problem:
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


def balanced_sizes(profile: ModelProfile, placement: Sequence[int], cluster: Cluster, *,
                   weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """Layers per stage minimising the heaviest stage's time (cost-aware dynamic program).

    A stage's time is its layers' ``f + b + w`` over its device's speed (``weights`` overrides
    the per-layer cost). Exact DP over prefix sums, vectorised over split points.
    """
    S, L = len(placement), profile.num_layers
    if S > L:
        raise PlanError(f"{S} stages need at least {S} layers; the model has {L}", field="partition")
    cost = np.asarray(weights if weights is not None else
                      [x.f + x.b + x.w for x in profile.layers], dtype=float)
    pre = np.concatenate([[0.0], np.cumsum(cost)])
    speeds = cluster.speeds
    inf = math.inf
    # best[s][j]: minimal max stage time covering layers [0, j) with stages 0..s.
    best = np.full((S, L + 1), inf)
    arg = np.zeros((S, L + 1), dtype=int)
    best[0, 1:] = pre[1:] / speeds[placement[0]]
    # The last stage of a prefix [0, j) starts at some i in [s, j): one (i, j) matrix per stage,
    # impossible splits at infinity, the first minimum kept (the same split as a loop over i).
    i_idx = np.arange(L + 1)[:, None]
    j_idx = np.arange(L + 1)[None, :]
    span = (pre[None, :] - pre[:, None])
    for s in range(1, S):
        sp = speeds[placement[s]]
        vals = np.maximum(best[s - 1][:, None], span / sp)
        vals[(i_idx < s) | (i_idx >= j_idx)] = inf
        lo, hi = s + 1, L - (S - 1 - s) + 1
        k = np.argmin(vals[:, lo:hi], axis=0)
        best[s, lo:hi] = vals[k, np.arange(lo, hi)]
        arg[s, lo:hi] = k
    sizes, j = [], L
    for s in range(S - 1, 0, -1):
        i = int(arg[s, j])
        sizes.append(j - i)
        j = i
    sizes.append(j)
    return tuple(reversed(sizes))


def microbatch_bytes(costs: StageCosts, placement: Sequence[int], devices: int, *,
                     split_backward: bool = True) -> list[float]:
    """Bytes one micro-batch can hold on each device at once: its stages' activations, or with a
    split backward what ``I`` leaves for ``W`` where that is more (PyTorch keeps the graph and
    W's gradients: ``TrainingConfig.input_backward_keeps_graph``)."""
    out = [0.0] * devices
    for s, d in enumerate(placement):
        out[d] += max(costs.act[s], costs.w_keep[s]) if split_backward else costs.act[s]
    return out


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


def materialize(c: Candidate, problem: Problem, *, costs: StageCosts | None = None) -> Plan:
    """The plan a candidate describes (``costs``: its stage costs, when already known)."""
    P, M = problem.devices, problem.microbatches
    partition = partition_from_sizes(c.sizes)
    if c.recompute is not None and len(c.recompute) != c.num_stages:
        raise PlanError(f"has {len(c.recompute)} entries for {c.num_stages} stages", field="recompute")
    if c.order == "list":
        if costs is None:
            costs = stage_costs(problem.profile, problem.cluster, partition, placement=c.placement,
                                training=problem.training, recompute=c.recompute)
        order = list_schedule(costs, c.placement, P, microbatches=M, config=list_config(c, costs, P))
    else:
        order = _fixed_order(c, P, M)
    return Plan(P, M, partition, c.placement, order, {"method": "candidate", "candidate": c.describe()},
                recompute=c.recompute)


def objective_key(result: Result) -> tuple[int, float, float]:
    """Lexicographic goal: feasible first, then least memory overflow, then fastest."""
    if not result.valid:
        return (2, math.inf, math.inf)
    over = sum(max(0.0, p - lim) for p, lim in zip(result.peak_memory, result.memory_limit))
    return (0 if over <= 0 else 1, over, result.iteration_time)


class Evaluator:
    """Simulates candidates for one problem; counts simulator calls and caches repeats.

    :meth:`result` is the search's hot path: a ``list`` candidate is scheduled and simulated in one
    engine call (:func:`pipeline.engine.schedule_and_simulate_many`) and no Python plan is built;
    :meth:`plan` builds the plan only when someone needs it (the best one, say). :meth:`results`
    evaluates a batch (a phase's neighbours) in one call, which the compiled engine spreads over threads.
    Results are identical on either engine and with or without batching.
    """

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.calls = 0
        self.started = time.perf_counter()
        self._cache: dict[Candidate, Result] = {}
        self._plans: dict[Candidate, Plan] = {}
        self._costs: dict[tuple[tuple[int, ...], tuple[int, ...]], StageCosts] = {}
        self._balanced: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._device_balanced: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}
        self._call_numbers: dict[Candidate, int] = {}
        # Overlapped iterations are timed on the order itself (simulator.steady_period): plans are built.
        self._overlap = runtime_named(problem.training.runtime).overlap_iterations

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def share_scenario_caches(self, other: Evaluator) -> None:
        """Use ``other``'s caches of what depends on the scenario alone (stage costs, DP-balanced and
        device-balanced splits); simulated results and call counts stay this evaluator's own."""
        if other.problem is not self.problem:
            raise ValueError("share_scenario_caches needs an evaluator of the same problem object")
        self._costs, self._balanced, self._device_balanced = other._costs, other._balanced, other._device_balanced

    def simulate_plan(self, plan: Plan) -> Result:
        """Simulate a plan built outside the candidate space (a named schedule from
        :func:`pipeline.schedules.build_plan`), counting one simulator call; not cached."""
        p = self.problem
        self.calls += 1
        return simulate(plan, p.profile, p.cluster, training=p.training, validate=False, record_timeline=False)

    def adopt(self, c: Candidate, result: Result) -> Result:
        """Take ``result`` of ``c``, found elsewhere (a memo shared across evaluators of the same
        problem), as this evaluator's own: it counts one call, as evaluating it here would."""
        self.calls += 1
        self._cache[c] = result
        self._call_numbers[c] = self.calls
        return result

    def cached(self, c: Candidate) -> Result | None:
        """The result of ``c`` if this evaluator has it (free), else None."""
        return self._cache.get(c)

    def known(self, c: Candidate) -> bool:
        """Whether ``c`` was evaluated already (its result is free)."""
        return c in self._cache

    def call_number(self, c: Candidate) -> int:
        """The call count right after ``c`` was evaluated (what a one-by-one search would have spent)."""
        return self._call_numbers.get(c, self.calls)

    def costs(self, sizes: tuple[int, ...], placement: tuple[int, ...],
              recompute: tuple[bool, ...] | None = None) -> StageCosts:
        """Stage costs of a partition and placement (cached: many candidates share them)."""
        key = (sizes, placement, recompute)
        hit = self._costs.get(key)
        if hit is None:
            p = self.problem
            if len(self._costs) > 4096:
                self._costs.clear()
            hit = self._costs[key] = stage_costs(p.profile, p.cluster, partition_from_sizes(sizes), placement=placement,
                                                 training=p.training, recompute=recompute)
        return hit

    def balanced_sizes(self, placement: tuple[int, ...]) -> tuple[int, ...]:
        """:func:`balanced_sizes` of the problem for ``placement`` (cached)."""
        hit = self._balanced.get(placement)
        if hit is None:
            p = self.problem
            hit = self._balanced[placement] = balanced_sizes(p.profile, placement, p.cluster)
        return hit

    def device_balanced_sizes(self, placement: tuple[int, ...], start: tuple[int, ...] | None = None
                              ) -> tuple[int, ...]:
        """:func:`pipeline.balance.device_balanced_sizes` of the problem for ``placement`` from
        ``start`` (default: :meth:`balanced_sizes`), cached."""
        start = self.balanced_sizes(placement) if start is None else start
        key = (placement, start)
        hit = self._device_balanced.get(key)
        if hit is None:
            p = self.problem
            if len(self._device_balanced) > 1024:
                self._device_balanced.clear()
            hit = self._device_balanced[key] = device_balanced_sizes(p.profile, placement, p.cluster, start=start)
        return hit

    def memory_budgets(self, c: Candidate) -> tuple[float, ...]:
        """:func:`memory_budgets` of a candidate's partition and placement."""
        return memory_budgets(self.costs(c.sizes, c.placement, c.recompute), c.placement, self.problem.devices,
                              split_backward=c.split_backward)

    def roomy_budgets(self, c: Candidate) -> tuple[float, ...]:
        """:func:`roomy_budgets` of a candidate's partition and placement."""
        return roomy_budgets(self.costs(c.sizes, c.placement, c.recompute), c.placement, self.problem.devices)

    def result(self, c: Candidate) -> Result:
        """The simulated result of a candidate; an impossible candidate gives an invalid result."""
        hit = self._cache.get(c)
        if hit is None:
            hit = self._finish(c, self._start(c))
        return hit

    def results(self, candidates: Sequence[Candidate]) -> list[Result]:
        """:meth:`result` of each candidate; the new ones' engine calls run side by side."""
        todo = list(dict.fromkeys(c for c in candidates if c not in self._cache))
        if len(todo) > 1:
            jobs = [self._start(c) for c in todo]
            batch = [job for job in jobs if job.job is not None]
            for job, outcome in zip(batch, schedule_and_simulate_many([job.job for job in batch])):
                if isinstance(outcome, str):
                    job.error = outcome
                else:
                    job.outcome = outcome
            for c, job in zip(todo, jobs):
                self._finish(c, job)
        return [self.result(c) for c in candidates]

    def plan(self, c: Candidate) -> Plan:
        """The plan of a candidate (built on demand and cached)."""
        hit = self._plans.get(c)
        if hit is not None:
            return hit
        self.result(c)  # a new candidate counts as a call once, as in evaluate()
        p = self.problem
        try:
            costs = self.costs(c.sizes, c.placement, c.recompute) if c.order == "list" else None
            plan = materialize(c, p, costs=costs)
        except PlanError:
            plan = _empty_plan(p)
        if len(self._plans) > 256:
            self._plans.clear()
        self._plans[c] = plan
        return plan

    def evaluate(self, c: Candidate) -> tuple[Plan, Result]:
        """(plan, result) of a candidate; an impossible candidate gives an invalid result."""
        result = self.result(c)
        return self.plan(c), result

    def key(self, c: Candidate) -> tuple[int, float, float]:
        return objective_key(self.result(c))

    # ------------------------------------------------------------------ internals

    def _start(self, c: Candidate) -> _Job:
        """Everything up to the engine call: costs, caps, the job (or an error, or a plan)."""
        p = self.problem
        try:
            costs = self.costs(c.sizes, c.placement, c.recompute) if c.order == "list" else None
            if costs is not None and not self._overlap:
                job = ScheduleJob(costs, c.placement, p.devices, p.microbatches, list_config(c, costs, p.devices))
                return _Job(costs=costs, job=job)
            return _Job(costs=costs, plan=materialize(c, p, costs=costs))
        except PlanError as exc:
            return _Job(error=str(exc))

    def _finish(self, c: Candidate, job: _Job) -> Result:
        p = self.problem
        if job.job is not None and job.outcome is None and job.error is None:
            job = _run_job(job)
        if job.outcome is not None and not job.outcome[0]:
            # Never for the list scheduler's orders; the simulator names the deadlock if it happens.
            job = _Job(costs=job.costs, plan=materialize(c, p, costs=job.costs))
        if job.error is not None:
            res = simulate(_empty_plan(p), p.profile, p.cluster, training=p.training)
            res.error = job.error
        elif job.plan is not None:
            self.calls += 1
            res = simulate(job.plan, p.profile, p.cluster, training=p.training, costs=job.costs, validate=False,
                           record_timeline=False)
            self._plans[c] = job.plan
        else:
            self.calls += 1
            _, makespan, busy, peak = job.outcome
            costs = job.costs
            static = costs.static_bytes
            res = Result(True, None, makespan + costs.post_step, tuple(busy),
                         tuple(static[d] + peak[d] for d in range(p.devices)),
                         costs.memory_limit, p.microbatches * p.profile.tokens_per_microbatch,
                         p.profile.seconds_per_unit, p.profile.time_unit, [], devices=p.devices)
        self._cache[c] = res
        self._call_numbers[c] = self.calls
        return res


def results_across(requests: Sequence[tuple[Evaluator, Candidate]], *, threads: int | None = None) -> list[Result]:
    """:meth:`Evaluator.result` of each ``(evaluator, candidate)`` pair, the engine calls of the new
    ones (over every evaluator and problem) in one :func:`pipeline.engine.schedule_and_simulate_many`
    batch on ``threads`` threads (default :data:`pipeline.engine.BATCH_THREADS`): what a batched
    environment's step needs. Each evaluator counts and caches its new candidates exactly as one
    ``result`` call each would (a pair repeated counts once)."""
    todo: list[tuple[Evaluator, Candidate, _Job]] = []
    seen: set[tuple[int, Candidate]] = set()
    for ev, c in requests:
        key = (id(ev), c)
        if key in seen or c in ev._cache:
            continue
        seen.add(key)
        todo.append((ev, c, ev._start(c)))
    batch = [job for _, _, job in todo if job.job is not None]
    if len(batch) > 1:
        for job, outcome in zip(batch, schedule_and_simulate_many([job.job for job in batch], threads=threads)):
            if isinstance(outcome, str):
                job.error = outcome
            else:
                job.outcome = outcome
    for ev, c, job in todo:
        ev._finish(c, job)
    return [ev.result(c) for ev, c in requests]


@dataclass
class _Job:
    costs: StageCosts | None = None
    job: ScheduleJob | None = None
    outcome: Outcome | None = None
    plan: Plan | None = None
    error: str | None = None


def _run_job(job: _Job) -> _Job:
    if job.job is None or job.outcome is not None:
        return job
    outcome = schedule_and_simulate_many([job.job])[0]
    if isinstance(outcome, str):
        job.error = outcome
    else:
        job.outcome = outcome
    return job


def _empty_plan(p: Problem) -> Plan:
    return Plan(p.devices, p.microbatches, ((0, p.profile.num_layers),), (0,), ((),) * p.devices)
