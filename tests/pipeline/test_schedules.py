"""Closed forms of the classic schedules (uniform stages, free communication) and validity of all."""

from __future__ import annotations

import pytest

from pipeline.megatron import megatron_partition
from pipeline.plan import validate_plan
from pipeline.schedules import NAMED_METHODS, build_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile

CASES = [(2, 4), (3, 7), (4, 8), (4, 16), (8, 16), (8, 64)]
# Stage costs: 4 layers per stage of f = b = w = 1 -> F = I = W = 4, B = 8.
F, I, W = 4.0, 4.0, 4.0
B = I + W


@pytest.mark.parametrize("p,m", CASES)
@pytest.mark.parametrize("method", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_closed_form(p: int, m: int, method: str) -> None:
    prof, cluster = uniform_profile(4 * p), ideal_cluster(p)
    result = simulate(build_plan(method, prof, cluster, microbatches=m), prof, cluster)
    assert result.valid, result.error
    assert result.iteration_time == pytest.approx((m + p - 1) * (F + B))


@pytest.mark.parametrize("p,m", [c for c in CASES if c[1] % c[0] == 0])
@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_closed_form(p: int, m: int, v: int) -> None:
    prof, cluster = uniform_profile(4 * p * v // 2 * 2), ideal_cluster(p)
    # v chunks per device, each stage of L / (p v) layers.
    per_stage = prof.num_layers // (p * v)
    f, b = per_stage * 1.0, per_stage * 2.0
    plan = build_plan(f"i1f1b-v{v}", prof, cluster, microbatches=m)
    result = simulate(plan, prof, cluster)
    assert result.valid, result.error
    # Per-device times F + B are v chunks' worth: m(F+B) + (p-1)(F+B)/v with F+B per device.
    per_device = v * (f + b)
    assert result.iteration_time == pytest.approx(m * per_device + (p - 1) * per_device / v)


@pytest.mark.parametrize("p,m", CASES)
def test_zb_h1_closed_form(p: int, m: int) -> None:
    prof, cluster = uniform_profile(4 * p, w=0.5), ideal_cluster(p)
    f, i, w = 4.0, 4.0, 2.0
    result = simulate(build_plan("zb-h1", prof, cluster, microbatches=m), prof, cluster)
    assert result.valid, result.error
    assert result.iteration_time == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))


@pytest.mark.parametrize("p,m", CASES)
@pytest.mark.parametrize("method", NAMED_METHODS)
def test_every_named_schedule_is_valid(p: int, m: int, method: str) -> None:
    prof, cluster = uniform_profile(8 * p), ideal_cluster(p)
    plan = build_plan(method, prof, cluster, microbatches=m)
    validate_plan(plan, num_layers=prof.num_layers, devices=p)
    result = simulate(plan, prof, cluster)
    assert result.valid, result.error
    ideal = m * prof.num_layers * 3.0 / p
    assert result.iteration_time >= ideal - 1e-9


def test_zero_bubble_family_beats_1f1b() -> None:
    prof, cluster = uniform_profile(32), ideal_cluster(4)
    t = {m: simulate(build_plan(m, prof, cluster, microbatches=16), prof, cluster).iteration_time
         for m in ("1f1b", "zb-h1", "zb-h2", "zbv")}
    assert t["zb-h1"] < t["1f1b"]
    assert t["zb-h2"] <= t["zb-h1"]
    assert t["zbv"] < t["1f1b"]


@pytest.mark.parametrize("p", [4, 8])
def test_memory_budgets_in_microbatches(p: int) -> None:
    """Peak activations follow each schedule's documented budget (in micro-batches of activations)."""
    m = 4 * p
    prof, cluster = uniform_profile(8 * p, params=0), ideal_cluster(p)
    per_mb = 8 * 1000  # activations of one micro-batch through one device's layers
    peaks = {meth: simulate(build_plan(meth, prof, cluster, microbatches=m), prof, cluster).peak_memory
             for meth in ("gpipe", "1f1b", "zbv", "v-half", "v-min")}
    assert max(peaks["gpipe"]) == pytest.approx(m * per_mb)
    assert [pk / per_mb for pk in peaks["1f1b"]] == pytest.approx([p - d for d in range(p)])
    assert max(peaks["zbv"]) <= p * per_mb + 1e-6
    assert max(peaks["v-half"]) <= (p + 2) / 2 * per_mb + 1e-6
    assert max(peaks["v-min"]) <= (p + 4) / 3 * per_mb + 1e-6
    assert max(peaks["v-min"]) < max(peaks["v-half"]) < max(peaks["zbv"])


def test_megatron_partition_puts_embedding_and_head_with_blocks(hetero_profile) -> None:
    part = megatron_partition(hetero_profile, 4)
    assert part[0][0] == 0 and part[-1][1] == hetero_profile.num_layers
    # 14 blocks over 4 stages: 4, 4, 3, 3 blocks, + embedding on the first, + head on the last.
    assert [b - a for a, b in part] == [5, 4, 3, 4]


def test_megatron_picks_its_best_chunk_count() -> None:
    prof, cluster = uniform_profile(32), ideal_cluster(4)
    mega = build_plan("megatron", prof, cluster, microbatches=16)
    times = {v: simulate(build_plan(f"i1f1b-v{v}" if v > 1 else "1f1b", prof, cluster, microbatches=16), prof, cluster
                         ).iteration_time for v in (1, 2, 4, 8)}
    assert simulate(mega, prof, cluster).iteration_time == pytest.approx(min(times.values()))
    assert mega.meta["chunks"] == min(times, key=times.get)


def test_unknown_method_is_a_clear_error() -> None:
    from pipeline.errors import PlanError

    prof, cluster = uniform_profile(8), ideal_cluster(2)
    with pytest.raises(PlanError, match="unknown method 'zb-h3'"):
        build_plan("zb-h3", prof, cluster, microbatches=4)


@pytest.mark.parametrize("p,m", CASES[:3])
def test_action_overhead_adds_to_every_action(p: int, m: int) -> None:
    """A per-action overhead o makes F cost F + o and a fused B (I + W) cost B + 2o."""
    from dataclasses import replace

    o = 0.5
    prof, cluster = replace(uniform_profile(4 * p), action_overhead=o), ideal_cluster(p)
    result = simulate(build_plan("1f1b", prof, cluster, microbatches=m), prof, cluster)
    assert result.iteration_time == pytest.approx((m + p - 1) * (F + B + 3 * o))


@pytest.mark.parametrize("p,m", CASES[:3])
def test_measured_fused_backward_prices_b(p: int, m: int) -> None:
    """With a measured fused-backward time on every layer, B costs that, not I + W."""
    from dataclasses import replace

    base = uniform_profile(4 * p)
    prof = replace(base, layers=tuple(replace(x, extra={"b_full": 1.5}) for x in base.layers))
    cluster = ideal_cluster(p)
    result = simulate(build_plan("1f1b", prof, cluster, microbatches=m), prof, cluster)
    assert result.iteration_time == pytest.approx((m + p - 1) * (F + 4 * 1.5))
    split = simulate(build_plan("zb-h1", prof, cluster, microbatches=m), prof, cluster)  # I and W keep b and w
    assert split.iteration_time == pytest.approx(simulate(build_plan("zb-h1", base, cluster, microbatches=m), base,
                                                          cluster).iteration_time)
