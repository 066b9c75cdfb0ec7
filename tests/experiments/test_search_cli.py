"""The search, baselines, simulate and reproduce commands, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.cli import main
from pipeline.plan import Plan, validate_plan
from tests.conftest import ROOT

PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
REQUIRED = {"method", "iteration_time", "bubble", "peak_memory_gb", "feasible", "sim_calls", "seconds"}


def _scenario():
    from pipeline.candidates import Scenario
    from pipeline.spec import Cluster, ModelProfile

    return Scenario(ModelProfile.load(PROFILE), Cluster.load(CLUSTER), 8)


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_search_json_and_files(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method",
                 "zbv,adaptis", "--budget", "60", "--out", str(out), "--json"])
    assert code == 0
    rows = _json_lines(capsys.readouterr().out)
    assert {r["method"] for r in rows} == {"megatron", "zbv", "adaptis"}
    for r in rows:
        assert set(r) >= REQUIRED
        assert isinstance(r["peak_memory_gb"], list) and len(r["peak_memory_gb"]) == 4
    best = min(rows, key=lambda r: r["iteration_time"])
    plan = Plan.load(out / "plan.json")
    validate_plan(plan, num_layers=16, devices=4)
    assert plan.method == best["method"]
    assert (out / "plan.csv").read_text().count("\n") == 4
    for name in ("gantt_best.png", "gantt_megatron.png", "results.jsonl"):
        assert (out / name).stat().st_size > 0


def test_search_table_output(tmp_path, capsys) -> None:
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method",
                 "1f1b,adaptis", "--budget", "30", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0
    assert "speedup" in text and "vs_bound" in text and "best: " in text


def test_no_plan_fits_is_a_clear_answer(tmp_path, capsys) -> None:
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--memory-gb", "1",
                 "--memory-reserve-gb", "0", "--method", "zb-h1,adaptis", "--budget", "40", "--out", str(tmp_path),
                 "--json"])
    captured = capsys.readouterr()
    assert code == 3
    assert "no plan fits in memory" in captured.err and "smallest peak found is" in captured.err
    assert all(not r["feasible"] for r in _json_lines(captured.out))


def test_memory_below_the_reserve_is_named(tmp_path, capsys) -> None:
    # the cluster file reserves 4 GiB per device: 1 GiB of capacity leaves nothing
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--memory-gb", "1",
                 "--method", "1f1b", "--budget", "10", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "memory_reserve_gb" in err and "--memory-reserve-gb" in err


def test_bad_budget_and_method_are_named(tmp_path, capsys) -> None:
    assert main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--budget", "lots", "--out",
                 str(tmp_path)]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--method", "best", "--out",
                 str(tmp_path)]) == 2
    assert "unknown method 'best'" in capsys.readouterr().err


def test_baselines_compares_every_named_schedule_fastest_first() -> None:
    from experiments.commands.baselines import compare
    from pipeline.schedules import NAMED_METHODS

    rows, results = compare(_scenario(), NAMED_METHODS)
    assert {r.method for r in rows} == set(NAMED_METHODS) == {r.method for r in results}
    assert all(r.bubble is not None and r.peak_memory_gb for r in rows if r.valid)
    feasible = [r.iteration_time for r in rows if r.feasible]
    assert feasible and feasible == sorted(feasible) and rows[:len(feasible)] == [r for r in rows if r.feasible]
    mega = next(r for r in rows if r.method == "megatron")
    assert all(r.speedup == pytest.approx(mega.iteration_time / r.iteration_time) for r in rows if r.iteration_time)


def test_baselines_and_simulate(tmp_path, capsys) -> None:
    assert main(["baselines", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--json"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert len(rows) == 11 and all({"method", "iteration_time", "feasible"} <= set(r) for r in rows)
    main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "8", "--method", "zbv",
          "--out", str(tmp_path), "--json"])
    capsys.readouterr()
    png = tmp_path / "sim.png"
    assert main(["simulate", "--profile", PROFILE, "--cluster", CLUSTER, "--plan", str(tmp_path / "plan.json"),
                 "--json", "--gantt", str(png)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["valid"] and row["feasible"] and png.stat().st_size > 0


def test_reproduce_tiny_grid(tmp_path, capsys) -> None:
    code = main(["reproduce", "--families", "gemma", "--sizes", "small", "--seq-lens", "2048", "--budget", "30",
                 "--methods", "megatron,zbv,adaptis", "--microbatches", "16", "--out", str(tmp_path)])
    assert code == 0
    md = (tmp_path / "reproduce.md").read_text()
    assert "gemma-small" in md and "1.16x" in md  # the paper's figure beside ours
    rows = _json_lines((tmp_path / "reproduce.jsonl").read_text())
    adaptis = next(r for r in rows if r["method"] == "adaptis")
    assert adaptis["speedup"] >= 1.0
    assert (tmp_path / "reproduce.png").stat().st_size > 0


@pytest.mark.parametrize("command", ["search", "baselines", "simulate", "reproduce", "profile-info"])
def test_every_command_has_help(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "experiments", command, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_every_method_rl_included_finds_a_plan() -> None:
    """What ``search --method all`` runs: every registered method, each with a feasible plan, and
    rl+tuner (the tuner from the policy's plans) no slower than the tuner alone."""
    from agents.base import Budget
    from agents.registry import all_methods, make_searcher

    scenario = _scenario()
    found = {m: make_searcher(m).search(scenario, budget=Budget(20), seed=0) for m in all_methods()}
    for name in ("rl", "rl+tuner", "adaptis", "random"):
        assert found[name].ok and found[name].feasible, found[name]
    assert found["rl+tuner"].iteration_time <= found["adaptis"].iteration_time


@pytest.mark.parametrize("argv", [
    ["search", "--model", "tiny-hybrid", "--devices", "64"],
    ["search", "--model", "tiny-hybrid", "--devices", "9", "--method", "adaptis"],
    ["baselines", "--model", "tiny-hybrid", "--devices", "9"],
    ["run", "--model", "tiny-hybrid", "--devices", "64"],  # refused before starting 64 local ranks
    ["run", "--model", "tiny-hybrid", "--gpu", "h100", "--devices", "64"],
], ids=lambda a: "-".join(a[:1] + a[-2:]))
def test_more_devices_than_layers_names_the_cause_and_the_fix(argv, tmp_path, capsys) -> None:
    assert main([*argv, *(["--out", str(tmp_path)] if argv[0] != "baselines" else [])]) == 2
    err = capsys.readouterr().err
    assert "field '--devices'" in err and "only 8 layers" in err and "use --devices 8 or fewer" in err
    assert "memory" not in err


def test_more_devices_than_layers_in_a_cluster_file(tmp_path, capsys) -> None:
    cluster = tmp_path / "c16.json"
    cluster.write_text(json.dumps({"devices": 16, "memory_gb": 80, "p2p_gbps": 450, "latency_us": 5}))
    assert main(["search", "--model", "tiny-hybrid", "--cluster", str(cluster), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(cluster) in err and "field 'devices'" in err and "set devices to 8 or fewer" in err


@pytest.mark.parametrize("argv,capacity,reserve", [
    (["--gpu", "h100"], 79.6, 4.0),  # nvidia-smi's 81559 MiB, less the default reserve
    (["--gpu", "h200", "--memory-reserve-gb", "1.5"], 140.4, 1.5),
    (["--gpu", "cpu"], 16.0, 0.0),
    (["--cluster", CLUSTER, "--memory-gb", "40"], 40.0, 4.0),
    (["--cluster", CLUSTER, "--memory-gb", "2", "--memory-reserve-gb", "0"], 2.0, 0.0),
])
def test_cluster_memory_flags_are_gib_less_the_reserve(argv, capacity, reserve) -> None:
    import argparse

    from experiments.common import add_cluster_args, resolve_cluster

    parser = argparse.ArgumentParser()
    add_cluster_args(parser)
    cluster = resolve_cluster(parser.parse_args(argv))
    assert (cluster.memory_gb, cluster.memory_reserve_gb) == (capacity, reserve)
    assert cluster.memory_limits_bytes[0] == pytest.approx((capacity - reserve) * 2**30)


def test_reproduce_prints_the_richer_ceiling_beside_the_whole_layer_one(tmp_path, capsys) -> None:
    code = main(["reproduce", "--families", "nemotronh", "--sizes", "small", "--seq-lens", "2048", "--budget", "30",
                 "--methods", "megatron", "--microbatches", "16", "--granularity", "sublayer", "--head-shards",
                 "auto", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "richer plan space" in out and "| whole-layer ceiling | richer | richer ceiling" in out
    rich = next(r for r in _json_lines((tmp_path / "reproduce.jsonl").read_text()) if r["method"] == "adaptis-richer")
    assert rich["head_shards"] > 1 and rich["vs_lower_bound"] >= 1.0 - 1e-9
    assert rich["speedup"] > 1.0


def test_search_over_finer_units_writes_a_plan_over_them(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["search", "--model", "tiny-hybrid", "--granularity", "sublayer", "--head-shards", "2", "--devices",
                 "2", "--microbatches", "4", "--method", "adaptis", "--budget", "30", "--out", str(out), "--json"])
    assert code == 0
    validate_plan(Plan.load(out / "plan.json"), num_layers=13, devices=2)


def test_granularity_with_a_profile_file_is_refused(capsys) -> None:
    code = main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--granularity", "sublayer"])
    assert code != 0
    assert "--granularity" in capsys.readouterr().err


def test_search_with_gpus_and_a_global_batch_plans_the_whole_job(tmp_path, capsys) -> None:
    out = tmp_path / "job"
    assert main(["search", "--model", "llama-control", "--gpus", "8", "--global-batch", "16", "--seq-len", "1024",
                 "--calls-per-config", "40", "--tune-top", "1", "--microbatch-sizes", "1", "--max-cp", "1",
                 "--json", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    best = lines[-1]["best"]
    assert best["tp"] * best["pp"] * best["dp"] * best["cp"] == 8
    assert Plan.load(out / "plan.json").devices == best["pp"]
    # the whole job's options cannot mix with a measured profile: one error naming the field
    assert main(["search", "--profile", str(ROOT / "experiments/configs/profiles/hetero-head-16.json"),
                 "--gpus", "8", "--global-batch", "16"]) == 2
    assert capsys.readouterr().err.startswith("error: field 'profile'")


def test_search_prove_prints_the_best_plans_proven_gap(tmp_path, capsys) -> None:
    out = tmp_path / "s"
    assert main(["search", "--model", "gemma-small", "--devices", "2", "--microbatches", "4", "--method",
                 "megatron,adaptis", "--budget", "100", "--prove", "5", "--json", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    proof = lines[-1]  # the figures are pipeline.exact.prove()'s (tests/experiments/test_prove_cli.py)
    assert proof["proof"] is True and proof["method"] in {"megatron", "adaptis"}
    assert {"plan_ms", "best_ms", "bound_ms", "gap"} <= set(proof)
