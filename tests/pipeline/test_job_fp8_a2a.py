"""FP8 linear GEMMs, node-limited routing and the overlapped EP all-to-all of the whole-job model
(pipeline.costs ``fp8_linear``, pipeline.job_layers, pipeline.parallelism; docs/whole-job.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import FP8_PEAK_RATIO, CostOptions, PassWork, layer_work
from pipeline.errors import ConfigError
from pipeline.hardware import get_gpu
from pipeline.job_layers import COMM_SMS, ep_all_to_all_seconds, exposed_all_to_all
from pipeline.parallelism import Parallelism, job_profile, validate_job


def dense(h: int = 8192) -> Architecture:
    specs = (LayerSpec("embedding"), LayerSpec(), LayerSpec("head"))
    return Architecture("d", "d", h, 32000, specs, num_attention_heads=64, num_key_value_heads=8,
                        intermediate_size=4 * h, gated_mlp=True)


def moe(experts: int = 64) -> Architecture:
    specs = (LayerSpec("embedding"), LayerSpec(), LayerSpec(ffn="moe"), LayerSpec("head"))
    return Architecture("m", "m", 2048, 32000, specs, num_attention_heads=16, num_key_value_heads=16,
                        intermediate_size=8192, num_experts=experts, num_experts_per_tok=8,
                        moe_intermediate_size=1024, num_shared_experts=1, gated_mlp=True)


def _linears(work_pass: PassWork) -> PassWork:
    return PassWork([op for op in work_pass.ops if op.kind == "matmul" and op.tag != "core"])


def test_fp8_runs_a_blocks_linear_gemms_at_the_fp8_peak_ratio_and_leaves_the_rest() -> None:
    gpu = replace(get_gpu("h100"), kernel_overhead_us=0.0)  # compare the rooflines alone
    arch = dense()
    for p in ("f", "i", "w"):
        bf = getattr(layer_work(arch, 1, seq_len=4096), p)
        f8 = getattr(layer_work(arch, 1, seq_len=4096, options=CostOptions(fp8_linear=True)), p)
        assert all(op.fp8 for op in _linears(f8).ops)
        # large GEMMs are compute-bound in both precisions: FP8 divides their time by the peak ratio
        assert _linears(bf).seconds(gpu) / _linears(f8).seconds(gpu) == pytest.approx(FP8_PEAK_RATIO["h100"])
        core = [PassWork([op for op in w.ops if op.tag == "core"]).seconds(gpu) for w in (bf, f8)]
        assert core[0] == core[1]  # the attention core stays bf16
        assert f8.vector_flops > bf.vector_flops  # the quantization kernels are paid
    for index in (0, 2):  # embedding and output head stay bf16
        plain = layer_work(arch, index, seq_len=4096)
        fp8 = layer_work(arch, index, seq_len=4096, options=CostOptions(fp8_linear=True))
        assert not any(op.fp8 for op in fp8.f.ops + fp8.i.ops + fp8.w.ops)
        assert fp8.f.seconds(gpu) == plain.f.seconds(gpu)


def test_fp8_keeps_the_router_in_bf16_and_caches_linear_inputs_in_one_byte() -> None:
    arch = moe()
    work = layer_work(arch, 2, seq_len=4096, options=CostOptions(fp8_linear=True))
    router = [op for op in work.f.ops if op.kind == "matmul" and op.mn == 4096 * arch.num_experts]
    assert router and not any(op.fp8 for op in router)
    block = layer_work(dense(), 1, seq_len=4096)
    block8 = layer_work(dense(), 1, seq_len=4096, options=CostOptions(fp8_linear=True))
    # every tensor W reads in a dense block is a linear layer's input: FP8 halves them, nothing else
    assert block8.w_act_bytes == pytest.approx(block.w_act_bytes / 2)
    assert block.act_bytes - block8.act_bytes == pytest.approx(block.w_act_bytes / 2)


def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores() -> None:
    with pytest.raises(ConfigError) as err:
        job_profile(dense(), Parallelism(fp8=True), gpu="a100", seq_len=4096)
    assert err.value.field == "fp8" and "A100" in str(err.value)
    assert "\n" not in str(err.value)


def test_node_limited_routing_bounds_the_copies_on_the_nic() -> None:
    gpu = get_gpu("h800")
    kw = dict(tokens=4096, hidden=7168, top_k=8, ep=64, stride=1, gpu=gpu, gpus_per_node=8)
    lat = 2 * gpu.inter_node_latency_us * 1e-6
    free = ep_all_to_all_seconds(**kw) - lat
    limited = {m: ep_all_to_all_seconds(**kw, max_nodes=m) - lat for m in (1, 2, 4, 8)}
    # unlimited: 63/64 of 8 copies on the NIC; at most m target nodes: m * 7/8 of them (8 nodes)
    for m, t in limited.items():
        ib = m * 7 / 8 / (63 / 64 * 8) * free
        nv = 8 * 7 / 8 * 4096 * 7168 * 4 / (gpu.nvlink_gbps * 1e9)  # forwarded inside the node
        assert t == pytest.approx(max(ib, nv))
    assert limited[1] <= limited[2] < limited[4] < free  # below 2 nodes NVLink forwarding sets the time
    # a group inside one node never touches the NIC: the limit changes nothing there
    inside = dict(kw, ep=8)
    assert ep_all_to_all_seconds(**inside, max_nodes=4) == ep_all_to_all_seconds(**inside)


def test_fp8_dispatch_moves_one_byte_each_way_out_of_the_two_transfers() -> None:
    gpu = get_gpu("h800")
    kw = dict(tokens=4096, hidden=7168, top_k=8, ep=64, stride=1, gpu=gpu, gpus_per_node=8)
    lat = 2 * gpu.inter_node_latency_us * 1e-6
    ratio = (ep_all_to_all_seconds(**kw, fp8=True) - lat) / (ep_all_to_all_seconds(**kw) - lat)
    assert ratio == pytest.approx((1 + 4 / 128 + 2) / 4)  # FP8 dispatch + scales, bf16 combine


@pytest.mark.parametrize("a2a,compute", [(5.0, 20.0), (20.0, 5.0), (10.0, 10.0)])
def test_the_overlapped_all_to_all_is_bounded_by_the_compute_and_pays_its_sms(a2a: float, compute: float) -> None:
    gpu = get_gpu("h800")
    tax = COMM_SMS / gpu.sm_count
    assert exposed_all_to_all(a2a, compute, overlap=0.0, gpu=gpu) == a2a
    full = exposed_all_to_all(a2a, compute, overlap=1.0, gpu=gpu)
    hidden = min(a2a, compute)
    assert full == pytest.approx(a2a - hidden * (1 - tax))
    assert full >= a2a - compute  # never hides more than the compute beside it
    half = exposed_all_to_all(a2a, compute, overlap=0.5, gpu=gpu)
    assert full <= half <= a2a


def test_job_profile_hides_only_the_moe_layers_all_to_all() -> None:
    arch = moe()
    base = Parallelism(dp=16, ep=16)
    kw = dict(gpu="h800", seq_len=4096, gpus_per_node=8)
    plain = job_profile(arch, base, **kw)
    over = job_profile(arch, replace(base, ep_overlap=1.0), **kw)
    limited = job_profile(arch, replace(base, moe_max_nodes=1), **kw)
    assert over.layers[1] == plain.layers[1]  # the dense block has no all-to-all
    assert over.layers[2].f < plain.layers[2].f and over.layers[2].b < plain.layers[2].b
    assert over.layers[2].w == plain.layers[2].w
    assert limited.layers[2].f < plain.layers[2].f
    fp8 = job_profile(arch, replace(base, fp8=True), **kw)
    assert fp8.layers[1].f < plain.layers[1].f and fp8.layers[3].f == plain.layers[3].f  # head bf16
    assert fp8.layers[2].act_bytes < plain.layers[2].act_bytes


@pytest.mark.parametrize("field,value", [("ep_overlap", 1.5), ("ep_overlap", -0.1), ("ep_overlap", True),
                                         ("moe_max_nodes", -1), ("moe_max_nodes", 2.5), ("fp8", "yes")])
def test_bad_knobs_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        validate_job(moe(), replace(Parallelism(dp=8, ep=8), **{field: value}), seq_len=4096)
    assert err.value.field == field and "\n" not in str(err.value)


def test_selective_frees_what_fp8_kept_not_the_bf16_size() -> None:
    from pipeline.job_layers import selective_recompute

    gpu = get_gpu("h100")
    kw = dict(tokens=4096, tp=1, sequence_parallel=False, gpu=gpu)
    arch = dense(2048)
    plain, _ = selective_recompute(arch, arch.layers[1], **kw)
    fp8, _ = selective_recompute(arch, arch.layers[1], **kw, fp8=True)
    assert fp8 == pytest.approx(plain / 2)  # both norm outputs are linear inputs, kept in FP8
    m = moe()
    plain, _ = selective_recompute(m, m.layers[2], **kw)
    fp8, _ = selective_recompute(m, m.layers[2], **kw, fp8=True)
    assert plain / 2 < fp8 < plain  # the router's input stays bf16
    # what selective drops never exceeds what the FP8 block keeps
    work = layer_work(m, 2, seq_len=4096, options=CostOptions(fp8_linear=True))
    assert fp8 < work.act_bytes
