"""GPU presets and the cluster builder."""

from __future__ import annotations

import argparse

import pytest

from experiments.common import add_cluster_args, resolve_cluster
from pipeline.errors import ConfigError
from pipeline.hardware import GPUS, build_cluster, get_gpu, gpu_names


def test_presets_cover_the_required_gpus_with_data_sheet_numbers() -> None:
    assert {"a100", "h100", "h200", "h800", "b200"} <= set(gpu_names())
    h100, h800, h200, a100 = (get_gpu(n) for n in ("h100", "h800", "h200", "a100"))
    assert (h100.peak_bf16_tflops, h100.hbm_tbps, h100.memory_gb, h100.nvlink_gbps) == (989.0, 3.35, 80.0, 450.0)
    assert h800.nvlink_gbps == 200.0
    assert (h800.peak_bf16_tflops, h800.hbm_tbps) == (h100.peak_bf16_tflops, h100.hbm_tbps)
    assert h200.memory_gb == 141.0 and h200.hbm_tbps > h100.hbm_tbps
    assert a100.peak_bf16_tflops == 312.0 and a100.nvlink_gbps == 300.0
    b200 = get_gpu("b200")  # HGX/DGX B200: 2.25 PFLOPS dense bf16, 8 TB/s HBM3e, 180 GB, NVLink 5
    assert (b200.peak_bf16_tflops, b200.hbm_tbps, b200.memory_gb, b200.nvlink_gbps) == (2250.0, 8.0, 180.0, 900.0)
    assert b200.matmul_flops_per_s > 2 * h100.matmul_flops_per_s and b200.sm_count > h100.sm_count
    for name, spec in GPUS.items():
        assert 0 < spec.matmul_efficiency <= 1 and 0 < spec.memory_efficiency <= 1
        if name == "cpu":  # the one-core preset for comparing with the CPU profiler
            continue
        assert spec.inter_node_gbps < spec.nvlink_gbps
        assert spec.matmul_flops_per_s < spec.peak_bf16_tflops * 1e12
        assert spec.ridge_flops_per_byte > 50  # matmuls with small token counts are memory-bound


@pytest.mark.parametrize("alias,name", [("H100", "h100"), ("h100-sxm-80gb", "h100"), ("H100_SXM5_80GB", "h100"),
                                        ("A100-80GB", "a100"), ("h200-141gb", "h200"), ("H800", "h800"),
                                        ("B200", "b200"), ("dgx_b200", "b200"), ("B200-SXM-180GB", "b200")])
def test_names_are_case_insensitive_with_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name
    assert get_gpu(get_gpu(alias)) is get_gpu(name)


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("v100")
    assert info.value.field == "gpu"
    for name in ("a100", "h100", "h200", "h800"):
        assert name in str(info.value)


def test_build_cluster_uses_the_presets_links() -> None:
    cluster = build_cluster("h100", devices=16, gpus_per_node=8)
    # capacity in GiB as nvidia-smi reports an "80GB" H100 (81559 MiB), less the default reserve
    assert cluster.devices == 16 and cluster.memory_gb == 79.6 and cluster.memory_reserve_gb == 4.0
    assert cluster.memory_limits_bytes[0] == (79.6 - 4.0) * 2**30
    assert build_cluster("cpu", devices=2).memory_reserve_gb == 0.0
    assert build_cluster("h100", devices=2, memory_reserve_gb=1.5).memory_reserve_gb == 1.5
    assert cluster.p2p_gbps == 450.0 and cluster.inter_node_gbps == 50.0
    assert cluster.same_node(0, 7) and not cluster.same_node(7, 8)
    assert cluster.transfer_seconds(0, 1, 1e8) < cluster.transfer_seconds(7, 8, 1e8)
    assert build_cluster("H800", devices=4).p2p_gbps == 200.0
    assert build_cluster("h200", devices=2, memory_gb=100).memory_gb == 100
    assert build_cluster("a100", devices=4).extra["gpu"] == "a100"


@pytest.mark.parametrize("devices,per_node", [(0, 8), (4, 0), (True, 8)])
def test_build_cluster_rejects_bad_sizes(devices: int, per_node: int) -> None:
    with pytest.raises(ConfigError):
        build_cluster("h100", devices=devices, gpus_per_node=per_node)


def test_command_line_cluster_args_build_the_preset() -> None:
    parser = argparse.ArgumentParser()
    add_cluster_args(parser)
    cluster = resolve_cluster(parser.parse_args(["--gpu", "h800", "--devices", "16", "--gpus-per-node", "8"]))
    assert (cluster.devices, cluster.p2p_gbps, cluster.gpus_per_node) == (16, 200.0, 8)
    cluster = resolve_cluster(parser.parse_args(["--gpu", "b200", "--devices", "8"]))
    assert (cluster.p2p_gbps, cluster.memory_gb, cluster.extra["gpu"]) == (900.0, 179.1, "b200")
