"""Flags generated from config dataclasses (experiments.dataclass_args) and the train command built on them."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

import pytest

from agents.rl.train import PPOConfig
from experiments.cli import main
from experiments.commands import train as train_command
from experiments.dataclass_args import add_dataclass_arguments, dataclass_from_args
from tests.experiments.flags import assert_fields_are_documented_flags, command_parser


@dataclass
class _Toy:
    """A config of every supported type."""

    count: int = 3
    """How many ``ratio`` steps (see :class:`pipeline.candidates.Candidate`)."""
    ratio: float = 0.5
    """A 50% share."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    name: str = "x"
    widths: list[int] = field(default_factory=lambda: [8, 8])
    """Layer widths."""
    on: bool = True
    """Do it."""
    off: bool = False
    """Skip it."""
    tagged: int = field(default=1, metadata={"help": "from the metadata"})
    """not this one"""


def _toy_parser(**kw) -> tuple[argparse.ArgumentParser, dict[str, str]]:
    parser = argparse.ArgumentParser(prog="toy")
    return parser, add_dataclass_arguments(parser, _Toy, **kw)


def test_every_field_gets_one_flag_with_its_type_default_and_help() -> None:
    parser, flags = _toy_parser(rename={"on": "go"})
    assert flags == {"count": "--count", "ratio": "--ratio", "mode": "--mode", "name": "--name",
                     "widths": "--widths", "on": "--no-go", "off": "--off", "tagged": "--tagged"}
    defaults = vars(parser.parse_args([]))
    assert dataclass_from_args(_Toy, argparse.Namespace(**defaults)) == _Toy()
    args = parser.parse_args(["--count", "7", "--ratio", "0.25", "--mode", "b", "--name", "y", "--widths", "4,2",
                              "--no-go", "--off"])
    assert dataclass_from_args(_Toy, args) == _Toy(count=7, ratio=0.25, mode="b", name="y", widths=[4, 2], on=False,
                                                   off=True)
    helps = {a.dest: a.help for a in parser._actions}
    # docstring under the field; a field named in double backticks becomes its flag; roles keep the name
    assert helps["count"] == "How many --ratio steps (see Candidate). (default: 3)"
    assert helps["ratio"] == "A 50%% share. (default: 0.5)"  # argparse formats help with %
    assert "50% share" in parser.format_help()
    assert helps["tagged"] == "from the metadata (default: 1)"
    assert helps["widths"] == "Layer widths. (default: 8,8)"
    assert "turns it off" in helps["on"] and helps["off"] == "Skip it."


def test_exclude_parsers_and_overrides() -> None:
    def even(text: str) -> int:
        if int(text) % 2:
            raise argparse.ArgumentTypeError(f"must be even, got {text!r}")
        return int(text)

    parser, flags = _toy_parser(exclude=("name",), parsers={"count": even})
    assert "name" not in flags and not hasattr(parser.parse_args([]), "name")
    args = parser.parse_args(["--count", "4"])
    assert dataclass_from_args(_Toy, args, ratio=0.75) == _Toy(count=4, ratio=0.75)
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "3"])


@pytest.mark.parametrize("argv", [["--count", "0"], ["--count", "x"], ["--ratio", "-1"], ["--ratio", "nan"],
                                  ["--mode", "c"], ["--widths", "8,"], ["--widths", "8,0"], ["--widths", ""]])
def test_values_the_types_refuse_are_argparse_errors(argv, capsys) -> None:
    parser, _ = _toy_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"toy: error: argument {argv[0]}:")


def test_a_field_of_an_unknown_type_needs_a_parser() -> None:
    @dataclass
    class Odd:
        limit: int | None = 5  # not giving the flag could not mean None
        table: dict[str, int] = field(default_factory=dict)

    for name in ("limit", "table"):
        with pytest.raises(TypeError, match=name):
            add_dataclass_arguments(argparse.ArgumentParser(), Odd, only=(name,))
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Odd, parsers={"limit": int, "table": lambda text: {text: 1}})
    assert dataclass_from_args(Odd, parser.parse_args(["--limit", "6"])) == Odd(6)


def test_an_optional_field_whose_default_is_none_is_the_flag_of_its_type(capsys) -> None:
    @dataclass
    class Opt:
        seq_len: int | None = None
        """Tokens (default: the model's)."""
        memory_gb: float | None = None
        path: str | None = None
        """A file."""

    parser = argparse.ArgumentParser(prog="opt")
    add_dataclass_arguments(parser, Opt, metavars={"path": "FILE"})
    assert dataclass_from_args(Opt, parser.parse_args([])) == Opt()
    assert dataclass_from_args(Opt, parser.parse_args(["--seq-len", "8", "--memory-gb", "0.5", "--path", "p"])) == \
        Opt(8, 0.5, "p")
    helps = {a.dest: a for a in parser._actions}
    assert helps["seq_len"].help == "Tokens (default: the model's)."  # no "(default: None)"
    assert helps["path"].metavar == "FILE" and helps["memory_gb"].help is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--seq-len", "0"])
    assert "opt: error: argument --seq-len:" in capsys.readouterr().err


