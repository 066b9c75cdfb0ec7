"""experiments.anytime: several budgets and the anytime figure of evaluate-agent."""

from __future__ import annotations

import pytest

from agents.base import Budget
from experiments.anytime import anytime_figure, parse_budgets, quality_at
from pipeline.errors import ConfigError


def test_parse_budgets_keeps_order_and_the_seconds_cap_of_call_budgets() -> None:
    assert parse_budgets("400") == [("400", Budget(400, None))]
    assert parse_budgets("300, 1000", max_seconds=60.0) == [("300", Budget(300, 60.0)), ("1000", Budget(1000, 60.0))]
    assert parse_budgets("0.25s,1s") == [("0.25s", Budget(None, 0.25)), ("1s", Budget(None, 1.0))]
    for bad, match in (("", "at least one"), ("1s,1s", "twice"), ("0", "out of range"), ("ten", "bad budget")):
        with pytest.raises(ConfigError, match=f"field '--budget'.*{match}"):
            parse_budgets(bad)


def test_quality_at_reads_the_best_plan_so_far() -> None:
    history = [[3, 0.1, 200.0], [9, 0.5, 120.0], [40, 2.0, 100.0]]
    assert quality_at(history, 0.05, 100.0) is None
    assert quality_at(history, 0.1, 100.0) == 0.5
    assert quality_at(history, 1.0, 100.0) == pytest.approx(100 / 120)
    assert quality_at(history, 9.0, 100.0) == 1.0


def test_anytime_figure_draws_from_rows_and_skips_rows_without_seconds(tmp_path) -> None:
    rows = [{"scenario": "s", "devices": 4, "method": m, "budget": b, "feasible": True, "iteration_time": t,
             "seconds": sec, "history": h}
            for m, b, t, sec, h in (("adaptis", "10", 110.0, 0.2, [[1, 0.01, 150.0], [8, 0.2, 110.0]]),
                                    ("adaptis", "40", 100.0, 0.9, [[1, 0.01, 150.0], [30, 0.8, 100.0]]),
                                    ("learned", "10", 100.0, 0.1, [[1, 0.02, 100.0]]),
                                    ("learned", "40", 100.0, 0.3, [[1, 0.02, 100.0]]))]
    assert anytime_figure(rows, ["adaptis", "learned"], tmp_path / "a.png") == tmp_path / "a.png"
    assert (tmp_path / "a.png").stat().st_size > 0
    blind = [{**r, "history": [[c, None, t] for c, _, t in r["history"]]} for r in rows]
    assert anytime_figure(blind, ["adaptis", "learned"], tmp_path / "b.png") is None
