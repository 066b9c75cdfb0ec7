"""The published benchmark's text: a range's distance to a measurement, the summary line."""

from __future__ import annotations

import pytest

from experiments.benchmarks.published_report import fmt, range_distance, summary_line


def test_range_distance_is_zero_inside_and_signed_as_an_error_outside() -> None:
    assert range_distance(450.0, (400.0, 470.0)) == 0.0
    assert range_distance(400.0, (400.0, 470.0)) == 0.0  # the ends are inside
    assert range_distance(380.0, (400.0, 470.0)) == pytest.approx(400 / 380 - 1)  # predicted too high: > 0
    assert range_distance(500.0, (400.0, 470.0)) == pytest.approx(470 / 500 - 1)  # predicted too low: < 0


def test_the_summary_line_counts_ranged_rows_apart() -> None:
    summary = {"predicted": 5, "with_throughput": 9, "rows": 11, "median_abs_error": 0.006, "max_abs_error": 0.023,
               "pairs_ranked_as_measured": 0, "pairs": 0, "groups_ranked_as_measured": 0, "groups": 0,
               "groups_misranked": [], "ranged": 4, "ranged_inside": 2, "range_max_distance": 0.011,
               "memory_rows": 0}
    line = summary_line(summary)
    assert line.startswith("5 of 9 rows with a throughput predicted")
    assert "4 more as a range over an unpublished interleaving: measured inside 2, at most 1.1% outside" in line
    assert "range" not in summary_line({**summary, "ranged": 0})
    assert fmt(None) == "-" and fmt(0.0234) == "2.3%"
