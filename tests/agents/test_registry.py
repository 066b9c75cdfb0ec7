"""agents.registry: one fixed table of methods, built lazily, in step with the README."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agents.registry import SEARCHERS, all_methods, make_searcher
from pipeline.errors import ConfigError
from pipeline.schedules import NAMED_METHODS
from tests.conftest import ROOT


def _readme_method_names() -> set[str]:
    """The backquoted names of README's "Method names" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Method names", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"`([^`\s]+)`", section)) - {"--method", "+dp"}


def test_all_runs_every_method_the_readme_lists() -> None:
    names = all_methods()
    assert len(names) == len(set(names))
    assert {"rl", "rl+tuner", "adaptis", "random"} <= set(names)
    listed = _readme_method_names()
    assert "i1f1b-vN" in listed and "rl+tuner" in listed
    expected = {n for n in listed if n != "i1f1b-vN"} | {"i1f1b-v2"}
    assert expected <= set(names)
    # every named schedule but Megatron's baseline also runs with the DP split
    assert {f"{m}+dp" for m in NAMED_METHODS if m != "megatron"} <= set(names)
    assert set(names) <= expected | {f"{m}+dp" for m in expected}


@pytest.mark.parametrize("name", [*SEARCHERS, "zbv", "zbv+dp", "i1f1b-v3", "megatron"])
def test_every_name_builds_its_searcher(name: str) -> None:
    searcher = make_searcher(name)
    assert searcher.name == name and callable(searcher.search)


@pytest.mark.parametrize("name", ["best", "zbv+bb", "rl+random", ""])
def test_unknown_method_names_the_field(name: str) -> None:
    with pytest.raises(ConfigError, match=r"--method.*unknown method"):
        make_searcher(name)


def test_the_table_imports_no_agent_until_asked() -> None:
    code = ("import sys, agents.registry as r\n"
            "print(sorted(m for m in ('agents.rl', 'agents.tuner', 'agents.baselines', 'torch') if m in sys.modules))\n"
            "r.make_searcher('adaptis')\n"
            "print(sorted(m for m in ('agents.rl', 'agents.tuner', 'torch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    assert out == ["[]", "['agents.tuner']"]
