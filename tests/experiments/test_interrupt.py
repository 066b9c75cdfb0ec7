"""An interrupted search keeps the best plan it had found; Ctrl-C and SIGTERM end it (each wait on
the exit has a hang guard; how fast it exits is not a test's to assert)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.plan import Plan, validate_plan
from tests.conftest import ROOT, ended_by_ctrl_c, exit_after, reaped, sigint_default

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_search_leaves_its_best_plan(tmp_path, sig, code) -> None:
    """It keeps the finished methods' rows and the best plan so far, named by its method, and says where."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments", "search", "--profile", PROFILE, "--cluster", CLUSTER,
           "--microbatches", "16", "--method", "zbv,adaptis", "--budget", "1000000", "--out", str(out)]
    env = dict(os.environ, WANDB_MODE="disabled")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_default)
    def tuner_improved() -> bool:  # megatron and zbv have finished, and the tuner beat them
        return (out / "plan.json").exists() and json.loads((out / "plan.json").read_text())["meta"].get("method") \
            == "adaptis"

    with reaped(proc):
        deadline = time.monotonic() + 60
        while not tuner_improved() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tuner_improved(), "no plan of the tuner written while searching"
        time.sleep(0.5)
        shown, err = exit_after(proc, lambda: proc.send_signal(sig), timeout=30)
    assert proc.returncode == code, err[-2000:]
    table = shown[shown.index("(interrupted: the finished methods only)"):].splitlines()
    assert sorted(line.split()[0] for line in table[3:] if line.strip()) == ["megatron", "zbv"]
    plan = Plan.load(out / "plan.json")
    validate_plan(plan, num_layers=16, devices=4)
    assert plan.method == "adaptis"
    assert not (out / "plan.json.tmp").exists()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"megatron", "zbv"}
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"interrupted: kept the rows of 2 finished methods (megatron, zbv) in "
                                            f"{out / 'results.jsonl'} and the best plan so far (adaptis) in "
                                            f"{out / 'plan.json'}")


