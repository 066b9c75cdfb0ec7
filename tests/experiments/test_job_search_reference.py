"""The job search's command line with ``--reference``, ``--ac`` and ``--moe-imbalance``."""

from __future__ import annotations

import json

import pytest

from experiments.commands.job_search import main

BASE = ["--model", "llama-control", "--gpus", "8", "--global-batch", "16", "--seq-len", "1024",
        "--calls-per-config", "40", "--tune-top", "1", "--microbatch-sizes", "1", "--max-cp", "1"]


def test_the_reference_is_printed_beside_the_best_and_megatrons(capsys) -> None:
    assert main([*BASE, "--reference", "tp2,pp2,interleaved"]) == 0
    out = capsys.readouterr().out
    assert "Megatron's best even-split configuration" in out
    line = out.split("the reference configuration", 1)[1]
    assert "reference tp=2 pp=2" in line and "tok/s/GPU" in line and "MFU" in line and "GiB" in line
    assert "best vs the reference:" in out


def test_the_reference_goes_into_the_json_rows_and_summary(capsys, tmp_path) -> None:
    assert main([*BASE, "--reference", "tp2,pp2,dp2,1f1b", "--json", "--out", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    refs = [x for x in lines if x.get("method") == "reference"]
    assert len(refs) == 1 and refs[0]["tp"] == 2 and refs[0]["pp"] == 2
    summary = lines[-1]
    assert summary["reference"]["tokens_per_s_per_gpu"] == refs[0]["tokens_per_s_per_gpu"]
    assert summary["speedup_over_reference"] >= 1.0
    rows = [json.loads(x) for x in (tmp_path / "job_rows.jsonl").read_text().splitlines()]
    assert any(r["method"] == "reference" for r in rows)


@pytest.mark.parametrize("flags,field", [
    (["--reference", "tp3,pp2"], "--reference"),
    (["--reference", "tp2,pp2,dp4"], "--reference"),
])
def test_a_bad_reference_is_one_line_before_any_search(capsys, flags, field) -> None:
    assert main([*BASE, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"field '{field}'" in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--ac", "partial"], ["--moe-imbalance", "0.5"], ["--moe-imbalance", "x"]])
def test_bad_ac_modes_and_imbalance_are_refused_by_the_parser(capsys, flags) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*BASE, *flags])
    assert exit_.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_ac_modes_restrict_the_checkpointing_tried(capsys) -> None:
    assert main([*BASE, "--ac", "full", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["ac"] for r in rows if "ac" in r} == {"full"}
