"""The ``python -m experiments`` command line.

Each module in ``experiments/commands/`` is one command. It defines ``NAME`` (the
command word), ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Commands are discovered, so adding one needs no edit here.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import pkgutil
import re
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from pipeline.errors import AdaptisError
from pipeline.spec import ProfileWarning

__all__ = ["build_parser", "main"]


def _command_modules() -> list:
    import experiments.commands as package

    modules = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"experiments.commands.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            modules.append(module)
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="AdaPtis toolkit: find, explain and run fast pipeline-parallel training plans.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in _command_modules():
        doc = (module.__doc__ or module.HELP).strip()
        p = sub.add_parser(module.NAME, help=module.HELP, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM becomes SystemExit, so ``finally`` blocks (W&B finish, stopping torchrun) run."""
    raise SystemExit(128 + signum)


def _show_warning(message, category, filename, lineno, file=None, line=None, *, default=None) -> None:
    """Warnings about the user's input (:class:`ProfileWarning`) print as one ``warning: ...`` line."""
    if issubclass(category, ProfileWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        (default or warnings.showwarning)(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports every command: a Ctrl-C here is common on a slow machine
    except KeyboardInterrupt:
        print("interrupted while starting; nothing was run", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    _check_single_values(parser, args)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    with warnings.catch_warnings():
        warnings.showwarning = functools.partial(_show_warning, default=warnings.showwarning)
        return _run(args)


def _check_single_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as argparse refuses a missing value, a flag of one value that parsed to a list:
    Python 3.11's argparse reads ``--method=--`` as ``[]`` (the ``--`` dropped), which the command
    would meet as a list instead of text."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = sub.choices[args.command]
    for action in command._actions:
        value = getattr(args, action.dest, None)
        if action.option_strings and action.nargs is None and isinstance(value, list) \
                and not isinstance(action.default, list):
            command.error(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")


def launch_failure(exc: BaseException) -> str:
    """What a failed torchrun job prints: one line, then its last lines of output indented."""
    output = str(getattr(exc, "output", "") or "")
    killed = re.search(r"\[killed after (\d+) s\]", output)
    if killed:
        return (f"the torchrun job did not finish within --timeout ({killed.group(1)} s) and was stopped; "
                "give it more time (--timeout SECONDS)")
    tail = [line for line in output.strip().splitlines() if line.strip()][-8:]
    code = getattr(exc, "returncode", None)
    return f"the torchrun job failed (exit code {code}); its last lines:" + "".join(f"\n  | {x}" for x in tail)


def _run(args: argparse.Namespace) -> int:
    """The command's exit code; the user's mistakes are one ``error: ...`` line and code 2."""
    from experiments.common import strict_profiles

    try:
        with strict_profiles(getattr(args, "strict", False)):
            return int(args._run(args) or 0)
    except AdaptisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, as Unix tools do.
        sys.stderr.close()
        return 0
    except RuntimeError as exc:
        if type(exc).__name__ != "LaunchError":  # executor.replay's (not imported here: it is heavy)
            raise
        print(f"error: {launch_failure(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:  # a path named on the command line: inside a file, not writable, disk full
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