@pytest.mark.slow  # training
def test_interrupted_training_saves_and_resumes(tmp_path) -> None:
    """Ctrl-C during `train` stops at the next step, saves a checkpoint and a policy; --resume
    continues from that checkpoint up to the requested total."""
    from agents.rl.train import latest_checkpoint

    out = tmp_path / "train"
    base = [sys.executable, "-m", "experiments", "train", "--seed", "0", "--n-envs", "1", "--out", str(out),
            "--eval-every", "0", "--checkpoint-every", "128", "--n-steps", "64", "--no-progress"]
    env = dict(os.environ, WANDB_MODE="disabled")
    proc = subprocess.Popen([*base, "--timesteps", "1000000"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=sigint_default)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while latest_checkpoint(out) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert latest_checkpoint(out) is not None, "no checkpoint written while training"
        _, err = exit_after(proc, lambda: proc.send_signal(signal.SIGINT), timeout=60)
    assert proc.returncode == 130, err[-2000:]  # the shell's code for Ctrl-C, as `search` exits
    assert (out / "policy.pth").is_file()
    stopped_at = int(latest_checkpoint(out).stem.split("_")[1])
    assert 0 < stopped_at < 1_000_000
    total = stopped_at + 128
    done = subprocess.run([*base, "--timesteps", str(total), "--resume", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert latest_checkpoint(out).name == f"model_{total}.zip"


def _train(out, *extra: str) -> subprocess.Popen:
    """`train` with two worker processes, started as a terminal starts a job (its own process group)."""
    cmd = [sys.executable, "-m", "experiments", "train", "--seed", "0", "--n-envs", "2", "--vec", "subproc",
           "--out", str(out), "--eval-every", "0", "--n-steps", "64", "--no-progress", "--timesteps", "1000000",
           *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=sigint_default)


def _clean_stop(err: str) -> str:
    """The last line of an interrupted command's stderr, checked for tracebacks (the workers' too)."""
    for bad in ("Traceback", "EOFError", "ConnectionResetError", "BrokenPipeError", "KeyboardInterrupt"):
        assert bad not in err, err[-3000:]
    return err.strip().splitlines()[-1]


@pytest.mark.slow  # training
def test_ctrl_c_in_the_terminal_stops_training_and_its_workers_cleanly(tmp_path) -> None:
    """The terminal sends SIGINT to the whole process group, environment workers included: the
    workers ignore it, the parent saves a checkpoint, closes them and names what it kept."""
    from agents.rl.train import latest_checkpoint

    out = tmp_path / "train"
    proc = _train(out, "--checkpoint-every", "128")
    with reaped(proc):
        deadline = time.monotonic() + 120
        while latest_checkpoint(out) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert latest_checkpoint(out) is not None, "no checkpoint written while training"
        _, err = exit_after(proc, lambda: os.killpg(proc.pid, signal.SIGINT), timeout=60)
    assert ended_by_ctrl_c(proc.returncode), f"{proc.returncode}: {err[-2000:]}"
    last = _clean_stop(err)
    ckpt = latest_checkpoint(out)
    assert last.startswith("interrupted: ") and f"checkpoint saved -> {ckpt}" in last
    assert f"resume: --resume --out {out}" in last


def test_ctrl_c_before_the_first_checkpoint_says_so(tmp_path) -> None:
    """Interrupted while it labels states for imitation (before PPO and its stop-and-save)."""
    out = tmp_path / "train"
    proc = _train(out, "--imitation-states", "100000")
    with reaped(proc):
        deadline = time.monotonic() + 60
        while not out.is_dir() and time.monotonic() < deadline:  # `train` has checked --out: it is setting up
            time.sleep(0.05)
        time.sleep(1.0)
        _, err = exit_after(proc, lambda: os.killpg(proc.pid, signal.SIGINT), timeout=60)
    assert ended_by_ctrl_c(proc.returncode), f"{proc.returncode}: {err[-2000:]}"
    assert _clean_stop(err) == (f"interrupted: stopped before the first checkpoint; nothing to resume from in "
                                f"{out / 'checkpoints'} (run the same command again to start over)")


def _interrupt_when(cmd: list[str], ready, sig: int, *, wait: float = 90) -> tuple[int, str]:
    """Start ``cmd``, send ``sig`` once ``ready()`` holds, and return its exit code and stderr."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=sigint_default)
    with reaped(proc):
        deadline = time.monotonic() + wait
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert ready(), "the command never reached the point to interrupt"
        time.sleep(0.5)
        _, err = exit_after(proc, lambda: proc.send_signal(sig), timeout=30)
    return proc.returncode, err


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_sweep_keeps_its_finished_trials(tmp_path, sig, code) -> None:
    """Trial 0 (5 calls) finishes, trial 1 (a million calls) is interrupted: trial 0's row and plan are kept."""
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "experiments", "sweep", "--profile", PROFILE, "--cluster", CLUSTER,
           "--microbatches", "16", "--param", "budget=5,1000000", "--out", str(out)]
    rc, err = _interrupt_when(cmd, lambda: len(_lines(out / "trials.jsonl")) == 1, sig)
    assert rc == code, err[-2000:]
    last = _clean_stop(err)
    assert last == (f"interrupted: kept the rows of 1 finished trial of 2 in {out / 'trials.jsonl'} and the best "
                    f"plan so far (trial 0) in {out / 'best_plan.json'}")
    assert [r["budget"] for r in _lines(out / "trials.jsonl")] == [5]
    validate_plan(Plan.load(out / "best_plan.json"), num_layers=16, devices=4)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_evaluation_keeps_its_finished_scenarios(tmp_path, sig, code) -> None:
    """tiny-hybrid's tuner ends at once (its plan space is small); the synthetic draw after it is interrupted."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "experiments", "evaluate-agent", "--models", "tiny-hybrid", "--devices", "2",
           "--heldout", "1", "--methods", "adaptis", "--budget", "1000000", "--max-seconds", "300", "--out", str(out)]
    rc, err = _interrupt_when(cmd, lambda: len(_lines(out / "results.jsonl")) == 1, sig)
    assert rc == code, err[-2000:]
    assert _clean_stop(err) == (f"interrupted: kept the rows of 1 finished scenario of 2 in {out / 'results.jsonl'} "
                                f"and their summary in {out / 'summary.json'}")
    assert [r["scenario"] for r in _lines(out / "results.jsonl")] == ["tiny-hybrid"]
    assert json.loads((out / "summary.json").read_text())["adaptis"]["feasible"] == 1


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_workflow_names_the_files_it_kept(tmp_path, sig, code) -> None:
    """`run` on analytic costs, interrupted in its search after megatron: the costs it wrote and the
    finished method's search row are named, and that no plan is."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments", "run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4",
           "--method", "megatron,adaptis", "--budget", "1000000", "--max-seconds", "300", "--out", str(out)]
    rc, err = _interrupt_when(cmd, lambda: (out / "search_rows.jsonl").is_file(), sig)
    assert rc == code, err[-2000:]
    assert _clean_stop(err) == (f"interrupted: kept profile.json, cluster.json, search_rows.jsonl in {out} "
                                "(search_rows.jsonl: the rows of 1 finished method, megatron); the search had not "
                                "finished: no plan yet")
    (row,) = _lines(out / "search_rows.jsonl")
    assert row["method"] == "megatron" and row["iteration_time"] > 0 and row["feasible"]


@pytest.mark.slow  # a reproduce grid interrupted mid-way: about 11 s
def test_interrupted_reproduce_keeps_its_finished_cases(tmp_path) -> None:
    """Before issue 47 reproduce wrote only at its end: a Ctrl-C kept nothing."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments", "reproduce", "--families", "gemma", "--sizes", "small", "--seq-lens",
           "2048,4096,8192", "--methods", "megatron,adaptis", "--budget", "10s", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=sigint_default)
    rows = out / "reproduce.jsonl"
    with reaped(proc):
        deadline = time.monotonic() + 120
        while not (rows.exists() and rows.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rows.read_text().strip(), "no case finished"
        _, err = exit_after(proc, lambda: proc.send_signal(signal.SIGINT), timeout=60)
    assert ended_by_ctrl_c(proc.returncode), err[-2000:]
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    assert {r["seq_len"] for r in kept} == {2048} and {r["method"] for r in kept} == {"megatron", "adaptis"}
    assert (out / "reproduce.md").is_file() and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted: kept the rows of 1 finished case of 3")


@pytest.mark.slow  # a 405B job search, interrupted a few seconds in
def test_ctrl_c_ends_the_job_search_and_its_workers(tmp_path) -> None:
    """Ctrl-C reaches the whole process group: the job search's worker processes ignore it, the
    parent stops, cancels what has not started and ends with one line (a worker the signal broke used
    to leave the pool waiting forever)."""
    cmd = [sys.executable, "-m", "experiments", "search", "--model", "llama3.1-405b", "--gpus", "512",
           "--global-batch", "1024", "--seq-len", "8192", "--workers", "2", "--out", str(tmp_path / "job")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_default)
    with reaped(proc):
        time.sleep(6)
        _, err = exit_after(proc, lambda: os.killpg(proc.pid, signal.SIGINT), timeout=60)
    assert ended_by_ctrl_c(proc.returncode), err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[-1].startswith("interrupted:") and "Traceback" not in err
    assert not (tmp_path / "job" / "job.json").exists()
