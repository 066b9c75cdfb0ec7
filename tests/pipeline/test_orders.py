"""pipeline.orders: the fixed orders are complete, runnable schedules with the shape each one is named for."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from pipeline.engine import check_schedule, simulate_schedule
from pipeline.errors import PlanError
from pipeline.event_sim import StageCosts
from pipeline.orders import gpipe_order, interleaved_order, looped_bfs_order, one_f_one_b_order, zbv_order
from pipeline.plan import Plan, even_partition, interleaved_placement, sequential_placement, v_placement


def _costs(stages: int, devices: int, *, f: float = 1.0, i: float = 1.0, w: float = 1.0) -> StageCosts:
    """Uniform stages, one activation byte per (stage, micro-batch), W keeping half of it, no transfers."""
    return StageCosts(f=(f,) * stages, i=(i,) * stages, w=(w,) * stages, act=(1.0,) * stages,
                      w_keep=(0.5,) * stages, comm=(0.0,) * stages, static_bytes=(0.0,) * devices,
                      memory_limit=(math.inf,) * devices)


def _check(order, placement: tuple[int, ...], devices: int, microbatches: int, *, split: bool):
    """The order is complete (every F and B, or I and W, of every stage and micro-batch exactly once,
    each on its stage's device) and runs to the end (no action waits forever on what it needs)."""
    stages = len(placement)
    plan = Plan(devices, microbatches, even_partition(stages, stages), placement, order)
    assert check_schedule(plan) is None
    ops = Counter((a.stage, a.op, a.mb) for acts in order for a in acts)
    want = ("F", "I", "W") if split else ("F", "B")
    assert ops == Counter((s, op, m) for s in range(stages) for op in want for m in range(microbatches))
    run = simulate_schedule(_costs(stages, devices), order, devices=devices, microbatches=microbatches,
                            record_timeline=True)
    assert run.ok, run.ran
    return run


CASES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 5), (3, 3), (4, 4), (4, 6), (4, 8), (5, 7)]


@pytest.mark.parametrize("p,m", CASES)
def test_gpipe_runs_every_forward_then_every_backward(p: int, m: int) -> None:
    order = gpipe_order(p, m)
    _check(order, sequential_placement(p), p, m, split=False)
    for d, acts in enumerate(order):
        assert [str(a) for a in acts] == [f"{d}F{k}" for k in range(m)] + [f"{d}B{k}" for k in range(m)]


@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_warms_up_p_minus_d_deep_then_alternates(p: int, m: int) -> None:
    order = one_f_one_b_order(p, m)
    run = _check(order, sequential_placement(p), p, m, split=False)
    for d, acts in enumerate(order):
        warm = min(p - d - 1, m)
        assert "".join(a.op for a in acts) == "F" * warm + "FB" * (m - warm) + "B" * warm
        depth = min(p - d, m)  # forwards before the first backward
        assert [a.mb for a in acts if a.op == "F"] == list(range(m))
        assert [a.mb for a in acts if a.op == "B"] == list(range(m))
        # what 1F1B is for: device d never holds more than p - d micro-batches of activations
        assert run.peak[d] == depth


@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_and_gpipe_take_the_closed_form(p: int, m: int) -> None:
    """(m + p - 1)(F + B) on uniform stages without transfers (DESIGN.md, reference facts)."""
    for order in (gpipe_order(p, m), one_f_one_b_order(p, m)):
        run = simulate_schedule(_costs(p, p, f=1.0, i=1.5, w=0.5), order, devices=p, microbatches=m)
        assert run.makespan == pytest.approx((m + p - 1) * 3.0)
    # 1F1B's memory beats GPipe's whenever there are more micro-batches than devices
    g = simulate_schedule(_costs(p, p), gpipe_order(p, m), devices=p, microbatches=m)
    o = simulate_schedule(_costs(p, p), one_f_one_b_order(p, m), devices=p, microbatches=m)
    assert max(o.peak) == min(p, m) and max(g.peak) == m


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 4), (2, 3, 6), (4, 2, 8), (4, 2, 6), (4, 3, 12), (3, 2, 7),
                                   (4, 4, 4)])
