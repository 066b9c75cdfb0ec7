"""A pool of prepared scenarios that the batched environment's resets take from (issue 45).

Today each reset of :class:`env.vector_env.PipelineVectorEnv` draws a new scenario
(:func:`env.scenarios.sample_scenario`, mostly :func:`pipeline.costs.profile_from_architecture`),
prepares it (``env.pipeline_env._Prep``: lower bound, feature constants, the compiled core's
table, the portfolio's DP splits) and simulates its starting plans: about 1.5 ms of Python per
reset, more than the compiled step of the environment. A :class:`ScenarioPool` keeps ``size``
entries, each a drawn scenario with its preparation; a reset takes one and pays only what depends
on the episode (its editor and, where the results are shared, the starting plans' results
adopted from the scenario's memo, not simulated again).

Why the scenario of a reset is distributed as today's: the pool spawns two seeds from one, one
for a generator that picks slots (``integers(size)`` per reset, whatever the scenarios are) and one
whose k-th child seeds the k-th draw (:func:`env.reset_worker.draw_rng`), made in turn with
:func:`~env.scenarios.sample_scenario` and the environments' :class:`~env.scenarios.ScenarioConfig`.
A slot's entry serves ``reuse`` resets; the reset that picks a slot whose entry has served them
draws its successor. Which draw serves the n-th reset is therefore a function of the slot picks
alone, and every draw is a draw of :func:`sample_scenario`: each reset's scenario has today's
distribution (``tests/env/test_scenario_pool.py`` checks it over seeds). What it costs: episodes are
correlated, up to ``reuse`` of them share a scenario (as ``repeat_scenario`` has one environment
repeat its own), and those live at once may share one.

**Reset workers** (``worker``, a :class:`env.reset_worker.StartSpec`, and ``workers``): the draws
are made, priced, prepared and their starts simulated in that many other processes, ahead, draw k
by worker ``k % workers``; an entry then arrives with its starts ready to load and its scenario is
redrawn here only where something asks for it (the same draw: each has its own seed). The entries
are the same, in the same order, as this process would make (``tests/env/test_reset_worker.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from env.pipeline_env import prep_of
from env.reset_worker import ResetFeeder, StartSpec, redraw
from env.scenarios import ScenarioConfig
from pipeline.candidates import Scenario

__all__ = ["ScenarioPool", "PoolEntry"]

#: Seconds :meth:`ScenarioPool.prefetch` waits at a time for the reset worker's next packet.
_WAIT_S = 5e-4


class PoolEntry:
    """One drawn scenario of the pool and what its resets reuse."""

    def __init__(self, scenario: Scenario | None, prep: Any = None, *, uses: int = 0,
                 starts: dict[tuple, tuple] | None = None, redraw: Callable[[], Scenario] | None = None) -> None:
        if scenario is None and redraw is None:
            raise ValueError("a pool entry needs its scenario or a way to redraw it")
        self._scenario, self._prep, self._redraw = scenario, prep, redraw
        self.uses = uses
        """Resets it served."""
        self.starts: dict[tuple, tuple] = starts if starts is not None else {}
        """The compiled core's start of this scenario's episodes and the reference time, by the episode
        settings it depends on: ``EnvCore.load``'s arguments (``env.native_core.load_args``) kept by the
        vector env after a first reset, or an ``EnvStart`` (:func:`pipeline.engine.env_start`: the
        reset worker's, or those arguments parsed at their first reuse), so that the next ones are
        one ``EnvCore.load_start``."""

    @property
    def scenario(self) -> Scenario:
        """The scenario (an entry the reset worker prepared redraws it here on first use)."""
        if self._scenario is None:
            self._scenario = self._redraw()
        return self._scenario

    @property
    def prep(self) -> Any:
        """The scenario's preparation (``env.pipeline_env._Prep``), held here so that it outlives the
        episodes that use it (``_PREPS`` keeps preparations weakly): its portfolio, the compiled
        core's table and, where the results are shared, the starting plans' results."""
        if self._prep is None:
            self._prep = prep_of(self.scenario)
        return self._prep


class ScenarioPool:
    """``size`` prepared scenarios of ``config``, each serving ``reuse`` resets (see the module docstring).

    :meth:`take` gives the entry of one reset; :meth:`seed` restarts the pool (emptied, slot picks
    and draws reseeded, the reset workers too) so that a seeded reset is reproducible. Entries are
    drawn when a reset first needs them: a vector step's new draws are prepared, and their starting
    plans simulated, together with its other resets in one native batch. :meth:`prefetch` draws the
    next ones ahead, in the same order (the vector env does while its compiled core steps on a side
    thread), so when they are drawn changes nothing. With ``worker`` (the episode settings to
    prepare starts for), ``workers`` processes make the draws instead (:mod:`env.reset_worker`, each
    at most ``worker_ahead / workers`` ahead); :meth:`close` stops them.
    """

    def __init__(self, size: int, *, reuse: int = 4, config: ScenarioConfig | None = None,
                 seed: int | list[int] | None = None, worker: StartSpec | None = None, workers: int = 1,
                 worker_ahead: int = 256) -> None:
        for name, value in (("size", size), ("reuse", reuse), ("workers", workers), ("worker_ahead", worker_ahead)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"scenario pool {name} must be a whole number >= 1, got {value!r}")
        self.size = int(size)
        self.reuse = int(reuse)
        self.config = config or ScenarioConfig()
        self.draws = 0
        """Scenarios drawn since the last :meth:`seed` (each one :func:`sample_scenario`)."""
        self.worker = worker
        """The episode settings a reset worker prepares starts for (:mod:`env.reset_worker`; None: the
        draws are made in this process)."""
        self.workers = int(workers)
        """Reset worker processes (with ``worker``)."""
        self._worker_ahead = int(worker_ahead)
        self._feeder: ResetFeeder | None = None
        self.seed(seed)

    def seed(self, seed: int | list[int] | None = None) -> None:
        """Empty the pool and reseed its slot picks and its draws from ``seed`` (None: fresh entropy)."""
        picks, draws = np.random.SeedSequence(seed).spawn(2)
        self._picks = np.random.default_rng(picks)
        self._draws_seed = draws
        if self._feeder is not None:
            self._feeder.reseed(draws)
        self._entries: list[PoolEntry | None] = [None] * self.size
        self._ahead: deque[PoolEntry] = deque()
        self.draws = 0

    def take(self, *, started: bool = True) -> PoolEntry:
        """The entry of one reset: a uniformly picked slot's, drawn anew when it served ``reuse`` resets.
        ``started=False``: the reset makes its start itself (a seeded one), so a new draw is made here
        at once instead of waiting for a reset worker's packet (dropped when it comes)."""
        j = self._pick()
        entry = self._entries[j]
        if entry is None or entry.uses >= self.reuse:
            entry = self._entries[j] = self._draw(started)
        entry.uses += 1
        return entry

    def prefetch(self, more: Callable[[], bool], *, limit: int,
                 prepare: Callable[[PoolEntry], None] | None = None) -> int:
        """Draw the next entries ahead (``prepare`` each: the caller's caches) while ``more()`` and fewer
        than ``limit`` wait; returns how many it drew."""
        n = 0
        while len(self._ahead) < limit and more():
            if self.worker is not None:  # what the worker sent meanwhile (waiting releases the GIL)
                entry = self._received(timeout_s=_WAIT_S)
                if entry is not None:
                    self._ahead.append(entry)
                    n += 1
                continue
            entry = self._new_entry()
            if prepare is not None:
                prepare(entry)
            self._ahead.append(entry)
            n += 1
        return n

    @property
    def ahead(self) -> int:
        """Entries drawn ahead (:meth:`prefetch`) and not taken yet."""
        return len(self._ahead)

    def _pick(self) -> int:
        return int(self._picks.integers(self.size))

    def _draw(self, started: bool = True) -> PoolEntry:
        if self._ahead:
            return self._ahead.popleft()
        if self.worker is not None and not started:
            if self._feeder is None:
                self._start_feeder()
            index = self._feeder.skip()
            self.draws += 1
            scenario = redraw(self.config, self._draws_seed, index)
            return PoolEntry(scenario, prep_of(scenario))
        return self._new_entry()

    def _new_entry(self) -> PoolEntry:
        if self.worker is not None:
            entry = self._received(timeout_s=None)
            assert entry is not None
            return entry
        scenario = redraw(self.config, self._draws_seed, self.draws)
        self.draws += 1
        return PoolEntry(scenario, prep_of(scenario))

    def _received(self, *, timeout_s: float | None) -> PoolEntry | None:
        """The worker's next prepared scenario as an entry (its starts ``EnvStart`` objects, loadable
        as they come), or None where ``timeout_s`` passed first (None: the feeder's own, then it raises)."""
        if self._feeder is None:
            self._start_feeder()
        packet = self._feeder.next(timeout_s=timeout_s)
        if packet is None:
            return None
        self.draws += 1
        config, seed, index = self.config, self._draws_seed, packet.index
        return PoolEntry(None, starts=dict(packet.starts), redraw=lambda: redraw(config, seed, index))

    def _start_feeder(self) -> None:
        self._feeder = ResetFeeder(self.config, self.worker, self._draws_seed, workers=self.workers,
                                   ahead=self._worker_ahead)

    def close(self) -> None:
        """Stop the reset worker, if one runs (a later draw starts another)."""
        if self._feeder is not None:
            self._feeder.close()
            self._feeder = None

    def scenarios(self) -> list[Scenario]:
        """The scenarios the pool holds now (empty slots left out)."""
        return [e.scenario for e in self._entries if e is not None]
