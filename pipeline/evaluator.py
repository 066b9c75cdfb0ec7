"""The :class:`Evaluator`: simulates a scenario's candidates, counts simulator calls and caches
repeats (stage costs, splits, results), with batched native calls (:func:`results_across`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.balance import balanced_sizes, device_balanced_sizes
from pipeline.budgets import memory_budgets, roomy_budgets
from pipeline.candidates import Candidate, Scenario, list_config, materialize, objective_key
from pipeline.engine import Outcome, ScheduleJob, schedule_and_simulate_many
from pipeline.errors import PlanError
from pipeline.event_sim import iteration_time
from pipeline.plan import Plan, partition_from_sizes
from pipeline.runtime import runtime_named
from pipeline.simulator import Result, StageCosts, simulate, stage_costs

__all__ = ["Evaluator", "results_across"]

class Evaluator:
    """Simulates candidates for one scenario; counts simulator calls and caches repeats.

    :meth:`result` is the search's hot path: a ``list`` candidate is scheduled and simulated in one
    engine call (:func:`pipeline.engine.schedule_and_simulate_many`) and no Python plan is built;
    :meth:`plan` builds the plan only when someone needs it (the best one, say). :meth:`results`
    evaluates a batch (a phase's neighbours) in one call, which the compiled engine spreads over threads.
    Results are identical on either engine and with or without batching.
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.calls = 0
        self.started = time.perf_counter()
        self._cache: dict[Candidate, Result] = {}
        self._plans: dict[Candidate, Plan] = {}
        self._costs: dict[tuple[tuple[int, ...], tuple[int, ...]], StageCosts] = {}
        self._balanced: dict[tuple, tuple[int, ...]] = {}
        """Placement, or ``("speeds", the stages' speeds)``, -> the DP-balanced split."""
        self._device_balanced: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}
        self._call_numbers: dict[Candidate, int] = {}
        self._call_log: list[tuple[float, float, bool]] = []
        """Per call (call n at index n - 1): seconds since :attr:`started` at its end, its iteration time,
        whether its plan was valid and fit in memory."""
        # Overlapped iterations are timed on the order itself (simulator.steady_period): plans are built.
        self._overlap = runtime_named(scenario.training.runtime).overlap_iterations

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def share_scenario_caches(self, other: Evaluator) -> None:
        """Use ``other``'s caches of what depends on the scenario alone (stage costs, DP-balanced and
        device-balanced splits); simulated results and call counts stay this evaluator's own."""
        if other.scenario is not self.scenario:
            raise ValueError("share_scenario_caches needs an evaluator of the same scenario object")
        self._costs, self._balanced, self._device_balanced = other._costs, other._balanced, other._device_balanced

    def simulate_plan(self, plan: Plan) -> Result:
        """Simulate a plan built outside the candidate space (a named schedule from
        :func:`pipeline.schedules.build_plan`), counting one simulator call; not cached."""
        p = self.scenario
        self.calls += 1
        result = simulate(plan, p.profile, p.cluster, training=p.training, validate=False, record_timeline=False)
        self._record(result)
        return result

    def adopt(self, c: Candidate, result: Result) -> Result:
        """Take ``result`` of ``c``, found elsewhere (a memo shared across evaluators of the same
        scenario), as this evaluator's own: it counts one call, as evaluating it here would."""
        self.calls += 1
        self._record(result)
        self._cache[c] = result
        self._call_numbers[c] = self.calls
        return result

    def cached(self, c: Candidate) -> Result | None:
        """The result of ``c`` if this evaluator has it (free), else None."""
        return self._cache.get(c)

    def _record(self, result: Result) -> None:
        """When the call just counted ended, its time and whether its plan fits (for :meth:`fits_of`)."""
        self._call_log.append((time.perf_counter() - self.started, result.iteration_time,
                               bool(result.valid and result.feasible)))

    def seconds_at(self, calls: int) -> float:
        """Seconds since this evaluator started at which its ``calls``-th call ended (0 before the first)."""
        if calls <= 0 or not self._call_log:
            return 0.0
        return self._call_log[min(calls, len(self._call_log)) - 1][0]

    def fits_of(self, calls: int, iteration_time: float) -> bool | None:
        """Whether a plan of iteration time ``iteration_time`` that was valid and fit in memory had been
        found by call ``calls`` (a search may report a cached result, or count calls past its plan's own;
        plans of one time may differ in memory, so any that fits counts); None where no call up to
        ``calls`` had that time."""
        same = [fits for _, t, fits in self._call_log[:max(calls, 0)] if t == iteration_time]
        return any(same) if same else None

    def known(self, c: Candidate) -> bool:
        """Whether ``c`` was evaluated already (its result is free)."""
        return c in self._cache

    @property
    def known_test(self) -> Callable[[Candidate], bool]:
        """:meth:`known` as a bare predicate for hot loops: the cache's own membership test (no
        method call per candidate), or :meth:`known` itself where a subclass redefines it."""
        return self._cache.__contains__ if type(self).known is Evaluator.known else self.known

    def remembers(self, c: Candidate) -> bool:
        """Whether a result of ``c`` that another evaluator found is at hand, which :meth:`result`
        would adopt (one call, no simulation). Never here; an evaluator that shares results across
        episodes (``env.editor.SharedEvaluator``) says whether its memo holds ``c``."""
        return False

    def remember(self, c: Candidate, result: Result) -> None:
        """Keep ``result``, which this evaluator just simulated for ``c``, where the evaluators that
        share its results find it (:meth:`remembers`), as :meth:`result` does. Nothing here."""

    def call_number(self, c: Candidate) -> int:
        """The call count right after ``c`` was evaluated (what a one-by-one search would have spent)."""
        return self._call_numbers.get(c, self.calls)

    def costs(self, sizes: tuple[int, ...], placement: tuple[int, ...],
              recompute: tuple[bool, ...] | None = None) -> StageCosts:
        """Stage costs of a partition and placement (cached: many candidates share them)."""
        key = (sizes, placement, recompute)
        hit = self._costs.get(key)
        if hit is None:
            p = self.scenario
            if len(self._costs) > 4096:
                self._costs.clear()
            hit = self._costs[key] = stage_costs(p.profile, p.cluster, partition_from_sizes(sizes), placement=placement,
                                                 training=p.training, recompute=recompute)
        return hit

    def balanced_sizes(self, placement: tuple[int, ...]) -> tuple[int, ...]:
        """:func:`balanced_sizes` of the scenario for ``placement`` (cached, by placement and by the
        speeds of its stages, all the split depends on: on a cluster of one speed, every placement
        of as many stages has the same split)."""
        hit = self._balanced.get(placement)
        if hit is None:
            p = self.scenario
            speeds = p.cluster.speeds
            if len(placement) > p.profile.num_layers or not all(0 <= d < len(speeds) for d in placement):
                return balanced_sizes(p.profile, placement, p.cluster)  # its error, or its answer
            key = ("speeds", tuple([speeds[d] for d in placement]))
            hit = self._balanced.get(key)
            if hit is None:
                hit = self._balanced[key] = balanced_sizes(p.profile, placement, p.cluster)
            self._balanced[placement] = hit
        return hit

    @property
    def balanced_memo(self) -> dict[tuple, tuple[int, ...]]:
        """The splits :meth:`balanced_sizes` keeps (placement, or ``("speeds", its stages' speeds)``, ->
        split; shared by :meth:`share_scenario_caches`): a caller with the same answer from elsewhere
        (the compiled engine's DP, ``env.native_core.balanced_of``) keeps it here."""
        return self._balanced

    def device_balanced_sizes(self, placement: tuple[int, ...], start: tuple[int, ...] | None = None
                              ) -> tuple[int, ...]:
        """:func:`pipeline.balance.device_balanced_sizes` of the scenario for ``placement`` from
        ``start`` (default: :meth:`balanced_sizes`), cached."""
        start = self.balanced_sizes(placement) if start is None else start
        key = (placement, start)
        hit = self._device_balanced.get(key)
        if hit is None:
            p = self.scenario
            if len(self._device_balanced) > 1024:
                self._device_balanced.clear()
            hit = self._device_balanced[key] = device_balanced_sizes(p.profile, placement, p.cluster, start=start)
        return hit

    def memory_budgets(self, c: Candidate) -> tuple[float, ...]:
        """:func:`memory_budgets` of a candidate's partition and placement."""
        return memory_budgets(self.costs(c.sizes, c.placement, c.recompute), c.placement, self.scenario.devices,
                              split_backward=c.split_backward)

    def roomy_budgets(self, c: Candidate) -> tuple[float, ...]:
        """:func:`roomy_budgets` of a candidate's partition and placement."""
        return roomy_budgets(self.costs(c.sizes, c.placement, c.recompute), c.placement, self.scenario.devices)

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
        p = self.scenario
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
        p = self.scenario
        try:
            costs = self.costs(c.sizes, c.placement, c.recompute) if c.order == "list" else None
            if costs is not None and not self._overlap:
                job = ScheduleJob(costs, c.placement, p.devices, p.microbatches, list_config(c, costs, p.devices))
                return _Job(costs=costs, job=job)
            return _Job(costs=costs, plan=materialize(c, p, costs=costs))
        except PlanError as exc:
            return _Job(error=str(exc))

    def _finish(self, c: Candidate, job: _Job) -> Result:
        p = self.scenario
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
            res = Result(True, None, iteration_time(costs, makespan, busy), tuple(busy),
                         tuple(static[d] + peak[d] for d in range(p.devices)),
                         costs.memory_limit, p.microbatches * p.profile.tokens_per_microbatch,
                         p.profile.seconds_per_unit, p.profile.time_unit, [], devices=p.devices)
        if job.error is None:
            self._record(res)
        self._cache[c] = res
        self._call_numbers[c] = self.calls
        return res


def results_across(requests: Sequence[tuple[Evaluator, Candidate]], *, threads: int | None = None) -> list[Result]:
    """:meth:`Evaluator.result` of each ``(evaluator, candidate)`` pair, the engine calls of the new
    ones (over every evaluator and scenario) in one :func:`pipeline.engine.schedule_and_simulate_many`
    batch on ``threads`` threads (default :data:`pipeline.engine.BATCH_THREADS`): what a batched
    environment's step needs. Each evaluator counts, caches and remembers (:meth:`Evaluator.remember`)
    its new candidates exactly as one ``result`` call each would (a pair repeated counts once); a
    candidate an evaluator :meth:`~Evaluator.remembers` is simulated here all the same (leave it
    out to have ``result`` adopt it)."""
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
        ev.remember(c, ev._finish(c, job))
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


def _empty_plan(p: Scenario) -> Plan:
    return Plan(p.devices, p.microbatches, ((0, p.profile.num_layers),), (0,), ((),) * p.devices)
