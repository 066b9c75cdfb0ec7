"""The learner's torch threads, chosen by timing PPO's own updates.

SB3's on-policy loop collects a rollout, then learns on it; the two never run at once. While it
learns, the environments are idle, so a second torch thread makes PPO's updates about 30% faster
on an idle two-core machine (the whole of ``train`` about 19%). Under load it is the other way:
with one busy process beside it, two OpenMP threads wait on each other at every parallel region
and the updates run about twice as slow. No fixed count is right on a shared machine, so
:class:`ThreadChooser` times the updates at each count it may use and keeps the faster, trying
the other one now and then (load changes). Rollouts always run on one torch thread (the
compiled engine's threads step the environments then).
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = ["ThreadChooser", "learner_threads_callback"]


class ThreadChooser:
    """Which thread count the next update runs on: each choice once, then the one with the least
    smoothed seconds per update, and every ``explore_every``-th update the least recently tried
    other choice, so a change of load is seen. ``alpha`` weighs the newest time in the smoothing."""

    def __init__(self, choices: list[int], *, explore_every: int = 16, alpha: float = 0.5) -> None:
        if not choices or min(choices) < 1:
            raise ValueError(f"choices must be thread counts >= 1, got {choices}")
        if explore_every < 2:
            raise ValueError(f"explore_every must be at least 2, got {explore_every}")
        self.choices = sorted(set(choices))
        self.explore_every = explore_every
        self.alpha = alpha
        self.seconds: dict[int, float] = {}
        self.last_tried: dict[int, int] = {}
        self.updates = 0
        self.counts: dict[int, int] = {c: 0 for c in self.choices}

    def pick(self) -> int:
        """The thread count of the next update."""
        untried = [c for c in self.choices if c not in self.seconds]
        if untried:
            return untried[0]
        best = min(self.choices, key=lambda c: (self.seconds[c], c))
        if len(self.choices) > 1 and self.updates % self.explore_every == 0:
            others = [c for c in self.choices if c != best]
            return min(others, key=lambda c: self.last_tried.get(c, -1))
        return best

    def record(self, threads: int, seconds: float) -> None:
        """One update ran on ``threads`` for ``seconds``."""
        old = self.seconds.get(threads)
        self.seconds[threads] = seconds if old is None else self.alpha * seconds + (1 - self.alpha) * old
        self.last_tried[threads] = self.updates
        self.counts[threads] = self.counts.get(threads, 0) + 1
        self.updates += 1

    @property
    def best(self) -> int | None:
        """The count with the least smoothed time so far (None before any update)."""
        return min(self.seconds, key=lambda c: (self.seconds[c], c)) if self.seconds else None


def learner_threads_callback(most: int | None = None) -> Any:
    """An SB3 callback that runs each PPO update on the thread count a :class:`ThreadChooser`
    picks among 1 and ``most`` (None: the machine's cores, at most 2) and each rollout on one
    thread. Its ``chooser`` holds the times and how often each count ran."""
    import torch as th
    from stable_baselines3.common.callbacks import BaseCallback

    most = min(2, os.cpu_count() or 1) if most is None else max(1, int(most))

    class LearnerThreads(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.chooser = ThreadChooser(sorted({1, most}))
            self._running: tuple[int, float] | None = None

        def _on_training_start(self) -> None:
            th.set_num_threads(1)

        def _on_rollout_end(self) -> None:  # SB3 calls train() next
            threads = self.chooser.pick()
            th.set_num_threads(threads)
            self._running = (threads, time.perf_counter())

        def _on_rollout_start(self) -> None:  # the previous update is done
            if self._running is not None:
                threads, t0 = self._running
                self.chooser.record(threads, time.perf_counter() - t0)
                self._running = None
            th.set_num_threads(1)

        def _on_training_end(self) -> None:
            th.set_num_threads(1)

        def _on_step(self) -> bool:
            return True

    return LearnerThreads()
