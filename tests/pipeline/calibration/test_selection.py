"""Choosing among replayed plans by measurement: even steps choose, odd steps report."""

from __future__ import annotations

import pytest

from pipeline.calibration.selection import choose_measured


def test_the_even_steps_choose_and_the_odd_steps_report() -> None:
    times = {"adaptis": [100.0, 130.0, 102.0, 128.0], "rl": [110.0, 111.0, 109.0, 112.0],
             "megatron": [90.0, 90.0, 90.0, 90.0]}
    out = choose_measured(times, among=["adaptis", "rl"])
    assert out.chosen == "adaptis"  # 101 on the even steps against rl's 109.5; megatron is not a candidate
    assert out.choosing_ms == {"adaptis": 101.0, "rl": 109.5, "megatron": 90.0}
    assert out.reported_ms["adaptis"] == 129.0  # the steps the choice never saw: its luck does not carry over
    assert out.reported_ms["rl"] == 111.5


def test_a_tie_keeps_the_order_of_among_and_one_step_is_both_halves() -> None:
    out = choose_measured({"a": [5.0], "b": [5.0]}, among=["b", "a"])
    assert out.chosen == "b"
    assert out.reported_ms == {"a": 5.0, "b": 5.0}


def test_plans_without_step_times_are_skipped_and_none_at_all_is_an_error() -> None:
    assert choose_measured({"a": [], "b": [3.0, 4.0]}, among=["a", "b"]).chosen == "b"
    with pytest.raises(ValueError, match="nothing to choose from"):
        choose_measured({"a": []}, among=["a", "c"])
