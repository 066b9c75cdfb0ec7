"""experiments.workflow.config: WorkflowConfig is ``run``'s command line (flags from experiments.dataclass_args)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing

import pytest

from experiments.cli import main
from experiments.commands import run as run_command
from experiments.workflow import DEFAULT_METHODS, WorkflowConfig
from pipeline.targets import TARGETS
from tests.experiments.flags import assert_fields_are_documented_flags, command_parser


def _run_parser() -> argparse.ArgumentParser:
    return command_parser("run")


def test_every_workflow_config_field_has_a_documented_flag() -> None:
    assert_fields_are_documented_flags(WorkflowConfig, _run_parser())


def test_the_existing_run_flags_keep_their_names_and_defaults() -> None:
    actions = {s: a for a in _run_parser()._actions for s in a.option_strings}
    old = {"--model": None, "--hf-config": None, "--profile": None, "--strict": False, "--seq-len": None,
           "--microbatch-size": 1, "--scale": 1.0, "--granularity": "layer", "--head-shards": 1, "--gpu": None,
           "--cluster": None, "--devices": 2, "--gpus-per-node": 8, "--memory-gb": None,
           "--memory-reserve-gb": None, "--microbatches": None, "--method": DEFAULT_METHODS, "--budget": "3000",
           "--max-seconds": 60.0, "--seed": 0, "--perturb-moves": None, "--policy": None, "--train-policy": 0,
           "--warmup": 2, "--profile-repeats": 5, "--threads": 1,
           "--timeout": 900.0, "--target": "executor", "--trace": None, "--out": None, "--group": None,
           "--wandb-project": "adaptis", "--json": False}
    # new since (issue 24): the plan chosen by measurement, the ranks' compute contention
    added = {"--choose": "measured", "--candidates": 4}
    # changed (issue 24): 8 calibration plans, not 6, since each operation's per-layer time is fitted too
    # and 20 timed steps, not 10, so each half of them (one chooses, one is reported) has ten
    changed = {"--calibration-plans": 8, "--steps": 20}
    assert set(actions) == {"-h", "--help", "--no-replay", "--no-contention", "--layer-factors", *old, *added,
                            *changed}
    assert {flag: actions[flag].default for flag in added} == added
    assert {flag: actions[flag].default for flag in changed} == changed
    assert {flag: actions[flag].default for flag in old} == old
    assert actions["--no-replay"].dest == "replay" and actions["--no-replay"].default is True
    assert actions["--no-contention"].dest == "contention" and actions["--no-contention"].default is True
    assert actions["--layer-factors"].dest == "layer_factors" and actions["--layer-factors"].default is False
    # --model and --hf-config: one of them
    with pytest.raises(SystemExit):
        _run_parser().parse_args(["--model", "gemma-small", "--hf-config", "c.json"])


def test_the_targets_are_the_deploy_targets() -> None:
    assert typing.get_args(typing.get_type_hints(WorkflowConfig)["target"]) == TARGETS


@pytest.mark.parametrize("argv,model,out", [
    ([], "tiny-hybrid", "runs/run-tiny-hybrid"),
    (["--model", ""], "tiny-hybrid", "runs/run-tiny-hybrid"),
    (["--hf-config", "x/config.json", "--gpu", "a100"], None, "runs/run-config"),
    (["--profile", "p/prof.json", "--gpu", "h100"], None, "runs/run-prof"),
    (["--profile", "p/prof.json"], "tiny-hybrid", "runs/run-tiny-hybrid"),  # measured here: the model is built
    (["--model", "gemma-small", "--gpu", "h100", "--out", "o"], "gemma-small", "o"),
])
def test_defaults_that_depend_on_other_flags(argv, model, out) -> None:
    cfg = run_command.config_from_args(_run_parser().parse_args(argv))
    assert (cfg.model, cfg.out) == (model, out)
    assert dataclasses.replace(cfg) == cfg  # resolving again changes nothing


def test_the_defaults_are_the_configs_defaults() -> None:
    assert run_command.config_from_args(_run_parser().parse_args([])) == WorkflowConfig()


@pytest.fixture
def captured(monkeypatch) -> list[WorkflowConfig]:
    """The configs ``run`` would have run (nothing runs)."""
    seen: list[WorkflowConfig] = []

    class Report:
        def to_dict(self) -> dict:
            return {}

    def fake(cfg, **_):
        seen.append(cfg)
        return Report()

    monkeypatch.setattr(run_command, "run_workflow", fake)
    return seen


def test_flags_reach_the_config(captured, tmp_path) -> None:
    out = str(tmp_path / "r")
    assert main(["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--method", "zbv, adaptis,",
                 "--no-replay", "--memory-reserve-gb", "0", "--warmup", "0", "--calibration-plans", "0",
                 "--seed", "-3", "--granularity", "sublayer", "--head-shards", "2", "--target", "megatron",
                 "--wandb-project", "p", "--profile", "x.json", "--cluster", "c.json", "--out", out, "--json"]) == 0
    (cfg,) = captured
    assert cfg == WorkflowConfig(model="gemma-small", gpu="h100", devices=4, methods=("zbv", "adaptis"), replay=False,
                                 memory_reserve_gb=0.0, warmup=0, calibration_plans=0, seed=-3,
                                 granularity="sublayer", head_shards=2, target="megatron", project="p",
                                 profile_path="x.json", cluster_path="c.json", out=out)


@pytest.mark.parametrize("argv,flag", [
    (["--devices", "0"], "--devices"),
    (["--scale", "-1"], "--scale"),
    (["--warmup", "-1"], "--warmup"),
    (["--seed", "x"], "--seed"),
    (["--granularity", "block"], "--granularity"),
    (["--target", "deepspeed"], "--target"),
    (["--memory-reserve-gb", "-1"], "--memory-reserve-gb"),
    (["--memory-gb", "0"], "--memory-gb"),
    (["--train-policy", "x"], "--train-policy"),
    (["--timeout", "nan"], "--timeout"),
])
def test_a_bad_value_is_one_error_line_naming_the_flag(argv, flag, captured, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv])
    assert exc.value.code == 2 and not captured
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"python -m experiments run: error: argument {flag}: ")


def test_the_command_uses_the_generator_for_every_field() -> None:
    """No hand-written add_argument for a WorkflowConfig field is left in the command: only --json."""
    source = inspect.getsource(run_command.add_arguments)
    assert source.count("add_argument(") == 1 and '"--json"' in source
    assert "dataclass_from_args(WorkflowConfig, args)" in inspect.getsource(run_command.config_from_args)
