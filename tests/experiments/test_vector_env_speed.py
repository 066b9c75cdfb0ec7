"""vector_env_speed: the PPO baseline from another checkout (``--today-checkout``), the reset-worker rows."""

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


@pytest.mark.parametrize("bad", ["-1", "9"])
def test_pool_workers_out_of_range_is_one_line_naming_the_flag(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--pool-workers", bad, "--cases", "", "--no-ppo"])
    assert exc.value.code == 2
    assert "--pool-workers" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_pooled_row_with_a_reset_worker_steps_and_counts_the_workers_cpu() -> None:
    """measure_vector with a worker steps; the worker's CPU time is read once close() joined it."""
    from env.vector_env import PipelineVectorEnv
    from experiments.benchmarks.vector_env_speed import _children_cpu, measure_vector

    got = measure_vector("default", n_envs=4, seconds=0.3, pool=4, pool_reuse=1, pool_workers=1)
    assert got["steps_per_s"] > 0 and got["engine_jobs_per_step"] > 0
    # the CPU of a step split: this process's and the worker's (its start-up alone is ~0.1 s: > 0)
    assert got["stepping_cpu_us_per_step"] > 0 and got["worker_cpu_us_per_step"] > 0
    split = 1e6 / (got["stepping_cpu_us_per_step"] + got["worker_cpu_us_per_step"])
    assert split == pytest.approx(got["cpu_steps_per_s"])
    before = _children_cpu()
    vec = PipelineVectorEnv(2, max_steps=1, scenario_pool=2, pool_reuse=1, pool_workers=1)
    vec.reset(seed=0)  # (the worker's draws: its start-up and two scenarios at least)
    vec.close()
    assert _children_cpu() - before > 0.05
