"""How :mod:`experiments.benchmarks.published` prints its rows and summaries (one concern: the text).

A row with a point prediction prints measured, predicted and the error (and the analytic
prediction beside profiled stage times, the peak memory where the row gives one); a refused row
prints its reason; a row whose schedule the source leaves open (Megatron-Core's interleaving)
prints the range of predictions over the schedules it could have run and how far the measurement
lies from that range (:func:`range_distance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["fmt", "print_rows", "summary_line", "range_distance"]


def fmt(x: float | None) -> str:
    """A fraction as a percentage with one decimal (``-`` for None)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def range_distance(measured: float, span: tuple[float, float]) -> float:
    """How far ``measured`` lies outside ``span`` (low, high), signed as a prediction error: 0 inside,
    ``low / measured - 1`` (> 0) below it, ``high / measured - 1`` (< 0) above it."""
    low, high = span
    if measured < low:
        return low / measured - 1
    if measured > high:
        return high / measured - 1
    return 0.0


def print_rows(preds: Sequence[Any]) -> None:
    """One line per :class:`~experiments.benchmarks.published.Prediction`, under a header."""
    print(f"{'id':36} {'schedule':10} {'measured':>9} {'predicted':>9} {'error':>7} {'analytic':>9} "
          f"{'error':>7}  stage times")
    for p in preds:
        if p.predicted is None:
            print(f"{p.id:36} {str(p.schedule or '-')[:10]:10} {p.measured!s:>9} {'-':>9}  {p.reason}")
            continue
        analytic = (f"{p.analytic:9.3f} {100 * (p.analytic / p.measured - 1):+6.1f}%" if p.analytic is not None
                    else f"{'-':>9} {'-':>7}")
        memory = (f"; memory {p.memory_measured_gb} GB, predicted {p.memory_predicted_gb:.1f} "
                  f"({100 * (p.memory_predicted_gb / p.memory_measured_gb - 1):+.1f}%{'; ' if p.memory_notes else ''}"
                  f"{p.memory_notes or ''})" if p.memory_measured_gb and p.memory_predicted_gb is not None else "")
        print(f"{p.id:36} {p.schedule[:10]:10} {p.measured:9.3f} {p.predicted:9.3f} "
              f"{100 * (p.predicted / p.measured - 1):+6.1f}% {analytic}  {p.stage_times or 'whole-job model'}{memory}")


def summary_line(summary: dict[str, Any]) -> str:
    """The one-line summary of a file (or of every file) that ``--all`` prints."""
    return (f"{summary['predicted']} of {summary['with_throughput']} rows with a throughput predicted "
            f"({summary['rows']} rows); median |error| {fmt(summary['median_abs_error'])}, max "
            f"{fmt(summary['max_abs_error'])}; pairs ranked as measured {summary['pairs_ranked_as_measured']} "
            f"of {summary['pairs']}; groups {summary['groups_ranked_as_measured']} of {summary['groups']}"
            + (f" (not: {', '.join(summary['groups_misranked'])})" if summary["groups_misranked"] else "")
            + (f"; {summary['ranged']} more as a range over an unpublished interleaving: measured inside "
               f"{summary['ranged_inside']}, at most {fmt(summary['range_max_distance'])} outside"
               if summary.get("ranged") else "")
            + (f"; analytic stage times on {summary['analytic_rows']} rows: median |error| "
               f"{fmt(summary['analytic_median_abs_error'])}, max {fmt(summary['analytic_max_abs_error'])}"
               if summary.get("analytic_rows") else "")
            + (f"; peak memory of {summary['memory_rows']} rows: median |error| "
               f"{fmt(summary['memory_median_abs_error'])}, max {fmt(summary['memory_max_abs_error'])}, "
               f"pairs ranked {summary['memory_pairs_ranked_as_measured']} of {summary['memory_pairs']}"
               if summary["memory_rows"] else ""))
