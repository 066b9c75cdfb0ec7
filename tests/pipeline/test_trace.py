"""Chrome traces of predicted and measured timelines: the format Perfetto reads, one slice per action."""

from __future__ import annotations

import json

import pytest

from pipeline import zoo
from pipeline.errors import ConfigError
from pipeline.hardware import build_cluster
from pipeline.schedules import build_plan
from pipeline.simulator import simulate, stage_costs
from pipeline.trace import SEND_TRACK, chrome_trace, validate_trace, write_trace


@pytest.fixture(scope="module")
def simulated():
    profile = zoo.zoo_profile("gemma-small")
    cluster = build_cluster("h100", devices=4)
    plan = build_plan("zbv", profile, cluster, microbatches=8)
    result = simulate(plan, profile, cluster)
    assert result.valid
    return plan, result, stage_costs(profile, cluster, plan.partition, placement=plan.placement).comm


def _slices(trace: dict, pid: int) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] < SEND_TRACK]


@pytest.mark.parametrize("method", ["zbv", "i1f1b-v2", "zb-h1"])
def test_one_complete_event_per_action_on_its_device(method: str, tmp_path) -> None:
    profile = zoo.zoo_profile("gemma-small")
    cluster = build_cluster("h100", devices=4)
    plan = build_plan(method, profile, cluster, microbatches=8)
    result = simulate(plan, profile, cluster)
    comm = stage_costs(profile, cluster, plan.partition, placement=plan.placement).comm
    path = write_trace(tmp_path / "t.json", chrome_trace(predicted=result.timeline_dict(), placement=plan.placement,
                                                         comm=comm))
    trace = json.loads(path.read_text())
    validate_trace(trace)
    slices = _slices(trace, pid=2)
    actions = {(d, str(a)) for d, acts in enumerate(plan.schedule) for a in acts}
    assert len(slices) == len(actions)
    assert {(e["tid"], e["name"]) for e in slices} == actions
    # microseconds: the makespan in the trace is the simulated iteration time (ms) x 1000
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(result.iteration_time * 1e3)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"device {d}" for d in range(4)} <= names


def test_transfers_follow_pytorch_names_and_links(simulated) -> None:
    plan, result, comm = simulated
    trace = chrome_trace(predicted=result.timeline_dict(), placement=plan.placement, comm=comm)
    sends = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] >= SEND_TRACK]
    # every forward of a stage whose successor is on another device sends, and so does every backward back
    crossing = [s for s in range(plan.num_stages - 1) if plan.placement[s] != plan.placement[s + 1]]
    assert len(sends) == 2 * len(crossing) * plan.microbatches
    assert {e["cat"] for e in sends} == {"SEND_F", "SEND_B"}
    first = next(e for e in sends if e["name"] == "0SEND_F0")
    assert first["args"]["to_device"] == plan.placement[1] and first["dur"] == pytest.approx(comm[0] * 1e3)


def test_measured_and_predicted_in_one_file(simulated) -> None:
    plan, result, _ = simulated
    measured = {"time_unit": "ms", "devices": plan.devices,
                "events": [{**e, "start": e["start"] * 1.1, "end": e["end"] * 1.1}
                           for e in result.timeline_dict()["events"]]}
    trace = chrome_trace(predicted=result.timeline_dict(), measured=measured, title="zbv")
    validate_trace(trace)
    assert len(_slices(trace, 1)) == len(_slices(trace, 2)) == sum(len(a) for a in plan.schedule)
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {"measured: zbv", "predicted: zbv"}


@pytest.mark.parametrize(("bad", "match"), [
    ({}, "traceEvents"),
    ({"traceEvents": [{"ph": "X", "pid": 1, "name": "0F0", "ts": 0.0, "tid": 0}]}, "complete event"),
    ({"traceEvents": [{"ph": "X", "pid": 1, "name": "0F0", "ts": 0.0, "dur": -1.0, "tid": 0}]}, "complete event"),
    ({"traceEvents": [{"ph": "B", "pid": 1, "name": "0F0"}]}, "phase"),
])
def test_validator_rejects_what_viewers_reject(bad: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate_trace(bad)
