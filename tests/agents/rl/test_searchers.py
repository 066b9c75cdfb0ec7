"""RL agents: a short training run learns, policies save/load/plan, resume, searchers and commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.base import Budget
from agents.rl.policy import DEFAULT_POLICY, load_policy
from agents.rl.searchers import RLSearcher, RLTunerSearcher, rollout
from agents.rl.train import PPOConfig, latest_checkpoint, train
from agents.tuner import AdaptisTuner
from env.pipeline_env import PipelineEnv
from env.scenarios import ScenarioConfig, sample_scenario
from pipeline.candidates import Candidate, Scenario
from pipeline.errors import ConfigError
from pipeline.evaluator import Evaluator
from pipeline.spec import LayerCost, ModelProfile
from tests.conftest import ideal_cluster

# A fixed scenario with an obviously bad start: 12 equal layers, 9 of them on device 0.
_LAYERS = tuple(LayerCost(f"l{i}", "attention+mlp", 1.0, 1.0, 1.0, 1000, 1000, 0) for i in range(12))
SCENARIO = Scenario(ModelProfile("fixed", _LAYERS), ideal_cluster(4), 8)
BAD_START = Candidate((9, 1, 1, 1), (0, 1, 2, 3), "list", (4.0, 3.0, 2.0, 1.0))


def _fixed_env(rank: int = 0) -> PipelineEnv:
    class Fixed(PipelineEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed, options={"scenario": SCENARIO, "start": BAD_START, **(options or {})})

    return Fixed(max_steps=1)  # one edit: only the DP rebalance (or re-picking sequential) gives ~3x


def _episode_gain(policy) -> float:
    env = _fixed_env()
    ev = Evaluator(SCENARIO)
    env.reset(options={"evaluator": ev})
    start = env.editor.result.iteration_time
    _, _, res = rollout(policy, env, scenario=SCENARIO, evaluator=ev, max_calls=10, deterministic=True,
                        start=[BAD_START])
    return start / res.iteration_time


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny MaskablePPO run on the fixed scenario (a few seconds)."""
    out = tmp_path_factory.mktemp("train")
    config = PPOConfig(timesteps=512, seed=0, n_envs=1, out=str(out), eval_every=0, checkpoint_every=256,
                       n_steps=128, batch_size=64, learning_rate=3e-3, progress_bar=False, max_steps=1)
    summary = train(config, env_fn=_fixed_env)
    return out, summary


def test_short_training_improves_over_untrained(trained):
    from sb3_contrib import MaskablePPO

    from agents.rl.net import EntityPolicy

    untrained = MaskablePPO(EntityPolicy, _fixed_env(), seed=0, device="cpu").policy
    before = _episode_gain(untrained)
    out, _ = trained
    policy, meta = load_policy(out / "policy.pth")
    after = _episode_gain(policy)
    assert meta["algo"] == "maskable-ppo" and meta["network"] == "entity" and meta["num_timesteps"] == 512
    assert after > 2.0 and after > before + 0.5, (before, after)  # one layer moved: 9/8; rebalanced: ~2.4x


@pytest.mark.parametrize("devices,blocks,zero_shot", [(2, 6, False), (5, 20, True), (32, 40, False)])
def test_saved_policy_plans_other_sizes(trained, devices, blocks, zero_shot):
    """One policy (trained on 4 devices) plans 2 to 32 devices; zero-shot spends at most 5 calls."""
    out, _ = trained
    cfg = ScenarioConfig(min_devices=devices, max_devices=devices, min_blocks=blocks, max_blocks=blocks,
                         microbatches=(32,))
    scenario = sample_scenario(np.random.default_rng(devices), cfg)
    searcher = RLSearcher(policy_path=str(out / "policy.pth"), samples=2, zero_shot=zero_shot)
    res = searcher.search(scenario, budget=Budget(400), seed=0)
    assert res.ok and res.plan.devices == devices and res.plan.num_layers == scenario.profile.num_layers
    assert 0 < res.sim_calls <= (5 if zero_shot else 40)


