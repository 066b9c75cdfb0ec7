"""The device-balance benchmark's runtimes: PyTorch's memory, a runtime that frees at I, a weight store."""

from __future__ import annotations

import json

import pytest

from experiments.benchmarks.device_balance import main


def _tuner_ms(capsys, *flags: str) -> float:
    assert main(["--model", "gemma-medium", "--devices", "8", "--seq-len", "4096", "--microbatches", "32",
                 "--budget", "100", *flags]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return next(r["tuner_ms"] for r in rows if "tuner_ms" in r)


def test_weight_store_sits_between_pytorch_and_frees_at_i(capsys) -> None:
    """A weight store keeps less than PyTorch's graph and more than the matmul inputs alone; on
    gemma-medium 4k (8 devices, 32 micro-batches) memory binds, so its plan lands in between."""
    pytorch = _tuner_ms(capsys)
    store = _tuner_ms(capsys, "--weight-store")
    frees = _tuner_ms(capsys, "--frees-at-i")
    assert frees < store < pytorch


def test_two_runtimes_at_once_is_an_error(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--frees-at-i", "--weight-store"])
    assert "pick one" in capsys.readouterr().err


def test_gpu_sets_the_devices_of_baseline_and_plans(capsys) -> None:
    """--gpu prices the Megatron baseline and the plans on that device (H200: faster memory, more
    of it), and an unknown device is a usage error that names the flag."""
    def megatron_ms(gpu: str) -> float:
        assert main(["--model", "gemma-medium", "--devices", "8", "--seq-len", "4096", "--microbatches", "32",
                     "--budget", "20", "--gpu", gpu]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        return next(r["megatron_ms"] for r in rows if "megatron_ms" in r)

    assert megatron_ms("h200") < megatron_ms("h100")
    with pytest.raises(SystemExit):
        main(["--gpu", "no-such-gpu"])
    assert "--gpu" in capsys.readouterr().err
