"""benchmarks.published_memory: a pipeline row's peak memory, walked along its simulated order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.benchmarks import published
from experiments.benchmarks.published_memory import (
    ZB_MEMORY,
    MemoryModel,
    fit_memory,
    memory_pairs,
    peak_memory,
    row_peak_memory,
    stage_contents,
)
from pipeline.plan import Action, Plan, interleaved_placement, sequential_placement, v_placement

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "published"
ZB_FILES = ("zero_bubble_qi2024_dev.json", "zero_bubble_qi2024_dev_more.json")
needs_dev = pytest.mark.skipif(not all((DATA / f).exists() for f in ZB_FILES), reason=f"{DATA} is not beside the repo")


def _zb_rows() -> list[dict]:
    return [r for f in ZB_FILES for r in published._load(DATA / f)]


@needs_dev
def test_the_zero_bubble_rows_peak_memory_meets_the_targets() -> None:
    """Every Zero Bubble row that gives its memory gets one, across both files: median |error| <= 5%,
    max <= 10%, and at least 95% of the pairs within a group ranked as measured."""
    rows = _zb_rows()
    preds = published.predict_rows(rows, with_analytic=False)
    with_memory = [p for p, r in zip(preds, rows) if r["measured"].get("peak_memory_gb")]
    assert with_memory and all(p.memory_predicted_gb is not None for p in with_memory)
    assert {p.schedule for p in with_memory} >= {"1F1B", "1F1B-I", "ZB-1p", "ZB-2p", "ZB-V"}
    summary = published.summarize(preds)
    assert summary["memory_rows"] == len(with_memory)
    assert summary["memory_median_abs_error"] <= 0.05 and summary["memory_max_abs_error"] <= 0.10
    assert summary["memory_pairs_ranked_as_measured"] >= 0.95 * summary["memory_pairs"] > 0
    assert all("vocab" in p.memory_notes and "ffn 4h" in p.memory_notes for p in with_memory)


@needs_dev
@pytest.mark.slow  # every grid point over both files: about 3 s (each row walked 24 times)
def test_the_stated_constants_are_the_fit_of_both_files() -> None:
    rows = _zb_rows()
    preds = published.predict_rows(rows, with_analytic=False)
    items = [(r, p.plan, p.group) for r, p in zip(rows, preds) if p.plan is not None and p.memory_measured_gb]
    model, figures = fit_memory(items, rows)
    assert model == ZB_MEMORY
    assert figures["memory_rows"] == len(items)
    # the fit walks each row once per walk's constants: its figures are the plain walk's
    got = [(g, float(r["measured"]["peak_memory_gb"]), row_peak_memory(p, r, rows, model=model)[0])
           for r, p, g in items]
    errors = sorted(abs(p / m - 1) for _, m, p in got)
    assert figures["memory_max_abs_error"] == errors[-1]
    assert (figures["memory_pairs_ranked_as_measured"], figures["memory_pairs"]) == memory_pairs(got)


def _row(layers: int = 6, *, mbs: int = 2) -> dict:
    return {"id": "x", "model": {"name": "m", "layers": layers, "hidden": 1024, "heads": 16, "seq_len": 512,
                                 "vocab": 32000, "ffn_hidden": 4096},
            "parallel": {"pp": 2}, "batch": {"micro_batch_size": mbs, "num_microbatches": 4}}


def _plan(orders: list[list[str]], placement: tuple[int, ...]) -> Plan:
    acts = [[Action(int(a[0]), a[1], int(a[2:])) for a in dev] for dev in orders]
    return Plan(len(orders), 2, tuple((k, k + 1) for k in range(len(placement))), placement, acts)


def test_a_fused_backward_frees_all_and_a_split_one_keeps_what_w_needs() -> None:
    """Two micro-batches in flight on stage 0: after their F, the device holds twice F's activations; an
    I then frees all but the weight GEMMs' inputs and output gradients (32 sbh of 34 sbh + 5as^2b per layer)."""
    row = _row()
    zero = MemoryModel(overhead_gb=0.0)
    s, b, h, a = 512, 2, 1024, 16
    layer = s * b * h * 34 + 5 * a * s * s * b  # Korthikanti et al., bytes
    both_f = _plan([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], (0, 1))
    first_then_i = _plan([["0F0", "0I0", "0F1", "0W0", "0I1", "0W1"], ["1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]],
                         (0, 1))
    peaks_f, _ = peak_memory(both_f, row, model=zero)
    peaks_i, _ = peak_memory(first_then_i, row, model=zero)
    # stage 0 holds the embedding and 3 layers (8 units over 2 stages, the ends one layer lighter)
    assert peaks_f[0] - peaks_i[0] == pytest.approx(3 * (layer - 32 * s * b * h) / 1e9, rel=1e-9)


def test_layers_over_chunks_add_up_for_every_placement() -> None:
    for placement in (sequential_placement(8), interleaved_placement(8, 3), v_placement(8), v_placement(16)):
        for layers in (22, 30, 46):
            if layers + 2 < len(placement):  # fewer units than chunks: refused before memory (a V needs 2p - 2)
                continue
            got = stage_contents(layers, placement, ends_lighter=True)
            assert sum(c.layers for c in got) == pytest.approx(layers)
            assert [c.embedding for c in got].count(True) == 1 and got[0].embedding
            assert [c.head for c in got].count(True) == 1 and got[-1].head
            per_device = [sum(c.layers + c.embedding + c.head for c, d in zip(got, placement) if d == dev)
                          for dev in range(max(placement) + 1)]
            assert max(per_device) - min(per_device) <= 1


def test_the_v_family_and_zb_h2_hold_what_their_caps_say() -> None:
    """Same model and stage times: V-Min < V-Half < ZB-V in peak memory, ZB-H1 about 1F1B (its list-scheduled
    order caps W's share at a quarter of F's, the walk keeps 32 of 74 sbh here), ZB-H2 above both."""
    base = {**_row(16, mbs=1), "schedule": "1F1B", "parallel": {"tp": 1, "pp": 4, "dp": 1, "cp": 1},
            "batch": {"micro_batch_size": 1, "num_microbatches": 16},
            "measured": {"throughput": 1.0, "throughput_unit": "samples/s/GPU", "peak_memory_gb": 10.0},
            "profiled_inputs": {"T_F": 1.0, "T_B": 1.0, "T_W": 0.5, "T_comm": 0.1},
            "layer_placement": "first and last pipeline stages have one fewer transformer layer"}
    got = {s: published.predict_row({**base, "schedule": s}, [], with_analytic=False).memory_predicted_gb
           for s in ("1F1B", "ZB-H1", "ZB-H2", "V-Min", "V-Half", "ZB-V")}
    assert all(v is not None for v in got.values()), got
    assert got["V-Min"] < got["V-Half"] < got["ZB-V"]
    assert got["ZB-H1"] <= got["1F1B"] * 1.10 and got["ZB-H2"] > max(got["1F1B"], got["ZB-H1"])


def test_a_row_without_its_dimensions_says_why_it_has_no_memory() -> None:
    row = {**_row(), "model": {"name": "m", "layers": 6}}
    got = peak_memory(_plan([["0F0", "0B0"], ["1F0", "1B0"]], (0, 1)), row)
    assert isinstance(got, str) and "model.hidden" in got


def test_memory_pairs_count_ties_as_ranked() -> None:
    rows = [("g", 30.0, 29.0), ("g", 32.0, 33.0), ("g", 59.0, 58.0), ("h", 10.0, 12.0), ("g", 59.2, 30.0)]
    # g: (30,32) ok, (30,59) ok, (32,59) ok, (30,59.2) ok, (32,59.2) wrong, (59,59.2) a tie
    assert memory_pairs(rows) == (5, 6)


def test_json_rows_carry_the_memory_and_its_assumptions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    row = {**_row(16, mbs=1), "schedule": "ZB-1p", "parallel": {"tp": 1, "pp": 4, "dp": 1, "cp": 1},
           "batch": {"micro_batch_size": 1, "num_microbatches": 8},
           "measured": {"throughput": 1.0, "throughput_unit": "samples/s/GPU", "peak_memory_gb": 10.0},
           "profiled_inputs": {"T_F": 1.0, "T_B": 1.0, "T_W": 0.5, "T_comm": 0.1}}
    row["model"].pop("vocab")
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"rows": [row]}))
    assert published.main([str(table), "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["memory_measured_gb"] == 10.0 and first["memory_predicted_gb"] > 0
    assert f"vocab {ZB_MEMORY.vocab}" in first["memory_notes"]
