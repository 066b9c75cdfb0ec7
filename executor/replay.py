"""Driver side of a replay: check a plan against a model and a world size, start ``torchrun``
with :mod:`executor.launch`, and collect its JSON result.

``check_plan`` runs before any process starts, so a plan for the wrong model or world size is
refused with a :class:`~pipeline.errors.PlanError` naming the field and the fix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.preflight import CHECKED_ENV
from pipeline.arch import Architecture
from pipeline.errors import PlanError
from pipeline.plan import Plan, validate_plan
from pipeline.spec import Cluster, LayerCost, ModelProfile

__all__ = ["check_plan", "ReplayOptions", "LaunchError", "torchrun_command", "run_torchrun", "replay_plans",
           "p2p_bench", "run_job"]

REPO_ROOT = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    """The distributed job failed or timed out; the message carries its exit code and output tail."""

    def __init__(self, message: str, *, returncode: int | None, output: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


def check_plan(plan: Plan, arch: Architecture, *, world_size: int, source: str = "plan") -> None:
    """Refuse a plan that does not fit ``arch`` and ``world_size``, or whose order cannot run."""
    n = len(arch.layers)
    if plan.partition and plan.num_layers != n:
        raise PlanError(f"the plan's partition covers {plan.num_layers} layers but model {arch.name!r} has {n}; "
                        "search again for this model", source=source, field="partition")
    if plan.devices != world_size:
        raise PlanError(f"the plan is for {plan.devices} devices but {world_size} processes would run it; "
                        f"run it with {plan.devices} processes or search again", source=source, field="devices")
    validate_plan(plan, num_layers=n, devices=world_size, source=source)
    idle = [d for d in range(plan.devices) if not plan.stages_of(d)]
    if idle:
        raise PlanError(f"devices {idle} hold no stage; the executor needs every rank to hold one",
                        source=source, field="placement")
    from pipeline.simulator import simulate

    unit = ModelProfile(name="unit", layers=tuple(LayerCost(f"l{i}", "layer", 1.0, 1.0, 1.0, 0, 0, 0)
                                                  for i in range(n)))
    result = simulate(plan, unit, Cluster(devices=plan.devices), validate=False, record_timeline=False)
    if not result.valid:
        raise PlanError(str(result.error), source=source, field="schedule")


@dataclass(frozen=True)
class ReplayOptions:
    """What the workers run (see ``python -m executor.launch --help``)."""

    model: str = "tiny-hybrid"
    """Zoo model name."""
    scale: float = 1.0
    """Width scale of the model."""
    granularity: str = "layer"
    """Plan units: ``layer`` or ``sublayer`` (see ``pipeline.arch.refine_architecture``)."""
    head_shards: int = 1
    """Head cut into this many units over the tokens."""
    seq_len: int = 128
    """Tokens per sequence."""
    microbatch_size: int = 1
    """Sequences per micro-batch."""
    steps: int = 5
    """Timed steps (the median is reported)."""
    warmup: int = 2
    """Untimed steps first."""
    check: bool = False
    """Compare loss, gradients and weights with the unpipelined model."""
    threads: int = 1
    """Torch threads per rank."""
    transfer_timeout: float = 60.0
    """Seconds for process-group set-up and for every transfer."""
    backend: str | None = None
    """``gloo`` or ``nccl`` (default: by device)."""
    seed: int = 0
    """Weights and data seed."""
    lowering: str = "early"
    """How receives are placed in each rank's program (:mod:`executor.lowering`): ``early`` or ``torch``."""
    gc: str = "freeze"
    """``freeze``: after the warm-up, the job's long-lived objects leave the garbage collector's scans
    (:func:`executor.launch.freeze_collector`); ``auto``: Python's default."""

    def worker_args(self) -> list[str]:
        args = ["--model", self.model, "--scale", str(self.scale), "--granularity", self.granularity,
                "--head-shards", str(self.head_shards), "--seq-len", str(self.seq_len),
                "--microbatch-size", str(self.microbatch_size), "--steps", str(self.steps),
                "--warmup", str(self.warmup), "--threads", str(self.threads),
                "--timeout", str(self.transfer_timeout), "--seed", str(self.seed), "--lowering", self.lowering,
                "--gc", self.gc]
        if self.check:
            args.append("--check")
        if self.backend:
            args += ["--backend", self.backend]
        return args


