"""Published rows with fields of the wrong kind: one line naming the field, never a traceback."""

from __future__ import annotations

import copy
import json
import random

import pytest

from experiments.benchmarks.published import predict_row
from tests.conftest import ROOT

DATA = ROOT.parent / "shared/data/published"
FILES = sorted(DATA.glob("*.json")) if DATA.exists() else []
WEIRD = [None, "x", -1, 0, 1.5, True, [], {}, "17%", 1e12]


@pytest.mark.skipif(not FILES, reason="shared published data not present")
def test_mutated_rows_are_predicted_or_refused_in_one_line() -> None:
    rows = [r for f in FILES for r in json.loads(f.read_text())["rows"]]
    rng = random.Random(7)
    refused = 0
    for _ in range(120):
        row = copy.deepcopy(rng.choice(rows))
        for _ in range(rng.randint(1, 3)):
            section = rng.choice(["model", "parallel", "batch", "measured", "training_flags", None])
            if section is None:
                row[rng.choice(["gpus", "gpu_type", "schedule"])] = rng.choice(WEIRD)
                continue
            part = row.get(section)
            if not isinstance(part, dict) or not part:
                row[section] = rng.choice(WEIRD)
                continue
            part[rng.choice(sorted(part))] = rng.choice(WEIRD)
        got = predict_row(row, rows, with_analytic=False)
        if got.predicted is None:
            refused += 1
            assert got.reason and "\n" not in got.reason, (row["id"], got.reason)
    assert refused > 40  # most mutations break a field the row needs


def test_a_text_micro_batch_size_is_named() -> None:
    row = {"id": "r", "model": {"name": "m", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 128},
           "parallel": {"tp": 1, "pp": 2, "dp": 1}, "batch": {"micro_batch_size": "x", "num_microbatches": 4},
           "gpus": 2, "schedule": "1F1B", "gpu_type": "A100", "measured": {"throughput": 1.0,
                                                                          "throughput_unit": "samples/s/GPU"}}
    got = predict_row(row, [row])
    assert got.predicted is None and "batch.micro_batch_size" in got.reason
    row["batch"]["micro_batch_size"] = 1
    row["measured"]["mfu"] = "17%"
    assert "measured.mfu" in predict_row(row, [row]).reason
