"""``python -m experiments prove``, run as a user runs it."""

from __future__ import annotations

import json

import pytest

from experiments.cli import main
from pipeline.plan import Action, Plan, validate_plan
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, ModelProfile, TrainingConfig
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
FIELDS = {"plan_ms", "best_ms", "bound_ms", "gap", "formulation", "status", "source", "plan_vs_best", "plan_fits",
          "solver_bound_ms", "analytic_bound_ms", "load_bound_ms", "actions", "seconds", "runtime"}


@pytest.fixture
def plan_file(tmp_path):
    profile, cluster = ModelProfile.load(PROFILE), Cluster.load(CLUSTER)
    fused = build_plan("1f1b", profile, cluster, microbatches=6, training=TrainingConfig(runtime="pytorch"))
    # 1F1B's order with each B run as I then W at once: the best order of these actions defers W (ZB-H1)
    split = tuple(tuple(x for s, op, m in acts for x in ([Action(s, "I", m), Action(s, "W", m)] if op == "B"
                                                         else [Action(s, op, m)])) for acts in fused.schedule)
    plan = Plan(fused.devices, fused.microbatches, fused.partition, fused.placement, split)
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


def test_the_proof_bounds_every_order_and_finds_the_better_one(plan_file) -> None:
    """What ``prove`` reports: the bound is below the best order found, which is below the plan's own
    (W deferred into the bubbles), and the better plan simulates to the best time."""
    from pipeline.exact import prove

    profile, cluster, training = ModelProfile.load(PROFILE), Cluster.load(CLUSTER), TrainingConfig(runtime="pytorch")
    proof = prove(Plan.load(plan_file), profile, cluster, training=training, seconds=3, workers=2)
    assert set(proof.summary()) >= FIELDS - {"runtime"}
    assert proof.bound <= proof.best_time <= proof.plan_time * (1 + 1e-12)
    assert proof.gap == pytest.approx(proof.best_time / proof.bound - 1)
    assert proof.best_time < proof.plan_time  # W deferred into the bubbles
    res = simulate(proof.plan, profile, cluster, training=training)
    assert res.valid and res.feasible
    assert res.iteration_time == pytest.approx(proof.best_time, rel=1e-12)


def test_text_output_names_every_figure_and_writes_the_better_plan(plan_file, tmp_path, capsys) -> None:
    out = tmp_path / "better.json"
    code = main(["prove", "--plan", str(plan_file), "--profile", PROFILE, "--cluster", CLUSTER, "--seconds", "3",
                 "--workers", "2", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    for word in ("plan_ms", "best_ms", "bound_ms", "gap", "formulation:", f"wrote {out}"):
        assert word in text
    validate_plan(Plan.load(out), num_layers=16, devices=4)


@pytest.mark.parametrize("extra,field", [
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "-3"], "--seconds"),
    (["--seconds", "inf"], "--seconds"),
])
def test_bad_seconds_is_one_error_line(plan_file, capsys, extra, field) -> None:
    code = main(["prove", "--plan", str(plan_file), "--profile", PROFILE, "--cluster", CLUSTER, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and field in err[0]


def test_missing_plan_is_one_error_line(tmp_path, capsys) -> None:
    code = main(["prove", "--plan", str(tmp_path / "none.json"), "--profile", PROFILE, "--cluster", CLUSTER,
                 "--seconds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "none.json" in err[0]


def test_plan_for_another_cluster_is_one_error_line(plan_file, capsys) -> None:
    code = main(["prove", "--plan", str(plan_file), "--profile", PROFILE, "--devices", "8", "--seconds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:")


def test_out_may_not_overwrite_the_input(plan_file, capsys) -> None:
    code = main(["prove", "--plan", str(plan_file), "--profile", PROFILE, "--cluster", CLUSTER, "--seconds", "1",
                 "--out", str(plan_file)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--out" in err[0]


def test_reproduce_prove_adds_the_proven_gaps(tmp_path) -> None:
    code = main(["reproduce", "--families", "gemma", "--sizes", "small", "--seq-lens", "2048", "--budget", "30",
                 "--microbatches", "4", "--methods", "megatron,adaptis", "--prove", "3", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "reproduce.md").read_text()
    section = text.split("## Proven gaps", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| gemma-small"))
    gap = float(row.split("|")[6].strip().rstrip("%"))
    assert 0 <= gap < 100


@pytest.mark.slow  # a solve that does not close in its time limit, interrupted
def test_ctrl_c_ends_the_proof_with_its_best_so_far(tmp_path) -> None:
    """Before issue 47 CP-SAT caught the Ctrl-C itself, ended only that solve, and the proof ran its full limit."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import reaped, sigint_default

    assert main(["search", "--model", "gemma-large", "--devices", "33", "--method", "adaptis", "--budget", "40",
                 "--out", str(tmp_path / "s")]) == 0
    cmd = [sys.executable, "-m", "experiments", "prove", "--plan", str(tmp_path / "s" / "plan.json"), "--model",
           "gemma-large", "--devices", "33", "--seconds", "300", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_default)
    with reaped(proc):
        time.sleep(15)  # into the solve (building the model of ~3,000 actions takes a few seconds)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # the hang guard: well under the 300 s limit
    assert proc.returncode == 130, err[-2000:]
    row = json.loads(out.strip().splitlines()[-1])
    assert row["interrupted"] is True and row["best_ms"] <= row["plan_ms"] and row["bound_ms"] > 0
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted after")
