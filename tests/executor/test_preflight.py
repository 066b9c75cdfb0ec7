"""The pre-flight memory check of ``replay`` and ``profile``: a job that would not fit in this machine's
memory is refused with the figures and the fix before any process starts or any tensor is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor import preflight
from executor.model import resolve_architecture
from experiments.cli import main
from pipeline.plan import Plan
from pipeline.spec import GIB

#: The machine of issue 30: 23 GiB, of which about this much available.
ISSUE_MACHINE = int(22.3 * GIB)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: field 'memory': "), err
    return lines[0]


def test_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n")
    assert preflight.available_bytes(meminfo) == 23000000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert preflight.available_bytes(meminfo) is None
    assert preflight.available_bytes(tmp_path / "missing") is None


@pytest.fixture
def plan_for(tmp_path: Path, capsys):
    """A plan of ``model`` on ``devices`` ranks, as ``search`` writes it."""
    def make(model: str, devices: int) -> Path:
        out = tmp_path / f"{model}-{devices}"
        assert main(["search", "--model", model, "--devices", str(devices), "--method", "megatron", "--budget", "1",
                     "--out", str(out), "--json"]) == 0
        capsys.readouterr()
        return out / "plan.json"
    return make


def test_replaying_the_default_run_plan_is_refused_with_the_fixes(plan_for, capsys, monkeypatch) -> None:
    """issue 30: the `make run` plan (gemma-medium, 8 ranks) ran a 23 GiB machine out of memory."""
    plan = plan_for("gemma-medium", 8)
    monkeypatch.setattr(preflight, "available_bytes", lambda: ISSUE_MACHINE)
    assert main(["replay", "--plan", str(plan), "--model", "gemma-medium", "--backend", "gloo"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"replaying {plan} on 8 CPU ranks needs about" in line and "profiling the whole model" in line
    assert "22.3 GiB available" in line
    assert "--scale 0.17" in line and "--profile P.json --cluster C.json" in line and "smaller model" in line
    assert not (plan.parent / "replay").exists()


def test_a_replay_that_fits_passes_the_check(plan_for, monkeypatch) -> None:
    plan = Plan.load(plan_for("tiny-hybrid", 2))
    found = preflight.replay_estimate(plan, resolve_architecture("tiny-hybrid"), seq_len=128, microbatch_size=1,
                                      measure=True)
    assert 0.35 < found.total / GIB < 1.0
    preflight.check_fits(found, what="replay", fixes=[], available=ISSUE_MACHINE)


def test_the_estimate_matches_a_measured_replay(plan_for) -> None:
    """A 2-rank megatron plan of nemotronh-small measured 8.24 GiB max RSS per rank (see the module)."""
    plan = Plan.load(plan_for("nemotronh-small", 2))
    found = preflight.replay_estimate(plan, resolve_architecture("nemotronh-small"), seq_len=128,
                                      microbatch_size=1, measure=True)
    assert 7.0 < max(found.per_process) / GIB < 9.5


@pytest.mark.parametrize("model,scale", [("gemma-large", "0.34"), ("gemma-small", "0.7")])
def test_profiling_a_model_too_large_is_refused_with_a_scale_that_fits(model, scale, capsys, monkeypatch) -> None:
    """issue 30: `profile --model gemma-large` climbed to 23 GB and was OOM-killed after 95 s."""
    monkeypatch.setattr(preflight, "available_bytes", lambda: ISSUE_MACHINE)
    assert main(["profile", "--model", model, "--device", "cpu"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"profiling {model} on the CPU needs about" in line and f"--scale {scale} (about" in line


def test_no_meminfo_no_check(monkeypatch) -> None:
    monkeypatch.setattr(preflight, "available_bytes", lambda: None)
    found = preflight.MemoryEstimate((10**15,), "a huge model")
    preflight.check_fits(found, what="profiling", fixes=[])  # nothing to compare with: the job runs


needs_cpu_ranks = pytest.mark.skipif(preflight.runs_on_gpu(None), reason="GPU ranks: host memory is not checked")


@needs_cpu_ranks
def test_run_refuses_a_job_that_would_not_fit_before_torchrun(capsys, monkeypatch, tmp_path) -> None:
    """`run` on this machine profiles the model in every rank first: refused before that job starts."""
    from executor import replay

    monkeypatch.setattr(preflight, "available_bytes", lambda: ISSUE_MACHINE)
    monkeypatch.setattr(replay, "run_torchrun", lambda *a, **k: pytest.fail("torchrun started"))
    assert main(["run", "--model", "gemma-medium", "--devices", "8", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[0].startswith("profiling gemma-medium")  # the progress line, then the refusal
    line = _one_error_line("\n".join(err.strip().splitlines()[1:]))
    assert "profiling gemma-medium on 8 CPU ranks needs about" in line
    assert "8 ranks x up to" in line and "22.3 GiB available" in line
    assert "--scale 0.17 (about" in line and "smaller model" in line


def test_a_job_of_several_plans_counts_the_stages_of_each(plan_for) -> None:
    """The plans of one job are timed round-robin, so their stages are alive together."""
    plan = Plan.load(plan_for("nemotronh-small", 2))
    arch = resolve_architecture("nemotronh-small")
    one = preflight.job_estimate([plan], arch, seq_len=128, microbatch_size=1, measure=False)
    two = preflight.job_estimate([plan, plan], arch, seq_len=128, microbatch_size=1, measure=False)
    base = preflight.PROCESS_BYTES
    assert [b - base for b in two.per_process] == [2 * (b - base) for b in one.per_process]
    assert "of 2 plans" in two.cause


def test_fewer_ranks_is_offered_when_one_rank_fits(plan_for) -> None:
    plan = Plan.load(plan_for("gemma-medium", 8))
    found = preflight.job_estimate([plan], resolve_architecture("gemma-medium"), seq_len=128, microbatch_size=1,
                                   measure=False)
    room = int(max(found.per_process) * 3 / preflight.HEADROOM) + 1  # three of the largest rank fit
    with pytest.raises(preflight.ConfigError, match=r"fewer ranks \(3 or fewer of this size fit; this job has 8"):
        preflight.check_job([plan], model="gemma-medium", scale=1.0, seq_len=128, microbatch_size=1, measure=False,
                            backend="gloo", available=room)


def test_executor_launch_checks_memory_before_the_process_group(plan_for, monkeypatch) -> None:
    """`torchrun ... -m executor.launch` started by hand: local rank 0 refuses before any layer is built."""
    import torch.distributed as dist

    from executor import launch

    plan = plan_for("tiny-hybrid", 1)
    monkeypatch.setattr(preflight, "available_bytes", lambda: GIB // 10)
    monkeypatch.delenv(preflight.CHECKED_ENV, raising=False)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    args = launch.build_parser().parse_args(["--plan", str(plan), "--model", "tiny-hybrid", "--backend", "gloo"])
    with pytest.raises(preflight.ConfigError, match=r"field 'memory': replaying 1 plan of tiny-hybrid on 1 CPU "
                                                    r"rank needs about .* this machine has 0.1 GiB available"):
        launch._worker(args)
    assert not dist.is_initialized()
    monkeypatch.setenv(preflight.CHECKED_ENV, "1")  # started by run_job, which checked before torchrun
    launch._check_memory([Plan.load(plan)], args, rank=0, world=1)
