"""CLI fuzz (issue 30): random command lines from every command's own flags, with random values and
files (other commands' outputs, corrupt, empty, a folder). Each exits 0, or != 0 with a short message
and no traceback, within its time limit and memory. More: python -m tests.cli_fuzz."""

from __future__ import annotations

import os
import time

import pytest

from tests.cli_fuzz import BASE, SKIPPED, _shell, command_flags, fuzz

COUNT = int(os.environ.get("CLI_FUZZ_COUNT", "70"))


def test_every_command_is_drawn_from_its_parser() -> None:
    flags = command_flags()
    assert set(flags) - set(SKIPPED) <= set(BASE) | {"profile-info"}
    assert all(any("--" in s for a in actions for s in a.option_strings) for actions in flags.values())


@pytest.mark.slow  # fuzzing: 70 invocations, 15-25 s on 2 cores
@pytest.mark.cost(22)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fuzz forks one child per invocation")
def test_random_command_lines_end_cleanly(tmp_path) -> None:
    start = time.monotonic()
    report = fuzz(COUNT, seed=int(os.environ.get("CLI_FUZZ_SEED", "0")), timeout=30, folder=tmp_path)
    elapsed = time.monotonic() - start
    print(f"{len(report.outcomes)} invocations in {elapsed:.0f} s: {dict(report.counts)}")
    assert len(report.outcomes) == COUNT
    assert {o.argv[0] for o in report.outcomes} >= {"search", "baselines", "simulate", "sweep", "profile-info"}
    assert report.counts["ok"] > COUNT // 5  # the base command lines run: not everything is a refusal
    bad = "\n\n".join(f"{o.kind} ({o.seconds} s, exit {o.code}): {_shell(o.argv)}\n{o.err[-1000:]}"
                      for o in report.failures)
    assert not report.failures, bad  # one past its 30 s is a "hang" failure: the hang guard, not a timing
