"""Deployment targets: what each runtime can run, and our exports run by the runtimes' own code
(torchtitan 0.3.0 builds and trains from our fragment; megatron-core 0.16.1's own schedule tables
give the order we call Megatron's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.base import Budget
from agents.target_search import target_searcher
from pipeline import zoo
from pipeline.balance import balanced_sizes
from pipeline.candidates import Candidate, Scenario, materialize
from pipeline.errors import ConfigError
from pipeline.hardware import build_cluster
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Action, interleaved_placement, v_placement, wave_placement
from pipeline.schedules import build_plan
from pipeline.targets import (
    is_v_placement,
    looped_chunks,
    megatron_args,
    megatron_layout,
    target_reason,
    torchtitan_fqns,
    torchtitan_fragment,
    torchtitan_schedule_name,
)

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    profile = zoo.zoo_profile("tiny-hybrid")
    cluster = build_cluster("h100", devices=2)
    return profile, cluster, Scenario(profile, cluster, 4)


def test_what_each_target_runs(tiny) -> None:
    profile, cluster, scenario = tiny
    zbv = build_plan("zbv", profile, cluster, microbatches=4)
    i1f1b = build_plan("i1f1b-v2", profile, cluster, microbatches=4)
    wave = materialize(Candidate((2, 1, 1, 2, 1, 1), wave_placement(2, 3), "list"), scenario)
    listed = materialize(Candidate((2, 2, 2, 2), interleaved_placement(2, 2), "list", (2.0, 2.0)), scenario)
    assert all(target_reason("executor", p, profile) is None for p in (zbv, i1f1b, wave, listed))
    assert target_reason("torchtitan", zbv, profile) is None and target_reason("torchtitan", listed, profile) is None
    assert "neither" in target_reason("torchtitan", wave, profile)
    assert target_reason("megatron", i1f1b, profile) is None
    assert "looped" in target_reason("megatron", zbv, profile)
    assert "own interleaved 1F1B order" in target_reason("megatron", listed, profile)
    assert looped_chunks(v_placement(2), 2) is None and looped_chunks(interleaved_placement(4, 3), 4) == 3
    with pytest.raises(ConfigError, match="Megatron"):
        megatron_args(listed, profile)


def test_models_a_target_cannot_express() -> None:
    profile = zoo.zoo_profile("tiny-hybrid")
    no_embed = type(profile)(profile.name, profile.layers[1:])
    plan = build_plan("1f1b", no_embed, build_cluster("h100", devices=2), microbatches=2)
    assert "embedding" in target_reason("megatron", plan, no_embed)
    with pytest.raises(ConfigError, match="embedding"):
        torchtitan_fqns(plan, no_embed)


def test_megatron_layout_language(tiny) -> None:
    profile, cluster, _ = tiny
    plan = build_plan("i1f1b-v2", profile, cluster, microbatches=4, partition=((0, 3), (3, 4), (4, 6), (6, 8)))
    # stage s is layout entry s: virtual rank 0 of ranks 0 and 1, then virtual rank 1
    assert megatron_layout(plan, profile) == "Et*2|t|t*2|tL"


@pytest.mark.parametrize(("devices", "chunks", "microbatches"), [(4, 1, 8), (2, 2, 4), (4, 2, 8), (4, 3, 12),
                                                                 (2, 4, 6), (8, 2, 16)])
def test_our_megatron_order_is_megatron_cores(devices: int, chunks: int, microbatches: int) -> None:
    """Rebuild each rank's order from megatron-core's own schedule table and warm-up count."""
    mc = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    from pipeline.targets import megatron_group_size

    g = megatron_group_size(devices, microbatches)
    table = mc.get_schedule_table(microbatches, chunks, g)
    ours = interleaved_order(devices, chunks, microbatches) if chunks > 1 else one_f_one_b_order(devices, microbatches)
    for rank in range(devices):
        comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: devices, rank=lambda r=rank: r),
                               virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None)
        total, _, warm, rest = mc.get_pp_rank_microbatches(microbatches, chunks, g, p2p_communicator=comm)

        def fwd(k: int, rank: int = rank) -> Action:
            mb, c = table[k]
            return Action(c * devices + rank, "F", mb)

        def bwd(k: int, rank: int = rank) -> Action:
            mb, c = table[k]
            return Action((chunks - 1 - c) * devices + rank, "B", mb)

        theirs = [fwd(k) for k in range(warm)]
        for k in range(rest):
            theirs += [fwd(warm + k), bwd(k)]
        theirs += [bwd(k) for k in range(rest, total)]
        assert list(ours[rank]) == theirs, rank


@pytest.mark.slow  # torchrun jobs
def test_torchtitan_builds_and_trains_our_plans(tiny, tmp_path: Path) -> None:
    """torchtitan's own _pipeline_module_split and _build_pipeline_schedule, fed our fragments,
    run the torchtitan-target search's plan and a plan of the other placement style (V, or loop
    with an I/W-split list order); gradients and weights after 2 SGD steps equal the unpipelined model's."""
    pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    profile, cluster, scenario = tiny
    pl = interleaved_placement(2, 2)
    searched = target_searcher("torchtitan", 2).search(scenario, budget=Budget(sim_calls=40)).plan
    plans = {"searched": searched}
    if is_v_placement(searched.placement, 2):  # the other style too: a loop plan with an I/W-split list order
        plans["loop-list"] = materialize(Candidate(balanced_sizes(profile, pl, cluster), pl, "list", (2.0, 2.0)),
                                         scenario)
    else:
        plans["zbv"] = build_plan("zbv", profile, cluster, microbatches=4)
    fragments = []
    for name, plan in plans.items():
        assert target_reason("torchtitan", plan, profile) is None
        plan.save_csv(tmp_path / f"{name}.csv")
        path = tmp_path / f"{name}.toml"
        path.write_text(torchtitan_fragment(plan, profile, csv_path=str(tmp_path / f"{name}.csv")))
        fragments.append(str(path))
    worker = Path(__file__).with_name("torchtitan_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.1", "--rdzv-endpoint=localhost:0", str(worker), *fragments]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, start_new_session=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [x.split() for x in proc.stdout.splitlines() if x.startswith("TITAN-OK")]
    assert len(lines) == len(plans)
    for (name, plan), (_, schedule, grad_err, weight_err, stages) in zip(plans.items(), lines):
        assert schedule == torchtitan_schedule_name(plan), name
        assert stages == f"stages={plan.num_stages}", name  # torchtitan built every stage of the plan
        assert float(grad_err) <= TOL and float(weight_err) <= TOL, name
