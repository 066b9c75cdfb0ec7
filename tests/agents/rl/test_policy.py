"""Policy files: a corrupt policy, start ranker or checkpoint is one ConfigError naming the file, never a
traceback; a policy pickled before ``agents/rl/`` was a package still loads."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from agents.rl.policy import DEFAULT_POLICY, load_policy
from agents.rl.starts import DEFAULT_RANKER, load_ranker
from pipeline.errors import ConfigError

CORRUPT = {"truncated": None, "garbage": b"garbage", "text": b"12345 hello\n", "empty": b""}


def _corrupt_copy(original: Path, folder: Path, kind: str, suffix: str) -> Path:
    """A copy of ``original``'s metadata beside a damaged copy of ``original`` itself."""
    path = folder / f"{kind}{suffix}"
    shutil.copy(original.with_suffix(".json"), path.with_suffix(".json"))
    data = CORRUPT[kind]
    path.write_bytes(original.read_bytes()[:3000] if data is None else data)
    return path


@pytest.mark.parametrize("kind", CORRUPT)
@pytest.mark.parametrize("suffix", [".pth", ".zip"])
def test_a_corrupt_policy_is_named(kind: str, suffix: str, tmp_path: Path) -> None:
    path = _corrupt_copy(DEFAULT_POLICY, tmp_path, kind, suffix)
    with pytest.raises(ConfigError, match=r"field '--policy': policy file .* cannot be read") as err:
        load_policy(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("meta", ['{"algo":', "[1]"])
def test_corrupt_policy_metadata_is_named(meta: str, tmp_path: Path) -> None:
    path = tmp_path / "p.pth"
    shutil.copy(DEFAULT_POLICY, path)
    path.with_suffix(".json").write_text(meta)
    with pytest.raises(ConfigError, match="bad policy metadata"):
        load_policy(path)


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_corrupt_start_ranker_is_named(kind: str, tmp_path: Path) -> None:
    path = _corrupt_copy(DEFAULT_RANKER, tmp_path, kind, ".pt")
    with pytest.raises(ConfigError, match=r"field '--ranker': start ranker .* cannot be read"):
        load_ranker(path)


def test_resuming_from_a_corrupt_checkpoint_is_named(tmp_path: Path) -> None:
    from agents.rl.train import PPOConfig, train

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model_64.zip").write_bytes(b"PK\x03\x04cut short")
    config = PPOConfig(timesteps=128, n_envs=1, vec="dummy", out=str(tmp_path), resume=True, eval_every=0)
    with pytest.raises(ConfigError, match=r"field '--resume': checkpoint .*model_64.zip cannot be read"):
        train(config)


def test_the_shipped_policies_name_no_module_that_moved() -> None:
    """Nothing shipped needs the old ``agents.rl_net`` path (the path map that loaded it is gone)."""
    for path, member in ((DEFAULT_POLICY, "default/data.pkl"),
                         (DEFAULT_POLICY.with_name("default_starts.pt"), "starts/data.pkl")):
        assert b"agents.rl_net" not in zipfile.ZipFile(path).read(member)
