"""Shared check of the learned priors' loaders (agents.tuner.learned.load_prior,
agents.tuner.start_prior.load_start_prior)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.errors import ConfigError


def refuses_corrupt_files(tmp_path: Path, good_file: Path, load: Callable[[Path], object], *, match: str) -> None:
    """Each way a prior file can be broken is one ConfigError matching ``match``, a missing file too."""
    good = json.loads(good_file.read_text())
    n = len(good["features"])
    bad_cases = {
        "not-json": "{weights: [",
        "list": "[1, 2]",
        "old-version": json.dumps({**good, "version": 0}),
        "features": json.dumps({**good, "features": good["features"][:-1]}),
        "short": json.dumps({**good, "weights": good["weights"][:-1]}),
        "nan": json.dumps({**good, "mean": [float("nan")] * n}),
        "zero-std": json.dumps({**good, "std": [0.0] * n}),
    }
    for name, text in bad_cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        load(tmp_path / "missing.json")
