"""The mixed-speeds benchmark runs the tuner both ways on the same draws and summarises the ratio."""

from __future__ import annotations

import json

from experiments.benchmarks.mixed_speeds import main


def test_both_orders_on_every_scenario_and_a_summary(capsys) -> None:
    assert main(["--scenarios", "3", "--budget", "30", "--seed", "50001"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    runs = [r for r in rows if "ratio" in r]
    summary = rows[-1]["summary"]
    assert runs and summary["scenarios"] == len(runs)
    for r in runs:
        assert r["slowest"] < 1.0 and abs(r["ratio"] - r["index_order_ms"] / r["speed_order_ms"]) < 1e-3
    assert summary["min"] <= summary["geomean_index_over_speed_order"] <= summary["max"]
