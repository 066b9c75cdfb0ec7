"""OUT/plan.json kept current while methods search: an interrupted search leaves its best plan so far.

A plan that does not fit in memory is never plan.json: it goes to OUT/infeasible_plan.json
(:data:`INFEASIBLE_PLAN`), marked ``meta.feasible: false``, and is removed once one that fits is found."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pipeline.candidates import objective_key
from pipeline.plan import Plan
from pipeline.simulator import Result

__all__ = ["BestPlanWriter", "INFEASIBLE_PLAN"]

#: Where the best plan goes while none fits in memory (plan.json only ever holds one that fits).
INFEASIBLE_PLAN = "infeasible_plan.json"


class BestPlanWriter:
    """Writes ``out/plan.json`` whenever any method finds a better plan that ``accept`` takes; the
    plan's ``meta.method`` names the method that found it, ``meta.predicted`` what ``predicted`` says
    of its result. Pass it as :func:`agents.run_methods.run_methods`'s ``on_improve`` (or bind the
    method: ``functools.partial(writer, method)`` for one searcher's ``on_improve``)."""

    def __init__(self, out: Path, accept: Callable[[Plan], bool] = lambda plan: True,
                 predicted: Callable[[Result], dict] | None = None) -> None:
        self.out = out
        self.accept = accept
        self.predicted = predicted
        self.key: tuple | None = None
        self.best_method: str | None = None

    def __call__(self, method: str, plan: Plan, result: Result) -> None:
        if not self.accept(plan):
            return
        key = objective_key(result)
        if self.key is None or key < self.key:
            self.key, self.best_method = key, method
            name = "plan.json" if result.feasible else INFEASIBLE_PLAN
            tmp = self.out / (name + ".tmp")
            extra = {"predicted": self.predicted(result)} if self.predicted is not None else {}
            if not result.feasible:
                extra["feasible"] = False
                extra["peak_memory_gb"] = [round(p, 3) for p in result.peak_memory_gb]
            replace(plan, meta={**plan.meta, "method": method, **extra}).save(tmp)
            os.replace(tmp, self.out / name)
            if result.feasible:
                (self.out / INFEASIBLE_PLAN).unlink(missing_ok=True)
            self.path = self.out / name

    path: Path | None = None
    """The file of the best plan so far (plan.json, or infeasible_plan.json), None before any."""
