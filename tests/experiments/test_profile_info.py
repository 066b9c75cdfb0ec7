"""``python -m experiments profile-info``: the table, the heterogeneity summary, and the profile JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.commands.profile_info import heterogeneity
from pipeline.spec import ModelProfile
from pipeline.zoo import zoo_profile

REPO = Path(__file__).resolve().parents[2]


def test_runs_as_a_module_and_names_the_heterogeneity() -> None:
    done = subprocess.run([sys.executable, "-m", "experiments", "profile-info", "--model", "gemma-small"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "gemma-small: 34 layers, seq_len 4096" in out
    assert "layer31" in out and "embed" in out
    assert any(x.strip().startswith("head = ") for x in out.splitlines())


def test_the_head_is_several_blocks_in_time() -> None:
    """The heterogeneity rows the command prints: gemma-small's head (its 256k vocabulary, the loss
    in fp32 op by op) costs several of its blocks (about 9; 4.6 with a fused loss)."""
    rows = {r["kind"]: r for r in heterogeneity(zoo_profile("gemma-small"))}
    reference = rows["head"]["reference"]
    assert rows[reference]["time_x"] == 1.0 and rows[reference]["count"] == max(r["count"] for r in rows.values())
    assert 7.0 <= rows["head"]["time_x"] <= 11.0
    assert sum(r["time_share_%"] for r in rows.values()) == pytest.approx(100.0)


def test_json_output_round_trips_through_model_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile-info", "--model", "deepseek-small", "--seq-len", "2048", "--gpu", "h800", "--json"]) == 0
    profile = ModelProfile.from_dict(json.loads(capsys.readouterr().out))
    assert profile == zoo_profile("deepseek-small", gpu="h800", seq_len=2048)
    assert profile.seq_len == 2048 and profile.extra["gpu"] == "h800"
    assert "flops_f" in profile.layers[1].extra


def test_out_writes_a_profile_that_profile_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["profile-info", "--model", "nemotronh-small", "--microbatch-size", "2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "mamba" in table and "attention" in table
    saved = ModelProfile.load(out)
    assert saved == zoo_profile("nemotronh-small", microbatch_size=2)
    assert main(["profile-info", "--profile", str(out), "--json"]) == 0
    assert ModelProfile.from_dict(json.loads(capsys.readouterr().out)) == saved


def test_hf_config_and_tensor_parallel(tmp_path: Path) -> None:
    from pipeline.costs import profile_from_architecture
    from pipeline.hf import load_hf_config

    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
           "num_attention_heads": 8, "vocab_size": 32000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    one = profile_from_architecture(load_hf_config(path), gpu="h100", seq_len=1024)
    two = profile_from_architecture(load_hf_config(path), gpu="h100", seq_len=1024, tp=2)
    assert one.num_layers == 6 and one.seq_len == 1024
    assert two.extra["tp"] == 2 and two.layers[1].params < one.layers[1].params
    out = tmp_path / "tp2.json"  # the command builds the same profile from its flags
    assert main(["profile-info", "--hf-config", str(path), "--seq-len", "1024", "--tp", "2", "--out", str(out)]) == 0
    assert ModelProfile.load(out) == two


def test_bad_input_exits_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile-info", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "gemma-small" in err
    assert main(["profile-info", "--model", "gemma-small", "--gpu", "tpu"]) == 2
    assert "h100" in capsys.readouterr().err
