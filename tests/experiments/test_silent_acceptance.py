"""What a newcomer's tries found accepted in silence or explained wrongly (issue 47, section 6)."""

from __future__ import annotations

import json

import pytest

from experiments.cli import main
from pipeline.errors import ConfigError
from pipeline.hf import architecture_from_config

QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
             "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
             "decoder_sparse_step": 1}


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv,field,words", [
    (["search", "--model", "gemma-small", "--devices", "4", "--method", ""], "--method", "names no method"),
    (["search", "--model", "gemma-small", "--method", " , "], "--method", "names no method"),
    (["search", "--model", "gemma-small", "--gpus", "8", "--global-batch", "64", "--devices", "4"], "--devices",
     "not both"),
    (["search", "--model", "gemma-small", "--gpus", "8", "--global-batch", "64", "--tp", "3"], "--tp",
     "divides both 8 GPUs and 8 attention heads"),
    (["profile-info", "--model", "gemma-small", "--tp", "3"], "tp", "8 attention heads do not split 3 ways"),
    (["train", "--batch-size", "100000", "--timesteps", "64"], "--batch-size", "larger than a rollout"),
], ids=["method-empty", "method-commas", "devices-beside-gpus", "job-tp-3", "profile-info-tp-3", "train-batch"])
def test_refused_in_one_line_naming_the_field(argv, field, words, tmp_path, capsys) -> None:
    assert main([*argv, "--out", str(tmp_path / "o")] if argv[0] != "profile-info" else argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"field '{field}'" in line and words in line


def test_gamma_errors_speak_of_gamma(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--gamma", "2"])
    err = capsys.readouterr().err
    assert "--gamma" in err and "learning rate" not in err


def test_key_value_heads_must_divide_the_heads() -> None:
    with pytest.raises(ConfigError, match="num_key_value_heads.*do not divide 16 attention heads"):
        architecture_from_config({**QWEN2_MOE, "num_key_value_heads": 5})


def test_qwen2_moe_is_supported_with_its_shared_expert() -> None:
    arch = architecture_from_config(QWEN2_MOE)
    assert arch.num_experts == 60 and arch.num_shared_experts == 1
    assert arch.shared_expert_intermediate_size == 5632
    without = architecture_from_config({**QWEN2_MOE, "shared_expert_intermediate_size": 0})
    assert without.num_shared_experts == 0


def test_out_of_memory_advice_when_the_weights_alone_do_not_fit(tmp_path, capsys) -> None:
    assert main(["search", "--model", "gemma-large", "--devices", "2", "--memory-gb", "40", "--method", "zb-h1",
                 "--budget", "10", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "the weights and optimizer state alone need" in err and "fewer micro-batches" not in err


def test_simulating_a_plan_of_another_model_warns(tmp_path, capsys) -> None:
    assert main(["search", "--model", "gemma-small", "--devices", "4", "--method", "zb-h1", "--budget", "5",
                 "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--plan", str(tmp_path / "plan.json"), "--model", "llama-control", "--devices", "4",
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "'gemma-small', not 'llama-control'" in captured.err
    assert json.loads(captured.out)["valid"] is True


def test_train_refuses_the_entity_network_without_masks(tmp_path, capsys) -> None:
    assert main(["train", "--network", "entity", "--algo", "ppo", "--timesteps", "64", "--out", str(tmp_path)]) == 2
    assert "field '--network'" in _one_error_line(capsys.readouterr().err)


@pytest.mark.slow  # a 64-step training run with one evaluation
def test_train_ends_with_its_quality_and_its_wandb_run(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--timesteps", "64", "--n-steps", "32", "--n-envs", "1", "--batch-size", "32",
                 "--eval-every", "64", "--eval-scenarios", "1", "--imitation-states", "0", "--no-progress",
                 "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "held-out quality at 64 steps: throughput / tuner's (geo-mean)" in out
    assert "W&B run" in out and "offline-run-" in out
