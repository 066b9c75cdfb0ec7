"""The plan space that search and RL move in, in one import.

Its parts live in one module each: the values (:mod:`pipeline.candidates`: ``Scenario``,
``Candidate``, ``materialize``, ``objective_key``, placements), the list scheduler's activation
budgets (:mod:`pipeline.budgets`), the cost-aware partition (:func:`pipeline.balance.balanced_sizes`)
and the :class:`~pipeline.evaluator.Evaluator` that simulates candidates, counts calls and caches
repeats. ``from pipeline.space import ...`` keeps working for all of them.
"""

from __future__ import annotations

from pipeline.balance import balanced_sizes
from pipeline.budgets import cut_budgets, memory_budgets, microbatch_bytes, preset_budgets, roomy_budgets
from pipeline.candidates import (
    ORDERS,
    PLACEMENT_KINDS,
    Candidate,
    Scenario,
    by_position,
    list_config,
    make_placement,
    materialize,
    objective_key,
    recompute_for,
    slow_first,
)
from pipeline.evaluator import Evaluator, results_across

__all__ = [
    "ORDERS",
    "PLACEMENT_KINDS",
    "Candidate",
    "Scenario",
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
