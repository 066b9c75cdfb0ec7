"""Our named schedules against the orders PyTorch 2.13 generates, fed through our simulator."""

from __future__ import annotations

import random

import pytest

from pipeline.plan import (
    Plan,
    even_partition,
    interleaved_placement,
    parse_torch_cell,
    sequential_placement,
    v_placement,
)
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from pipeline.spec import LayerCost, ModelProfile, TrainingConfig
from tests.conftest import ideal_cluster

sv = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

# PyTorch schedule name -> (our method or None, stages per rank, placement kind)
TORCH_SCHEDULES = {
    "1F1B": ("1f1b", 1, "sequential"),
    "GPipe": ("gpipe", 1, "sequential"),
    "Interleaved1F1B": ("i1f1b-v2", 2, "interleaved"),
    "LoopedBFS": ("looped-bfs", 2, "interleaved"),
    "InterleavedZeroBubble": (None, 2, "interleaved"),
    "ZBVZeroBubble": ("zbv", 2, "v"),
    "DualPipeV": ("dualpipev", 2, "v"),
}
CASES = [(2, 4), (4, 8), (4, 16), (8, 16)]
# Memory rules: PyTorch's (the default: on later stages I keeps the graph and W's gradients, so a
# deferred W holds a whole micro-batch) and a runtime whose I frees what W does not need (the
# rule the schedules' activation budgets were written for).
RUNTIMES = {"pytorch": TrainingConfig(), "frees-at-i": TrainingConfig(input_backward_keeps_graph=False)}
# Under PyTorch's memory our DualPipeV (the list scheduler capped at p+1 micro-batches, deferred
# W's counted whole) is up to 3.4% slower than PyTorch's hand-made order, at no less memory
# (p=8, m=16: 243.8 against 235.8 time units): a known gap of the greedy list scheduler.
SLOWER = {("DualPipeV", "pytorch"): 0.05}


def _profile(layers: int, seed: int) -> ModelProfile:
    rng = random.Random(seed)
    het = seed > 0
    return ModelProfile("p", tuple(LayerCost(f"l{i}", "x", rng.uniform(0.5, 2) if het else 1.0, 1.0,
                                             rng.uniform(0.3, 1.5) if het else 1.0, 1000, 1000, 0)
                                   for i in range(layers)))


def _torch_plan(name: str, p: int, m: int, layers: int) -> Plan:
    _, spr, kind = TORCH_SCHEDULES[name]
    ops = sv.get_schedule_ops(name, p, m, num_stages_per_rank=spr)
    placement = {"sequential": sequential_placement(p), "interleaved": interleaved_placement(p, 2),
                 "v": v_placement(p)}[kind]
    schedule = [[x for a in row if a is not None for x in parse_torch_cell(str(a))] for row in ops]
    return Plan(p, m, even_partition(layers, p * spr), placement, schedule)


def _cases():
    for name in TORCH_SCHEDULES:
        for p, m in CASES:
            for seed in (0, 1, 2):
                yield name, p, m, seed


# What our validator rejects of PyTorch 2.13's orders, recorded: the single-stage 1F1B order that
# get_schedule_ops returns for the last rank starts at micro-batch 1 and ends at micro-batch M.
REJECTED = {"1F1B"}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("name,p,m,seed", list(_cases()))
def test_ours_no_worse_than_pytorch(name: str, p: int, m: int, seed: int, runtime: str) -> None:
    ours_method, spr, _ = TORCH_SCHEDULES[name]
    layers = 2 * p * spr
    prof, cluster = _profile(layers, seed), ideal_cluster(p)
    training = RUNTIMES[runtime]
    theirs = simulate(_torch_plan(name, p, m, layers), prof, cluster, training=training)
    if name in REJECTED:
        assert not theirs.valid
        assert f"names micro-batch {m}" in theirs.error
    else:
        assert theirs.valid, theirs.error
    if ours_method is None:
        return
    ours = simulate(build_plan(ours_method, prof, cluster, microbatches=m,
                               partition=even_partition(layers, p * spr), training=training), prof,
                    cluster, training=training)
    assert ours.valid, ours.error
    if theirs.valid:
        assert ours.iteration_time <= theirs.iteration_time * (1 + SLOWER.get((name, runtime), 1e-9))