def test_policy_metadata_is_checked(trained, tmp_path):
    out, _ = trained
    for name in ("policy.pth", "policy.json"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    meta = json.loads((tmp_path / "policy.json").read_text())
    meta["obs_version"] = "pipeline-v0.0"
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="obs_version"):
        load_policy(tmp_path / "policy.pth")
    (tmp_path / "policy.json").unlink()
    with pytest.raises(ConfigError, match="metadata"):
        load_policy(tmp_path / "policy.pth")


def test_checkpoint_and_resume(trained):
    out, summary = trained
    assert latest_checkpoint(out).name == "model_512.zip"
    config = PPOConfig(timesteps=768, seed=0, n_envs=1, out=str(out), eval_every=0, checkpoint_every=256,
                       n_steps=128, batch_size=64, progress_bar=False, max_steps=1, resume=True)
    again = train(config, env_fn=_fixed_env)
    assert again["timesteps"] == 768 and not again["interrupted"]
    assert latest_checkpoint(out).name == "model_768.zip"
    done = train(config, env_fn=_fixed_env)  # resumed at its total: nothing to learn, the policy is still saved
    assert done["timesteps"] == 768 and Path(done["policy"]).is_file()


def test_default_policy_and_rl_tuner_within_the_tuner_budget():
    assert DEFAULT_POLICY.is_file() and DEFAULT_POLICY.with_suffix(".json").is_file()
    scenario = sample_scenario(np.random.default_rng(99), ScenarioConfig(max_devices=4, max_blocks=16))
    rl = RLSearcher().search(scenario, budget=Budget(400), seed=0)
    assert rl.ok and rl.sim_calls <= 40
    both = RLTunerSearcher().search(scenario, budget=Budget(120), seed=0)
    alone = AdaptisTuner().search(scenario, budget=Budget(120), seed=0)
    assert alone.sim_calls <= 120 and both.sim_calls <= 120  # the same budget, shared by policy and tuner
    # tuner first (its own path, 90% of the calls), then the policy polishes: never worse than that tuner
    first = AdaptisTuner().search(scenario, budget=Budget(108), seed=0)
    assert both.ok and both.iteration_time <= first.iteration_time * (1 + 1e-9)
    policy_first = RLTunerSearcher(order="policy-first").search(scenario, budget=Budget(120), seed=0)
    assert policy_first.ok and policy_first.sim_calls <= 120
    with pytest.raises(ValueError, match="order"):
        RLTunerSearcher(order="sideways").search(scenario, budget=Budget(120))


def _spy_on_searches(monkeypatch) -> list[tuple[str, Budget, float]]:
    """(method, budget, seconds spent) of every search ``evaluate-agent`` runs, in order."""
    from agents import run_methods

    searches = []
    make = run_methods._searcher

    class Spy:
        def __init__(self, method, *args):
            self.method, self.inner = method, make(method, *args)
            self.name = self.inner.name

        def search(self, scenario, *, budget, **kwargs):
            res = self.inner.search(scenario, budget=budget, **kwargs)
            searches.append((self.method, budget, res.seconds))
            return res

    monkeypatch.setattr(run_methods, "_searcher", Spy)
    return searches


def _timed_runs(searches) -> int:
    """How many rl+tuner / adaptis-no-named searches there were; each must have had exactly the wall
    time of the tuner's search just before it as its budget (seconds, no call limit)."""
    tuner, timed = None, 0
    for method, budget, seconds in searches:
        if method == "adaptis":
            tuner = seconds
        elif method in ("rl+tuner", "adaptis-no-named"):
            assert tuner is not None and budget == Budget(sim_calls=None, seconds=tuner)
            timed += 1
    return timed


