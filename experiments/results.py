"""One row per searched method: what ``search``, ``run``, ``baselines``, ``evaluate-agent`` and ``sweep``
print, log to W&B and write as JSON, with one set of field names (docs/formats.md, "Method rows").

:class:`MethodRow` is built from a :class:`agents.base.SearchResult` (:meth:`MethodRow.of`);
:meth:`MethodRow.as_dict` is its JSON object and :meth:`MethodRow.cells` its cells in a printed
table (the one place where a table shows a figure in other units: bubble in %, the largest peak).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agents.base import SearchResult

__all__ = ["MethodRow", "method_rows", "result_row", "sort_rows"]


@dataclass
class MethodRow:
    """The figures of one method's best plan (JSON, tables, W&B and ``summary.json`` share these names)."""

    method: str
    iteration_time: float | None = None
    """Predicted iteration time of the best plan, in :attr:`time_unit`; None without a valid plan."""
    time_unit: str | None = None
    throughput: float | None = None
    """Tokens per time unit."""
    bubble: float | None = None
    """Mean idle fraction of the devices (0-1)."""
    bubble_per_device: list[float] | None = None
    peak_memory_gb: list[float] | None = None
    """Peak memory per device (GiB)."""
    peak_memory_max_gb: float | None = None
    """The largest of :attr:`peak_memory_gb`."""
    memory_limit_gb: list[float] | None = None
    feasible: bool = False
    """A valid plan that fits in memory."""
    valid: bool = False
    speedup: float | None = None
    """Over the Megatron baseline of the same scenario (None without one)."""
    vs_lower_bound: float | None = None
    """Iteration time over the lower bound (``pipeline.bounds``)."""
    sim_calls: int = 0
    seconds: float = 0.0
    """Search wall time."""
    stages: int | None = None
    chunks: int | None = None
    """Chunks per device of a named interleaved/V schedule (None for others)."""
    error: str | None = None
    """Why there is no valid plan (None with one)."""
    note: str = ""
    """What the method says about its plan (e.g. why it was skipped)."""
    history: list[list[float | None]] = field(default_factory=list)
    """The anytime curve, ``[[calls, seconds, best_time], ...]`` (:meth:`agents.base.SearchResult.anytime`)."""

    @classmethod
    def of(cls, res: SearchResult, reference: float | None = None, bound: float | None = None) -> MethodRow:
        """The row of ``res``, with its speedup over ``reference`` (the Megatron baseline's iteration
        time) and its distance to the lower bound ``bound``."""
        row = cls(res.method, sim_calls=res.sim_calls, seconds=round(res.seconds, 3), history=res.anytime(),
                  note=res.note)
        if not res.ok:
            row.error = res.note or (res.result.error if res.result else "no plan")
            return row
        s = res.result.summary()
        row.iteration_time, row.time_unit, row.throughput = s["iteration_time"], s["time_unit"], s["throughput"]
        row.bubble, row.bubble_per_device = s["bubble"], s["bubble_per_device"]
        row.peak_memory_gb, row.memory_limit_gb = s["peak_memory_gb"], s["memory_limit_gb"]
        row.peak_memory_max_gb = max(s["peak_memory_gb"]) if s["peak_memory_gb"] else None
        row.feasible, row.valid = s["feasible"], True
        row.speedup = reference / res.iteration_time if reference else None
        row.vs_lower_bound = res.iteration_time / bound if bound else None
        if res.plan is not None:
            row.stages = res.plan.num_stages
            row.chunks = res.plan.meta.get("chunks")
        return row

    def as_dict(self) -> dict[str, Any]:
        """The JSON object (every field; ``chunks`` only where set)."""
        out = asdict(self)
        if self.chunks is None:
            del out["chunks"]
        return out

    def cells(self) -> dict[str, Any]:
        """The cells of a printed table: the row with ``bubble_pct`` (%), ``peak_mem_gb`` (the largest
        peak), ``iter_time`` (or ``n/a: <error>``), ``tokens_per_s``, ``vs_bound`` and ``(OOM)`` after
        the name of a valid plan that does not fit."""
        return {**self.as_dict(),
                "method": self.method + (" (OOM)" if self.valid and not self.feasible else ""),
                "iter_time": self.iteration_time if self.iteration_time else f"n/a: {str(self.error)[:50]}",
                "tokens_per_s": self.throughput, "vs_bound": self.vs_lower_bound,
                "bubble_pct": None if self.bubble is None else 100 * self.bubble,
                "peak_mem_gb": self.peak_memory_max_gb}


def result_row(res: SearchResult, reference: float | None, bound: float) -> dict[str, Any]:
    """:meth:`MethodRow.as_dict` of ``res`` (speedup over ``reference``, distance to ``bound``)."""
    return MethodRow.of(res, reference, bound).as_dict()


def sort_rows(rows: Sequence[MethodRow]) -> list[MethodRow]:
    """Feasible rows first, fastest first."""
    return sorted(rows, key=lambda r: (not r.feasible, r.iteration_time if r.iteration_time else float("inf")))


def method_rows(results: Sequence[SearchResult], bound: float | None = None) -> list[MethodRow]:
    """:meth:`MethodRow.of` each result, sorted (:func:`sort_rows`), with its speedup over the
    ``megatron`` result among them when that one found a plan."""
    mega = next((r for r in results if r.method == "megatron" and r.ok), None)
    return sort_rows([MethodRow.of(r, mega.iteration_time if mega else None, bound) for r in results])
