"""The device-balance benchmark's runtimes: PyTorch's memory, a runtime that frees at I, a weight store."""

from __future__ import annotations

import json

import pytest

from experiments.benchmarks.device_balance import main, rows
from pipeline.hardware import build_cluster


def _plan_row(runtime: str = "pytorch", *, gpu: str = "h100", budget: str = "100") -> dict:
    """The row of the tuner's plan against Megatron's on gemma-medium 4k, 8 devices, 32 micro-batches."""
    found = rows("gemma-medium", build_cluster(gpu, devices=8, gpus_per_node=8), 32, gpu=gpu, seq_len=4096,
                 budget=budget, runtime=runtime)
    return next(r for r in found if "tuner_ms" in r)


def test_weight_store_sits_between_pytorch_and_frees_at_i() -> None:
    """A weight store keeps less than PyTorch's graph and more than the matmul inputs alone; on
    gemma-medium 4k (8 devices, 32 micro-batches) memory binds, so its plan lands in between."""
    pytorch, store, frees = (_plan_row(runtime)["tuner_ms"] for runtime in ("pytorch", "weight-store", "frees-at-i"))
    assert frees < store < pytorch


def test_two_runtimes_at_once_is_an_error(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--frees-at-i", "--weight-store"])
    assert "pick one" in capsys.readouterr().err


def test_gpu_sets_the_devices_of_baseline_and_plans(capsys) -> None:
    """--gpu prices the Megatron baseline and the plans on that device (H200: faster memory, more
    of it), and an unknown device is a usage error that names the flag."""
    h200, h100 = (_plan_row(gpu=gpu, budget="20") for gpu in ("h200", "h100"))
    assert h200["megatron_ms"] < h100["megatron_ms"]
    assert h200["speedup"] == h200["megatron_ms"] / h200["tuner_ms"]
    with pytest.raises(SystemExit):
        main(["--gpu", "no-such-gpu"])
    assert "--gpu" in capsys.readouterr().err


def test_prints_one_json_line_per_row(capsys) -> None:
    assert main(["--model", "gemma-small", "--devices", "4", "--microbatches", "8", "--budget", "10"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any("placement" in x for x in lines) and any("tuner_ms" in x for x in lines)
    assert [x["device"] for x in lines if "device" in x] == [0, 1, 2, 3]