@pytest.mark.slow  # training, then evaluate-agent and search
def test_commands_with_tiny_budgets(tmp_path, capsys, monkeypatch):
    from experiments.cli import main

    searches = _spy_on_searches(monkeypatch)
    out = tmp_path / "train"
    assert main(["train", "--timesteps", "256", "--n-steps", "128", "--n-envs", "1", "--eval-every", "128",
                 "--eval-scenarios", "1", "--checkpoint-every", "128", "--out", str(out), "--no-progress",
                 "--imitation-states", "40", "--imitation-epochs", "2", "--ranker-scenarios", "6"]) == 0
    assert (out / "policy.pth").is_file() and (out / "learning_curve.png").is_file()
    assert (out / "starts.pt").is_file() and (out / "starts.json").is_file()
    meta = json.loads((out / "policy.json").read_text())
    assert meta["imitation"]["states"] == 40 and meta["ranker"]["scenarios"] == 6
    rows = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows[:3]] == ["random-edits", "untrained", "imitation"]
    assert rows[-1]["timesteps"] == 256
    ea = tmp_path / "ea"
    assert main(["evaluate-agent", "--policy", str(out / "policy.pth"), "--ranker", str(out / "starts.pt"),
                 "--models", "deepseek-small",
                 "--devices", "2", "--heldout", "1", "--budget", "30",
                 "--methods", "rl+tuner,rl,rl-zero,rl-random,no-learning,adaptis",
                 "--samples", "1", "--train-dir", str(out), "--out", str(ea), "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert {r["method"] for r in lines} == {"rl", "rl-zero", "rl-random", "no-learning", "adaptis", "rl+tuner"}
    assert len({r["scenario"] for r in lines}) == 2
    assert all(r["sim_calls"] <= 5 for r in lines if r["method"] == "rl-zero")
    assert _timed_runs(searches) == 2  # rl+tuner ran on the tuner's own wall time, in both scenarios
    summary = json.loads((ea / "summary.json").read_text())
    assert summary["adaptis"]["geomean_quality"] == pytest.approx(1.0)
    assert (ea / "learning_curve.png").is_file() and (ea / "quality.png").is_file()
    assert main(["search", "--model", "deepseek-small", "--devices", "4", "--method", "rl", "--budget", "50",
                 "--policy", str(out / "policy.pth"), "--out", str(tmp_path / "s"), "--json"]) == 0


def test_evaluate_agent_repeats_keep_each_methods_median_run(tmp_path, capsys):
    """--repeats 3: every search runs three times per scenario, one row per method (its median run)."""
    from dataclasses import dataclass

    from experiments.cli import main
    from experiments.commands.evaluate_agent import _median_run

    @dataclass
    class Run:  # what _median_run reads of a SearchResult
        iteration_time: float
        feasible: bool = True

    runs = [Run(3.0), Run(1.0), Run(float("inf"), False), Run(2.0)]
    assert _median_run(runs).iteration_time == 3.0  # of 1, 2, 3, infeasible: the slower middle one
    assert _median_run(runs[:3]).iteration_time == 3.0 and _median_run(runs[1:]).iteration_time == 2.0
    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--budget", "30",
                 "--methods", "adaptis,rl+tuner", "--repeats", "3", "--out", str(tmp_path), "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert sorted(r["method"] for r in lines) == ["adaptis", "rl+tuner"]
    assert json.loads((tmp_path / "summary.json").read_text())["adaptis"]["feasible"] == 1


def test_evaluate_agent_mixed_speeds_and_the_index_order_baseline(tmp_path, capsys):
    """--mixed-speeds draws every held-out scenario on devices of mixed speeds; on draw 50023 (16
    devices of mixed speeds) the slow-first twins of rl's starts find a plan far faster than
    rl-index-order (the same searcher without them): 0.71x its time on the fp32-head cost model
    (draw 50016, the one used before it, now ties)."""
    import argparse

    from experiments.cli import main
    from experiments.commands.evaluate_agent import _scenarios

    args = argparse.Namespace(models="none", hf_config=[], devices="8", gpu="h100", microbatches=32, heldout=3,
                              heldout_seed=50014, mixed_speeds=True, runtime=None)
    assert all(max(p.cluster.speeds) > min(p.cluster.speeds) for _, p in _scenarios(args))
    on_megatron = _scenarios(argparse.Namespace(**{**vars(args), "runtime": "megatron"}))
    assert [p.training.runtime for _, p in on_megatron] == ["megatron"] * 3  # --runtime reaches every scenario
    assert main(["evaluate-agent", "--models", "none", "--heldout", "1", "--heldout-seed", "50023", "--mixed-speeds",
                 "--methods", "rl,rl-index-order", "--out", str(tmp_path), "--json"]) == 0
    rows = {r["method"]: r for r in (json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))}
    assert rows["rl"]["feasible"] and rows["rl"]["sim_calls"] <= 40
    assert rows["rl"]["iteration_time"] < 0.8 * rows["rl-index-order"]["iteration_time"]


def test_evaluate_agent_yardsticks_for_rl_tuner(tmp_path, capsys, monkeypatch):
    """adaptis@N runs the tuner with N calls against the --budget tuner: its path is the same, so
    more calls are never slower; adaptis-no-named runs at the tuner's wall time like rl+tuner; a
    malformed N is a usage error naming --methods."""
    from experiments.cli import main

    searches = _spy_on_searches(monkeypatch)
    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--budget", "30",
                 "--methods", "adaptis@90,adaptis-no-named,adaptis", "--out", str(tmp_path), "--json"]) == 0
    rows = {r["method"]: r for r in (json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))}
    assert rows["adaptis"]["sim_calls"] <= 30 < rows["adaptis@90"]["sim_calls"] <= 90
    assert rows["adaptis@90"]["quality"] >= 1.0 - 1e-12
    assert rows["adaptis-no-named"]["feasible"]
    assert _timed_runs(searches) == 1
    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--methods", "adaptis,adaptis@x",
                 "--out", str(tmp_path)]) == 2
    assert "adaptis@N" in capsys.readouterr().err


