"""Plan JSON round trip, validation messages, placements, and the CSV that PyTorch loads."""

from __future__ import annotations

import csv
import json

import pytest

from pipeline.errors import PlanError
from pipeline.plan import (
    Action,
    Plan,
    even_partition,
    interleaved_placement,
    parse_action,
    parse_torch_cell,
    v_placement,
    validate_plan,
    wave_placement,
)
from pipeline.schedules import NAMED_METHODS, build_plan
from tests.conftest import ideal_cluster, uniform_profile


def test_parse_action_and_str_round_trip() -> None:
    assert parse_action("12I3") == Action(12, "I", 3)
    assert str(Action(3, "W", 10)) == "3W10"
    with pytest.raises(PlanError, match="bad action 'F0'"):
        parse_action("F0")


def test_parse_torch_cells() -> None:
    assert parse_torch_cell("(0F3;3B1)OVERLAP_F_B") == [Action(0, "F", 3), Action(3, "B", 1)]
    assert parse_torch_cell("0REDUCE_GRAD") == []
    assert parse_torch_cell("1SEND_F0") == []


def test_placements() -> None:
    assert interleaved_placement(2, 2) == (0, 1, 0, 1)
    assert v_placement(3) == (0, 1, 2, 2, 1, 0)
    assert wave_placement(2, 3) == (0, 1, 1, 0, 0, 1)
    assert even_partition(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))


@pytest.mark.parametrize("method", NAMED_METHODS)
def test_json_round_trip(tmp_path, method: str) -> None:
    prof, cluster = uniform_profile(16), ideal_cluster(4)
    plan = build_plan(method, prof, cluster, microbatches=8)
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again == plan
    assert again.meta["method"] == method
    raw = json.loads(path.read_text())
    assert set(raw) >= {"devices", "microbatches", "partition", "placement", "schedule"}


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.pop("schedule"), "field 'schedule': missing"),
    (lambda r: r.update(devices=0), "field 'devices'"),
    (lambda r: r.update(partition=[[0, 2], [3, 4]]), "stage 1 starts at layer 3"),
    (lambda r: r.update(partition=[[0, 2], [2, 2]]), "stage 1 is empty"),
    (lambda r: r.update(placement=[0, 5]), "outside 0..1"),
    (lambda r: r.update(placement=[0]), "1 entries for 2 stages"),
    (lambda r: r["schedule"][0].append("0X1"), "bad action '0X1'"),
    (lambda r: r.update(partition="0-2"), "list of [start, end) pairs"),
])
def test_validation_names_field_and_fix(tmp_path, mutate, needle) -> None:
    raw = {"devices": 2, "microbatches": 2, "partition": [[0, 2], [2, 4]], "placement": [0, 1],
           "schedule": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]}
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        validate_plan(Plan.load(path), num_layers=4, devices=2)


def test_not_json_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{oops")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(path)
    with pytest.raises(PlanError, match="cannot read file"):
        Plan.load(tmp_path / "missing.json")


@pytest.mark.parametrize("method", ["1f1b", "i1f1b-v2", "zb-h1", "zbv", "dualpipev", "looped-bfs"])
def test_csv_loads_the_way_pytorch_loads_it(tmp_path, method: str) -> None:
    """Replays ``_PipelineScheduleRuntime._load_csv(format="compute_only")``: parse every cell with
    ``_Action.from_str``, validate the order, and lower it with send/recv like the runtime does."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    prof, cluster = uniform_profile(16), ideal_cluster(4)
    plan = build_plan(method, prof, cluster, microbatches=8)
    path = tmp_path / "plan.csv"
    plan.save_csv(path)
    order = {}
    with open(path, newline="") as fh:
        for rank, row in enumerate(csv.reader(fh)):
            order[rank] = [schedules._Action.from_str(cell) for cell in row]
    assert [[str(a) for a in order[r]] for r in range(4)] == [[str(a) for a in row] for row in plan.schedule]
    stage_to_rank = schedules._validate_schedule(order, 4, plan.num_stages, plan.microbatches)
    assert stage_to_rank == dict(enumerate(plan.placement))
    lowered = schedules._add_send_recv(order, stage_to_rank=lambda s: plan.placement[s],
                                       num_stages=plan.num_stages)
    assert sum(len(v) for v in lowered.values()) > sum(len(v) for v in order.values())


# ------------------------------------------------------------------------ recompute (issue 15)

def test_recompute_round_trips_as_version_2(tmp_path) -> None:
    plan = build_plan("1f1b", uniform_profile(4), ideal_cluster(2), microbatches=4)
    redo = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                recompute=(True, False))
    raw = redo.to_dict()
    assert raw["version"] == 2 and raw["recompute"] == [True, False]
    assert plan.to_dict()["version"] == 1 and "recompute" not in plan.to_dict()  # old readers unaffected
    redo.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").recompute == (True, False)
    redo.save_csv(tmp_path / "a.csv")
    plan.save_csv(tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()  # the CSV is the schedule only


def test_all_false_recompute_is_no_recompute() -> None:
    plan = build_plan("1f1b", uniform_profile(4), ideal_cluster(2), microbatches=4)
    same = Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                recompute=(False, False))
    assert same.recompute is None and same == plan


@pytest.mark.parametrize("value,needle", [([True], "one per stage"), (["yes", False], "true/false"),
                                          ("all", "true/false")])
def test_bad_recompute_names_the_field(value, needle) -> None:
    raw = build_plan("1f1b", uniform_profile(4), ideal_cluster(2), microbatches=4).to_dict()
    raw["recompute"] = value
    with pytest.raises(PlanError, match=needle) as exc:
        Plan.from_dict(raw)
    assert exc.value.field == "recompute"


def test_newer_plan_version_is_refused() -> None:
    raw = build_plan("1f1b", uniform_profile(4), ideal_cluster(2), microbatches=4).to_dict()
    raw["version"] = 3
    with pytest.raises(PlanError, match="newer") as exc:
        Plan.from_dict(raw)
    assert exc.value.field == "version"


def test_a_binary_plan_file_is_one_plan_error(tmp_path) -> None:
    from pipeline.errors import PlanError
    from pipeline.plan import Plan

    blob = tmp_path / "plan.json"
    blob.write_bytes(bytes(range(256)))
    with pytest.raises(PlanError, match="not a text file"):
        Plan.load(blob)
