"""experiments.tracking.offline: what the reader does with logs that are not whole.

Whole runs (every kind of value logged, then read back) are in test_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.tracking import start_run
from experiments.tracking.offline import TransactionLogError, iter_transaction_log, read_offline_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished offline run with 300 rows (the log spans several 32 KiB blocks)."""
    home = tmp_path_factory.mktemp("wandb-offline")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_API_KEY", "WANDB_BASE_URL"):
            mp.delenv(var, raising=False)
        for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config")):
            mp.setenv(var, str(home / sub))
        with start_run(command="probe", config={"k": 1}, dir=home / "runs") as tr:
            for step in range(300):
                tr.log_metrics({"x": float(step), "pad": "p" * 200}, step=step)
        assert tr.run_dir is not None
        assert read_offline_run(tr.run_dir, wait_for_exit_s=20).exit_code == 0
        return tr.run_dir


def test_a_log_cut_short_reads_up_to_the_cut(run_dir: Path, tmp_path: Path) -> None:
    (log,) = run_dir.glob("run-*.wandb")
    data = log.read_bytes()
    assert len(data) > 3 * 32768
    cut = tmp_path / log.name
    cut.write_bytes(data[:len(data) // 2 + 5])  # mid-chunk, past the first blocks
    whole, part = read_offline_run(run_dir), read_offline_run(cut)
    assert whole.truncated == [] and whole.exit_code == 0
    assert part.exit_code is None and len(part.truncated) == 1 and str(cut) in part.truncated[0]
    steps = [s for s, _ in part.metric("x")]
    assert 0 < len(steps) < 300 and part.metric("x") == whole.metric("x")[:len(steps)]
    assert part.config == whole.config == {"k": 1, "command": "probe"}


@pytest.mark.parametrize(("head", "match"), [
    (b"", "too short"),
    (b"PK\x03\x04\x00\x00\x00\x00", "bad header"),
    (b":W&B\xe1\xbe\x07", "version 7"),
])
def test_not_a_transaction_log(tmp_path: Path, head: bytes, match: str) -> None:
    path = tmp_path / "run-x.wandb"
    path.write_bytes(head)
    with pytest.raises(TransactionLogError, match=match):
        list(iter_transaction_log(path))


def test_a_folder_without_a_log_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run-\\*.wandb"):
        read_offline_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no run folder"):
        read_offline_run(tmp_path / "absent")
