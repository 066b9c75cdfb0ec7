"""``python -m experiments sweep``: grid parsing, refusals, and a small sweep read back from W&B."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agents.base import Budget
from experiments.cli import main
from experiments.sweeps import check_params, grid, parse_params, run_sweep
from experiments.tracking.offline import read_offline_run
from pipeline.errors import ConfigError
from pipeline.plan import Plan
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")


def test_parse_params_and_grid_order() -> None:
    params = parse_params(["seed=0,1", "memory-gb=40,80.5", "budget=30s", "eager=true"])
    assert params == {"seed": [0, 1], "memory_gb": [40, 80.5], "budget": ["30s"], "eager": [True]}
    combos = list(grid({"a": [1, 2], "b": ["x", "y"]}))
    assert combos == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]


@pytest.mark.parametrize("items, field", [
    (["seed"], "--param"),
    (["seed=0", "seed=1"], "--param"),
    (["budget=lots"], "budget"),
    (["microbatches=8.5"], "microbatches"),
    (["warp_factor=9"], "warp_factor"),
    (["budget=0"], "budget"),
    (["devices=0"], "devices"),
    (["memory-gb=nan"], "memory_gb"),
    (["method=adaptis,nope"], "--method"),
    (["perturb_moves=-3,x"], "'--param perturb_moves': perturb_moves of method 'adaptis' must be >= 0, got -3"),
    (["perturb_moves=2,x"], "'--param perturb_moves': perturb_moves of method 'adaptis' takes whole numbers, got 'x'"),
    (["perturb_moves=2.5"], "takes whole numbers"),
    (["perturb_moves=true"], "takes whole numbers"),
    (["method=rl+tuner", "rl_share=1.5"], "rl_share of method 'rl+tuner' must be between 0 and 1"),
    (["method=rl+tuner", "samples=-1"], "samples of method 'rl+tuner' must be >= 0"),
    (["method=rl", "zero_shot=1"], "zero_shot of method 'rl' takes true or false"),
    (["method=rl", "policy_path=3"], "policy_path of method 'rl' takes text"),
    (["best_candidate=1"], "best_candidate"),  # an attribute, not a setting
    (["runtime=ideal,megatronn"], "unknown runtime 'megatronn'"),
])
def test_bad_params_are_refused_before_any_trial(items: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_params(parse_params(items), "adaptis")
    assert field in str(err.value)


def test_good_searcher_settings_pass(tmp_path: Path) -> None:
    check_params(parse_params(["perturb_moves=0,2", "method=adaptis"]), "adaptis")
    check_params(parse_params(["method=rl+tuner", "rl_share=0,0.5,1", "samples=0,4", "policy_path=p.pth"]), "adaptis")
    check_params(parse_params(["method=rl", "zero_shot=true,false"]), "adaptis")


@pytest.mark.parametrize("param", ["perturb_moves=-3,x", "devices=100"])
def test_sweep_command_refuses_bad_values_before_any_trial(param: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sweep"
    code = main(["sweep", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--budget", "10",
                 "--param", param, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: field '--param ")
    assert not (out / "trials.jsonl").exists()


def test_searcher_settings_reach_the_searcher(hetero_profile, h100x4) -> None:
    trials = run_sweep({"perturb_moves": [1, 5], "budget": [30]}, profile=hetero_profile, cluster=h100x4,
                       microbatches=8, method="adaptis", budget="30", seed=0)
    assert sorted(t.params["perturb_moves"] for t in trials) == [1, 5]
    assert all(t.feasible and t.speedup and t.speedup >= 1.0 for t in trials)
    assert [t.objective for t in trials] == sorted(t.objective for t in trials)


def test_each_trial_is_priced_on_its_runtime_and_so_is_its_reference(hetero_profile, h100x4) -> None:
    from agents.registry import make_searcher
    from pipeline.candidates import Scenario
    from pipeline.spec import TrainingConfig

    trials = run_sweep({"runtime": ["ideal", "megatron"]}, profile=hetero_profile, cluster=h100x4,
                       microbatches=8, method="megatron", budget="1", seed=0)
    by_runtime = {t.params["runtime"]: t for t in trials}
    for name, trial in by_runtime.items():
        alone = make_searcher("megatron").search(Scenario(hetero_profile, h100x4, 8, TrainingConfig(runtime=name)),
                                                 budget=Budget(1))
        assert trial.iteration_time == pytest.approx(alone.iteration_time)
        assert trial.speedup == pytest.approx(1.0)  # Megatron against itself on the same runtime
    assert by_runtime["megatron"].iteration_time > by_runtime["ideal"].iteration_time


def test_optuna_missing_is_a_clear_error(hetero_profile, h100x4, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ConfigError, match="Optuna is not installed"):
        run_sweep({"seed": [0, 1]}, profile=hetero_profile, cluster=h100x4, microbatches=8, method="adaptis",
                  budget="20", seed=0, sampler="optuna")


def test_sweep_command_logs_each_trial_in_one_group(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    out = tmp_path / "sweep"
    code = main(["sweep", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--param", "budget=20,60",
                 "--param", "memory-gb=30,80", "--out", str(out), "--group", "sw-test"])
    text = capsys.readouterr().out
    assert code == 0 and "best: trial" in text
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {(r["budget"], r["memory_gb"]) for r in rows} == {(20, 30), (20, 80), (60, 30), (60, 80)}
    feasible = [r for r in rows if r["feasible"]]
    assert rows[0]["iteration_time"] == min(r["iteration_time"] for r in feasible)
    Plan.load(out / "best_plan.json")
    runs = [read_offline_run(d, wait_for_exit_s=20) for d in sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))]
    assert len(runs) == 5 and {r.group for r in runs} == {"sw-test"}
    trials = [r for r in runs if r.job_type == "trial"]
    assert sorted(r.config["budget"] for r in trials) == [20, 20, 60, 60]
    assert all(r.metric("iteration_time") for r in trials)
    summary = next(r for r in runs if r.job_type == "summary")
    assert len(summary.tables["trials"]) == 4
    assert summary.artifact("sweep-best-hetero-head-16").type == "plan"


def test_an_infeasible_trial_carries_the_reason_search_gives(tmp_path: Path, capsys) -> None:
    """A trial out of memory names its peak against the usable memory, as `search` does, in its row,
    its table and the last line; it was all None/infeasible with no reason (issue 30)."""
    common = ["--model", "gemma-small", "--devices", "4", "--memory-gb", "8", "--budget", "20"]
    assert main(["search", *common, "--method", "megatron", "--out", str(tmp_path / "search")]) == 3
    said = capsys.readouterr().err.strip().splitlines()[-1]
    searched = said.split(" against ", 1)[1]  # search: "... the smallest peak found is P GiB (m) against ..."
    out = tmp_path / "sweep"
    assert main(["sweep", *common, "--param", "seed=0,1", "--method", "megatron", "--out", str(out)]) == 3
    cap = capsys.readouterr()
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert all(not r["feasible"] and r["reason"].startswith("out of memory: the peak is ") for r in rows)
    assert all(r["reason"].endswith(" against " + searched) for r in rows)
    assert "reason" in cap.out.splitlines()[1] and "out of memory" in cap.out
    last = cap.err.strip().splitlines()[-1]
    assert last == f"no trial found a plan that fits in memory; trial 0: {rows[0]['reason']}"


def test_a_trial_without_a_plan_says_why() -> None:
    from agents.base import SearchResult
    from experiments.sweeps import infeasible_reason
    from tests.conftest import ideal_cluster

    cluster = ideal_cluster(4)
    assert infeasible_reason(SearchResult("rl", None, None, note="skipped: no policy"), cluster) == "skipped: no policy"
    assert infeasible_reason(SearchResult("x", None, None), cluster) == "no plan"
