"""pipeline.list_scheduler: valid orders under every knob, activation caps kept, each knob doing what it says."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from pipeline import engine
from pipeline.event_sim import StageCosts
from pipeline.list_scheduler import ListSchedulerConfig, budget_caps, list_schedule_python
from pipeline.plan import (
    Plan,
    even_partition,
    interleaved_placement,
    sequential_placement,
    v_placement,
    wave_placement,
)

PLACEMENTS = {"sequential": sequential_placement, "v": v_placement,
              "interleaved-2": lambda p: interleaved_placement(p, 2), "wave-3": lambda p: wave_placement(p, 3)}
CASES = [(p, m, kind) for p, m in ((2, 2), (2, 5), (3, 6), (4, 4), (4, 13), (6, 12)) for kind in PLACEMENTS]


def _costs(stages: int, devices: int, seed: int = 0) -> StageCosts:
    """Uneven stages (0.5-2 time units, 1-3 MB of activations, W keeping 40% of them), small transfers."""
    r = random.Random(seed)
    f = tuple(r.uniform(0.5, 2.0) for _ in range(stages))
    act = tuple(r.uniform(1e6, 3e6) for _ in range(stages))
    return StageCosts(f=f, i=tuple(x * r.uniform(0.8, 1.2) for x in f), w=tuple(x * r.uniform(0.5, 1.0) for x in f),
                      act=act, w_keep=tuple(a * 0.4 for a in act), comm=(0.1,) * stages,
                      static_bytes=(0.0,) * devices, memory_limit=(math.inf,) * devices)


def _schedule(p: int, m: int, kind: str, seed: int = 0, **knobs):
    placement = PLACEMENTS[kind](p)
    costs = _costs(len(placement), p, seed)
    config = ListSchedulerConfig(**knobs)
    return costs, placement, config, list_schedule_python(costs, placement, p, microbatches=m, config=config)


def _held(costs: StageCosts, acts, *, count_w: bool) -> float:
    """The most activation bytes a device's own order ever holds (what its cap limits): F adds its
    stage's activations; I frees them but what W still needs (``count_w``) or all of them; W frees the rest."""
    mem = peak = 0.0
    for a in acts:
        s = a.stage
        if a.op == "F":
            mem += costs.act[s]
        elif a.op == "I":
            mem -= costs.act[s] - costs.w_keep[s] if count_w else costs.act[s]
        elif a.op == "W" and count_w:
            mem -= costs.w_keep[s]
        elif a.op == "B":
            mem -= costs.act[s]
        peak = max(peak, mem)
    return peak


KNOBS = [{}, {"split_backward": False}, {"eager_w": True}, {"depth_first": False}, {"max_pending_w": 2},
         {"cap_counts_w": False}]


@pytest.mark.parametrize("p,m,kind", CASES)
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(k) or "defaults")
def test_every_knob_gives_a_complete_order_that_runs(p: int, m: int, kind: str, knobs: dict) -> None:
    costs, placement, config, order = _schedule(p, m, kind, **knobs)
    S = len(placement)
    plan = Plan(p, m, even_partition(S, S), placement, order)
    assert engine.check_schedule(plan) is None
    ops = ("F", "I", "W") if config.split_backward else ("F", "B")
    assert sorted((a.stage, a.op, a.mb) for acts in order for a in acts) == sorted(
        (s, op, k) for s in range(S) for op in ops for k in range(m))
    run = engine.simulate_schedule(costs, order, devices=p, microbatches=m)
    assert run.ok
    # the facade gives the same order on whichever engine is built
    assert engine.list_schedule(costs, placement, p, microbatches=m, config=config) == order


def test_budget_caps_are_budgets_times_a_devices_microbatch() -> None:
    costs = _costs(8, 4)
    placement = v_placement(4)  # device d holds stages d and 7 - d
    caps = budget_caps(costs, placement, 4, microbatches_per_device=(4.0, 2.5, 1.0, 0.0))
    per_mb = [costs.act[d] + costs.act[7 - d] for d in range(4)]
    assert caps == pytest.approx((4.0 * per_mb[0], 2.5 * per_mb[1], per_mb[2], per_mb[3]))  # at least one
    # a device's micro-batch is summed once per placement: another placement of the same costs gets its own
    other = tuple(s % 4 for s in range(8))
    assert budget_caps(costs, other, 4, microbatches_per_device=(1.0,) * 4) == tuple(
        costs.act[d] + costs.act[d + 4] for d in range(4))
    assert budget_caps(costs, placement, 4, microbatches_per_device=(4.0, 2.5, 1.0, 0.0)) == caps


