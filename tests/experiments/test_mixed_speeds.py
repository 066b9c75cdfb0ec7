"""The mixed-speeds benchmark runs the tuner both ways on the same draws and summarises the ratio."""

from __future__ import annotations

import json

from experiments.benchmarks.mixed_speeds import main, scenario_rows, summary


def test_both_orders_on_every_scenario_and_a_summary() -> None:
    rows = list(scenario_rows(3, seed=50001, budget=30))
    runs = [r for r in rows if "ratio" in r]
    total = summary(rows, budget=30)
    assert runs and total["scenarios"] == len(runs) and total["budget_calls"] == 30
    for r in runs:
        assert r["slowest"] < 1.0 and r["ratio"] == r["index_order_ms"] / r["speed_order_ms"]
    assert total["min"] <= total["geomean_index_over_speed_order"] <= total["max"]
    assert summary([{"scenario": "x", "feasible": [True, False]}], budget=30) is None


def test_prints_one_line_per_scenario_and_the_summary(capsys) -> None:
    assert main(["--scenarios", "1", "--budget", "10", "--seed", "50001"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "scenario" in lines[0] and "summary" in lines[-1]