def torchrun_command(nproc: int, worker_args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone`` (a free port) for ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.1", "-m", "executor.launch", *worker_args]


def run_torchrun(nproc: int, worker_args: Sequence[str], *, timeout: float = 600.0,
                 threads: int = 1) -> subprocess.CompletedProcess[str]:
    """Run the job; on timeout kill its whole process group. Never raises for a failed job."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[CHECKED_ENV] = "1"  # run_job checked the job's memory before this start (executor.preflight)
    env.setdefault("TORCHELASTIC_ERROR_FILE", "")
    env.pop("TORCHELASTIC_ERROR_FILE")
    guarded = [sys.executable, "-m", "executor.orphan_guard", str(os.getpid()), *torchrun_command(nproc, worker_args)]
    proc = subprocess.Popen(guarded, cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The launcher's group only: its ranks run in sessions of their own and die with it
        # (executor.launch sets their parent-death signal), closing the output pipe they share.
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=60.0)
        except subprocess.TimeoutExpired:  # a descendant still holds the pipe: stop reading it
            proc.kill()
            out = ""
        return subprocess.CompletedProcess(proc.args, -signal.SIGKILL, f"{out or ''}\n[killed after {timeout:.0f} s]")
    except BaseException:
        # Ctrl-C or SIGTERM of the caller: torchrun runs in its own session and would not see
        # the terminal's SIGINT, so stop its whole process group before re-raising.
        _stop_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the job's process group, SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # The launcher is gone; make sure no worker of its group lingers.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
        return


def _run_for_json(nproc: int, worker_args: list[str], *, timeout: float, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="adaptis-replay-") as tmp:
        out_path = Path(tmp) / "result.json"
        proc = run_torchrun(nproc, [*worker_args, "--out", str(out_path)], timeout=timeout, threads=threads)
        if proc.returncode != 0 or not out_path.exists():
            tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
            raise LaunchError(f"the distributed job failed (exit code {proc.returncode}):\n{tail}",
                              returncode=proc.returncode, output=proc.stdout)
        return json.loads(out_path.read_text())


def run_job(plans: Sequence[Plan], options: ReplayOptions, *, measure: bool = False, nproc: int | None = None,
            timeout: float = 600.0, profile_repeats: int = 7, adjust_drift: bool = True) -> dict[str, Any]:
    """One ``torchrun`` job: with ``measure``, the p2p link and a profile of the model measured by
    every rank at once (``result["p2p"]``, ``result["profile"]``); then every plan (all for the same
    world size), timed round-robin (``result["runs"]``, one dict per plan). With ``adjust_drift`` (and
    at least :data:`pipeline.calibration.drift.MIN_PLANS` plans) each plan's step times have the
    rounds' drift taken out (:func:`pipeline.calibration.drift.adjust_runs`;
    ``result["round_factors"]``, the raw steps kept in each run)."""
    sizes = {p.devices for p in plans}
    if len(sizes) > 1:
        raise PlanError(f"plans for different world sizes {sorted(sizes)} cannot share a job", field="devices")
    world = sizes.pop() if sizes else (nproc or 2)
    from executor.preflight import check_job

    check_job(plans, model=options.model, scale=options.scale, seq_len=options.seq_len,
              microbatch_size=options.microbatch_size, measure=measure, check=options.check, nproc=world,
              granularity=options.granularity, head_shards=options.head_shards,
              backend=options.backend)  # before torchrun starts a process
    with tempfile.TemporaryDirectory(prefix="adaptis-plans-") as tmp:
        args = options.worker_args()
        if measure:
            args += ["--measure", "--profile-repeats", str(profile_repeats)]
        for k, plan in enumerate(plans):
            path = Path(tmp) / f"plan{k}.json"
            plan.save(path)
            args += ["--plan", str(path)]
        result = _run_for_json(world, args, timeout=timeout, threads=options.threads)
    result.setdefault("runs", [])
    if adjust_drift:
        from pipeline.calibration.drift import adjust_runs

        result["round_factors"] = adjust_runs(result["runs"])
    return result


def replay_plans(plans: Sequence[Plan], options: ReplayOptions, *, timeout: float = 600.0) -> list[dict[str, Any]]:
    """Run every plan (same world size) in one ``torchrun`` job; one result dict per plan."""
    return run_job(plans, options, timeout=timeout)["runs"] if plans else []


def p2p_bench(*, nproc: int = 2, timeout: float = 120.0, backend: str | None = None) -> dict[str, Any]:
    """Latency (µs) and bandwidth (GB/s) of a point-to-point transfer between two local ranks."""
    args = ["--p2p-bench"] + (["--backend", backend] if backend else [])
    result = _run_for_json(nproc, args, timeout=timeout, threads=1)
    return {**result["p2p"], "backend": result.get("backend")}
