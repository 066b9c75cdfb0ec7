"""Size flags bounded up front, and late failures made early and clean (issue 47, item 4)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from experiments.cli import main
from tests.conftest import ROOT

PROFILE = ROOT / "experiments/configs/profiles/uniform-16.json"


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["search", "--model", "gemma-small", "--devices", "4", "--head-shards", "100000"],
    ["profile-info", "--model", "gemma-small", "--head-shards", "100000"],
], ids=["search", "profile-info"])
def test_a_huge_head_cut_is_refused_at_once(argv, tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert time.perf_counter() - t0 < 10
    line = _one_error_line(capsys.readouterr().err)
    assert "head_shards" in line and "at most 256" in line


def test_more_head_shards_than_tokens_is_refused(tmp_path, capsys) -> None:
    assert main(["profile-info", "--model", "gemma-small", "--head-shards", "200", "--seq-len", "128"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "200 head shards but only 128 tokens" in line


def test_an_all_zero_cost_profile_is_refused_by_validation(tmp_path, capsys) -> None:
    raw = json.loads(PROFILE.read_text())
    for layer in raw["layers"]:
        layer.update(f=0.0, b=0.0, w=0.0)
    (tmp_path / "zero.json").write_text(json.dumps(raw))
    assert main(["search", "--profile", str(tmp_path / "zero.json"), "--devices", "4", "--budget", "10",
                 "--out", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "field 'layers'" in line and "is 0" in line


def test_a_trace_path_that_is_a_folder_is_refused_before_the_search(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["search", "--profile", str(PROFILE), "--devices", "4", "--budget", "10", "--trace", str(tmp_path),
                 "--out", str(out)]) == 2
    assert "field '--trace'" in _one_error_line(capsys.readouterr().err)
    assert not out.exists()  # refused before anything ran


def test_a_replay_that_times_out_is_one_clean_message(tmp_path, capsys, monkeypatch) -> None:
    import executor.replay as replay
    from tests.executor.plans import named_plans

    def killed(nproc, worker_args, *, timeout=600.0, threads=1):
        return subprocess.CompletedProcess(["torchrun"], -9, f"starting\n[killed after {timeout:.0f} s]")

    monkeypatch.setattr(replay, "run_torchrun", killed)
    dict(named_plans(2))["1f1b"].save(tmp_path / "plan.json")
    code = main(["replay", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-hybrid", "--seq-len", "32",
                 "--steps", "1", "--warmup", "0", "--timeout", "1", "--out", str(tmp_path / "r")])
    assert code == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "within --timeout (1 s)" in line


def test_profile_on_cuda_without_it_is_one_line(tmp_path, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    assert main(["profile", "--model", "tiny-hybrid", "--device", "cuda", "--out", str(tmp_path / "p.json")]) == 2
    assert "field '--device'" in _one_error_line(capsys.readouterr().err)
