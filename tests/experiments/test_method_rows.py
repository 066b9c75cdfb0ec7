"""One row for every command that compares methods: search, run, baselines and evaluate-agent share
field names (experiments.results.MethodRow, docs/formats.md "Method rows")."""

from __future__ import annotations

import dataclasses
import json

from experiments.cli import main
from experiments.results import MethodRow
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
FIELDS = {f.name for f in dataclasses.fields(MethodRow)} - {"chunks"}  # chunks: only where set


def _rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_commands_rows_share_field_names(tmp_path, capsys) -> None:
    scenario = ["--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8"]
    assert main(["search", *scenario, "--method", "zbv,adaptis", "--budget", "20", "--out", str(tmp_path / "s"),
                 "--json"]) == 0
    search = _rows(capsys.readouterr().out)
    assert main(["baselines", *scenario, "--methods", "zbv,1f1b", "--json"]) == 0
    baselines = _rows(capsys.readouterr().out)
    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--heldout", "1", "--budget", "20",
                 "--methods", "adaptis,zbv", "--out", str(tmp_path / "e"), "--json"]) == 0
    evaluated = _rows(capsys.readouterr().out)
    assert main(["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--microbatches", "8",
                 "--method", "zbv", "--budget", "20", "--out", str(tmp_path / "r"), "--json"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for name, rows in {"search": search, "baselines": baselines, "evaluate-agent": evaluated,
                       "run": summary["rows"]}.items():
        assert rows, name
        for row in rows:
            assert set(row) >= FIELDS, (name, FIELDS - set(row))
            assert "iter_time" not in row and "predicted" not in row and "peak_mem_gb" not in row, name
    assert {r["method"] for r in summary["rows"]} == {"megatron", "zbv"}
    assert all(r["iteration_time"] > 0 for r in search + baselines + summary["rows"] if r["valid"])
