"""Faults on purpose: a rank killed mid-run, and Ctrl-C on replay. Both end the job (before the hang
guard, not by a timeout) and leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.replay import REPO_ROOT, torchrun_command
from tests.conftest import exit_after, reaped, sigint_default
from tests.executor.plans import named_plans

pytestmark = pytest.mark.slow  # torchrun jobs, killed

def _pids_with(marker: str) -> list[int]:
    """Live processes whose command line mentions ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmd and "executor.launch" in cmd and state != "Z":
            out.append(int(entry.name))
    return out


def _wait_for_workers(marker: str, count: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in _pids_with(marker) if "torch.distributed.run" not in _cmdline(p)]
        if len(pids) >= count:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"workers did not start within {timeout} s")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _descendants(root: int) -> list[int]:
    """Live processes below ``root`` (through torchrun's own session too)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid, seen = int(entry.name), 0
        p = pid
        while p > 1 and seen < 64:
            p = _parent(p)
            seen += 1
            if p == root:
                out.append(pid)
                break
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def test_killed_rank_ends_the_job_and_leaves_nothing(tmp_path: Path) -> None:
    plan_path = tmp_path / "kill-plan.json"
    dict(named_plans(microbatches=4))["1f1b"].save(plan_path)
    args = ["--plan", str(plan_path), "--model", "tiny-hybrid", "--seq-len", "32", "--steps", "100000",
            "--warmup", "0", "--timeout", "300"]  # past the hang guard: an exit before it is no timeout
    proc = subprocess.Popen(torchrun_command(2, args), cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with reaped(proc):
        workers = _wait_for_workers(str(plan_path), 2)
        time.sleep(3.0)  # let them get into the steps
        out, _ = exit_after(proc, lambda: os.kill(workers[-1], signal.SIGKILL), timeout=90)
    assert proc.returncode != 0
    assert "Timed out" not in out, out[-3000:]  # the survivor stopped on its peer's death, not a timeout
    time.sleep(0.5)
    assert _pids_with(str(plan_path)) == []


def test_ctrl_c_on_replay_leaves_no_stray_process(tmp_path: Path) -> None:
    plan_path = tmp_path / "ctrlc-plan.json"
    dict(named_plans(microbatches=4))["1f1b"].save(plan_path)
    cmd = [sys.executable, "-m", "experiments", "replay", "--plan", str(plan_path), "--model", "tiny-hybrid",
           "--seq-len", "32", "--steps", "100000", "--json"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=sigint_default)
    with reaped(proc):
        deadline = time.monotonic() + 120
        family: list[int] = []
        while time.monotonic() < deadline:
            family = _descendants(proc.pid)
            if sum("executor.launch" in _cmdline(p) and "torch.distributed.run" not in _cmdline(p)
                   for p in family) >= 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("replay's workers did not start")
        time.sleep(1.0)
        # what a terminal's Ctrl-C does to the foreground group
        out, _ = exit_after(proc, lambda: os.killpg(proc.pid, signal.SIGINT), timeout=60)
    assert proc.returncode == 130, out[-2000:]
    # By the time replay has exited its job must be gone too (allow 2 s for the kernel to reap).
    deadline = time.monotonic() + 2
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in family if _alive(p)] == []


def test_a_replay_killed_outright_takes_its_job_with_it(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) gives replay no chance to stop torchrun, which runs in a session of
    its own; the parent-death signal set by executor.orphan_guard ends the job anyway."""
    plan_path = tmp_path / "orphan-plan.json"
    dict(named_plans(microbatches=4))["1f1b"].save(plan_path)
    cmd = [sys.executable, "-m", "experiments", "replay", "--plan", str(plan_path), "--model", "tiny-hybrid",
           "--seq-len", "32", "--steps", "100000", "--json"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        family: list[int] = []
        while time.monotonic() < deadline:  # replay's job: torchrun and its two workers (plans in a temp dir)
            family = [p for p in _descendants(proc.pid) if "executor.launch" in _cmdline(p)]
            if sum("torch.distributed.run" not in _cmdline(p) for p in family) >= 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("replay's workers did not start")
        os.kill(proc.pid, signal.SIGKILL)  # the parent alone: its job is in another session
        proc.wait(timeout=30)
    deadline = time.monotonic() + 60  # the hang guard; torchrun stops its workers on SIGTERM
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in family if _alive(p)]
    for p in alive:  # do not leave them to the rest of the run
        os.kill(p, signal.SIGKILL)
    assert alive == [], f"the job outlived its parent: {[_cmdline(p)[:80] for p in alive]}"


def test_a_job_past_its_timeout_takes_its_ranks_with_it(tmp_path: Path) -> None:
    """run_torchrun's timeout kills the launcher's process group; torch's elastic agent starts the
    ranks in sessions of their own, so before the ranks took the parent-death signal
    (executor.launch) they ran on, orphaned, and the wait for the output they held never ended."""
    from concurrent.futures import ThreadPoolExecutor

    from executor.replay import ReplayOptions, run_torchrun

    plan_path = tmp_path / "timeout-plan.json"
    dict(named_plans(microbatches=4))["1f1b"].save(plan_path)
    args = [*ReplayOptions(model="tiny-hybrid", seq_len=32, steps=100000, warmup=0).worker_args(),
            "--plan", str(plan_path)]
    seen: list[int] = []
    pool = ThreadPoolExecutor(1)
    try:
        job = pool.submit(run_torchrun, 2, args, timeout=10.0)
        while not job.done() and len(seen) < 2:  # the ranks ran before the timeout (else it proves nothing)
            seen = [p for p in _pids_with(str(plan_path)) if "torch.distributed.run" not in _cmdline(p)]
            time.sleep(0.2)
        result = job.result(timeout=120)  # the hang guard: 10 s, then the kill and the output read
        assert len(seen) >= 2, "the ranks did not start before the timeout"
        assert result.returncode == -signal.SIGKILL and "[killed after 10 s]" in result.stdout
        deadline = time.monotonic() + 5
        while _pids_with(str(plan_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_with(str(plan_path)) == []
    finally:
        for pid in _pids_with(str(plan_path)):  # do not leave them to the rest of the run
            os.kill(pid, signal.SIGKILL)
        pool.shutdown(wait=False)


def test_the_orphan_guard_refuses_a_bad_command_line_and_a_dead_parent() -> None:
    guard = [sys.executable, "-m", "executor.orphan_guard"]
    bad = subprocess.run([*guard, "not-a-pid", "true"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr
    if sys.platform.startswith("linux"):  # another pid than its parent's: the parent is "gone", start nothing
        gone = subprocess.run([*guard, "1", sys.executable, "-c", "print('started')"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=30)
        assert gone.returncode == 1 and "started" not in gone.stdout
    ran = subprocess.run([*guard, str(os.getpid()), sys.executable, "-c", "print('started')"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout.strip() == "started"
