"""``python -m experiments run``: the whole workflow on tiny-hybrid (2 CPU ranks), read back from W&B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.tracking.offline import read_offline_run
from pipeline.plan import Plan, validate_plan
from pipeline.spec import ModelProfile


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    return tmp_path / "wb"


@pytest.mark.slow
def test_workflow_end_to_end_on_two_cpu_ranks(tmp_path: Path, offline_wandb: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["run", "--model", "tiny-hybrid", "--devices", "2", "--seq-len", "64", "--microbatches", "6",
                 "--budget", "40", "--profile-repeats", "1", "--steps", "2", "--warmup", "1",
                 "--calibration-plans", "4", "--out", str(out), "--group", "wf-test", "--timeout", "240",
                 "--trace", str(tmp_path / "trace.json")])
    text = capsys.readouterr().out
    assert code == 0
    assert "where the time went" in text and "best:" in text and "measured" in text
    summary = json.loads((out / "summary.json").read_text())
    s = summary["summary"]
    assert "measured_ms" in s, f"the replay measured nothing; notes: {summary['notes']}, best: {s.get('best_method')}"
    assert s["measured_ms"] > 0 and s["megatron_measured_ms"] > 0
    assert s["measured_speedup"] == pytest.approx(s["megatron_measured_ms"] / s["measured_ms"])
    # Chosen by measurement: the fastest predicted plans and Megatron's replayed, the least median of
    # the even timed steps kept, every measured time the odd steps' (one step each here: steps 2).
    assert s["chosen_by"] == "measured"
    replayed = [r for r in summary["rows"] if r.get("chosen_on_ms") is not None]
    assert len(replayed) >= 2 and "megatron" in {r["method"] for r in replayed}
    assert min(replayed, key=lambda r: r["chosen_on_ms"])["method"] == s["best_method"]
    assert any(n.startswith("chosen by measurement: ") for n in summary["notes"])
    replays = summary["replays"]  # every replayed plan's steps; 2 rounds: too few to take the drift out
    assert set(replays) == {r["method"] for r in replayed}
    assert all(len(r["measured_iteration_times"]) == 2 and r["raw_iteration_times"] is None for r in replays.values())
    assert replays[s["best_method"]]["measured_ms"] == pytest.approx(s["measured_ms"])
    assert s["calibration_plans_ratio"] > 0  # the calibration plans' times, final job over calibration job
    plan = Plan.load(out / "plan.json")
    validate_plan(plan, num_layers=8, devices=2)
    assert plan.method == s["best_method"]
    assert (out / "plan.csv").read_text().count("\n") == 2
    for name in ("gantt_predicted.png", "gantt_measured.png", "gantt_fidelity.png", "profile.json", "cluster.json",
                 "calibrated_profile.json"):
        assert (out / name).stat().st_size > 0
    # The measurements fed back: random plans replayed first, the search priced with what they taught.
    calibration = summary["calibration"]
    assert set(calibration) >= {"F", "I", "W", "overhead"} and all(v >= 0 for v in calibration.values())
    assert ModelProfile.load(out / "calibrated_profile.json").action_overhead == pytest.approx(calibration["overhead"])
    # ... and replayed again beside the best plan: its prediction re-calibrated in the same job
    assert s["predicted_same_job_ms"] > 0
    assert s["same_job_error_pct"] == pytest.approx(100 * (s["predicted_same_job_ms"] / s["measured_ms"] - 1))
    assert "calibrated on the random plans replayed in the same job" in text
    assert [d["device"] for d in summary["devices"]] == [0, 1]
    assert all("measured_bubble_pct" in d for d in summary["devices"])
    assert abs(sum(k["time_share_pct"] for k in summary["kinds"]) - 100) < 1e-6
    trace = json.loads((tmp_path / "trace.json").read_text())  # --trace: measured and predicted, one file
    assert {e["args"]["name"].split(":")[0] for e in trace["traceEvents"] if e["name"] == "process_name"} == \
        {"measured", "predicted"}

    # The W&B group, read back from the offline run folders.
    assert set(summary["run_dirs"]) == {"profile", "search", "replay", "summary"}
    runs = {phase: read_offline_run(d, wait_for_exit_s=20) for phase, d in summary["run_dirs"].items()}
    assert {r.group for r in runs.values()} == {"wf-test"}
    assert all(r.exit_code == 0 for r in runs.values())
    final = runs["summary"]
    assert final.summary["best_method"] == s["best_method"]
    assert final.summary["measured_ms"] == pytest.approx(s["measured_ms"])
    assert final.metric("predicted_speedup") and final.metric("measured_speedup")
    assert set(final.images) >= {"gantt/predicted", "gantt/measured", "gantt/fidelity"}
    assert all(p.is_file() for paths in final.images.values() for p in paths)
    assert {r["method"] for r in final.tables["methods"]} >= {"megatron", "adaptis"}
    art = final.artifact("plan-tiny-hybrid")
    assert art.type == "plan"
    assert Plan.load(art.files["plan.json"]) == plan
    prof = runs["profile"].artifact("profile-tiny-hybrid")
    assert prof.type == "profile" and prof.metadata["source"] == "measured"
    assert runs["search"].artifact("plan-tiny-hybrid").type == "plan"
    assert runs["replay"].metric("adaptis/measured_ms") or runs["replay"].metric("megatron/measured_ms")
    assert runs["profile"].metric("calibration/F")


def test_named_gpu_cluster_skips_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--microbatches", "8",
                 "--method", "zbv,adaptis", "--budget", "40", "--out", str(tmp_path), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["source"] == "analytic" and "measured_ms" not in report["summary"]
    assert any(n.startswith("replay skipped") for n in report["notes"])
    assert {r["method"] for r in report["rows"]} == {"megatron", "zbv", "adaptis"}
    assert report["summary"]["predicted_speedup"] >= 1.0


def test_hf_config_on_this_machine_is_refused_with_the_fix(tmp_path: Path, capsys) -> None:
    cfg = Path(__file__).resolve().parents[2] / "experiments/configs/models/tiny-hybrid.json"
    assert main(["run", "--hf-config", str(cfg), "--out", str(tmp_path)]) == 2
    assert "--gpu" in capsys.readouterr().err


def test_rl_unavailable_is_a_note_not_a_failure(tmp_path: Path, monkeypatch, capsys) -> None:
    import agents.registry as registry

    real = registry.make_searcher

    def fake(name: str):
        if name.startswith("rl"):
            raise ImportError("no module named agents.rl (test)")
        return real(name)

    monkeypatch.setattr(registry, "make_searcher", fake)
    code = main(["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--microbatches", "8",
                 "--method", "adaptis,rl", "--budget", "30", "--out", str(tmp_path), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rl = next(r for r in report["rows"] if r["method"] == "rl")
    assert rl["iteration_time"] is None and "not available" in rl["note"]
    assert any(n.startswith("rl: skipped") for n in report["notes"])


def test_a_machine_that_changed_speed_between_the_jobs_is_named_beyond_ten_percent() -> None:
    from experiments.commands.run import drift_note

    assert drift_note(None) is None and drift_note(1.0) is None and drift_note(1.09) is None
    assert drift_note(0.91) is None
    slower = drift_note(1.26)
    assert slower is not None and slower.startswith("the machine ran 26% slower in this replay")
    faster = drift_note(0.85)
    assert faster is not None and faster.startswith("the machine ran 15% faster")


def test_a_rerun_of_the_runs_policy_training_replaces_its_folder(tmp_path: Path, offline_wandb: Path) -> None:
    """`run --train-policy N --out DIR` twice: the second trains afresh into DIR/policy (the run's own folder, as
    its plans are), where `train --out` without --resume would refuse an earlier run's checkpoints."""
    from agents.rl.train import latest_checkpoint
    from experiments.tracking import start_run
    from experiments.workflow.phases import train_policy

    out = tmp_path / "policy"
    for _ in range(2):
        tracker = start_run(command="train", config={}, mode="disabled")
        try:
            assert Path(train_policy(timesteps=32, seed=0, out=out, tracker=tracker, log=lambda _: None)).exists()
        finally:
            tracker.finish()
    assert latest_checkpoint(out).name == "model_32.zip"
