"""Which engine runs the hot loops: the compiled one (``pipeline/_native/engine.cpp``) or the
pure-Python reference (:mod:`pipeline.list_scheduler`, :mod:`pipeline.simulator`).

Selected once, at import, by the environment variable ``ADAPTIS_ENGINE``:

* ``auto`` (default): the compiled engine when it is built, else the Python reference;
* ``native``: the compiled engine, and an ImportError that says how to build it when it is not;
* ``python``: the Python reference (the readable one; identical results, 30-100x slower).

Both give bit-identical schedules, times and memory peaks (tests/pipeline/
test_engine_differential.py). Build the compiled one with ``make engine`` (or
``python -m pipeline._native.build``); ``make run`` and ``make test`` build it first.

Schedules cross the boundary as flat arrays (:func:`schedule_arrays`): an ``(N, 3)`` int32 array
of ``(stage, op, micro-batch)`` rows, device after device, and ``devices + 1`` offsets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import numpy as np

from pipeline.plan import Action, Schedule

__all__ = ["ENGINE_ENV", "ENGINE", "OP_CODES", "OP_NAMES", "native", "python_reference", "schedule_arrays",
           "actions_from_arrays"]

ENGINE_ENV = "ADAPTIS_ENGINE"
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


native: ModuleType | None = _load()
"""The compiled module, or ``None`` when the Python reference runs."""
ENGINE = "native" if native is not None else "python"
"""The engine in use: ``"native"`` or ``"python"``."""


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


@contextmanager
def python_reference() -> Iterator[None]:
    """Run the Python reference inside the block (benchmarks and differential tests compare the two
    in one process). Not thread-safe: it swaps the module-level engine."""
    global native
    saved = native
    native = None
    try:
        yield
    finally:
        native = saved
