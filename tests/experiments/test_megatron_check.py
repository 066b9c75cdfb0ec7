"""The Megatron layout check of docs/deploy.md (issue 47): MTP layouts and flags without a value."""

from __future__ import annotations

import pytest

from experiments.megatron_check import main, read_megatron_args
from pipeline.schedules import build_plan
from pipeline.spec import Cluster, LayerCost, ModelProfile
from pipeline.targets import megatron_args

pytest.importorskip("megatron.core")


def _mtp_args() -> str:
    layers = ([LayerCost("e", "embedding", 1, 1, 1, 1000, 1000, 0)]
              + [LayerCost(f"l{i}", "attention+mlp", 1, 1, 1, 1000, 1000, 0) for i in range(6)]
              + [LayerCost("m", "mtp", 1, 1, 1, 1000, 1000, 0), LayerCost("h", "head", 1, 1, 1, 1000, 1000, 0)])
    profile = ModelProfile("mtp", tuple(layers))
    return megatron_args(build_plan("1f1b", profile, Cluster(devices=2, memory_gb=80), microbatches=4), profile)


def test_an_mtp_layout_with_valueless_flags_is_accepted(tmp_path, capsys) -> None:
    path = tmp_path / "megatron_args.txt"
    path.write_text(_mtp_args() + "--use-distributed-optimizer\n--sequence-parallel\n")
    assert read_megatron_args(path.read_text())["--use-distributed-optimizer"] is None
    assert main([str(path)]) == 0
    assert "mtp" in capsys.readouterr().out


def test_a_layout_megatron_refuses_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "megatron_args.txt"
    path.write_text(_mtp_args().replace("--num-layers 6", "--num-layers 7"))
    assert main([str(path)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "Megatron refuses it" in err[0]


def test_list_arguments_and_bad_lines() -> None:
    """Megatron's list arguments (``--recompute-modules layernorm moe_act``) keep every value; a
    line with two flags or a value without a flag is one clear error naming the line."""
    args = read_megatron_args("--recompute-modules layernorm moe_act\n--seq-length 4096\n")
    assert args == {"--recompute-modules": "layernorm moe_act", "--seq-length": "4096"}
    for bad in ("--a 1 --b 2\n", "4096\n"):
        with pytest.raises(ValueError, match="line 1"):
            read_megatron_args(bad)
