"""Rows of the result tables that ``search`` and ``baselines`` print (and log, and write as JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.base import SearchResult

__all__ = ["result_row", "sort_rows", "method_rows"]


def result_row(res: SearchResult, reference: float | None, bound: float) -> dict[str, Any]:
    """One JSON-able row: the result's figures, its speedup over ``reference`` (the Megatron
    baseline's iteration time), its distance to the lower bound ``bound`` and its anytime ``history``
    (:meth:`agents.base.SearchResult.anytime`)."""
    row: dict[str, Any] = {"method": res.method, "sim_calls": res.sim_calls, "seconds": round(res.seconds, 3),
                           "history": res.anytime()}
    if res.result is not None and res.result.valid:
        row.update(res.result.summary())
        row["speedup"] = reference / res.iteration_time if reference else None
        row["vs_lower_bound"] = res.iteration_time / bound if bound > 0 else None
        if res.plan is not None and "chunks" in res.plan.meta:
            row["chunks"] = res.plan.meta["chunks"]
    else:
        row.update({"iteration_time": None, "bubble": None, "peak_memory_gb": None, "feasible": False,
                    "valid": False, "error": res.note or (res.result.error if res.result else "no plan")})
    return row


def sort_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feasible rows first, fastest first."""
    return sorted(rows, key=lambda r: (not r.get("feasible"), r["iteration_time"] if r.get("iteration_time")
                                       else float("inf")))


def method_rows(results: Sequence[SearchResult], bound: float) -> list[dict[str, Any]]:
    """:func:`result_row` of each result, sorted (:func:`sort_rows`), with its speedup over the
    ``megatron`` result among them when that one found a plan."""
    mega = next((r for r in results if r.method == "megatron" and r.ok), None)
    return sort_rows([result_row(r, mega.iteration_time if mega else None, bound) for r in results])
