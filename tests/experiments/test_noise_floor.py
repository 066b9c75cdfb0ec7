"""The noise-floor benchmark: its summary arithmetic, and one short real run (two torchrun jobs)."""

from __future__ import annotations

import json

import pytest

from experiments.benchmarks.noise_floor import JobTimes, main, spread_summary


def test_spread_summary_reports_each_plans_spread_and_ratio() -> None:
    jobs = [JobTimes(1.0, {"a": 100.0, "b": 80.0}, 102.0), JobTimes(3.0, {"a": 120.0, "b": 90.0}, 114.0),
            JobTimes(2.0, {"a": 110.0, "b": 88.0}, 110.0)]
    out = spread_summary(jobs, ["a", "b"])
    assert out["plans"]["a"]["median_ms"] == 110.0
    assert out["plans"]["a"]["spread_pct"] == pytest.approx(100 * 20 / 110)
    assert out["plans"]["b"]["ratio_min"] == pytest.approx(0.75)
    assert out["plans"]["b"]["ratio_max"] == pytest.approx(0.8)
    assert out["plans"]["b"]["ratio_to_first"] == pytest.approx(0.8)
    assert out["plans"]["b"]["ratio_spread_pct"] == pytest.approx(100 * 0.05 / 0.8)
    assert out["copy_difference_pct"] == pytest.approx(2.0)  # |102-100|/100, |114-120|/120 = 5%, 0%
    assert out["copy_difference_max_pct"] == pytest.approx(5.0)
    assert out["load"] == [1.0, 3.0, 2.0]


def test_spread_summary_refuses_nothing_to_summarise() -> None:
    with pytest.raises(ValueError, match="at least one job"):
        spread_summary([], ["a"])


def test_one_job_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--jobs", "1"])
    assert "--jobs must be at least 2" in capsys.readouterr().err


@pytest.mark.slow  # two torchrun jobs and a profile: ~30 s on 2 cores
def test_two_real_jobs_time_the_same_plan_twice(capsys) -> None:
    assert main(["--jobs", "2", "--steps", "1", "--plans", "1f1b,zbv", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["jobs"] == 2 and set(out["plans"]) == {"1f1b", "zbv"}
    assert all(row["1f1b"] > 0 and row["copy_of_first"] > 0 and row["zbv"] > 0 for row in out["per_job"])
    assert out["plans"]["1f1b"]["ratio_to_first"] == 1.0