def test_only_adds_those_fields_in_its_order_into_groups() -> None:
    parser = argparse.ArgumentParser(prog="toy")
    group = parser.add_argument_group("sizes")
    flags = add_dataclass_arguments(group, _Toy, only=("widths", "count"), rename={"widths": "width"})
    assert list(flags) == ["widths", "count"] and [a.dest for a in group._group_actions] == ["widths", "count"]
    rest = add_dataclass_arguments(parser, _Toy, exclude=("widths", "count"))
    assert set(rest) == {"ratio", "mode", "name", "on", "off", "tagged"}
    assert dataclass_from_args(_Toy, parser.parse_args(["--width", "3", "--count", "2"])) == _Toy(count=2, widths=[3])
    # a help names the flag of a field in another group; a renamed flag's value is named after the flag
    assert {a.dest: a for a in group._group_actions}["count"].help.startswith("How many --ratio steps")
    assert {a.dest: a for a in group._group_actions}["widths"].metavar == "N,N"


# ------------------------------------------------------------------ the train command

def _train_parser() -> argparse.ArgumentParser:
    return command_parser("train")


def test_every_train_config_field_has_a_documented_flag() -> None:
    assert_fields_are_documented_flags(PPOConfig, _train_parser())


def test_the_existing_train_flags_keep_their_names() -> None:
    flags = {s for a in _train_parser()._actions for s in a.option_strings}
    old = {"--algo", "--timesteps", "--seed", "--n-envs", "--vec", "--network", "--out", "--resume", "--eval-every",
           "--eval-scenarios", "--checkpoint-every", "--n-steps", "--imitation-states", "--imitation-epochs",
           "--ranker-scenarios", "--learning-rate", "--no-progress", "--json", "--wandb-project"}
    assert old <= flags
    assert {"--gamma", "--batch-size", "--hidden", "--net-arch", "--n-epochs", "--ent-coef"} <= flags


def test_the_algos_are_the_policy_files_algos() -> None:
    from agents.rl.policy import ALGOS

    assert set(typing.get_args(typing.get_type_hints(PPOConfig)["algo"])) == set(ALGOS)


@pytest.fixture
def captured(monkeypatch) -> list[PPOConfig]:
    """The configs ``train`` would have trained (no training runs)."""
    import agents.rl.train

    seen: list[PPOConfig] = []

    def fake_train(config, **_):
        seen.append(config)
        return {"timesteps": 0, "seconds": 0.0, "checkpoint": "c", "policy": "p", "interrupted": False,
                "signal": None, "eval_log": "e"}

    monkeypatch.setattr(agents.rl.train, "train", fake_train)
    return seen


def test_flags_reach_the_config(captured, tmp_path) -> None:
    out = str(tmp_path / "t")
    assert main(["train", "--gamma", "0.9", "--batch-size", "32", "--hidden", "16", "--net-arch", "32,16",
                 "--n-epochs", "3", "--ent-coef", "0", "--allow-stop", "--single-start-share", "1",
                 "--max-calls", "12", "--eval-every", "0", "--seed", "4294966", "--no-progress", "--out", out]) == 0
    (config,) = captured
    assert dataclasses.replace(config) == PPOConfig(
        gamma=0.9, batch_size=32, hidden=16, net_arch=[32, 16], n_epochs=3, ent_coef=0.0, allow_stop=True,
        single_start_share=1.0, max_calls=12, eval_every=0, seed=4294966, progress_bar=False, out=out)


def test_ppo_trains_the_mlp(captured, tmp_path) -> None:
    assert main(["train", "--algo", "ppo", "--out", str(tmp_path)]) == 0
    assert captured[0].algo == "ppo" and captured[0].network == "mlp"


@pytest.mark.parametrize("argv,flag", [
    (["--gamma", "1.5"], "--gamma"),
    (["--gamma", "0"], "--gamma"),
    (["--batch-size", "0"], "--batch-size"),
    (["--hidden", "x"], "--hidden"),
    (["--net-arch", "64,x"], "--net-arch"),
    (["--ent-coef", "-0.1"], "--ent-coef"),
    (["--single-start-share", "2"], "--single-start-share"),
    (["--vec", "threads"], "--vec"),
    (["--seed", "4294967"], "--seed"),
    (["--learning-rate", "1e9"], "--learning-rate"),
    (["--eval-every", "-1"], "--eval-every"),
    (["--hidden", "99999999999"], "--hidden"),  # a typo, not a network torch can build
    (["--net-arch", "64,100000"], "--net-arch"),
])
def test_a_bad_value_is_one_error_line_naming_the_flag(argv, flag, captured, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", *argv, "--out", str(tmp_path / "t")])
    assert exc.value.code == 2 and not captured
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"python -m experiments train: error: argument {flag}: ")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("argv,flag", [
    (["--n-steps", "1", "--n-envs", "1"], "--n-steps"),
    (["--network", "mlp", "--imitation-states", "4"], "--imitation-states"),
])
def test_values_that_do_not_go_together_are_one_error_line(argv, flag, captured, tmp_path, capsys) -> None:
    assert main(["train", *argv, "--out", str(tmp_path / "t")]) == 2 and not captured
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: field '{flag}': "), lines
    assert not (tmp_path / "t").exists()


def test_the_command_uses_the_generator_for_every_field() -> None:
    """No hand-written add_argument for a PPOConfig field is left in the command."""
    import inspect

    source = inspect.getsource(train_command.add_arguments)
    assert "add_dataclass_arguments(parser, PPOConfig" in source and "add_argument(" not in source
