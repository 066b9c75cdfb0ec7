"""Command-line flags generated from a config dataclass: one flag per field, so a config is its command line.

:func:`add_dataclass_arguments` adds, for every field of a dataclass, one flag named after the
field (``n_envs`` -> ``--n-envs``; ``rename`` picks another name), with the field's type, its
default, and its help taken from the docstring written under the field (read with :mod:`ast`;
``field(metadata={"help": ...})`` wins where given). :func:`dataclass_from_args` builds the
dataclass back from the parsed namespace. The flags' values go through the same checks as the
hand-written flags of :mod:`experiments.common`, so a bad value is argparse's one ``error:``
line naming the flag.

Types: ``int`` -> a whole number >= 1 (:func:`~experiments.common.positive_int`); ``float`` -> a
positive number; ``str`` -> text; ``Literal[...]`` -> one of its values (``choices``);
``list[int]`` -> comma-separated positive whole numbers (``--net-arch 64,64``); ``bool`` -> a
switch that flips the default (``--resume`` when the default is off, ``--no-progress`` for a
``progress`` field that is on); ``X | None`` with a default of None -> the flag of ``X``, None
when not given (the field's docstring says what None means; no ``(default: ...)`` is shown).
Other ranges (0 allowed, at most 1, ...) come in ``parsers``, one argparse type function per
field; ``metavars`` names a flag's value where its name does not (``FILE``). Any other
annotation raises TypeError: a new field of a new type has to be given a flag on purpose.
``only`` adds some fields, in its order, so that one dataclass's flags can sit in several
argument groups (``run``'s model, cluster, search and replay groups).

Why not tyro (1.0.17 is installed, and torchtitan and CleanRL build their CLIs with it): tyro
builds its own parser for a whole program, while our commands are argparse sub-parsers that
:mod:`experiments.cli` discovers, whose refusals go through argparse's one-line error and
``_check_single_values``, whose help :mod:`experiments.gen_docs` renders into docs/commands, and
whose values are checked by :mod:`experiments.common`'s type functions. A sixty-line generator
over ``dataclasses.fields`` keeps all of that, and the flags of the existing commands keep their
names, with no new dependency in the command line's path.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from experiments.common import positive_float, positive_int

__all__ = ["field_docs", "flag_of", "add_dataclass_arguments", "dataclass_from_args", "int_list"]


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its help: ``metadata["help"]``, else the string literal written right under the
    field in the class body (an attribute docstring), whitespace collapsed; ``""`` for a field with
    neither."""
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a class made at run time): metadata only
        tree = None
    if tree is not None:
        body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)).body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = after.value.value
    out = {}
    for f in dataclasses.fields(cls):
        given = f.metadata.get("help") or docs.get(f.name, "")
        out[f.name] = " ".join(str(given).split())
    return out


def _plain(text: str, flags: Mapping[str, str]) -> str:
    """Help text from a docstring: Sphinx roles (``:class:`a.B``` -> ``B``, modules in full),
    ````name```` of another field -> its flag, other double backticks dropped, ``%`` escaped."""
    def role(m: re.Match) -> str:
        target = m.group(2)
        return target if m.group(1) == "mod" else target.rsplit(".", 1)[-1]

    text = re.sub(r":([a-z]+):`~?([^`]+)`", role, text)
    text = re.sub(r"``([^`]+)``", lambda m: flags.get(m.group(1), m.group(1)), text)
    return text.replace("%", "%%")


def flag_of(name: str, rename: Mapping[str, str] | None = None) -> str:
    """The flag of field ``name``: ``--`` and the (renamed) name with ``-`` for ``_``."""
    return "--" + (rename or {}).get(name, name).replace("_", "-")


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers >= 1, e.g. ``64,64``."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(parts):
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas (e.g. 64,64), got {text!r}")
    return [positive_int(p) for p in parts]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"field {f.name!r} has no default; a flag needs one")


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _optional(kind: Any) -> Any:
    """``X`` for an annotation ``X | None``; None for any other."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0]
    return None


def _int_list(kind: Any) -> bool:
    return typing.get_origin(kind) in (list, tuple) and set(typing.get_args(kind)) - {...} == {int}


def add_dataclass_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
                            only: Sequence[str] | None = None, exclude: Sequence[str] = (),
                            rename: Mapping[str, str] | None = None,
                            parsers: Mapping[str, Callable[[str], Any]] | None = None,
                            metavars: Mapping[str, str] | None = None,
                            old_flags: Mapping[str, str] | None = None) -> dict[str, str]:
    """Add one flag per field of dataclass ``cls`` (but ``exclude``; just ``only``, in its order, when
    given) to ``parser`` (see the module docstring); the value lands under the field's own name.
    ``old_flags`` (field -> flag): a renamed flag's earlier spelling, still parsed, not in the help.
    Returns field name -> flag, for the fields added."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    parsers, metavars, rename = parsers or {}, metavars or {}, rename or {}
    every = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    # every field's flag, so that a help can name the flag of a field added to another group;
    # a switch that is on by default is turned off by --no-NAME
    flags = {name: flag_of(("no_" if hints[name] is bool and _default(f) else "") + rename.get(name, name))
             for name, f in every.items()}
    fields = list(every.values()) if only is None else [every[name] for name in only]
    for f in fields:
        kind = hints[f.name]
        default = _default(f)
        help_text = _plain(docs[f.name], flags)
        flag = flags[f.name]
        if kind is bool:
            if default:
                help_text = f"{help_text} On by default; this flag turns it off.".strip()
            parser.add_argument(flag, dest=f.name, action="store_false" if default else "store_true",
                                default=default, help=help_text or None)
            continue
        if f.name not in parsers and _optional(kind) is not None:
            if default is not None:
                raise TypeError(f"field {f.name!r} of {cls.__name__}: an optional type whose default is not None "
                                "has no flag (not giving it could not mean None); give it a parser")
            kind = _optional(kind)
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        if f.name in parsers:
            kw["type"] = parsers[f.name]
            if typing.get_origin(kind) is Literal:
                kw["choices"] = typing.get_args(kind)
        elif typing.get_origin(kind) is Literal:
            kw["choices"] = typing.get_args(kind)
            kw["type"] = type(kw["choices"][0])
        elif kind is int:
            kw["type"] = positive_int
        elif kind is float:
            kw["type"] = positive_float
        elif kind is str:
            kw["type"] = str
        elif _int_list(kind):
            kw["type"] = int_list
        elif isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
            raise TypeError(f"field {f.name!r} of {cls.__name__}: no flag for the union {kind!r}; give it a parser")
        else:
            raise TypeError(f"field {f.name!r} of {cls.__name__}: no flag for type {kind!r}; give it a parser")
        if f.name in metavars:
            kw["metavar"] = metavars[f.name]
        elif _int_list(kind):
            kw["metavar"] = "N,N"
        elif f.name in rename and "choices" not in kw:  # argparse would name the value after the field
            kw["metavar"] = flag.removeprefix("--").replace("-", "_").upper()
        shown = "" if default is None else f"(default: {_shown(default)})".replace("%", "%%")
        parser.add_argument(flag, help=" ".join(t for t in (help_text, shown) if t) or None, **kw)
        if f.name in (old_flags or {}):
            parser.add_argument(old_flags[f.name], **{**kw, "default": argparse.SUPPRESS}, help=argparse.SUPPRESS)
    return {f.name: flags[f.name] for f in fields}


def dataclass_from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """``cls`` from the parsed ``args``: each field that has a value in ``args`` (its flag's), then
    ``overrides``; the rest keep their defaults."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values.update(overrides)
    return cls(**values)
