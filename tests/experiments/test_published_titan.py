"""torchtitan's published rows: predicted within the targets, bad rows refused in one line naming the field."""

from __future__ import annotations

import copy
import json
import statistics

import pytest

from experiments.benchmarks.published import predict_row, summarize
from experiments.benchmarks.published_titan import _score, main, pairs_ranked, predict_torchtitan_row
from experiments.cli import main as cli
from tests.conftest import ROOT

FILE = ROOT.parent / "shared/data/published/torchtitan_llama3_h100_no_pp.json"
needs_file = pytest.mark.skipif(not FILE.exists(), reason="shared published data not present")
PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")


def rows() -> list[dict]:
    return json.loads(FILE.read_text())["rows"]


@needs_file
def test_the_file_meets_its_targets() -> None:
    s = _score(rows(), None)
    assert s["predicted"] == s["rows"] == 12
    assert s["median_abs_error"] <= 0.08 and s["max_abs_error"] <= 0.15
    assert s["pairs_ranked"] >= 0.95


@needs_file
def test_assumptions_are_stated() -> None:
    p = predict_torchtitan_row(rows()[0], {})
    assert p.refused is None and any("seq_len=8192" in a for a in p.assumptions)
    assert any("vocab=128256" in a for a in p.assumptions)


@needs_file
@pytest.mark.parametrize("edit, field", [
    (lambda r: r["parallel"].update(dp=3), "parallel"),
    (lambda r: r.update(gpu_type="TPU v5"), "gpu_type"),
    (lambda r: r["measured"].update(throughput_unit="samples/s"), "throughput_unit"),
    (lambda r: r["model"].update(layers=None), "model.layers"),
    (lambda r: r["training_flags"].update(activation_checkpoint="sometimes"), "activation"),
    (lambda r: r["parallel"].update(dp_kind="HSDP"), "parallel.dp_kind"),  # replication is not priced
])
def test_bad_rows_are_refused_naming_the_field(edit, field) -> None:
    row = copy.deepcopy(rows()[0])
    edit(row)
    p = predict_torchtitan_row(row, {})
    assert p.tokens_per_s_per_gpu is None and field in p.refused and "\n" not in p.refused


@needs_file
def test_a_pipelined_row_without_micro_batches_takes_torchtitans_defaults() -> None:
    """torchtitan (9dec370) splits the local batch into ``pipeline_parallel_degree`` micro-batches
    when none is set, and a looped schedule gets two stages per rank: said, not guessed silently."""
    row = copy.deepcopy(rows()[6])  # the 70B 2D row, made into a pipelined one
    row["parallel"].update(pp=8, dp=4, vpp=None)
    row["batch"] = {"micro_batch_size": None, "num_microbatches": None, "global_batch": 128, "local_batch": 32}
    row["schedule"] = "Interleaved 1F1B"
    p = predict_torchtitan_row(row, {})
    assert p.refused is None, p.refused
    assert any("num_microbatches=8" in a for a in p.assumptions)
    assert any("vpp=2" in a for a in p.assumptions)
    stated = copy.deepcopy(row)
    stated["batch"].update(micro_batch_size=4, num_microbatches=8)
    stated["parallel"].update(vpp=2)
    q = predict_torchtitan_row(stated, {})
    assert q.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s_per_gpu)
    assert not any("num_microbatches" in a or "vpp" in a for a in q.assumptions)
    vpp_one = copy.deepcopy(row)  # transcribers write vpp 1 for "not stated"; one stage per rank is 1F1B
    vpp_one["parallel"].update(vpp=1)
    r = predict_torchtitan_row(vpp_one, {})
    assert r.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s_per_gpu) and any("vpp=2" in a for a in r.assumptions)
    plain = copy.deepcopy(vpp_one)
    plain["schedule"] = "1F1B"
    assert predict_torchtitan_row(plain, {}).tokens_per_s_per_gpu < r.tokens_per_s_per_gpu
    one = copy.deepcopy(stated)
    one["batch"].update(micro_batch_size=1, num_microbatches=32)
    assert predict_torchtitan_row(one, {}).tokens_per_s_per_gpu != pytest.approx(q.tokens_per_s_per_gpu)


def test_ties_count_as_ranked() -> None:
    rs = [{"table": "t", "measured": {"throughput": 100}}, {"table": "t", "measured": {"throughput": 100.5}},
          {"table": "t", "measured": {"throughput": 200}}]
    assert pairs_ranked(rs, [101, 100, 150]) == (3, 3)
    assert pairs_ranked(rs, [101, 100, 50]) == (1, 3)


@needs_file
def test_the_command_prints_every_row(capsys) -> None:
    assert main([str(FILE)]) == 0
    out = capsys.readouterr().out
    assert out.count("tt_table") == 12 and '"pairs_ranked": 1.0' in out


@pytest.mark.parametrize("command", ["simulate-search", "baselines"])
def test_the_commands_take_runtime_torchtitan(command, tmp_path, capsys) -> None:
    if command == "baselines":
        argv = ["baselines", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8",
                "--runtime", "torchtitan"]
        assert cli(argv) == 0
        return
    assert cli(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method", "1f1b",
                "--runtime", "torchtitan", "--out", str(tmp_path), "--json"]) == 0
    assert cli(["simulate", "--profile", PROFILE, "--cluster", CLUSTER, "--plan", str(tmp_path / "plan.json"),
                "--runtime", "torchtitan", "--json"]) == 0


def test_torchtitans_pipelined_405b_runs_from_the_row_alone() -> None:
    """torchtitan's Tables 5-6 (our transcription; checked, not fitted): median within 10%, the 1F1B / interleaved
    order right, every pair of the group in order."""
    rows = json.loads((ROOT / "experiments/data/published/torchtitan_llama3_405b_pp.json").read_text())["rows"]
    preds = {p.id: p for p in (predict_row(r, rows) for r in rows)}
    assert all(p.reason is None for p in preds.values()) and len(preds) == 6
    errors = [abs(p.predicted / p.measured - 1) for p in preds.values()]
    assert statistics.median(errors) <= 0.10
    assert preds["tt_table5_405B_Interleaved_1F1B"].predicted > preds["tt_table5_405B_1F1B"].predicted
    summary = summarize(list(preds.values()))
    assert summary["pairs_ranked_as_measured"] == summary["pairs"] == 15
