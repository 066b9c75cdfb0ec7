"""Choose among replayed plans by measurement, and report the winner on steps the choice never saw.

A search that optimises a model picks the plan whose prediction errs most in its favour (the
optimizer's curse); replaying several of the searched plans and keeping the fastest turns that
into a measured choice. Choosing and reporting on the same steps would repeat the curse on the
measurement's own noise, so the timed steps are split: the even-numbered steps (0, 2, 4, ...)
choose, the odd-numbered ones (spread over the same job, round-robin with the other plans)
give the reported time.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MeasuredChoice", "choose_measured"]


@dataclass(frozen=True)
class MeasuredChoice:
    """The plan chosen, and each plan's median on the choosing and on the reporting steps (ms)."""

    chosen: str
    choosing_ms: dict[str, float]
    reported_ms: dict[str, float]


def choose_measured(step_times: Mapping[str, Sequence[float]], *, among: Sequence[str]) -> MeasuredChoice:
    """The plan of ``among`` whose even-numbered timed steps have the least median.

    ``step_times[name]``: each timed step's iteration time (ms), in order, for every replayed plan
    (plans outside ``among``, such as a baseline, are reported too but never chosen). With a single
    timed step both halves are that step. Raises ``ValueError`` when ``among`` names no plan with
    step times."""
    usable = [name for name in among if step_times.get(name)]
    if not usable:
        raise ValueError(f"no step times for any of {list(among)}: nothing to choose from")

    def halves(times: Sequence[float]) -> tuple[float, float]:
        even, odd = list(times[0::2]), list(times[1::2])
        return statistics.median(even), statistics.median(odd or even)

    split = {name: halves(times) for name, times in step_times.items() if times}
    chosen = min(usable, key=lambda name: (split[name][0], usable.index(name)))
    return MeasuredChoice(chosen, {n: s[0] for n, s in split.items()}, {n: s[1] for n, s in split.items()})
