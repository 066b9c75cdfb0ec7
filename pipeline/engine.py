"""The facade over the two engines that run the hot loops: the compiled one
(``pipeline/_native/engine.cpp``) and the pure-Python reference (:func:`pipeline.event_sim.run_reference`,
:func:`pipeline.list_scheduler.list_schedule_python`, :func:`pipeline.plan.schedule_defect`).

This is the only module that knows there are two: everything else calls the typed functions below,
and argument packing for the compiled module is private to it. Selected once, at import, by the
environment variable ``ADAPTIS_ENGINE``:

* ``auto`` (default): the compiled engine when it is built, else the Python reference;
* ``native``: the compiled engine, and an ImportError that says how to build it when it is not;
* ``python``: the Python reference (the readable one; identical results, 30-100x slower).

Both give bit-identical schedules, times and memory peaks (tests/pipeline/
test_engine_differential.py). Build the compiled one with ``make engine`` (or
``python -m pipeline._native.build``); ``make run`` and ``make test`` build it first.
:func:`python_reference` switches to the reference inside a block (benchmarks and differential
tests compare the two in one process), :func:`compiled_build` to another build of the compiled one.

Schedules cross the boundary as flat arrays (:func:`schedule_arrays`): an ``(N, 3)`` int32 array
of ``(stage, op, micro-batch)`` rows, device after device, and ``devices + 1`` offsets.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from pipeline.errors import PlanError
from pipeline.event_sim import StageCosts, TimelineEntry, run_reference
from pipeline.list_scheduler import ListSchedulerConfig, list_schedule_python
from pipeline.plan import Action, Plan, Schedule, ScheduleDefect, schedule_defect

__all__ = ["ENGINE_ENV", "ENGINE", "OP_CODES", "OP_NAMES", "SimRun", "Outcome", "ScheduleJob", "compiled",
           "python_reference", "compiled_build", "EngineClock", "clocked", "schedule_arrays", "actions_from_arrays",
           "simulate_schedule", "list_schedule", "schedule_and_simulate", "schedule_and_simulate_many",
           "check_schedule", "pack_job", "env_core", "env_scenario", "env_scenario_derived",
           "env_start", "env_portfolio_start", "env_step",
           "env_evaluate", "balanced_split"]

ENGINE_ENV = "ADAPTIS_ENGINE"
_DEFAULT_CONFIG = ListSchedulerConfig()
OP_CODES = {"F": 0, "I": 1, "W": 2, "B": 3}
OP_NAMES = ("F", "I", "W", "B")


def _load() -> ModuleType | None:
    choice = os.environ.get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"{ENGINE_ENV}={choice!r}: use auto, native or python")
    if choice == "python":
        return None
    try:
        from pipeline import _engine
    except ImportError as exc:
        if choice == "native":
            raise ImportError(f"{ENGINE_ENV}=native but the compiled engine is not built ({exc}); run "
                              "'make engine' (needs g++ and pybind11), or set ADAPTIS_ENGINE=python") from None
        return None
    return _engine


_native: ModuleType | None = _load()
ENGINE = "native" if _native is not None else "python"
"""The engine chosen at import: ``"native"`` or ``"python"``."""


def compiled() -> bool:
    """Whether the compiled engine runs now (``False`` inside :func:`python_reference`)."""
    return _native is not None


@contextmanager
def python_reference() -> Iterator[None]:
    """Run the Python reference inside the block. Not thread-safe: it swaps the module-level engine."""
    global _native
    saved = _native
    _native = None
    try:
        yield
    finally:
        _native = saved


_builds: dict[str, ModuleType] = {}


@contextmanager
def compiled_build(path: str | os.PathLike[str]) -> Iterator[ModuleType]:
    """Run another build of the compiled engine inside the block (which gets its module): ``path`` is
    its ``_engine*.so`` (e.g. an older checkout's, after ``make engine`` there). Benchmarks time two
    builds in one process with it. Not thread-safe: it swaps the module-level engine."""
    global _native
    lib = os.path.realpath(path)
    if _native is not None and os.path.realpath(getattr(_native, "__file__", "")) == lib:
        raise ValueError(f"{path}: that is the compiled engine in use; give another build's _engine*.so")
    if lib not in _builds:
        if not os.path.isfile(lib):
            raise FileNotFoundError(f"{path}: no compiled engine there; build one with 'make engine' in that "
                                    "checkout and give its pipeline/_engine*.so")
        loader = importlib.machinery.ExtensionFileLoader("_engine", lib)
        spec = importlib.util.spec_from_loader("_engine", loader)
        if spec is None:
            raise ImportError(f"{path}: cannot load it as an extension module")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        mine = getattr(_load_compiled(), "ABI", None)
        if getattr(module, "ABI", None) != mine:
            raise ImportError(f"{path}: engine ABI {getattr(module, 'ABI', None)} differs from this checkout's "
                              f"({mine}); its arguments would not match")
        _builds[lib] = module
    saved = _native
    _native = _builds[lib]
    try:
        yield _native
    finally:
        _native = saved


def _load_compiled() -> ModuleType | None:
    """This checkout's compiled module whatever ``ADAPTIS_ENGINE`` says (None when not built)."""
    try:
        from pipeline import _engine
    except ImportError:
        return None
    return _engine


@dataclass(eq=False)  # each block its own clock, even where two read alike
class EngineClock:
    """What :func:`schedule_and_simulate` and :func:`schedule_and_simulate_many` spent inside a
    :func:`clocked` block: ``seconds`` in their engine calls (the compiled call, or the reference's
    list schedule and simulation; not the facade's checks and packing) and the ``jobs`` they ran."""

    seconds: float = 0.0
    jobs: int = 0


_clocks: list[EngineClock] = []


@contextmanager
def clocked() -> Iterator[EngineClock]:
    """Count the schedule-and-simulate work done inside the block (every thread's, nested blocks each
    their own): where a caller's time goes between the engine and the rest (benchmarks)."""
    clock = EngineClock()
    _clocks.append(clock)
    try:
        yield clock
    finally:
        _clocks.remove(clock)


def _charge(started: float, jobs: int) -> None:
    spent = time.perf_counter() - started
    for clock in _clocks:
        clock.seconds += spent
        clock.jobs += jobs


# ------------------------------------------------------------------ flat schedules

def schedule_arrays(schedule: Sequence[Sequence[Action]]) -> tuple[np.ndarray, list[int]]:
    """``(rows, offsets)`` of per-device action lists (see the module docstring); a
    :class:`~pipeline.plan.Schedule` the engine made gives back the arrays it carries."""
    if isinstance(schedule, Schedule) and schedule.arrays is not None:
        return schedule.arrays
    codes = OP_CODES
    flat = [(a[0], codes.get(a[1], -1), a[2]) for acts in schedule for a in acts]
    rows = np.array(flat, dtype=np.int32).reshape(-1, 3)
    offsets = [0]
    for acts in schedule:
        offsets.append(offsets[-1] + len(acts))
    return rows, offsets


_NAMES = np.array(OP_NAMES, dtype=object)


def actions_from_arrays(rows: np.ndarray, offsets: Sequence[int]) -> Schedule:
    """Per-device tuples of :class:`~pipeline.plan.Action` from ``(rows, offsets)``, carrying the arrays."""
    acts = list(map(Action._make, zip(rows[:, 0].tolist(), _NAMES[rows[:, 1]].tolist(), rows[:, 2].tolist())))
    out = Schedule(tuple(acts[offsets[d]:offsets[d + 1]]) for d in range(len(offsets) - 1))
    out.arrays = (rows, list(offsets))
    return out


# ------------------------------------------------------------------ what comes back

class Outcome(NamedTuple):
    """The figures of one simulation: whether every action ran, the makespan (without
    ``StageCosts.post_step``), busy time and peak activation bytes per device."""

    ok: bool
    makespan: float
    busy: tuple[float, ...]
    peak: tuple[float, ...]


class SimRun(NamedTuple):
    """:class:`Outcome` plus the actions run per device (where a deadlock stopped) and the timeline."""

    ok: bool
    makespan: float
    busy: tuple[float, ...]
    peak: tuple[float, ...]
    ran: tuple[int, ...]
    timeline: list[TimelineEntry]


class ScheduleJob(NamedTuple):
    """One list-schedule-and-simulate job of :func:`schedule_and_simulate_many`."""

    costs: StageCosts
    placement: tuple[int, ...]
    devices: int
    microbatches: int
    config: ListSchedulerConfig


# ------------------------------------------------------------------ the engine's work

def simulate_schedule(costs: StageCosts, schedule: Sequence[Sequence[Action]], *, devices: int,
                      microbatches: int, record_timeline: bool = False) -> SimRun:
    """Event-simulate a per-device order (checked structurally beforehand, see :func:`check_schedule`)."""
    if _native is None:
        ok, makespan, busy, peak, ran, timeline = run_reference(
            schedule, costs, devices=devices, microbatches=microbatches, record_timeline=record_timeline)
        return SimRun(ok, makespan, tuple(busy), tuple(peak), tuple(ran), timeline)
    rows, offsets = schedule_arrays(schedule)
    ok, makespan, busy, peak, ran, starts, ends = _native.simulate(*_vectors(costs), devices, microbatches, rows,
                                                                   offsets, record_timeline)
    timeline = []
    if ok and record_timeline:
        starts, ends = starts.tolist(), ends.tolist()
        k = 0
        for d, acts in enumerate(schedule):
            for a in acts:
                timeline.append(TimelineEntry(d, a, starts[k], ends[k]))
                k += 1
    return SimRun(ok, makespan, tuple(busy), tuple(peak), tuple(ran), timeline)


def list_schedule(costs: StageCosts, placement: Sequence[int], devices: int, *, microbatches: int,
                  config: ListSchedulerConfig = _DEFAULT_CONFIG) -> tuple[tuple[Action, ...], ...]:
    """Build per-device orders by simulating time: the action that can start earliest runs next.

    On a device, a ready backward (I or B) comes first, then a ready forward whose activations
    fit under the cap, then a deferred W. Caps are soft: when every device is stuck on its cap,
    the earliest forward runs anyway, so the scheduler always finishes (see
    :mod:`pipeline.list_scheduler`). Raises PlanError for a placement that forms no pipeline.
    """
    _check_placement(costs, placement, devices)
    if _native is None:
        return list_schedule_python(costs, placement, devices, microbatches=microbatches, config=config)
    try:
        rows, offsets = _native.list_schedule(*_vectors(costs), list(placement), devices, microbatches,
                                              *_config_args(config))
    except RuntimeError as exc:
        raise PlanError(str(exc), field="placement") from None
    return actions_from_arrays(rows, offsets)


def schedule_and_simulate(costs: StageCosts, placement: Sequence[int], devices: int, *, microbatches: int,
                          config: ListSchedulerConfig = _DEFAULT_CONFIG) -> Outcome:
    """:func:`list_schedule` then :func:`simulate_schedule` in one call (no order crosses back from
    the compiled engine). Raises PlanError like :func:`list_schedule`."""
    _check_placement(costs, placement, devices)
    if _native is None:
        started = time.perf_counter()
        order = list_schedule_python(costs, placement, devices, microbatches=microbatches, config=config)
        ok, makespan, busy, peak, _, _ = run_reference(order, costs, devices=devices, microbatches=microbatches,
                                                      record_timeline=False)
        _charge(started, 1)
        return Outcome(ok, makespan, tuple(busy), tuple(peak))
    args = _job_args(ScheduleJob(costs, tuple(placement), devices, microbatches, config))
    started = time.perf_counter()
    try:
        ok, makespan, busy, peak = _native.schedule_and_simulate(*args)
    except RuntimeError as exc:
        raise PlanError(str(exc), field="placement") from None
    finally:
        _charge(started, 1)
    return Outcome(ok, makespan, tuple(busy), tuple(peak))


#: Threads the compiled engine spreads a batch over (it releases the GIL).
BATCH_THREADS = max(1, min(2, os.cpu_count() or 1))


def schedule_and_simulate_many(jobs: Sequence[ScheduleJob], *, threads: int | None = None) -> list[Outcome | str]:
    """:func:`schedule_and_simulate` of each job (on ``threads`` threads with the compiled engine,
    default :data:`BATCH_THREADS`); a job whose placement forms no pipeline comes back as its error
    message. The results do not depend on ``threads``. The compiled engine keeps its helper threads
    from batch to batch and never waits for one that has not started (where other work keeps the
    cores busy, the calling thread runs the jobs a helper did not take); a batch of under 2,000
    actions in all runs on the calling thread alone."""
    if _native is None or len(jobs) < 2:
        out: list[Outcome | str] = []
        for j in jobs:
            try:
                out.append(schedule_and_simulate(j.costs, j.placement, j.devices, microbatches=j.microbatches,
                                                 config=j.config))
            except PlanError as exc:
                out.append(str(exc))
        return out
    bad = {}
    for k, j in enumerate(jobs):
        try:
            _check_placement(j.costs, j.placement, j.devices)
        except PlanError as exc:
            bad[k] = str(exc)
    if bad:  # the compiled engine indexes devices unchecked: run the others alone
        good = [j for k, j in enumerate(jobs) if k not in bad]
        done = iter(schedule_and_simulate_many(good, threads=threads))
        return [bad[k] if k in bad else next(done) for k in range(len(jobs))]
    width = BATCH_THREADS if threads is None else max(1, int(threads))
    packed = [_job_args(j) for j in jobs]
    started = time.perf_counter()
    raw = _native.schedule_and_simulate_batch(packed, width)
    _charge(started, len(jobs))
    return [r if isinstance(r, str) else Outcome(r[0], r[1], tuple(r[2]), tuple(r[3])) for r in raw]


def check_schedule(plan: Plan) -> ScheduleDefect | None:
    """The first structural defect of ``plan.schedule`` (see :func:`pipeline.plan.schedule_defect`)."""
    if _native is None:
        return schedule_defect(plan)
    rows, offsets = schedule_arrays(plan.schedule)
    kind, data = _native.check_schedule(plan.devices, plan.microbatches, list(plan.placement), rows, offsets)
    return (kind, tuple(data)) if kind else None


def pack_job(job: ScheduleJob) -> tuple:
    """What a batch does in Python per job before the compiled engine runs it: the placement checked
    (a PlanError if the engines cannot index it) and the job packed into the compiled
    ``schedule_and_simulate``'s positional arguments. Benchmarks time the Python share of a batch with it."""
    _check_placement(job.costs, job.placement, job.devices)
    return _job_args(job)


# ------------------------------------------------------------------ the batched environment's core

def env_core(num_envs: int, *, threads: int = 1) -> Any | None:
    """The compiled core of the batched environment (``EnvCore``, pipeline/_native/env_core.hpp;
    driven by :mod:`env.native_core`) for ``num_envs`` environments on ``threads`` threads, or None
    where the Python reference runs (or the build predates the core)."""
    if _native is None or not hasattr(_native, "EnvCore"):
        return None
    return _native.EnvCore(int(num_envs), max(1, int(threads)))


def env_scenario(table: dict[str, Any]) -> Any:
    """A scenario's tables for :func:`env_core` (``EnvScenario``; :func:`env.native_core.scenario_table` builds
    ``table``). Needs the compiled engine."""
    if _native is None or not hasattr(_native, "EnvScenario"):
        raise RuntimeError("env_scenario needs the compiled engine with its environment core; run 'make engine'")
    return _native.EnvScenario(table)


def env_scenario_derived(columns: dict[str, Any]) -> Any | None:
    """:func:`env_scenario`'s table derived in the engine from a scenario's raw columns
    (:func:`env.native_core.direct_table` builds ``columns``): the same table as from
    :func:`env.native_core.table_fields`, without a ``PipelineEnv`` preparation. None where the Python
    reference builds it (sums not exact in doubles, a balanced split the engine leaves to it) or the
    build predates it."""
    if _native is None or not hasattr(_native, "env_scenario_derived"):
        return None
    return _native.env_scenario_derived(columns)


def env_start(load_args: tuple) -> Any:
    """An episode's start for :func:`env_core` (``EnvStart``): ``EnvCore.load``'s arguments after the slot
    (``(table, current, current_result, best, best_result, known, params)``,
    :func:`env.native_core.load_args`), parsed and checked once. ``EnvCore.load_start`` loads it with a
    copy; it pickles as bytes (``to_bytes`` / ``EnvStart.from_bytes``), so another process may make it
    (:mod:`env.reset_worker`). Needs the compiled engine."""
    if _native is None or not hasattr(_native, "EnvStart"):
        raise RuntimeError("env_start needs the compiled engine with its environment core; run 'make engine'")
    if not isinstance(load_args, tuple) or len(load_args) != 7:
        got = f"a tuple of {len(load_args)}" if isinstance(load_args, tuple) else type(load_args).__name__
        raise ValueError("env_start takes load_args' 7-tuple (table, current, current_result, best, best_result, "
                         f"known, params), got {got}")
    table, current, current_result, best, best_result, known, params = load_args
    return _native.EnvStart(table, current, current_result, best, best_result, list(known), params)


def env_portfolio_start(table: Any, picks: Sequence[tuple[int, int, bool]], *, repair_starts: int,
                        max_calls: int | None, max_steps: int, step_cost: float, allow_stop: bool,
                        reference: float) -> Any | None:
    """A fresh episode's start from the portfolio, in the compiled engine (an ``EnvStart``; see
    :func:`env_start`): what ``PipelineEnv``'s reset with a new evaluator and
    :meth:`env.editor.PlanEditor.starting` over :func:`env.editor.portfolio` leave, bit for bit.
    ``picks``: ``(placement family index, budget preset index, W counted)`` of each portfolio plan.
    None where no pick fits the scenario, or the build predates it."""
    if _native is None or not hasattr(_native, "env_portfolio_start"):
        return None
    return _native.env_portfolio_start(table, list(picks), int(repair_starts), max_calls, int(max_steps),
                                       float(step_cost), bool(allow_stop), float(reference))


def env_evaluate(pairs: Sequence[tuple[Any, tuple]], *, threads: int = 1) -> list[tuple[float, tuple, tuple]]:
    """``(iteration time, busy, peak memory)`` of each ``(scenario table, candidate tuple)`` pair
    (:func:`env_scenario`, :func:`env.native_core.candidate_tuple`), on ``threads`` threads: what
    ``Evaluator.result`` gives those candidates, without the Python stage costs. Counts for :func:`clocked`."""
    started = time.perf_counter()
    out = _native.env_evaluate(list(pairs), max(1, int(threads)))
    _charge(started, len(pairs))
    return out


def balanced_split(prefix: Sequence[float], stage_speeds: Sequence[float]) -> tuple[int, ...] | None:
    """:func:`pipeline.balance.balanced_sizes` in the compiled engine, from the prefix sums of the layers'
    ``f + b + w`` and each stage's device speed; None where the Python reference runs (or the
    costs or speeds are not finite and positive: the reference's own cases)."""
    if _native is None or not hasattr(_native, "balanced_split"):
        return None
    try:
        return tuple(_native.balanced_split(list(prefix), list(stage_speeds)))
    except ValueError:
        return None


def env_step(core: Any, actions: np.ndarray, which: np.ndarray, *, threads: int = 0) -> None:
    """Step the environments of ``core`` where ``which`` is set (``actions``: int64, one per environment)
    on ``threads`` threads (0: the core's own count); the GIL is released inside, so another Python
    thread may load other environments meanwhile. The engine work counts for :func:`clocked` blocks."""
    seconds, jobs = core.engine_seconds, core.engine_jobs
    core.step(actions, which, int(threads))
    spent, ran = core.engine_seconds - seconds, core.engine_jobs - jobs
    for clock in _clocks:
        clock.seconds += spent
        clock.jobs += ran


# ------------------------------------------------------------------ packing (private)

def _check_placement(costs: StageCosts, placement: Sequence[int], devices: int) -> None:
    """A PlanError for a placement the engines cannot index: one device per stage, each in
    ``0..devices-1`` (the compiled engine does not check, and would read past its arrays)."""
    if len(placement) != len(costs.f):
        raise PlanError(f"has {len(placement)} entries for {len(costs.f)} stages; give one device per stage",
                        field="placement")
    if placement and (min(placement) < 0 or max(placement) >= devices):
        bad = next(d for d in placement if not 0 <= d < devices)
        raise PlanError(f"names device {bad}, but there are {devices} devices (0..{devices - 1})", field="placement")


def _vectors(costs: StageCosts) -> tuple[tuple[float, ...], ...]:
    """``(f, i, w, act, w_keep, comm, backward)``: the compiled engine's per-stage arguments."""
    return (costs.f, costs.i, costs.w, costs.act, costs.w_keep, costs.comm, costs.backward)


def _config_args(config: ListSchedulerConfig) -> tuple:
    """The compiled list scheduler's arguments after ``devices, microbatches`` (see engine.cpp)."""
    caps = list(config.caps) if config.caps is not None else []
    mpw = config.max_pending_w if config.max_pending_w is not None else -1
    return (caps, config.split_backward, config.eager_w, config.depth_first, mpw, config.cap_counts_w)


def _job_args(job: ScheduleJob) -> tuple:
    """The compiled ``schedule_and_simulate``'s 16 positional arguments."""
    return (*_vectors(job.costs), list(job.placement), job.devices, job.microbatches, *_config_args(job.config))