def test_evaluate_agent_learned_and_its_random_weights_ablation(tmp_path, capsys):
    """learned and learned-random-w (the same tuner with a prior of random weights) run with --budget
    calls against the --budget tuner, one row each, in the summary too."""
    from experiments.cli import main

    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--budget", "40",
                 "--methods", "adaptis,learned,learned-random-w", "--out", str(tmp_path), "--json"]) == 0
    rows = {r["method"]: r for r in (json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))}
    assert set(rows) == {"adaptis", "learned", "learned-random-w"}
    assert all(r["feasible"] and r["sim_calls"] <= 41 and r["quality"] > 0 for r in rows.values())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learned-random-w"]["feasible"] == 1 and "mean_seconds" in summary["learned-random-w"]


def test_evaluate_agent_several_budgets_rows_carry_anytime_histories(tmp_path, capsys):
    """--budget 20,60: every method runs at each budget (rows say which), each row carries its
    [calls, seconds, best_time] history (calls and seconds rising, times falling, the last its final),
    the summary has one table per budget, and OUT/anytime.png is drawn."""
    from experiments.cli import main

    assert main(["evaluate-agent", "--models", "gemma-small", "--devices", "4", "--budget", "20,60",
                 "--methods", "adaptis,learned,random", "--out", str(tmp_path), "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert sorted((r["budget"], r["method"]) for r in rows) == [
        (b, m) for b in ("20", "60") for m in ("adaptis", "learned", "random")]
    for r in rows:
        h = r["history"]
        assert h and all(len(e) == 3 for e in h)
        assert all(a[0] < b[0] and a[1] <= b[1] and a[2] > b[2] for a, b in zip(h, h[1:]))
        assert h[-1][0] <= r["sim_calls"] and h[-1][1] <= r["seconds"] + 1e-3
        assert h[-1][2] == pytest.approx(r["iteration_time"], rel=1e-9)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"20", "60"} and summary["60"]["adaptis"]["feasible"] == 1
    assert (tmp_path / "anytime.png").stat().st_size > 0 and (tmp_path / "quality.png").exists()


def test_rl_history_marks_its_plans_that_fit_though_it_counts_calls_after_them():
    """rl records an improvement after a whole rollout (its calls so far, not the plan's own call): the
    fit of each entry is the plan's, found by its time."""
    from pipeline.candidates import Scenario
    from pipeline.spec import Cluster
    from pipeline.zoo import zoo_profile

    scenario = Scenario(zoo_profile("gemma-small", seq_len=2048), Cluster(devices=4), 16)
    res = RLSearcher().search(scenario, budget=Budget(40), seed=0)
    assert res.feasible and res.history_fits and res.history_fits[-1] is True
    assert res.anytime()[-1][2] == pytest.approx(res.iteration_time, rel=1e-9)
