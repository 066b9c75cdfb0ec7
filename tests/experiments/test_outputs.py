"""Outputs that say what happened (issue 47): no plan.json for a plan that does not fit, exit 3
with advice when no whole-job configuration fits, and an --out that holds this run's files only."""

from __future__ import annotations

import json
import subprocess

from experiments.cli import main
from experiments.common import OUT_MARK
from pipeline.plan import Plan
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
SEARCH = ["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--budget", "30"]
TIGHT = ["--memory-gb", "5", "--memory-reserve-gb", "0", "--method", "zb-h1,adaptis"]


def test_an_infeasible_search_writes_no_plan_json(tmp_path, capsys) -> None:
    assert main([*SEARCH, *TIGHT, "--out", str(tmp_path)]) == 3
    assert not (tmp_path / "plan.json").exists()
    plan = Plan.load(tmp_path / "infeasible_plan.json")
    assert plan.meta["feasible"] is False and max(plan.meta["peak_memory_gb"]) > 5
    assert "infeasible_plan.json (not plan.json)" in capsys.readouterr().err


def test_a_second_search_replaces_the_first_whole(tmp_path, capsys) -> None:
    assert main([*SEARCH, "--method", "zb-h1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plan.json").is_file() and (tmp_path / OUT_MARK).is_file()
    assert main([*SEARCH, *TIGHT, "--out", str(tmp_path)]) == 3
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "gantt_best.png").exists()


def test_a_folder_of_your_own_is_never_emptied(tmp_path, capsys) -> None:
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    assert main([*SEARCH, "--method", "zb-h1", "--out", str(tmp_path)]) == 0
    assert main([*SEARCH, "--method", "zb-h1", "--out", str(tmp_path)]) == 0
    assert mine.read_text() == "mine" and not (tmp_path / OUT_MARK).exists()


def test_a_folder_another_run_is_writing_is_refused(tmp_path, capsys) -> None:
    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / OUT_MARK).write_text(json.dumps({"command": "search", "pid": other.pid}))
        (tmp_path / "plan.json").write_text("{}")
        assert main([*SEARCH, "--method", "zb-h1", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"pid {other.pid}" in err and "field '--out'" in err and "Traceback" not in err
        assert (tmp_path / "plan.json").read_text() == "{}"
    finally:
        other.kill()
        other.wait()


def test_a_job_where_nothing_fits_exits_3_with_advice(tmp_path, capsys) -> None:
    code = main(["search", "--model", "deepseek-large", "--gpus", "2", "--global-batch", "64", "--json",
                 "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 3
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["best"] is None and "GPUs (--gpus)" in summary["why"] and "--zero fsdp" in summary["why"]
    assert summary["why"] in captured.err
