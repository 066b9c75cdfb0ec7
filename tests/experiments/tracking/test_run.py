"""experiments.tracking: offline W&B runs, read back from their transaction log (experiments.tracking.offline)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments import tracking
from experiments.tracking import Tracker, artifact_name, resolve_mode, start_run
from experiments.tracking.offline import OfflineRun, read_offline_run
from experiments.tracking.sb3 import make_sb3_logger
from pipeline.plan import Plan, parse_action, validate_plan

REPO = Path(__file__).resolve().parents[3]
STEPS = 600  # enough rows to span several 32 KiB blocks of the .wandb log


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Keep W&B's caches, settings and credentials inside a temporary folder; no WANDB_MODE."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_API_KEY", "WANDB_BASE_URL"):
            mp.delenv(var, raising=False)
        mp.setenv("WANDB_CACHE_DIR", str(home / "cache"))
        mp.setenv("WANDB_DATA_DIR", str(home / "data"))
        mp.setenv("WANDB_CONFIG_DIR", str(home / "config"))
        mp.setenv("WANDB_ERROR_REPORTING", "false")
        yield home


def make_plan() -> Plan:
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    plan = Plan(devices=2, microbatches=2, partition=((0, 1), (1, 2)), placement=(0, 1),
                schedule=tuple(tuple(parse_action(a) for a in row) for row in rows), meta={"method": "hand"})
    validate_plan(plan, num_layers=2, devices=2)
    return plan


def make_png(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [1, 0])
    fig.savefig(path, dpi=16)
    plt.close(fig)
    return path


class LoggedRun:
    def __init__(self, tracker: Tracker, run: OfflineRun, plan: Plan, profile: Path, png: Path) -> None:
        self.tracker, self.run, self.plan, self.profile, self.png = tracker, run, plan, profile, png


@pytest.fixture(scope="module")
def logged(wandb_env: Path, tmp_path_factory: pytest.TempPathFactory) -> LoggedRun:
    """One offline run that logs a bit of everything, finished and read back once."""
    work = tmp_path_factory.mktemp("logged")
    png = make_png(work / "gantt.png")
    profile = work / "profile.json"
    profile.write_text(json.dumps({"name": "tiny", "layers": []}))
    plan = make_plan()
    config = {"seed": 3, "lr": 0.5, "out": Path("out/x"), "nested": {"a": 1}, "_run": print}
    with start_run(command="probe", config=config, dir=work / "runs", group="g1", name="probe-1",
                   tags=["t1", "t2"]) as tr:
        assert tr.mode == "offline" and tr.enabled
        for step in range(STEPS):
            tr.log_metrics({"loss": 1.0 / (step + 1), "iter_ms": 100.0 + step}, step=step)
        tr.log_table("plans", [{"method": "1f1b", "ms": 10.5}, {"method": "zb", "ms": 9.0, "note": "best"}],
                     step=STEPS)
        tr.log_image("gantt", png, step=STEPS)
        tr.log_plan(plan, "best-plan", {"iteration_ms": 9.0})
        tr.log_artifact(profile, "tiny-profile", "profile")
        logger = make_sb3_logger(tr, formats=())
        logger.record("rollout/ep_rew_mean", np.float32(1.5))
        logger.record("train/n_updates", 3)
        logger.record("train/hidden", 2.0, exclude="wandb")
        logger.record("train/vector", np.arange(3.0))
        logger.dump(step=STEPS + 100)
        tr.summary({"best_ms": 9.0, "best_method": "zb"})
    assert tr.finished
    assert tr.run_dir is not None and tr.run_dir.is_dir()
    return LoggedRun(tr, read_offline_run(tr.run_dir, wait_for_exit_s=20), plan, profile, png)


def test_run_folder_and_identity(logged: LoggedRun) -> None:
    tr, run = logged.tracker, logged.run
    assert tr.run_dir.parent.name == "wandb" and tr.run_dir.name.startswith("offline-run-")
    assert tr.run_dir.name.endswith(tr.run_id) and run.run_id == tr.run_id
    assert (run.project, run.group, run.name, run.job_type) == ("adaptis", "g1", "probe-1", "probe")
    assert run.tags == ("t1", "t2")
    assert run.exit_code == 0 and run.finished and run.truncated == []


def test_config(logged: LoggedRun) -> None:
    assert logged.run.config == {"seed": 3, "lr": 0.5, "out": "out/x", "nested": {"a": 1}, "command": "probe"}


def test_metrics_over_steps(logged: LoggedRun) -> None:
    run = logged.run
    assert run.metric("loss") == [(s, pytest.approx(1.0 / (s + 1))) for s in range(STEPS)]
    assert run.metric("iter_ms")[-1] == (STEPS - 1, 100.0 + STEPS - 1)
    steps = [row["_step"] for row in run.history]
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert (logged.tracker.run_dir / f"run-{run.run_id}.wandb").stat().st_size > 2 * 32768


def test_table(logged: LoggedRun) -> None:
    assert logged.run.tables["plans"] == [{"method": "1f1b", "ms": 10.5, "note": None},
                                          {"method": "zb", "ms": 9.0, "note": "best"}]
    (step, cell), = logged.run.metric("plans")
    assert step == STEPS and cell["_type"] == "table-file" and cell["nrows"] == 2


def test_image(logged: LoggedRun) -> None:
    (path,) = logged.run.images["gantt"]
    assert path.is_file() and path.read_bytes() == logged.png.read_bytes()
    assert logged.run.metric("gantt")[0][0] == STEPS


def test_plan_artifact(logged: LoggedRun) -> None:
    art = logged.run.artifact("best-plan")
    assert art.type == "plan"
    assert art.metadata == {"devices": 2, "microbatches": 2, "num_stages": 2, "num_layers": 2,
                            "method": "hand", "iteration_ms": 9.0}
    assert set(art.files) == {"plan.json", "plan.csv"}
    # the files live inside the run folder, so the folder alone is what `wandb sync` needs
    assert all(p.is_relative_to(logged.tracker.run_dir) and p.is_file() for p in art.files.values())
    assert Plan.load(art.files["plan.json"]) == logged.plan
    with open(art.files["plan.csv"], newline="") as fh:
        assert list(csv.reader(fh)) == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_other_artifact(logged: LoggedRun) -> None:
    art = logged.run.artifact("tiny-profile")
    assert art.type == "profile" and list(art.files) == ["profile.json"]
    assert art.files["profile.json"].read_text() == logged.profile.read_text()
    # W&B also stores each table as an artifact of type run_table
    assert [(a.name, a.type) for a in logged.run.artifacts if a.type != "run_table"] == [
        ("best-plan", "plan"), ("tiny-profile", "profile")]
    assert [a.type for a in logged.run.artifacts].count("run_table") == 1


def test_sb3_writer_forwards_recorded_values(logged: LoggedRun) -> None:
    run = logged.run
    assert run.metric("rollout/ep_rew_mean") == [(STEPS + 100, 1.5)]
    assert run.metric("train/n_updates") == [(STEPS + 100, 3)]
    assert run.metric("train/hidden") == [] and run.metric("train/vector") == []


def test_summary(logged: LoggedRun) -> None:
    summary = logged.run.summary
    assert summary["best_ms"] == 9.0 and summary["best_method"] == "zb"
    assert summary["loss"] == pytest.approx(1.0 / STEPS)  # W&B keeps each key's last value
    assert not any(k.startswith("_") for k in summary)


def test_finished_tracker_refuses_more(logged: LoggedRun) -> None:
    logged.tracker.finish()  # idempotent
    with pytest.raises(RuntimeError, match="finished"):
        logged.tracker.log_metrics({"x": 1.0})


@pytest.mark.parametrize(("value", "expected"), [
    (None, "offline"), ("", "offline"), ("offline", "offline"), ("ONLINE", "online"),
    ("disabled", "disabled"), ("dryrun", "offline"), ("run", "online"),
])
def test_resolve_mode(value: str | None, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", value)
    assert resolve_mode() == expected


def test_resolve_mode_rejects_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offlne")
    with pytest.raises(ValueError, match="online, offline or disabled"):
        resolve_mode()


def test_disabled_is_a_noop_that_accepts_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    png = make_png(tmp_path / "g.png")
    with start_run(command="probe", config={"a": 1}, dir=tmp_path / "runs") as tr:
        assert (tr.mode, tr.enabled, tr.run_dir, tr.run_id) == ("disabled", False, None, None)
        tr.log_metrics({"x": 1.0}, step=0)
        tr.log_metrics({"x": 2.0})
        tr.log_table("t", [{"a": 1}])
        tr.log_image("img", png)
        assert tr.log_plan(make_plan(), "p", {"k": 1}) is None
        assert tr.log_artifact(png, "g", "image") is None
        tr.summary({"best": 1})
        make_sb3_logger(tr, formats=()).record("a", 1.0)
        with pytest.raises(FileNotFoundError):  # arguments are still checked
            tr.log_image("img", tmp_path / "missing.png")
        assert tr.log_plan(make_plan(), "no/slash") is None  # made valid, not refused
        with pytest.raises(ValueError, match="artifact type"):
            tr.log_artifact(png, "g", "no/slash")
    assert tr.finished
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text,name", [
    ("megatron+layout", "megatron-layout"), ("adaptis@torchtitan", "adaptis-torchtitan"),
    ("plan-gemma-medium", "plan-gemma-medium"), ("runs/a b", "runs-a-b"), ("+x", "x"), ("@@", "artifact"),
    ("a" * 200, "a" * 128),
])
def test_artifact_names_are_made_valid(text: str, name: str) -> None:
    assert artifact_name(text) == name
    assert tracking._check_name(name, "artifact name") == name


def test_online_without_credentials_fails_instead_of_prompting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"), WANDB_MODE="online",
               WANDB_CONFIG_DIR=str(tmp_path / "cfg"), WANDB_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO))
    code = ("from experiments.tracking import start_run\n"
            f"start_run(command='probe', config={{}}, dir={str(tmp_path / 'runs')!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode != 0
    assert "no W&B credentials" in proc.stderr and "WANDB_API_KEY" in proc.stderr
    assert proc.stdout == ""


CHILD = textwrap.dedent("""
    import json, signal, sys, time
    from experiments.tracking import start_run

    # a shell may start background jobs with SIGINT ignored; a terminal would not
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with start_run(command="probe", config={"k": 1}, dir=sys.argv[1]) as tr:
        for step in range(3):
            tr.log_metrics({"x": float(step)}, step=step)
            print(json.dumps({"step": step}), flush=True)
        tr.summary({"before": 1})
        print(json.dumps({"run_dir": str(tr.run_dir)}), flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_interrupted_run_survives(sig: signal.Signals, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_DIR")}
    env.update(PYTHONPATH=str(REPO), WANDB_CACHE_DIR=str(tmp_path / "cache"),
               WANDB_DATA_DIR=str(tmp_path / "data"), WANDB_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "runs")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        run_dir = Path(json.loads(lines[-1])["run_dir"])
        if sig == signal.SIGKILL:
            time.sleep(3 * tracking.FLUSH_INTERVAL_S)  # let W&B's periodic flush write the rows
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    # --json commands stay parseable: everything on stdout is ours, one JSON object a line
    assert [json.loads(line) for line in lines + rest.splitlines()][:3] == [{"step": s} for s in range(3)]
    assert rest == ""
    run = read_offline_run(run_dir)
    assert run.config == {"k": 1, "command": "probe"}
    if sig == signal.SIGKILL:
        # no chance to finish: the exit is missing and the last, still open step with it
        assert run.exit_code is None
        assert run.metric("x") == [(0, 0.0), (1, 1.0)]
    else:
        assert run.exit_code == 128 + sig
        assert run.metric("x") == [(0, 0.0), (1, 1.0), (2, 2.0)]
        assert run.summary["before"] == 1
