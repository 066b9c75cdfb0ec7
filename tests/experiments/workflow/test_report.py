"""experiments.workflow.report: the workflow's tables on a known plan."""

from __future__ import annotations

import pytest

from agents.base import SearchResult
from experiments.workflow.report import Measurement, device_rows, kind_rows, method_rows, op_share, timeline_busy
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile


def test_report_functions_on_a_known_plan() -> None:
    profile = uniform_profile(8)
    cluster = ideal_cluster(2)
    plan = build_plan("1f1b", profile, cluster, microbatches=4)
    result = simulate(plan, profile, cluster)
    busy, span = timeline_busy(result.timeline_dict())
    assert span == pytest.approx(result.iteration_time)
    assert busy == pytest.approx(list(result.busy))
    rows = device_rows(profile, plan, cluster, result=result, measured_timeline=result.timeline_dict())
    assert [r["layers"] for r in rows] == [4, 4]
    assert rows[0]["measured_bubble_pct"] == pytest.approx(100 * result.bubble[0])
    assert rows[1]["top_kind"] == "attention+mlp" and rows[1]["top_kind_pct"] == pytest.approx(100)
    kinds = kind_rows(profile, plan)
    assert kinds == [{"kind": "attention+mlp", "count": 8, "f": 1.0, "b": 1.0, "w": 1.0, "time_share_pct": 100.0,
                      "act_mib": pytest.approx(1000 / 2**20), "devices": "0,1"}]
    assert sum(op_share(result.timeline_dict()).values()) == pytest.approx(100)
    slow = SearchResult("megatron", plan, result)
    fast_result = simulate(plan, profile.scaled(0.5), cluster)
    fast = SearchResult("adaptis", plan, fast_result)
    table = method_rows([slow, fast], time_unit="ms")
    assert [r["method"] for r in table] == ["adaptis", "megatron"]
    assert table[0]["speedup"] == pytest.approx(2.0)
    assert "measured_ms" not in table[0]
    tl = result.timeline_dict()
    measured = {"megatron": Measurement(measured_ms=10.0, predicted_runtime_ms=11.0, measured_timeline=tl,
                                        predicted_timeline=tl),
                "adaptis": Measurement(measured_ms=5.0, predicted_runtime_ms=4.5, measured_timeline=tl,
                                       predicted_timeline=tl)}
    fast_row, slow_row = method_rows([slow, fast], time_unit="ms", measured=measured)
    assert (fast_row["measured_ms"], slow_row["measured_ms"]) == (5.0, 10.0)
    assert fast_row["measured_speedup"] == pytest.approx(2.0) and slow_row["measured_speedup"] == pytest.approx(1.0)
    assert (fast_row["error_pct"], slow_row["error_pct"]) == (pytest.approx(-10.0), pytest.approx(10.0))
    assert fast_row["measured_bubble_pct"] == pytest.approx(100 * sum(result.bubble) / 2)
