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


def test_learning_with_the_silent_logger_leaves_no_folder_in_the_temp_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from sb3_contrib import MaskablePPO

    from env.pipeline_env import PipelineEnv
    from env.scenarios import ScenarioConfig
    from experiments.tracking.sb3 import silent_sb3_logger

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    env = PipelineEnv(scenario=ScenarioConfig(max_devices=4, max_blocks=8), max_steps=4)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.set_logger(silent_sb3_logger())
    model.learn(8)
    assert not list(tmp_path.glob("SB3-*"))
    MaskablePPO("MultiInputPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(8)
    assert list(tmp_path.glob("SB3-*"))  # SB3's own logger makes one: what the silent logger avoids
