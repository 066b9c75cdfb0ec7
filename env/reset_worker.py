"""A scenario pool's draws and their episodes' starts, prepared in another process (issue 45).

On the compiled core a step of the batched environment costs about 25 µs of engine time an
environment, but a reset about 1 ms, mostly Python, on the main thread: the scenario draw and its cost
model, the preparation (lower bound, feature constants, the core's table), the portfolio and its
starting plans' simulations. Episodes end every ~25 steps, so the resets, not the engine, set the
speed. A :class:`ResetFeeder` runs that work in one worker process, ahead of the resets, and sends
for each scenario what starting an episode of it needs, for each episode setting the vector env
asks for (:class:`StartSpec`): an ``EnvStart`` (:func:`pipeline.engine.env_start`: the core's table
and the rest of ``EnvCore.load``'s arguments, parsed once), which pickles as a flat byte string.
The main process unpickles it and loads the episode with a copy: about 30 us.

**The same draws, the same episodes.** The worker draws with the generator the pool would draw
with (:class:`env.scenario_pool.ScenarioPool` hands it the same seed), one scenario after another
in the pool's order, and prepares each as the vector env would in-process: the portfolio's start
in the compiled engine (:func:`pipeline.engine.env_portfolio_start`: the portfolio's plans
simulated, the best kept, the fastest that overflow fitted; the same bytes as the Python reset's)
from the table the engine derives from the scenario's columns (:func:`env.native_core.direct_table`:
no ``PipelineEnv`` preparation; the same table),
other starts with the Python code (:meth:`PipelineEnv.reset_rounds`,
:func:`env.native_core.evaluate` for the starting plans, :func:`env.native_core.load_args`). Each
draw has its own seed (:func:`draw_rng`), so the main process redraws the very scenario where it
needs the object (a seeded reset, a setting the worker did not prepare).
``tests/env/test_reset_worker.py`` checks that a vector env with and without the worker gives
identical observations, rewards, flags and masks.

Packets travel in lists of up to eight while the stepping process has some left to take (one at a
time while it has none): a queue's put and get cost ~50 us each, a list's once.

**Nothing hangs, nothing leaks.** The worker runs at most ``ahead`` packets ahead (a bounded
queue: it idles while the learner trains), checks its parent every wait, and stops on
:meth:`ResetFeeder.close` or when the feeder is collected; the main process waits ``timeout_s``
at most for a packet and raises with the worker's traceback where it failed.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from env import native_core
from env.editor import BUDGET_PRESETS, PLACEMENT_FAMILIES, PORTFOLIO_PICKS, REPAIR_STARTS
from env.pipeline_env import PipelineEnv, prep_of, round_to_simulate
from env.scenarios import ScenarioConfig, sample_scenario
from pipeline import engine
from pipeline.candidates import Scenario
from pipeline.evaluator import results_across
from pipeline.start_recipes import preset_candidate

__all__ = ["StartSpec", "ResetFeeder", "Packet", "prepared_starts", "portfolio_start", "draw_rng", "redraw"]

#: Seconds between the worker's checks for commands (a reseed, stop) and for its parent.
_POLL_S = 0.05
#: Seconds between the stepping process's checks that the worker it waits on runs.
_ALIVE_S = 1.0
#: Packets a worker sends together while the stepping process has some left to take (one at a time
#: while it has none): a queue's put and get cost ~50 us each in syscalls and locks, a batch's once.
_BATCH = 8
#: The environment each setting's starts are prepared with (reset for every scenario: a reset
#: keeps nothing of the one before that its start depends on).
_ENVS: dict[Any, PipelineEnv] = {}


@dataclass(frozen=True)
class StartSpec:
    """The episode settings the worker prepares starts for: the vector env's environments' own
    (``PipelineEnv``'s arguments of the same names), one start per value of ``singles`` (False: the
    portfolio's start, True: the zero-shot start of ``single_start_share``). The keys of the starts
    are the vector env's ``_start_key``: ``(max_steps, step_cost, max_calls, allow_stop, single)``."""

    max_steps: int
    step_cost: float
    max_calls: int | None
    allow_stop: bool
    share_results: bool
    singles: tuple[bool, ...] = (False,)

    def key(self, single: bool) -> tuple:
        return self.max_steps, self.step_cost, self.max_calls, self.allow_stop, single


@dataclass(frozen=True)
class Packet:
    """One scenario prepared by a worker: its draw's index and, by start key, ``(EnvStart, the
    reference time)`` (:func:`prepared_starts`)."""

    generation: int
    index: int
    starts: dict[tuple, tuple[Any, float]]


#: numpy's conversion of a seed's entropy to the 32-bit words it mixes (private: without it, none is kept).
_ENTROPY_WORDS = getattr(np.random.bit_generator, "_coerce_to_uint32_array", None)
#: ``id(seed)`` -> ``(seed, its entropy as uint32 words)`` for the pools' seeds lately drawn from (the
#: seed kept, so its id is not reused meanwhile).
_WORDS: dict[int, tuple[np.random.SeedSequence, Any]] = {}


def draw_rng(seed: np.random.SeedSequence, index: int) -> np.random.Generator:
    """The generator of a pool's draw ``index``: the ``index``-th child of ``seed`` (what
    ``seed.spawn`` would give), so any process can make any draw of the pool's sequence. The seed's
    entropy is converted to words once: a vector env's pool seeded with one seed per environment has
    256 of them, and converting them took 256 us of a draw's ~600."""
    hit = _WORDS.get(id(seed))
    if hit is None or hit[0] is not seed:
        words = seed.entropy if _ENTROPY_WORDS is None else _ENTROPY_WORDS(seed.entropy)
        if len(_WORDS) >= 16:
            _WORDS.clear()
        hit = _WORDS[id(seed)] = (seed, words)
    return np.random.default_rng(np.random.SeedSequence(hit[1], spawn_key=(*seed.spawn_key, index),
                                                        pool_size=seed.pool_size))


def redraw(config: ScenarioConfig, seed: np.random.SeedSequence, index: int) -> Scenario:
    """Draw ``index`` of a pool whose draws are seeded by ``seed`` (a packet's scenario, here)."""
    return sample_scenario(draw_rng(seed, index), config)


def _compiled_picks() -> tuple[tuple[int, int, bool], ...]:
    """:data:`env.editor.PORTFOLIO_PICKS` as the compiled portfolio start takes them: the placement
    family's and the budget preset's indices in the core's table, and whether
    :func:`~pipeline.start_recipes.preset_candidate` counts W against that preset's budgets."""
    return tuple((PLACEMENT_FAMILIES.index((kind, chunks)), BUDGET_PRESETS.index(preset),
                  preset_candidate((1,), (0,), preset, devices=1).cap_counts_w)
                 for kind, chunks, preset in PORTFOLIO_PICKS)


_PICKS = _compiled_picks()


def portfolio_start(prep: Any, *, max_calls: int | None, max_steps: int, step_cost: float,
                    allow_stop: bool) -> tuple[Any, float] | None:
    """``(EnvStart, reference time)`` of a ``PipelineEnv`` reset from the portfolio of a preparation's
    scenario with those settings (the reference its default, the lower bound), made in the compiled
    engine (:func:`pipeline.engine.env_portfolio_start`: the Python reset's, bit for bit); None where
    the core does not port the scenario, the call budget is not None or >= 1, or nothing fits."""
    table = native_core.scenario_table(prep) if native_core.unsupported(prep.scenario) is None else None
    if table is None:
        return None
    return _portfolio_start(table, prep.reference("bound"), max_calls=max_calls, max_steps=max_steps,
                            step_cost=step_cost, allow_stop=allow_stop)


def _portfolio_start(table: Any, bound: float, *, max_calls: int | None, max_steps: int, step_cost: float,
                     allow_stop: bool) -> tuple[Any, float] | None:
    """:func:`portfolio_start` of a scenario's table and lower bound."""
    if max_calls is not None and (type(max_calls) is not int or max_calls < 1):
        return None
    start = engine.env_portfolio_start(table, _PICKS, repair_starts=REPAIR_STARTS, max_calls=max_calls,
                                       max_steps=max_steps, step_cost=step_cost, allow_stop=allow_stop,
                                       reference=bound)
    return None if start is None else (start, float(start.reference))


def prepared_starts(scenario: Scenario, spec: StartSpec, *, compiled: bool = True) -> dict[tuple, tuple[Any, float]]:
    """The starts of ``scenario``'s episodes for each setting of ``spec``, as a vector env on the compiled
    core would load them (its reset's rounds, the starting plans on the engine): by start key,
    ``(EnvStart, reference time)``; none where the core does not port the scenario or the start.
    ``compiled``: the portfolio's start made in the compiled engine (:func:`engine.env_portfolio_start`,
    the same bytes as the Python reset's: ``tests/env/test_env_start.py``) from the table the engine
    derives from the scenario's columns (:func:`env.native_core.direct_table`: no preparation where
    that start is all ``spec`` asks for); False: always in Python."""
    if native_core.unsupported(scenario) is not None:
        return {}
    out = {}
    prep = None
    if compiled and False in spec.singles:
        table = native_core.direct_table(scenario)
        if table is not None:
            bound = table.bound
        else:  # (the table the Python reference builds, or none)
            prep = prep_of(scenario)
            table, bound = native_core.scenario_table(prep), prep.reference("bound")
            if table is None:
                return {}
        start = _portfolio_start(table, bound, max_calls=spec.max_calls, max_steps=spec.max_steps,
                                 step_cost=spec.step_cost, allow_stop=spec.allow_stop)
        if start is not None:
            out[spec.key(False)] = start
    if all(spec.key(single) in out for single in spec.singles):
        return out
    prep = prep if prep is not None else prep_of(scenario)
    if native_core.scenario_table(prep) is None:
        return {}
    env = _ENVS.get(spec)
    if env is None:
        env = _ENVS[spec] = PipelineEnv(max_steps=spec.max_steps, step_cost=spec.step_cost, max_calls=spec.max_calls,
                                        share_results=spec.share_results, allow_stop=spec.allow_stop)
    for single in spec.singles:
        if spec.key(single) in out:
            continue
        for hint in env.reset_rounds(options={"scenario": scenario, "start": "single" if single else "portfolio"}):
            ev = env.editor.ev
            rest = native_core.evaluate([(ev, t, prep) for t in round_to_simulate(ev, hint)], threads=1)
            if rest:
                results_across(rest, threads=1)
        args = native_core.load_args(env)
        if args is not None:
            out[spec.key(single)] = (engine.env_start(args), float(env.reference))
    return out


def _serve(config: ScenarioConfig, spec: StartSpec, seed: np.random.SeedSequence, first: int, stride: int,
           out: Any, commands: Any, parent: int, batch_size: int = 1) -> None:
    """A worker's loop: prepare draws ``first``, ``first + stride``, ... and send them in lists of up to
    ``batch_size`` (fewer where the stepping process took all it was sent); reseed or stop on command;
    stop when the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the stepping process's to handle: it stops us)
    generation, index = 0, first
    batch: list[Packet] = []
    try:
        while True:
            batch.append(Packet(generation, index, prepared_starts(redraw(config, seed, index), spec)))
            index += stride
            if len(batch) < batch_size and not _taken_all(out):
                command = _command(commands)
            else:
                while True:
                    try:
                        out.put(batch, timeout=_POLL_S)
                        batch = []
                        break
                    except queue.Full:
                        pass
                    finally:
                        command = _command(commands)
                    if command is not None or os.getppid() != parent:
                        break
            while command is not None:  # (a reseed drops the packets in hand; the latest command wins)
                if command[0] == "stop":
                    out.cancel_join_thread()  # (exit without flushing packets no one will read)
                    return
                generation, seed, index = command[1], command[2], first
                batch = []
                command = _command(commands)
            if os.getppid() != parent:
                out.cancel_join_thread()
                return
    except BaseException:  # the main process raises it at its next wait
        with contextlib.suppress(queue.Full):
            out.put(("error", traceback.format_exc()), timeout=30.0)


def _taken_all(out: Any) -> bool:
    """Whether the stepping process took every batch sent (it may be waiting: send what is made)."""
    try:
        return out.qsize() == 0
    except NotImplementedError:  # (macOS: no semaphore count)
        return True


def _command(commands: Any) -> tuple | None:
    try:
        return commands.get_nowait()
    except queue.Empty:
        return None


def _stop(processes: list[Any], commands: list[Any]) -> None:
    for process, queue_ in zip(processes, commands):
        if process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                queue_.put(("stop",))
    for process in processes:
        process.join(timeout=5.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)


class ResetFeeder:
    """``workers`` processes that prepare the draws of ``config``'s scenarios seeded by ``seed`` (a
    pool's, :func:`draw_rng`) and their starts for ``spec``, each at most ``ahead`` ahead (see the
    module docstring); :meth:`next` returns them in the draws' order."""

    def __init__(self, config: ScenarioConfig, spec: StartSpec, seed: np.random.SeedSequence, *,
                 workers: int = 1, ahead: int = 256, timeout_s: float = 120.0) -> None:
        for name, value in (("workers", workers), ("ahead", ahead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.config, self.spec, self.timeout_s = config, spec, float(timeout_s)
        self.generation = 0
        self.index = 0
        """The next draw :meth:`next` returns."""
        self._skipped: set[int] = set()
        self.made_here = 0
        """Draws :meth:`skip` left to the caller (the seeded resets' own)."""
        ctx = mp.get_context("spawn")  # (fork would copy the engine's threads' locks mid-use)
        per = max(1, -(-ahead // workers))
        batch = min(_BATCH, per)
        self._out = [ctx.Queue(maxsize=max(1, per // batch)) for _ in range(workers)]  # (lists of packets)
        self._taken: list[collections.deque[Packet]] = [collections.deque() for _ in range(workers)]
        """Packets received from each worker, not yet returned."""
        self._commands = [ctx.Queue() for _ in range(workers)]
        self._processes = [ctx.Process(target=_serve, args=(config, spec, seed, j, workers, self._out[j],
                                                            self._commands[j], os.getpid(), batch),
                                       daemon=True, name=f"adaptis-reset-worker-{j}") for j in range(workers)]
        for process in self._processes:
            process.start()
        self._finalizer = weakref.finalize(self, _stop, self._processes, self._commands)

    def reseed(self, seed: np.random.SeedSequence) -> None:
        """Restart the draws from ``seed``: packets drawn before are dropped as they arrive."""
        self.generation += 1
        self.index = 0
        self._skipped.clear()
        for taken in self._taken:
            taken.clear()
        for commands in self._commands:
            commands.put(("seed", self.generation, seed))

    def next(self, *, timeout_s: float | None = None) -> Packet | None:
        """The next draw's packet; waits ``timeout_s`` (default: the feeder's, then raises) or, given a
        ``timeout_s``, returns None when none came in that time."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        j = self.index % len(self._processes)
        process = self._processes[j]
        taken = self._taken[j]
        deadline = time.monotonic() + wait
        while True:
            if taken:
                got = taken.popleft()
                if got.generation != self.generation:
                    continue
                if got.index in self._skipped:  # (a draw the caller made itself)
                    self._skipped.discard(got.index)
                    continue
                assert got.index == self.index, (got.index, self.index)
                self.index += 1
                return got
            left = deadline - time.monotonic()
            try:  # (in slices: a worker that died is told within a second, not after the whole wait)
                got = self._out[j].get(timeout=max(0.0, min(_ALIVE_S, left)))
            except queue.Empty:
                if not process.is_alive():
                    raise RuntimeError(
                        f"a reset worker stopped (exit code {process.exitcode}); its error is printed above. "
                        "A script that starts it needs the 'if __name__ == \"__main__\":' guard (the worker is "
                        "spawned and imports the script, as SB3's SubprocVecEnv does); or pass pool_workers=0 "
                        "to reset in this process") from None
                if left > _ALIVE_S:
                    continue
                if timeout_s is not None:
                    return None
                raise RuntimeError(f"a reset worker sent nothing in {wait:g} s (is the machine overloaded?); pass "
                                   "pool_workers=0 to reset in this process") from None
            if isinstance(got, tuple):
                raise RuntimeError(f"a reset worker failed:\n{got[1]}")
            taken.extend(got)

    def skip(self) -> int:
        """Take the next draw without waiting for its packet (the caller makes it; the packet is dropped
        when it comes); returns its index."""
        self._skipped.add(self.index)
        self.made_here += 1
        self.index += 1
        return self.index - 1

    @property
    def alive(self) -> bool:
        """Whether every worker runs."""
        return all(p.is_alive() for p in self._processes)

    def close(self) -> None:
        """Stop the workers (waits a few seconds, then terminates them)."""
        self._finalizer()
