"""The prepared GPU check runs on the CPU at tiny widths, as CI runs it."""

from __future__ import annotations

import json
import math

import pytest

from experiments import gpu_check
from pipeline.zoo import list_models, load_zoo_architecture


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_zoo_layer_kind_is_measured_and_compared(result) -> None:
    """Every kind the executor builds as it is; the MTP block (DeepSeek-V3) and vision blocks run as
    attention+MLP stand-ins (``executor.layers.STAND_IN_KINDS``), so no measurement of them exists."""
    from executor.layers import STAND_IN_KINDS

    zoo_kinds = {spec.label for name in list_models() for spec in load_zoo_architecture(name).layers
                 if spec.kind not in STAND_IN_KINDS}
    assert "mtp" in {spec.kind for spec in load_zoo_architecture("deepseek-v3").layers}
    rows = [r for r in result["kinds"] if "error" not in r]
    assert len(rows) == len(result["kinds"])
    assert zoo_kinds <= {r["kind"] for r in rows}
    for r in rows:
        for key in ("f_ratio", "act_ratio"):
            assert r[key] is not None and math.isfinite(r[key]) and r[key] > 0, (r["model"], r["kind"], key)
    assert result["tiny"] and result["preset"] == "cpu" and result["dtype"] == "float32"


def test_plan_peaks_per_device_match_the_model_from_measured_kinds(result) -> None:
    plan = result["plan"]
    assert plan["method"] == "zb-h1" and len(plan["devices"]) == plan["stages"] == 4
    for d in plan["devices"]:
        # what each device really kept (autograd's saved tensors and the gradients PyTorch's I keeps
        # until W) vs the simulator's peak from the measured kinds
        assert d["kept_act_gib"] == pytest.approx(d["pred_kinds_act_gib"], rel=0.10), d
        assert d["kept_act_gib"] >= d["saved_act_gib"]
    # device 0 holds the most micro-batches in flight under ZB-H1
    assert plan["devices"][0]["pred_kinds_act_gib"] >= max(d["pred_kinds_act_gib"] for d in plan["devices"][1:-1])


def test_the_check_is_a_command_that_refuses_a_device_it_cannot_use(tmp_path, capsys) -> None:
    """``python -m experiments gpu-check`` ships with the product (issue 46); a device this torch
    lacks is one line naming --device, before any work."""
    from experiments.cli import main

    out = tmp_path / "check.json"
    assert main(["gpu-check", "--tiny", "--device", "cpu", "--skip-plan", "--models", "hybrid", "--out",
                 str(out)]) == 0
    assert json.loads(out.read_text())["tiny"] is True
    capsys.readouterr()
    assert main(["gpu-check", "--device", "tpu9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: field '--device'")


@pytest.mark.parametrize(("flags", "field"), [
    (["--microbatches", "100000"], "--microbatches"),
    (["--repeats", "1000000"], "--repeats"),
    (["--seq-len", "100000"], "--seq-len"),  # on a CPU: it hung past the fuzz's 60 s before
    (["--gpu", ""], "gpu"),
])
def test_sizes_past_the_check_are_one_line_before_any_work(flags, field, tmp_path, capsys) -> None:
    from experiments.cli import main

    assert main(["gpu-check", "--device", "cpu", *flags, "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: field") and field in err[0]
    assert not (tmp_path / "c.json").exists()


def test_an_out_that_is_a_folder_is_refused_before_any_work(tmp_path, capsys) -> None:
    from experiments.cli import main

    assert main(["gpu-check", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