@pytest.mark.parametrize("p,m,kind", CASES)
@pytest.mark.parametrize("budget", ["1f1b", "one", "two"])
@pytest.mark.parametrize("count_w", [True, False])
def test_no_device_holds_more_than_its_cap(p: int, m: int, kind: str, budget: str, count_w: bool) -> None:
    """The caps bind: with ``cap_counts_w`` every byte a device holds counts; without it, only the
    activations whose I has not run (ZB-H1's rule)."""
    placement = PLACEMENTS[kind](p)
    costs = _costs(len(placement), p, seed=1)
    budgets = {"1f1b": [float(p - d) for d in range(p)], "one": [1.0] * p, "two": [2.0] * p}[budget]
    caps = budget_caps(costs, placement, p, microbatches_per_device=budgets)
    config = ListSchedulerConfig(caps=caps, cap_counts_w=count_w)
    order = list_schedule_python(costs, placement, p, microbatches=m, config=config)
    for d, acts in enumerate(order):
        assert _held(costs, acts, count_w=count_w) <= caps[d] * (1 + 1e-9)
    unlimited = list_schedule_python(costs, placement, p, microbatches=m)
    if budget == "one" and m > 1:  # a cap of one micro-batch costs time and saves memory against none
        capped = engine.simulate_schedule(costs, order, devices=p, microbatches=m)
        free = engine.simulate_schedule(costs, unlimited, devices=p, microbatches=m)
        assert max(capped.peak) < max(free.peak) and capped.makespan >= free.makespan - 1e-9


@pytest.mark.parametrize("kind", ["sequential", "v"])
def test_split_backward_and_eager_w(kind: str) -> None:
    *_, fused = _schedule(4, 8, kind, split_backward=False)
    assert {a.op for acts in fused for a in acts} == {"F", "B"}
    *_, eager = _schedule(4, 8, kind, eager_w=True)
    for acts in eager:
        for k, a in enumerate(acts):
            if a.op == "I":
                assert acts[k + 1] == (a.stage, "W", a.mb)  # W right after its I
    *_, deferred = _schedule(4, 8, kind)
    assert any(acts[k + 1] != (a.stage, "W", a.mb) for acts in deferred for k, a in enumerate(acts) if a.op == "I")


@pytest.mark.parametrize("p,m,kind", CASES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_max_pending_w_runs_waiting_ws_before_any_forward(p: int, m: int, kind: str, k: int) -> None:
    *_, order = _schedule(p, m, kind, max_pending_w=k)
    for acts in order:
        pending = 0
        for a in acts:
            assert not (a.op == "F" and pending >= k)
            pending += (a.op == "I") - (a.op == "W")


def test_without_a_pending_limit_ws_fill_the_drain() -> None:
    """Unlimited memory, no limit: the zero-bubble heuristic defers every W it can into bubbles."""
    *_, order = _schedule(4, 12, "sequential")
    bounded = _schedule(4, 12, "sequential", max_pending_w=1)[-1]

    def most_pending(o) -> int:
        worst = 0
        for acts in o:
            pending = 0
            for a in acts:
                pending += (a.op == "I") - (a.op == "W")
                worst = max(worst, pending)
        return worst

    assert most_pending(order) > 2 * most_pending(bounded)


def test_depth_first_prefers_the_later_stage() -> None:
    """One device holding both chunks of a V: depth-first takes micro-batch 0 through stage 1 before
    starting micro-batch 1; breadth-first runs every stage-0 forward first."""
    costs = replace(_costs(2, 1), comm=(0.0, 0.0))  # no transfer between stages on one device
    deep = list_schedule_python(costs, (0, 0), 1, microbatches=3)[0]
    wide = list_schedule_python(costs, (0, 0), 1, microbatches=3, config=ListSchedulerConfig(depth_first=False))[0]
    assert [str(a) for a in deep[:2]] == ["0F0", "1F0"]
    forwards = [str(a) for a in wide if a.op == "F"]
    assert forwards == ["0F0", "0F1", "0F2", "1F0", "1F1", "1F2"]


def test_a_device_without_stages_gets_an_empty_order() -> None:
    costs = _costs(2, 3)
    order = engine.list_schedule(costs, (0, 1), 3, microbatches=4)
    assert order[2] == () and len(order[0]) == len(order[1]) == 12
    assert engine.simulate_schedule(costs, order, devices=3, microbatches=4).ok
