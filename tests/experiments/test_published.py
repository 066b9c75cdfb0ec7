"""benchmarks.published: published GPU measurements beside the runtime model's predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.benchmarks import published

DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "published" / "zero_bubble_qi2024_dev.json"
needs_dev = pytest.mark.skipif(not DEV.exists(), reason=f"{DEV} is not beside the repository")


@needs_dev
def test_the_zero_bubble_rows_meet_the_fidelity_targets() -> None:
    rows = json.loads(DEV.read_text())["rows"]
    summary = published.summarize(published.predict_rows(rows))
    assert summary["predicted"] == len(rows)
    assert summary["median_abs_error"] <= 0.03
    assert summary["max_abs_error"] <= 0.075
    assert summary["median_ratio_to_1f1b_error"] <= 0.03
    assert summary["groups_misranked"] == [] and summary["groups_ranked_as_measured"] == summary["groups"] > 0


@needs_dev
def test_json_prints_one_object_per_row_then_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert published.main([str(DEV), "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[-1]["summary"] is True
    for row in lines[:-1]:
        assert set(row) >= {"id", "unit", "measured", "predicted"}
        assert row["unit"] == "samples/s/GPU" and row["predicted"] > 0


def _row(**parallel: int) -> dict:
    return {"id": "x", "model": {"name": "m", "layers": 8}, "schedule": "1F1B",
            "parallel": {"tp": 1, "pp": 4, "dp": 1, "cp": 1, **parallel},
            "batch": {"micro_batch_size": 1, "num_microbatches": 8},
            "measured": {"throughput": 1.0, "throughput_unit": "samples/s/GPU"},
            "profiled_inputs": {"T_F": 1.0, "T_B": 1.0, "T_W": 0.5, "T_comm": 0.1}}


def test_rows_it_cannot_predict_say_why() -> None:
    tp = published.predict_row(_row(tp=2), [])
    assert tp.predicted is None and "tensor" in tp.reason
    plain = published.predict_row(_row(), [])
    assert plain.predicted is not None and plain.reason is None
    unknown = published.predict_row({**_row(), "schedule": "GPipe-X"}, [])
    assert unknown.predicted is None and "GPipe-X" in unknown.reason


def test_a_file_that_is_not_a_table_gets_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    with pytest.raises(SystemExit, match="'rows' must be a list"):
        published.main([str(bad)])


def test_rows_without_a_schedule_print_without_a_traceback(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    row = {**_row(tp=8), "schedule": None}
    table.write_text(json.dumps({"rows": [row]}))
    assert published.main([str(table)]) == 0
    out = capsys.readouterr().out
    assert "x " in out and "tensor" in out


MEGATRON = [DEV.parent / "megatron_narayanan2021.json", DEV.parent / "megatron_core_h100_readme.json"]


@pytest.mark.parametrize("path", MEGATRON, ids=lambda p: p.stem)
def test_the_megatron_rows_meet_the_whole_job_targets(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not beside the repository")
    rows = json.loads(path.read_text())["rows"]
    preds = published.predict_rows(rows)
    full = [p for p, r in zip(preds, rows, strict=True) if r["parallel"].get("tp") and r["model"].get("layers")
            and r["measured"].get("throughput")]
    assert full and all(p.predicted is not None for p in full)  # every row with its degrees is predicted
    summary = published.summarize(preds)
    assert summary["median_abs_error"] <= 0.10 and summary["max_abs_error"] <= 0.20
    assert all(p.reason for p in preds if p.predicted is None)


def test_a_whole_job_row_without_its_degrees_says_why() -> None:
    row = {"id": "y", "model": {"name": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200,
                                "seq_len": 2048},
           "parallel": {"tp": None, "pp": None, "dp": 4}, "batch": {"micro_batch_size": 1, "global_batch": 64},
           "schedule": None, "gpu_type": "A100 80GB", "measured": {"throughput": 150,
                                                                    "throughput_unit": "achieved TFLOP/s per GPU"}}
    pred = published.predict_row(row, [row])
    assert pred.predicted is None and "degrees" in pred.reason
    row["parallel"] = {"tp": 2, "pp": 2, "dp": 4, "cp": 1}
    row["schedule"] = "1F1B"
    pred = published.predict_row(row, [row])
    assert pred.predicted is not None and 50 < pred.predicted < 312


@needs_dev
def test_the_shipped_stage_time_files_predict_what_the_published_row_predicts() -> None:
    from experiments.commands.baselines import compare
    from pipeline.space import Scenario
    from pipeline.spec import Cluster, ModelProfile, TrainingConfig

    root = Path(__file__).resolve().parents[2] / "experiments" / "configs"
    problem = Scenario(ModelProfile.load(root / "profiles" / "zb-1.5b-stages.json"),
                       Cluster.load(root / "clusters" / "zb-a100x8-stages.json"), 24,
                       TrainingConfig(runtime="megatron"))
    rows, _ = compare(problem, ["1f1b"])
    one_f_one_b = next(r for r in rows if r.method == "1f1b")
    per_gpu = 144 / (one_f_one_b.iteration_time / 1e3) / 8  # 24 micro-batches of 6 samples, 8 GPUs
    rows = json.loads(DEV.read_text())["rows"]
    row = next(r for r in rows if r["id"] == "zb_t4_1.5B_m24_1F1B")
    assert per_gpu == pytest.approx(published.predict_row(row, rows).predicted, rel=1e-3)


@pytest.mark.parametrize("gated", [False, True])
def test_megatrons_flop_formula_is_the_cost_models_matmul_flops(gated: bool) -> None:
    """Megatron's formula (no recomputation) counts what the cost model's per-layer FLOPs add up to."""
    from experiments.benchmarks.published_job import _gpt, megatron_flops
    from pipeline.parallelism import Parallelism, job_profile, model_flops
    model = {"name": "g", "layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 2816,
             "vocab": 32000, "seq_len": 2048, "activation": "swiglu" if gated else "gelu"}
    par = Parallelism(tp=2, dp=2, microbatch_size=2, global_batch=8)
    profile = job_profile(_gpt(model, tied=False), par, gpu="h100", seq_len=2048)
    assert model_flops(profile, par) == pytest.approx(megatron_flops(model, batch=8, recompute=False), rel=1e-9)


def test_infer_degrees_fills_a_node_with_tp_and_takes_the_pipelined_rows_flags() -> None:
    from experiments.benchmarks.published_job import infer_job_degrees
    flags = {"activation_recompute": "full", "ddp_impl": "local", "precision": "fp16"}
    known = {"id": "a", "parallel": {"tp": 8, "pp": 4}, "training_flags": {**flags, "other": 1}}
    row = {"id": "b", "parallel": {"tp": None, "pp": None, "dp": 2, "model_parallel_size_in_table": 96},
           "schedule": None}
    out = infer_job_degrees(row, [known, row])
    assert out["parallel"]["tp"] == 8 and out["parallel"]["pp"] == 12 and out["schedule"] == "1F1B"
    assert out["training_flags"] == flags
    assert infer_job_degrees(known, [known]) is None  # a row with its degrees is left alone
