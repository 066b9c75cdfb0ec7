"""Plans that do not fit the model or the world size are refused before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor import replay
from executor.model import resolve_architecture
from executor.replay import check_plan
from experiments.cli import main
from pipeline.errors import PlanError
from pipeline.orders import one_f_one_b_order
from pipeline.plan import Plan, even_partition
from tests.executor.plans import named_plans


@pytest.fixture(scope="module")
def arch():
    return resolve_architecture("tiny-hybrid")


def test_wrong_world_size_is_refused(arch) -> None:
    plan = dict(named_plans(4))["1f1b"]
    with pytest.raises(PlanError, match="2 devices but 4 processes"):
        check_plan(plan, arch, world_size=4)


def test_wrong_model_is_refused(arch) -> None:
    plan = Plan(2, 4, even_partition(10, 2), (0, 1), one_f_one_b_order(2, 4))
    with pytest.raises(PlanError, match="covers 10 layers but model 'tiny-hybrid' has 8"):
        check_plan(plan, arch, world_size=2)


def test_deadlocking_order_is_refused(arch) -> None:
    good = dict(named_plans(4))["1f1b"]
    rows = [list(good.schedule[0]), list(good.schedule[1])]
    rows[1].reverse()  # backward before forward on the last stage
    bad = Plan(2, 4, good.partition, good.placement, rows)
    with pytest.raises(PlanError, match="deadlock|before"):
        check_plan(bad, arch, world_size=2)


def test_replay_cli_refuses_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []  # the world size of every torchrun job the command starts
    monkeypatch.setattr(replay, "run_torchrun", lambda nproc, *args, **kwargs: started.append(nproc))
    plan = Plan(2, 4, even_partition(10, 2), (0, 1), one_f_one_b_order(2, 4))
    plan.save(tmp_path / "plan.json")
    code = main(["replay", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-hybrid"])
    assert code == 2
    assert "covers 10 layers" in capsys.readouterr().err
    good = dict(named_plans(4))["1f1b"]
    good.save(tmp_path / "good.json")
    assert main(["replay", "--plan", str(tmp_path / "good.json"), "--nproc", "3"]) == 2
    assert "3 processes" in capsys.readouterr().err
    assert started == []  # no torchrun was started
