"""A pool of prepared scenarios that the batched environment's resets take from (issue 45).

Today each reset of :class:`env.vector_env.PipelineVectorEnv` draws a new scenario
(:func:`env.scenarios.sample_scenario`, mostly :func:`pipeline.costs.profile_from_architecture`),
prepares it (``env.pipeline_env._Prep``: lower bound, feature constants, the compiled core's
table, the portfolio's DP splits) and simulates its starting plans: about 1.5 ms of Python per
reset, more than the compiled step of the environment. A :class:`ScenarioPool` keeps ``size``
entries, each a drawn scenario with its preparation; a reset takes one and pays only what depends
on the episode (its editor and, where the results are shared, the starting plans' results
adopted from the scenario's memo, not simulated again).

Why the scenario of a reset is distributed as today's: the pool has two generators spawned from
one seed, one that picks slots (``integers(size)`` per reset, whatever the scenarios are) and one
that draws the scenarios, in turn, with :func:`~env.scenarios.sample_scenario` and the
environments' :class:`~env.scenarios.ScenarioConfig`. A slot's entry serves ``reuse`` resets; the
reset that picks a slot whose entry has served them draws its successor. Which draw serves the
n-th reset is therefore a function of the slot picks alone, and every draw is a draw of
:func:`sample_scenario`: each reset's scenario has today's distribution (``tests/env/test_scenario_pool.py``
checks it over seeds). What it costs: episodes are correlated, up to ``reuse`` of them share a scenario
(as ``repeat_scenario`` has one environment repeat its own), and those live at once may share one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env.pipeline_env import prep_of
from env.scenarios import ScenarioConfig, sample_scenario
from pipeline.candidates import Scenario

__all__ = ["ScenarioPool", "PoolEntry"]


@dataclass
class PoolEntry:
    """One drawn scenario of the pool and what its resets reuse."""

    scenario: Scenario
    prep: Any
    """The scenario's preparation (``env.pipeline_env._Prep``), held here so that it outlives the
    episodes that use it (``_PREPS`` keeps preparations weakly): its portfolio, the compiled
    core's table and, where the results are shared, the starting plans' results."""
    uses: int = 0
    """Resets it served."""
    starts: dict[tuple, tuple] = field(default_factory=dict)
    """The compiled core's start of this scenario's episodes (``env.native_core.load_args`` and the
    reference time), by the episode settings it depends on: kept by the vector env after a first
    reset, so that the next ones are one ``EnvCore.load``."""


class ScenarioPool:
    """``size`` prepared scenarios of ``config``, each serving ``reuse`` resets (see the module docstring).

    :meth:`take` gives the entry of one reset; :meth:`seed` restarts the pool (emptied, both
    generators reseeded) so that a seeded reset is reproducible. Entries are drawn when a reset
    first needs them: a vector step's new draws are prepared, and their starting plans simulated,
    together with its other resets in one native batch. :meth:`prefetch` draws the next ones ahead,
    in the same order (the vector env does while its compiled core steps on a side thread), so
    when they are drawn changes nothing.
    """

    def __init__(self, size: int, *, reuse: int = 4, config: ScenarioConfig | None = None,
                 seed: int | list[int] | None = None) -> None:
        for name, value in (("size", size), ("reuse", reuse)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"scenario pool {name} must be a whole number >= 1, got {value!r}")
        self.size = int(size)
        self.reuse = int(reuse)
        self.config = config or ScenarioConfig()
        self.draws = 0
        """Scenarios drawn since the last :meth:`seed` (each one :func:`sample_scenario`)."""
        self.seed(seed)

    def seed(self, seed: int | list[int] | None = None) -> None:
        """Empty the pool and reseed its slot picks and its draws from ``seed`` (None: fresh entropy)."""
        picks, draws = np.random.SeedSequence(seed).spawn(2)
        self._picks = np.random.default_rng(picks)
        self._draws = np.random.default_rng(draws)
        self._entries: list[PoolEntry | None] = [None] * self.size
        self._ahead: deque[PoolEntry] = deque()
        self.draws = 0

    def take(self) -> PoolEntry:
        """The entry of one reset: a uniformly picked slot's, drawn anew when it served ``reuse`` resets."""
        j = self._pick()
        entry = self._entries[j]
        if entry is None or entry.uses >= self.reuse:
            entry = self._entries[j] = self._draw()
        entry.uses += 1
        return entry

    def prefetch(self, more: Callable[[], bool], *, limit: int,
                 prepare: Callable[[PoolEntry], None] | None = None) -> int:
        """Draw the next entries ahead (``prepare`` each: the caller's caches) while ``more()`` and fewer
        than ``limit`` wait; returns how many it drew."""
        n = 0
        while len(self._ahead) < limit and more():
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

    def _draw(self) -> PoolEntry:
        return self._ahead.popleft() if self._ahead else self._new_entry()

    def _new_entry(self) -> PoolEntry:
        scenario = sample_scenario(self._draws, self.config)
        self.draws += 1
        return PoolEntry(scenario, prep_of(scenario))

    def scenarios(self) -> list[Scenario]:
        """The scenarios the pool holds now (empty slots left out)."""
        return [e.scenario for e in self._entries if e is not None]
