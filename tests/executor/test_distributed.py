"""Two gloo ranks under torchrun: every schedule kind matches the unpipelined model, the exported
CSV runs under PyTorch's runtime directly, and a failing rank ends the job instead of hanging."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from executor.replay import ReplayOptions, run_job, run_torchrun
from tests.executor.plans import named_plans, uneven_plan

pytestmark = pytest.mark.slow  # torchrun jobs

TOL = 1e-5
OPTIONS = ReplayOptions(model="tiny-hybrid", seq_len=32, steps=1, warmup=0, check=True, transfer_timeout=60)


def test_every_schedule_matches_one_process() -> None:
    """One torchrun job checks every plan (one test, not one per plan: under ``pytest -n`` each worker
    would run the whole job again for its share of the plans)."""
    plans = named_plans(microbatches=4)
    result = run_job([p for _, p in plans], OPTIONS, timeout=240)
    runs = {name: run for (name, _), run in zip(plans, result["runs"])}
    assert set(runs) == {"gpipe", "1f1b", "i1f1b-v2", "zb-h1", "zbv", "uneven-custom"}
    for name, run in runs.items():
        assert run["max_grad_error"] <= TOL, (name, run["max_grad_error"])
        assert run["loss_error"] <= TOL, (name, run["loss_error"])
        assert run["max_weight_error"] <= TOL, (name, run["max_weight_error"])  # after a few SGD steps
        ops = {e["action"].rstrip("0123456789")[-1] for e in run["timeline"]["events"]}
        if name in ("zb-h1", "zbv", "uneven-custom"):
            assert {"I", "W"} <= ops, name  # the I/W split really ran
        assert run["measured_iteration_time"] > 0, name
        assert {e["device"] for e in run["timeline"]["events"]} == {0, 1}, name


def test_pytorchs_own_lowering_matches_one_process_too() -> None:
    plans = [p for name, p in named_plans(microbatches=4) if name in ("zbv", "uneven-custom")]
    result = run_job(plans, replace(OPTIONS, lowering="torch"), timeout=240)
    for run in result["runs"]:
        assert run["max_grad_error"] <= TOL and run["loss_error"] <= TOL and run["max_weight_error"] <= TOL


def test_a_job_of_four_plans_takes_the_rounds_drift_out_and_keeps_the_raw_steps() -> None:
    import statistics

    plans = [p for name, p in named_plans(microbatches=4) if name in ("gpipe", "1f1b", "zb-h1", "zbv")]
    result = run_job(plans, replace(OPTIONS, check=False, steps=4), timeout=240)
    factors = result["round_factors"]
    assert len(factors) == 4 and all(f > 0 for f in factors)
    for run in result["runs"]:
        raw, adjusted = run["raw_iteration_times"], run["measured_iteration_times"]
        assert [a * f for a, f in zip(adjusted, factors)] == pytest.approx(raw)
        assert run["measured_iteration_time"] == statistics.median(adjusted)
        assert run["raw_iteration_time"] == pytest.approx(statistics.median(raw))


def test_plan_kinds_are_what_they_claim() -> None:
    plans = dict(named_plans(microbatches=4))
    assert plans["zbv"].placement == (0, 1, 1, 0)
    assert plans["i1f1b-v2"].placement == (0, 1, 0, 1)
    uneven = plans["uneven-custom"]
    assert uneven.stage_sizes == (3, 1, 2, 2) and uneven.placement == (1, 0, 0, 1)


def test_exported_csv_runs_under_pytorch_runtime(tmp_path: Path) -> None:
    from tests.executor.plans import tiny_profile

    plan = uneven_plan(tiny_profile(), 4)
    plan.save(tmp_path / "plan.json")
    plan.save_csv(tmp_path / "plan.csv")
    worker = Path(__file__).with_name("csv_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", "--monitor-interval=0.1", str(worker), str(tmp_path / "plan.json"),
           str(tmp_path / "plan.csv")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CSV-OK"))
    assert float(line.split()[1]) <= TOL


def test_replay_lowers_pytorch_orders_exactly() -> None:
    """Our replay of PyTorch's ZBV / interleaved order runs the very same lowered program (sends
    and receives included) as PyTorch's schedule class, so any time difference is not ours."""
    worker = Path(__file__).with_name("lowering_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", "--monitor-interval=0.1", str(worker)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("LOWERING-OK") == 2


def test_failing_rank_ends_the_job(tmp_path: Path) -> None:
    """A failing rank exits at once (executor.launch), so its peer stops on the broken connection (or
    the launcher stops it) instead of waiting out its --timeout. The --timeout (300 s) outlasts the
    hang guard (90 s), so a job that ends on its own did not end by a timeout; the outcome, not the
    clock, says why the surviving rank stopped."""
    plan = dict(named_plans(microbatches=4))["1f1b"]
    plan.save(tmp_path / "plan.json")
    args = [*OPTIONS.worker_args(), "--plan", str(tmp_path / "plan.json"), "--inject-failure", "1",
            "--timeout", "300"]
    proc = run_torchrun(2, args, timeout=90)
    assert "[killed after" not in proc.stdout, "the job hung after rank 1 failed:\n" + proc.stdout[-3000:]
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stdout
    assert "Timed out" not in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"Connection (reset|closed) by peer|SIGTERM", proc.stdout), proc.stdout[-3000:]


def test_finer_units_match_one_process() -> None:
    """Issue 15: a plan cutting inside blocks, one with the head's shards on both ranks (gradients
    all-reduced after the step) and one recomputing every stage, each under the I/W split."""
    from experiments.benchmarks.richer_units import UNITS
    from tests.executor.plans import richer_plans

    plans = richer_plans(microbatches=4)
    options = ReplayOptions(model="tiny-hybrid", seq_len=32, steps=1, warmup=0, check=True, transfer_timeout=60,
                            **UNITS)
    runs = run_job([p for _, p in plans], options, timeout=240)["runs"]
    for (name, _), run in zip(plans, runs):
        assert run["max_grad_error"] <= TOL, (name, run["max_grad_error"])
        assert run["loss_error"] <= TOL and run["max_weight_error"] <= TOL, name
        assert {e["action"].rstrip("0123456789")[-1] for e in run["timeline"]["events"]} >= {"I", "W"}
    split = dict(plans)["split-head"]
    assert split.placement[split.num_stages - 1] != split.placement[split.num_stages - 2]  # shards apart
    assert dict(plans)["recompute"].recompute == (True, True)


def test_the_collector_is_frozen_after_the_warm_up_and_stays_on() -> None:
    import gc

    from executor.launch import freeze_collector

    try:
        freeze_collector()
        assert gc.get_freeze_count() > 0 and gc.isenabled()  # frozen objects are never scanned; collection runs
    finally:
        gc.unfreeze()
    assert ReplayOptions().worker_args()[-2:] == ["--gc", "freeze"]
    assert ReplayOptions(gc="auto").worker_args()[-2:] == ["--gc", "auto"]


def test_ranks_of_one_host_share_a_clock_and_others_keep_the_barrier() -> None:
    from executor.launch import rank_offsets

    # rank 1 left the barrier 3 ms after rank 0: its step-relative times move 3 ms later
    assert rank_offsets([10.000, 10.003], ["box", "box"]) == pytest.approx([0.0, 0.003])
    assert rank_offsets([10.000, 99.0], ["a", "b"]) == [0.0, 0.0]  # two hosts: two clocks
