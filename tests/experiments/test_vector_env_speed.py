"""vector_env_speed's PPO baseline from another checkout (``--today-checkout``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.benchmarks.vector_env_speed import main, ppo_today_at

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_that_is_no_checkout_is_one_line_naming_the_flag(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--today-checkout", str(tmp_path), "--cases", "", "--repeats", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--today-checkout" in err[-1] and "git worktree add" in err[-1]


@pytest.mark.slow
def test_the_baseline_runs_with_the_other_checkouts_code() -> None:
    """Here with this checkout as the other one: a real PPO run in a subprocess, its steps/s read back."""
    got = ppo_today_at(str(ROOT), timesteps=32, seed=0)
    assert got["steps_per_s"] > 0 and got["seconds"] > 0


def test_a_failing_checkout_says_which_and_why(tmp_path: Path) -> None:
    (tmp_path / "experiments" / "benchmarks").mkdir(parents=True)
    (tmp_path / "experiments" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "benchmarks" / "vector_env_speed.py").write_text("raise ImportError('too old')\n")
    with pytest.raises(RuntimeError, match="too old"):
        ppo_today_at(str(tmp_path), timesteps=32)
