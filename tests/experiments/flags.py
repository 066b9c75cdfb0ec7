"""Shared checks for commands whose flags are generated from a config dataclass (experiments.dataclass_args)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Literal

from experiments.cli import build_parser
from experiments.dataclass_args import field_docs


def command_parser(name: str) -> argparse.ArgumentParser:
    """The ``python -m experiments NAME`` sub-parser."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def assert_fields_are_documented_flags(config: type, parser: argparse.ArgumentParser) -> None:
    """Every field of ``config`` has a flag with its docstring as help, the field's default and, for a
    ``Literal``, its choices; every flag shows in ``--help`` (but an old spelling kept hidden)."""
    actions = {a.dest: a for a in parser._actions if a.help != argparse.SUPPRESS}
    docs = field_docs(config)
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        assert f.name in actions, f"{config.__name__}.{f.name} has no flag"
        assert docs[f.name], f"{config.__name__}.{f.name} has no docstring (it is the flag's help)"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert actions[f.name].default == default, f.name
        if typing.get_origin(hints[f.name]) is Literal:
            assert tuple(actions[f.name].choices) == typing.get_args(hints[f.name])
    help_text = parser.format_help()
    assert all(flag in help_text for a in actions.values() for flag in a.option_strings)