def test_interleaved_goes_round_robin_over_chunks_in_groups(p: int, v: int, m: int) -> None:
    order = interleaved_order(p, v, m)
    run = _check(order, interleaved_placement(p, v), p, m, split=False)
    # the group: p micro-batches when p divides m, else the smallest divisor of m that is >= p
    g = p if m % p == 0 else min(k for k in range(p, m + 1) if m % k == 0)
    for d, acts in enumerate(order):
        assert {a.stage for a in acts} == {c * p + d for c in range(v)}
        fwd = [a for a in acts if a.op == "F"]
        bwd = [a for a in acts if a.op == "B"]
        # forwards: g micro-batches through chunk 0, then the same g through chunk 1, ...; backwards
        # the same, from the last chunk down
        assert [a.stage // p for a in fwd] == [(k // g) % v for k in range(m * v)]
        assert [a.stage // p for a in bwd] == [v - 1 - (k // g) % v for k in range(m * v)]
        for c in range(v):
            assert [a.mb for a in fwd if a.stage // p == c] == list(range(m))
        warm = min(2 * (p - d - 1) + (v - 1) * g, m * v)
        assert "".join(a.op for a in acts).index("B") == min(warm + 1, m * v)
        assert run.peak[d] <= min(warm + 1, m * v)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_interleaved_takes_the_closed_form(p: int, m: int) -> None:
    """m(F + B) + (p - 1)(F + B)/v on uniform stages without transfers (Megatron-LM's formula)."""
    for v in (2, 4):
        costs = _costs(p * v, p, f=1.0 / v, i=1.0 / v, w=1.0 / v)
        run = simulate_schedule(costs, interleaved_order(p, v, m), devices=p, microbatches=m)
        assert run.makespan == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    assert interleaved_order(4, 1, 8) == one_f_one_b_order(4, 8)


@pytest.mark.parametrize("p,v,m", [(2, 2, 3), (3, 2, 4), (4, 3, 4), (1, 2, 2)])
def test_looped_bfs_runs_a_chunk_for_every_microbatch_before_the_next(p: int, v: int, m: int) -> None:
    order = looped_bfs_order(p, v, m)
    _check(order, interleaved_placement(p, v), p, m, split=False)
    for d, acts in enumerate(order):
        chunks = [c * p + d for c in range(v)]
        want = [(s, "F", k) for s in chunks for k in range(m)] + [(s, "B", k) for s in reversed(chunks)
                                                                  for k in range(m)]
        assert [(a.stage, a.op, a.mb) for a in acts] == want


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (2, 8), (3, 5), (4, 7), (4, 8), (4, 16), (6, 11)])
def test_zbv_is_a_v_shaped_zero_bubble_order(p: int, m: int) -> None:
    order = zbv_order(p, m)
    run = _check(order, v_placement(p), p, m, split=True)
    for d, acts in enumerate(order):
        assert {a.stage for a in acts} == {d, 2 * p - 1 - d}
        ops = "".join(a.op for a in acts)
        assert ops.startswith("F" * (2 * (p - d) - 1))  # the first chunk's warm-up forwards
        for s in (d, 2 * p - 1 - d):  # each W after its own I
            pos = {(a.op, a.mb): k for k, a in enumerate(acts) if a.stage == s}
            assert all(pos[("I", k)] < pos[("W", k)] for k in range(m))
        assert run.peak[d] <= 2 * p  # V-ZB: about p micro-batches of both chunks' activations
    if m >= 2 * p:  # the steady state leaves (almost) no bubble: F + I + W per stage and micro-batch
        busy = 2 * m * 3.0
        assert run.makespan <= busy * 1.1  # 1F1B would take (m + p - 1) / m of it: 1.375 at p=4, m=8


@pytest.mark.parametrize("p,m", [(2, 2), (4, 6), (8, 1)])
def test_zbv_needs_2p_minus_1_microbatches(p: int, m: int) -> None:
    with pytest.raises(PlanError, match=f"at least {2 * p - 1} micro-batches"):
        zbv_order(p, m)


def _interleaved_by_the_definition(devices: int, chunks: int, microbatches: int) -> tuple:
    """Megatron-LM's interleaved 1F1B written action by action (the readable reference of the
    vectorised :func:`pipeline.orders.interleaved_order`; chunks = 1 is not 1F1B's warm-up)."""
    from pipeline.orders import _interleaved_group
    from pipeline.plan import Action

    g, total = _interleaved_group(devices, microbatches), microbatches * chunks

    def act(d: int, k: int, op: str) -> Action:
        c = (k // g) % chunks
        return Action((chunks - 1 - c if op == "B" else c) * devices + d, op, (k // (g * chunks)) * g + k % g)

    out = []
    for d in range(devices):
        warm = min(2 * (devices - d - 1) + (chunks - 1) * g, total)
        acts = [act(d, k, "F") for k in range(warm)]
        for k in range(total - warm):
            acts += [act(d, warm + k, "F"), act(d, k, "B")]
        out.append(tuple(acts + [act(d, k, "B") for k in range(total - warm, total)]))
    return tuple(out)


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 7, 8])
def test_the_vectorised_orders_are_the_definition_and_carry_the_engines_arrays(devices: int) -> None:
    import numpy as np

    from pipeline.engine import schedule_arrays
    from pipeline.orders import interleaved_order, one_f_one_b_order
    from pipeline.plan import Action

    for m in (1, 2, devices, 2 * devices + 1, 24):
        ofob = one_f_one_b_order(devices, m)
        plain = []
        for d in range(devices):
            warm = min(devices - d - 1, m)
            acts = [Action(d, "F", k) for k in range(warm)]
            for k in range(m - warm):
                acts += [Action(d, "F", warm + k), Action(d, "B", k)]
            plain.append(tuple(acts + [Action(d, "B", k) for k in range(m - warm, m)]))
        assert ofob == tuple(plain)
        for chunks in (2, 3, 4):
            order = interleaved_order(devices, chunks, m)
            assert order == _interleaved_by_the_definition(devices, chunks, m)
            rows, offsets = schedule_arrays(tuple(order))  # the arrays a plain tuple would give
            assert np.array_equal(order.arrays[0], rows) and list(order.arrays[1]) == offsets
