"""agents.rl.train: config checks, checkpoints and resume, the settings reaching the model, evaluation helpers.

The training runs here are tiny (64-96 steps on one fixed 2-device scenario, one environment).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from agents.rl.train import (
    MAX_SEED,
    MAX_WIDTH,
    PPOConfig,
    check_config,
    evaluate_policy_on,
    latest_checkpoint,
    minibatch_size,
    silent_sb3_logger,
    train,
    tuner_times,
)
from env.pipeline_env import PipelineEnv
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError
from tests.conftest import ideal_cluster, uniform_profile

SCENARIO = Scenario(uniform_profile(8), ideal_cluster(2), 4)


def _fixed_env(rank: int = 0) -> PipelineEnv:  # noqa: ARG001
    class Fixed(PipelineEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed, options={"scenario": SCENARIO, **(options or {})})

    return Fixed(max_steps=2)


def _tiny(out: Path, **changes) -> PPOConfig:
    return PPOConfig(**{"timesteps": 64, "n_steps": 32, "batch_size": 32, "n_envs": 1, "vec": "dummy",
                        "eval_every": 0, "checkpoint_every": 32, "progress_bar": False, "out": str(out),
                        **changes})


def test_the_defaults_and_the_shipped_policys_settings_pass() -> None:
    check_config(PPOConfig())
    check_config(PPOConfig(ranker_scenarios=9000, imitation_states=20000, timesteps=102400, learning_rate=1e-4,
                           eval_every=51200, checkpoint_every=51200))
    check_config(PPOConfig(algo="ppo", network="mlp", seed=MAX_SEED, eval_every=0, gamma=1.0, ent_coef=0.0,
                           single_start_share=1.0))


@pytest.mark.parametrize("changes,flag", [
    ({"algo": "a2c"}, "--algo"),
    ({"network": "transformer"}, "--network"),
    ({"vec": "threads"}, "--vec"),
    ({"seed": -1}, "--seed"),
    ({"seed": MAX_SEED + 1}, "--seed"),
    ({"timesteps": 0}, "--timesteps"),
    ({"n_envs": 0}, "--envs"),
    ({"n_envs": 10**9}, "--envs"),  # beyond any machine's memory: refused before an environment is built
    ({"n_envs": 1000, "vec": "subproc"}, "--envs"),  # a process each
    ({"hidden": 0}, "--hidden"),
    ({"batch_size": 0}, "--batch-size"),
    ({"batch_size": 1}, "--batch-size"),  # one sample per minibatch: NaN advantages (the CLI fuzz found it)
    ({"batch_size": 31}, "--batch-size"),  # 32 steps in minibatches of 31: the last holds one sample
    ({"n_epochs": 0}, "--n-epochs"),
    ({"max_calls": 0}, "--max-calls"),
    ({"eval_every": -5}, "--eval-every"),
    ({"imitation_states": -1}, "--imitation-states"),
    ({"ranker_scenarios": -1}, "--ranker-scenarios"),
    ({"learning_rate": 0.0}, "--learning-rate"),
    ({"learning_rate": 2.0}, "--learning-rate"),
    ({"gamma": 0.0}, "--gamma"),
    ({"gamma": 1.01}, "--gamma"),
    ({"gamma": float("nan")}, "--gamma"),
    ({"ent_coef": -0.1}, "--ent-coef"),
    ({"single_start_share": 1.5}, "--single-start-share"),
    ({"net_arch": []}, "--net-arch"),
    ({"net_arch": [64, 0]}, "--net-arch"),
    ({"net_arch": [MAX_WIDTH + 1]}, "--net-arch"),
    ({"hidden": MAX_WIDTH + 1}, "--hidden"),
    ({"n_steps": 1, "n_envs": 1}, "--n-steps"),
    ({"network": "mlp", "imitation_states": 10}, "--imitation-states"),
    ({"algo": "ppo", "network": "entity"}, "--network"),
])
def test_a_config_that_cannot_train_names_the_flag(changes: dict, flag: str) -> None:
    config = dataclasses.replace(PPOConfig(), **changes)
    with pytest.raises(ConfigError, match=f"field '{flag}'"):
        check_config(config)


def test_train_refuses_before_it_writes_anything(tmp_path: Path) -> None:
    out = tmp_path / "never"
    with pytest.raises(ConfigError, match="--gamma"):
        train(_tiny(out, gamma=2.0), env_fn=_fixed_env)
    assert not out.exists()


def test_latest_checkpoint_counts_steps_not_characters(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None  # no checkpoints folder
    (tmp_path / "checkpoints").mkdir()
    assert latest_checkpoint(tmp_path) is None
    for steps in (64, 512, 1024, 96):
        (tmp_path / "checkpoints" / f"model_{steps}.zip").write_bytes(b"")
    (tmp_path / "checkpoints" / "notes.txt").write_text("not a checkpoint")
    assert latest_checkpoint(tmp_path).name == "model_1024.zip"


def test_settings_reach_the_model_and_a_resume_continues_to_the_total(tmp_path: Path, capsys) -> None:
    from sb3_contrib import MaskablePPO

    out = tmp_path / "run"
    out.mkdir()
    (out / "eval.jsonl").write_text('{"stale": true}\n')
    config = _tiny(out, gamma=0.9, n_epochs=3, ent_coef=0.05, learning_rate=1e-3, hidden=16, batch_size=16)
    # a resume with nothing to resume from starts from scratch (and says so)
    summary = train(dataclasses.replace(config, resume=True), env_fn=_fixed_env)
    assert "no checkpoint" in capsys.readouterr().out
    assert summary["timesteps"] == 64 and not summary["interrupted"]
    assert sorted(p.name for p in (out / "checkpoints").glob("*.zip")) == ["model_32.zip", "model_64.zip"]
    assert (out / "eval.jsonl").read_text() == '{"stale": true}\n'  # a resume keeps the log it continues
    model = MaskablePPO.load(str(latest_checkpoint(out)), device="cpu")
    assert (model.gamma, model.n_epochs, model.ent_coef, model.batch_size) == (0.9, 3, 0.05, 16)
    assert model.policy.hidden == 16
    meta = json.loads((out / "policy.json").read_text())
    assert meta["config"] == dataclasses.asdict(dataclasses.replace(config, resume=True))

    again = train(dataclasses.replace(config, timesteps=96, resume=True), env_fn=_fixed_env)
    assert again["timesteps"] == 96 and latest_checkpoint(out).name == "model_96.zip"
    assert MaskablePPO.load(str(latest_checkpoint(out)), device="cpu").num_timesteps == 96

    # no --resume into a folder with checkpoints: refused (a fresh run there would mix two runs' checkpoints,
    # and a later --resume would pick the old run's last one), nothing touched
    with pytest.raises(ConfigError, match=r"field '--out': .*model_96.zip.*pass --resume"):
        train(dataclasses.replace(config, timesteps=32), env_fn=_fixed_env)
    assert (out / "eval.jsonl").exists() and latest_checkpoint(out).name == "model_96.zip"


def test_evaluation_never_reports_the_plan_worse_than_its_start() -> None:
    """Random edits keep only improvements, so the best plan is at least the starting one, at any
    budget (a budget below the number of starts used to cut the rollout's start short: gain < 1)."""
    for calls in (5, 10, 40):
        metrics = evaluate_policy_on(None, [SCENARIO], max_calls=calls, max_steps=3)
        assert metrics["eval/gain_over_start"] >= 1.0
        assert metrics["eval/sim_calls"] <= calls
        assert "eval/quality_vs_tuner" not in metrics
    tuner = tuner_times([SCENARIO], calls=20)
    with_tuner = evaluate_policy_on(None, [SCENARIO], max_calls=10, max_steps=3, tuner=tuner)
    assert 0.0 < with_tuner["eval/min_quality_vs_tuner"] <= with_tuner["eval/quality_vs_tuner"]
    assert with_tuner["eval/zero_shot_quality"] > 0


def test_tuner_times_are_infinite_where_nothing_fits() -> None:
    roomy, cramped = SCENARIO, Scenario(uniform_profile(8, params=10**11), ideal_cluster(2, memory_gb=1.0), 4)
    times = tuner_times([roomy, cramped], calls=10)
    assert np.isfinite(times[0]) and times[0] > 0 and times[1] == float("inf")


@pytest.mark.parametrize(("n_steps", "n_envs", "expected"), [(128, 1, 128), (128, 64, 256), (257, 1, 255), (3, 1, 3)])
def test_the_default_minibatch_fits_any_rollout(n_steps: int, n_envs: int, expected: int) -> None:
    """Without --batch-size: 256, capped at the rollout, never leaving a one-sample last minibatch
    (a default the user did not choose must not be refused); a size given by hand is still checked."""
    config = PPOConfig(n_steps=n_steps, n_envs=n_envs)
    check_config(config)
    assert minibatch_size(config) == expected
    with pytest.raises(ConfigError, match="--batch-size"):
        check_config(PPOConfig(n_steps=n_steps, n_envs=n_envs, batch_size=n_steps * n_envs + 1))


def test_the_batched_vector_env_trains_through_the_sb3_adapter(tmp_path: Path) -> None:
    """``vec="batched"``: adaptis/Pipeline-v0's own vector env (one native batch a step) under MaskablePPO,
    with the training scenarios; the run reaches its steps and writes the policy."""
    config = dataclasses.replace(_tiny(tmp_path), vec="batched", n_envs=4, n_steps=16, batch_size=32, timesteps=64,
                                 max_steps=3, max_calls=6)
    summary = train(config)
    assert summary["timesteps"] >= 64 and not summary["interrupted"]
    assert Path(summary["policy"]).is_file()


def test_evaluation_counts_plans_that_do_not_fit_apart_from_the_quality() -> None:
    """A scenario where the tuner's plan fits and no start does is a share of plans that fit below 1,
    not a floor priced into the geometric mean (which read 0.24 for a policy at 0.96 elsewhere)."""
    cramped = Scenario(uniform_profile(8, params=10**11), ideal_cluster(2, memory_gb=1.0), 4)
    tuner = tuner_times([SCENARIO], calls=20) + [1.0]  # a finite time where nothing of the policy's fits
    metrics = evaluate_policy_on(None, [SCENARIO, cramped], max_calls=10, max_steps=3, tuner=tuner)
    assert metrics["eval/fits"] == 0.5
    assert metrics["eval/zero_shot_fits"] == 0.5
    alone = evaluate_policy_on(None, [SCENARIO], max_calls=10, max_steps=3, tuner=tuner[:1])
    assert metrics["eval/quality_vs_tuner"] == alone["eval/quality_vs_tuner"]
    assert metrics["eval/gain_over_start"] == alone["eval/gain_over_start"]


def test_fewer_timesteps_than_one_rollout_cut_the_rollout_and_say_so(tmp_path: Path, capsys) -> None:
    """SB3 trains whole rollouts: ``--timesteps 8 --envs 4096`` trained 524,288 steps."""
    from agents.rl.train import fit_rollout

    assert fit_rollout(PPOConfig(timesteps=8, n_envs=4096)).n_steps == 1
    assert "--n-steps cut to 1" in capsys.readouterr().out
    assert fit_rollout(PPOConfig(timesteps=100, n_envs=8)).n_steps == 13
    assert fit_rollout(PPOConfig(timesteps=1, n_envs=1)).n_steps == 2  # PPO needs 2 samples
    assert fit_rollout(PPOConfig(timesteps=4096, n_envs=8)).n_steps == 128  # a rollout fits: unchanged
    capsys.readouterr()
    result = train(_tiny(tmp_path, timesteps=8, n_steps=128, batch_size=None, n_envs=4, checkpoint_every=8),
                   env_fn=_fixed_env)
    assert result["timesteps"] == 8
    assert "--n-steps cut to 2" in capsys.readouterr().out


def test_learning_with_the_silent_logger_leaves_no_folder_in_the_temp_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from sb3_contrib import MaskablePPO

    from env.pipeline_env import PipelineEnv
    from env.scenarios import ScenarioConfig

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    env = PipelineEnv(scenario=ScenarioConfig(max_devices=4, max_blocks=8), max_steps=4)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.set_logger(silent_sb3_logger())
    model.learn(8)
    assert not list(tmp_path.glob("SB3-*"))
    MaskablePPO("MultiInputPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(8)
    assert list(tmp_path.glob("SB3-*"))  # SB3's own logger makes one: what the silent logger avoids
