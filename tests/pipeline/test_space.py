"""The plan space's helpers: memory-filling activation budgets, the evaluator's cached partitions."""

from __future__ import annotations

import pytest

from pipeline.balance import device_balanced_sizes
from pipeline.hardware import build_cluster
from pipeline.space import Candidate, Evaluator, Problem, make_placement, memory_budgets
from pipeline.zoo import zoo_profile


@pytest.mark.parametrize(("kind", "chunks"), [("sequential", 1), ("interleaved", 2), ("v", 2), ("wave", 3)])
def test_memory_budgets_fill_memory_and_fit(kind: str, chunks: int) -> None:
    profile = zoo_profile("gemma-small", seq_len=4096)
    cluster = build_cluster("h100", devices=4, gpus_per_node=8).with_memory(40)
    problem = Problem(profile, cluster, 32)
    ev = Evaluator(problem)
    placement = make_placement(kind, 4, chunks)
    sizes = ev.balanced_sizes(placement)
    costs = ev.costs(sizes, placement)
    budgets = memory_budgets(costs, placement, 4)
    per_mb = [sum(a for a, d in zip(costs.act, placement) if d == dev) for dev in range(4)]
    for d in range(4):  # static memory plus the budget's activations is exactly the limit
        assert costs.static_bytes[d] + budgets[d] * per_mb[d] == pytest.approx(costs.memory_limit[d])
    result = ev.result(Candidate(sizes, placement, "list", budgets, cap_counts_w=True))
    assert result.feasible
    deeper = ev.result(Candidate(sizes, placement, "list", tuple(2 * b for b in budgets), cap_counts_w=True))
    assert max(p / m for p, m in zip(deeper.peak_memory, deeper.memory_limit)) > \
        max(p / m for p, m in zip(result.peak_memory, result.memory_limit))


def test_evaluator_device_balanced_sizes_is_cached_and_matches() -> None:
    profile = zoo_profile("gemma-small", seq_len=2048, granularity="sublayer")
    problem = Problem(profile, build_cluster("h100", devices=4, gpus_per_node=8), 16)
    ev = Evaluator(problem)
    placement = make_placement("interleaved", 4, 3)
    got = ev.device_balanced_sizes(placement)
    assert got is ev.device_balanced_sizes(placement)
    assert got == device_balanced_sizes(profile, placement, problem.cluster, start=ev.balanced_sizes(placement))
    assert ev.calls == 0  # no simulator calls


def test_recompute_flags_follow_a_new_layout():
    """A placement move keeps 'recompute every stage' and drops per-stage flags (they name other stages)."""
    from pipeline.space import Candidate, recompute_for

    everywhere = Candidate((2, 2, 2, 2), (0, 1, 1, 0), "list", recompute=(True,) * 4)
    some = Candidate((2, 2, 2, 2), (0, 1, 1, 0), "list", recompute=(True, False, False, False))
    assert recompute_for(everywhere, 2) == (True, True) and recompute_for(everywhere, 4) == (True,) * 4
    assert recompute_for(some, 2) is None and recompute_for(some, 4) == some.recompute
    assert recompute_for(Candidate((4, 4), (0, 1), "list"), 4) is None
