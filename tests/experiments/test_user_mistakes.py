"""Mistakes a new user makes (issue 30): each gets one line naming the field and the fix, no traceback."""

from __future__ import annotations

import pytest

from experiments.cli import main
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
SCENARIO = ["--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8"]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["search", *SCENARIO, "--method", "megatron"],
    ["sweep", *SCENARIO, "--param", "seed=0", "--budget", "5"],
    ["train", "--timesteps", "64"],
    ["evaluate-agent"],
    ["reproduce"],
    ["run", "--model", "tiny-hybrid", "--devices", "2"],
], ids=lambda a: a[0])
@pytest.mark.parametrize("inside", [False, True], ids=["file", "inside-a-file"])
def test_out_naming_a_file_is_one_line(argv, inside, tmp_path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    out = taken / "sub" if inside else taken
    assert main([*argv, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "field '--out'" in line and str(taken) in line and "not a folder" in line
    assert taken.read_text() == "not a folder"


@pytest.mark.parametrize("argv,field", [
    (["search", *SCENARIO, "--method", "megatron", "--budget", "0"], "--budget"),
    (["search", *SCENARIO, "--method", "megatron", "--budget=-5"], "--budget"),
    (["search", *SCENARIO, "--method", "megatron", "--budget", "0s"], "--budget"),
    (["sweep", *SCENARIO, "--param", "seed=0", "--budget", "0"], "--budget"),
    (["sweep", *SCENARIO, "--param", "budget=5,-1s"], "--param budget"),
], ids=["search-0", "search--5", "search-0s", "sweep-0", "sweep-param--1s"])
def test_a_budget_with_nothing_to_spend_is_refused(argv, field, tmp_path, capsys) -> None:
    assert main([*argv, "--out", str(tmp_path)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"field '{field}'" in line and "at least 1 simulator call" in line
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "trials.jsonl").exists()


def test_a_plan_whose_method_is_no_wandb_name_is_simulated_and_logged(tmp_path, capsys, monkeypatch) -> None:
    """`search --target megatron` may save a plan of method megatron+layout; W&B names allow no '+'."""
    from dataclasses import replace

    from pipeline.plan import Plan

    assert main(["search", *SCENARIO, "--method", "megatron", "--budget", "5", "--out", str(tmp_path), "--json"]) == 0
    plan = Plan.load(tmp_path / "plan.json")
    replace(plan, meta={**plan.meta, "method": "megatron+layout"}).save(tmp_path / "layout.json")
    capsys.readouterr()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--profile", PROFILE, "--cluster", CLUSTER, "--plan", "layout.json",
                 "--trace", "t.json"]) == 0
    assert "megatron+layout" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "runs/wandb").glob("offline-run-*/artifacts/*")] == ["megatron-layout"]
    assert (tmp_path / "t.json").stat().st_size > 0


