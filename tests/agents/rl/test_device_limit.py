"""The RL policy's device limit (issue 47): past MAX_DEVICES the rl methods are skipped with one line."""

from __future__ import annotations

import json

import pytest

from agents.base import Budget
from agents.rl.searchers import RLSearcher, RLTunerSearcher, beyond_reach
from env.editor import MAX_DEVICES
from experiments.cli import main
from pipeline.candidates import Scenario
from pipeline.spec import LayerCost, ModelProfile
from tests.conftest import ideal_cluster

_LAYERS = tuple(LayerCost(f"l{i}", "attention+mlp", 1.0, 1.0, 1.0, 1000, 1000, 0) for i in range(80))


def _scenario(devices: int) -> Scenario:
    return Scenario(ModelProfile("wide", _LAYERS), ideal_cluster(devices), 2 * devices)


@pytest.mark.parametrize("searcher", [RLSearcher(), RLSearcher(zero_shot=True), RLSearcher(random_edits=True),
                                      RLTunerSearcher()], ids=["rl", "rl-zero", "rl-random", "rl+tuner"])
def test_past_the_device_limit_rl_is_skipped_not_a_crash(searcher) -> None:
    res = searcher.search(_scenario(MAX_DEVICES + 1), budget=Budget(20))
    assert res.plan is None and res.result is None and res.sim_calls == 0
    assert res.note == f"skipped: rl plans up to {MAX_DEVICES} devices, got {MAX_DEVICES + 1}"


def test_the_limit_itself_is_within_reach() -> None:
    assert beyond_reach(_scenario(MAX_DEVICES)) is None
    assert beyond_reach(_scenario(MAX_DEVICES + 1)) is not None


def test_search_past_the_limit_keeps_the_table_and_the_plan(tmp_path, capsys) -> None:
    code = main(["search", "--model", "gemma-large", "--devices", "33", "--method", "adaptis,rl,rl+tuner",
                 "--budget", "40", "--out", str(tmp_path), "--json"])
    assert code == 0
    rows = {r["method"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(rows) == {"megatron", "adaptis", "rl", "rl+tuner"}
    assert rows["rl"]["error"].startswith("skipped: rl plans up to")
    assert json.loads((tmp_path / "plan.json").read_text())["meta"]["method"] in ("adaptis", "megatron")


def test_the_table_shows_a_skipped_method_with_dashes_not_none(tmp_path, capsys) -> None:
    """The text table: the skipped row says why in its time column and has '-' where it has no figure."""
    assert main(["search", "--model", "gemma-large", "--devices", "33", "--method", "adaptis,rl+tuner",
                 "--budget", "20", "--out", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rl+tuner "))
    assert "skipped: rl plans up to 32 devices" in row and "None" not in row and " - " in row


def test_evaluate_agent_past_the_limit_counts_no_loss(tmp_path, capsys) -> None:
    code = main(["evaluate-agent", "--models", "gemma-large", "--devices", "48", "--heldout", "0", "--budget", "30",
                 "--methods", "rl,adaptis", "--repeats", "1", "--out", str(tmp_path), "--json"])
    assert code == 0
    rows = {r["method"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["rl"]["quality"] is None and rows["rl"]["note"].startswith("skipped: rl plans up to")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rl"]["losses"] == 0
