"""experiments.tracking.sb3: SB3's recorded metrics forwarded to a tracker.

The round trip through a real offline W&B run is in test_run.py
(``test_sb3_writer_forwards_recorded_values``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.tracking import sb3
from experiments.tracking.sb3 import make_sb3_logger

REPO = Path(__file__).resolve().parents[3]


class _Recorder:
    """Stands in for a Tracker: records log_metrics calls."""

    finished = False

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], int | None]] = []

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.calls.append((metrics, step))


def test_sb3_writer_filters_and_keeps_stdout_clean(capsys: pytest.CaptureFixture[str]) -> None:
    rec = _Recorder()
    logger = make_sb3_logger(rec, formats=("stderr",), prefix="sb3/")  # type: ignore[arg-type]
    logger.record("train/loss", np.float64(0.25))
    logger.record("time/fps", 120)
    logger.record("train/skip", 1.0, exclude=("wandb",))
    logger.dump(step=2048)
    assert rec.calls == [({"sb3/train/loss": 0.25, "sb3/time/fps": 120}, 2048)]
    out, err = capsys.readouterr()
    assert out == "" and "loss" in err and "fps" in err
    assert isinstance(sb3.sb3_logger_output(rec), sb3.WandbKVWriter)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="folder"):
        make_sb3_logger(rec, formats=("csv",))  # type: ignore[arg-type]


def test_import_does_not_load_sb3_or_torch() -> None:
    code = ("import sys, experiments.tracking, experiments.tracking.sb3, experiments.tracking.offline\n"
            "print(sorted(m for m in ('torch', 'stable_baselines3', 'wandb') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == "[]"
