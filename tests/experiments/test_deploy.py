"""--target and --trace on the command line: the plan stays inside the runtime, the exports and
the trace land where the user asked."""

from __future__ import annotations

import json
import shlex

import pytest

from experiments.cli import main
from pipeline.plan import Plan
from pipeline.spec import ModelProfile
from pipeline.targets import target_reason
from pipeline.trace import SEND_TRACK, validate_trace
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_search_target_keeps_the_plan_runnable_and_exports(target: str, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method",
                 "megatron,zbv,adaptis", "--budget", "30", "--target", target, "--out", str(out),
                 "--trace", str(tmp_path / "best.json")])
    text = capsys.readouterr().out
    assert code == 0
    profile = ModelProfile.load(PROFILE)
    plan = Plan.load(out / "plan.json")
    assert target_reason(target, plan, profile) is None
    rows = {r["target"]: r for r in json.loads((out / "targets.json").read_text())}
    assert plan.method == rows[target]["method"]  # plan.json is that target's best
    assert rows[target]["speedup"] >= 1.0
    assert rows["executor"]["iteration_time"] <= rows[target]["iteration_time"]
    assert "per deployment target" in text and "-> megatron_args.txt" in text
    args = shlex.split((out / "megatron_args.txt").read_text())
    assert args[:2] == ["--pipeline-model-parallel-size", "4"]
    toml = (out / "torchtitan.toml").read_text()
    assert "[parallelism]" in toml and "pipeline_parallel_degree = 4" in toml
    trace = json.loads((tmp_path / "best.json").read_text())
    validate_trace(trace)
    compute = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] < SEND_TRACK]
    assert len(compute) == sum(len(a) for a in plan.schedule)


def test_a_target_that_cannot_express_the_model_says_why(tmp_path, capsys) -> None:
    raw = json.loads((ROOT / "experiments/configs/profiles/hetero-head-16.json").read_text())
    raw["layers"] = raw["layers"][1:]  # no embedding layer: Megatron's layout needs E first
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(raw))
    out = tmp_path / "out"
    assert main(["search", "--profile", str(profile), "--cluster", CLUSTER, "--microbatches", "8", "--method",
                 "megatron,zbv", "--budget", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "megatron    cannot: megatron needs exactly one embedding layer" in text
    assert not (out / "megatron_args.txt").exists() and not (out / "torchtitan.toml").exists()
    assert main(["search", "--profile", str(profile), "--cluster", CLUSTER, "--microbatches", "8", "--method",
                 "megatron", "--budget", "20", "--target", "torchtitan", "--out", str(out)]) == 3
    assert "no plan for --target torchtitan: torchtitan needs exactly one embedding layer" in capsys.readouterr().err


def test_simulate_trace(tmp_path, capsys) -> None:
    assert main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method", "zbv",
                 "--out", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--profile", PROFILE, "--cluster", CLUSTER, "--plan", str(tmp_path / "plan.json"),
                 "--trace", str(tmp_path / "sim.json"), "--json"]) == 0
    trace = json.loads((tmp_path / "sim.json").read_text())
    validate_trace(trace)
    plan = Plan.load(tmp_path / "plan.json")
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] < SEND_TRACK) == \
        sum(len(a) for a in plan.schedule)


def test_run_target_megatron_on_a_named_gpu(tmp_path, capsys) -> None:
    code = main(["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--microbatches", "8",
                 "--method", "zbv,adaptis", "--budget", "40", "--target", "megatron", "--out", str(tmp_path),
                 "--trace", str(tmp_path / "t.json"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    plan = Plan.load(tmp_path / "plan.json")
    from pipeline.zoo import zoo_profile

    assert target_reason("megatron", plan, zoo_profile("gemma-small")) is None
    targets = {r["target"]: r for r in report["summary"]["targets"]}
    assert targets["megatron"]["file"] == "megatron_args.txt" and (tmp_path / "megatron_args.txt").is_file()
    assert report["summary"]["best_method"] == targets["megatron"]["method"]
    validate_trace(json.loads((tmp_path / "t.json").read_text()))