@pytest.mark.parametrize("command", [["evaluate-agent"], ["search", *SCENARIO, "--method", "rl"]], ids=lambda c: c[0])
def test_a_corrupt_policy_file_is_one_line(command, tmp_path, capsys) -> None:
    from agents.rl.policy import DEFAULT_POLICY

    policy = tmp_path / "p.pth"
    policy.write_bytes(DEFAULT_POLICY.read_bytes()[:3000])
    policy.with_suffix(".json").write_text(DEFAULT_POLICY.with_suffix(".json").read_text())
    assert main([*command, "--policy", str(policy), "--out", str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "field '--policy'" in line and str(policy) in line and "cannot be read" in line


def test_a_misspelt_profile_field_is_one_warning_line(tmp_path, capsys) -> None:
    import json

    raw = json.loads((ROOT / "experiments/configs/profiles/hetero-head-16.json").read_text())
    raw["layers"][3]["b_ful"] = 1.0
    profile = tmp_path / "typo.json"
    profile.write_text(json.dumps(raw))
    assert main(["search", "--profile", str(profile), "--cluster", CLUSTER, "--method", "megatron", "--out",
                 str(tmp_path / "out"), "--json"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "b_ful" in line]
    assert err == [f"warning: {profile}: unknown layer field 'b_ful' (layer 'layer2'; did you mean 'b_full'?): "
                   "kept, but not used"]


def _typo_profile(tmp_path) -> str:
    import json

    raw = json.loads((ROOT / "experiments/configs/profiles/hetero-head-16.json").read_text())
    raw["layers"][3]["b_ful"] = 1.0
    profile = tmp_path / "typo.json"
    profile.write_text(json.dumps(raw))
    return str(profile)


def test_every_command_that_reads_a_profile_has_strict() -> None:
    """--strict comes with --profile (experiments.common.add_strict_arg), whatever the command."""
    import argparse

    from experiments.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    readers = {name for name, p in sub.choices.items() if "--profile" in p._option_string_actions}
    assert {"search", "simulate", "run", "replay", "sweep"} <= readers
    assert [name for name in sorted(readers) if "--strict" not in sub.choices[name]._option_string_actions] == []


@pytest.mark.parametrize("argv", [
    ["search", "--cluster", CLUSTER, "--method", "megatron", "--json"],
    ["sweep", "--cluster", CLUSTER, "--param", "seed=0", "--budget", "5"],
    ["profile-info"],
    ["run", "--gpu", "h100", "--devices", "4", "--method", "megatron"],
    ["replay", "--plan", "no-such-plan-is-read.json"],
], ids=lambda a: a[0])
def test_strict_makes_an_unknown_profile_field_an_error(argv, tmp_path, capsys) -> None:
    """Under --strict the typo is one error line naming the field and the likely one, before any work."""
    profile = _typo_profile(tmp_path)
    if argv[0] == "replay":  # a real plan, so that the profile is what is refused
        assert main(["search", "--model", "tiny-hybrid", "--devices", "2", "--method", "megatron", "--budget", "1",
                     "--out", str(tmp_path / "s"), "--json"]) == 0
        capsys.readouterr()
        argv = ["replay", "--plan", str(tmp_path / "s/plan.json"), "--backend", "gloo"]
    out = tmp_path / ("out.json" if argv[0] == "profile-info" else "out")
    assert main([*argv, "--profile", profile, "--strict", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {profile}: field 'b_ful': unknown layer field, refused under --strict: "
                           "did you mean 'b_full'?"), line
    assert not (out / "plan.json").exists() and not (out / "trials.jsonl").exists() and not out.is_file()


def test_replay_checks_out_before_torchrun_starts(tmp_path, capsys) -> None:
    """It used to write --out only after the whole job had run, and then end in a traceback."""
    assert main(["search", "--model", "tiny-hybrid", "--devices", "2", "--method", "megatron", "--budget", "1",
                 "--out", str(tmp_path / "s"), "--json"]) == 0
    capsys.readouterr()
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["replay", "--plan", str(tmp_path / "s/plan.json"), "--backend", "gloo", "--out", str(taken)]) == 2
    assert "field '--out'" in _one_error_line(capsys.readouterr().err)


def test_a_file_output_inside_a_file_is_one_line(tmp_path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["profile-info", "--model", "tiny-hybrid", "--out", str(taken / "p.json")]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"error: {taken / 'p.json'}: Not a directory"


@pytest.mark.parametrize("argv,field", [
    (["baselines", "--model", "gemma-small", "--devices", "4", "--microbatches", "100000"], "--microbatches"),
    (["search", "--model", "gemma-small", "--devices", "4", "--microbatches", "100000"], "--microbatches"),
    (["sweep", "--model", "gemma-small", "--devices", "4", "--param", "microbatches=8,100000"],
     "--param microbatches"),
    (["evaluate-agent", "--models", "gemma-small", "--devices", "4,8", "--microbatches", "10000"], "--microbatches"),
    (["reproduce", "--sizes", "large", "--microbatches", "5000"], "--microbatches"),
    (["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--microbatches", "100000"],
     "--microbatches"),
], ids=lambda a: a[0] if isinstance(a, list) else None)
def test_too_many_microbatches_are_refused_before_any_work(argv, field, tmp_path, capsys, monkeypatch) -> None:
    """`baselines ... --microbatches 100000` grew ~90 MB/s for minutes without a line: now one line at once,
    before any scenario is set up (a Scenario or an Evaluator made would fail the test)."""
    from experiments.common import MAX_MICROBATCH_DEVICES
    from pipeline.candidates import Scenario
    from pipeline.evaluator import Evaluator

    def work(*_a, **_k) -> None:
        raise AssertionError("work started before the micro-batches were checked")

    monkeypatch.setattr(Scenario, "__init__", work)
    monkeypatch.setattr(Evaluator, "__init__", work)
    assert main([*argv, "--out", str(tmp_path / "out")] if argv[0] != "baselines" else argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"field '{field}'" in line and f"{MAX_MICROBATCH_DEVICES:,}" in line and "KB" in line


def test_the_microbatch_limit_allows_what_fits() -> None:
    from experiments.common import MAX_MICROBATCH_DEVICES, check_microbatches

    check_microbatches(MAX_MICROBATCH_DEVICES // 4, 4)
    check_microbatches(1024, 64)
    with pytest.raises(Exception, match="use --microbatches 16384 or fewer"):
        check_microbatches(MAX_MICROBATCH_DEVICES // 4 + 1, 4)


@pytest.mark.parametrize("argv,field", [
    (["search", *SCENARIO, "--method=--"], "--method"),
    (["evaluate-agent", "--models", "tiny-hybrid", "--devices", "x"], "--devices"),
    (["evaluate-agent", "--heldout-seed", "-5"], "--heldout-seed"),
    (["train", "--seed", "99999999999"], "--seed"),
    (["train", "--imitation-states", "-1"], "--imitation-states"),
    (["train", "--n-steps", "1", "--n-envs", "1"], "--n-steps"),
    (["simulate", "--profile", PROFILE, "--cluster", CLUSTER, "--plan", "p.json", "--gantt", "chart.txt"], "--gantt"),
    (["train", "--learning-rate", "1e9"], "--learning-rate"),
], ids=lambda a: " ".join(a[:1] + a[-2:]) if isinstance(a, list) else None)
def test_what_the_cli_fuzz_found_is_one_line(argv, field, tmp_path, capsys) -> None:
    """Each was a traceback (AttributeError, ValueError, a NaN in PPO, matplotlib) found by the CLI fuzz
    (tests/experiments/test_cli_fuzz.py); argparse's refusals exit through SystemExit(2)."""
    if argv[0] != "simulate":
        argv = [*argv, "--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert field in last and "error" in last, err


def test_an_invalid_plan_is_one_error_line_on_stderr(tmp_path, capsys) -> None:
    """simulate of a plan for another model: the CLI fuzz saw exit 1 with nothing on stderr (it was on stdout)."""
    plan = tmp_path / "search" / "plan.json"
    assert main(["search", *SCENARIO, "--method", "megatron", "--budget", "1", "--out", str(plan.parent)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--plan", str(plan), "--model", "gemma-small", "--devices", "4"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: invalid plan: ") and "field 'partition'" in line
    assert line.endswith(", not 'gemma-small')") and "(the plan was searched for " in line  # no warning line


@pytest.mark.parametrize("command", ["search", "run"])
def test_replay_predicts_a_plan_as_its_search_did_with_the_same_profile(command, tmp_path, capsys) -> None:
    """issue 30: replay predicted 136.5 ms for the plan run predicted at 163 ms, with nothing saying why
    (another profile). With the search's profile and cluster the prediction is the same; with another
    profile replay says so in one line, with the search's figure."""
    from dataclasses import replace

    from experiments.commands.replay import prediction_notes
    from pipeline.plan import Plan
    from pipeline.spec import Cluster, ModelProfile

    out = tmp_path / "out"
    argv = (["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method", "megatron,zbv",
             "--budget", "20", "--json"] if command == "search" else
            ["run", "--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--method", "megatron,zbv",
             "--budget", "20", "--json"])
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    plan = Plan.load(out / "plan.json")
    meta = plan.meta["predicted"]
    profile_file, cluster_file = (PROFILE, CLUSTER) if command == "search" else \
        (str(out / "profile.json"), str(out / "cluster.json"))
    profile, cluster = ModelProfile.load(profile_file), Cluster.load(cluster_file)
    searched_ms, notes = prediction_notes(plan, profile, cluster, profile_file=profile_file, cluster_file=cluster_file,
                                          replay_ms=0.0)
    assert searched_ms / (profile.seconds_per_unit * 1e3) == pytest.approx(meta["iteration_time"], rel=1e-9)
    assert notes[0].startswith(f"predicted with profile {profile_file} and cluster {cluster_file}: search's model")
    assert notes[1].startswith("the same profile and cluster as this plan's search, which predicted")
    if command == "run":
        summary = __import__("json").loads((out / "summary.json").read_text())["summary"]
        assert meta["iteration_time"] == pytest.approx(summary["predicted_time"], rel=1e-9)
    slower = profile.scaled(1.25)
    _, notes = prediction_notes(plan, slower, cluster, profile_file=None, cluster_file=cluster_file, replay_ms=0.0)
    assert notes[0].startswith("predicted with the profile this job measured on this machine")
    assert notes[-1] == (f"note: this plan was searched with another profile ({meta.get('profile_file')}), which "
                         f"predicted {meta['iteration_time']:.4g} {meta['time_unit']}; for the same prediction replay "
                         "it with --profile and --cluster of that search")
    _, notes = prediction_notes(replace(plan, meta={"method": "x"}), profile, cluster, profile_file=None,
                                cluster_file=None, replay_ms=0.0)
    assert len(notes) == 1  # a plan without the search's prediction: nothing to compare


@pytest.mark.slow  # a torchrun job
def test_replay_with_the_searchs_profile_predicts_what_the_search_did(tmp_path, capsys) -> None:
    """End to end: `replay --profile P --cluster C` of a plan `search --profile P --cluster C` wrote gives the
    search's figure for it, says which profile it used and that it is the search's."""
    import json

    profile, cluster = tmp_path / "p.json", tmp_path / "c.json"
    assert main(["profile-info", "--model", "tiny-hybrid", "--out", str(profile), "--json"]) == 0
    cluster.write_text(json.dumps({"devices": 2, "memory_gb": 64, "p2p_gbps": 10, "latency_us": 20}))
    assert main(["search", "--profile", str(profile), "--cluster", str(cluster), "--microbatches", "4", "--method",
                 "megatron", "--out", str(tmp_path / "s"), "--json"]) == 0
    capsys.readouterr()
    plan = tmp_path / "s/plan.json"
    meta = json.loads(plan.read_text())["meta"]["predicted"]
    assert main(["replay", "--plan", str(plan), "--profile", str(profile), "--cluster", str(cluster), "--backend",
                 "gloo", "--steps", "1", "--warmup", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["search_predicted_iteration_time"] == pytest.approx(meta["iteration_time"], rel=1e-9)  # both in ms
    assert row["profile"] == str(profile)
    assert row["notes"][0].startswith(f"predicted with profile {profile} and cluster {cluster}: search's model")
    assert row["notes"][1].startswith("the same profile and cluster as this plan's search")
