"""adaptis/Pipeline-v0: the checkers, masks that only allow valid plans, seeding, options, render."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import env as env_pkg
from env.editor import ACTIONS, MAX_STAGES, N_ACTIONS
from env.pipeline_env import PipelineEnv, observation_space
from env.scenarios import ScenarioConfig
from pipeline.candidates import Candidate, Scenario, materialize
from pipeline.plan import validate_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile

SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))


def _small_env(**kw) -> PipelineEnv:
    return PipelineEnv(scenario=SMALL, **kw)


def _random_allowed(env: PipelineEnv, rng: np.random.Generator) -> int:
    allowed = np.flatnonzero(env.action_masks()[1:]) + 1
    return int(rng.choice(allowed)) if len(allowed) else 0


def test_registered_on_import():
    assert env_pkg.ENV_ID == "adaptis/Pipeline-v0"
    e = gym.make("adaptis/Pipeline-v0", scenario=SMALL)
    obs, info = e.reset(seed=0)
    assert e.observation_space.contains(obs)
    assert info["action_mask"].shape == (N_ACTIONS,)
    e.close()


@pytest.mark.parametrize("checker", ["gymnasium", "sb3"])
def test_env_checkers(checker):
    if checker == "gymnasium":
        from gymnasium.utils.env_checker import check_env

        check_env(_small_env(), skip_render_check=True)
    else:
        from stable_baselines3.common.env_checker import check_env

        check_env(_small_env(), warn=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masks_only_allow_valid_plans(seed):
    """Every allowed edit, from random states, materialises a plan that validates and simulates."""
    e = _small_env(max_steps=6)
    rng = np.random.default_rng(seed)
    e.reset(seed=seed)
    checked = 0
    for _ in range(6):
        ed = e.editor
        mask = e.action_masks()
        assert mask[0] and mask.dtype == bool
        p = ed.scenario
        for a in np.flatnonzero(mask[1:]) + 1:
            cand = ed.targets()[a]
            assert cand is not None, ACTIONS[a]
            assert cand.num_stages <= MAX_STAGES and min(cand.sizes) >= 1
            plan = materialize(cand, p)
            validate_plan(plan, num_layers=p.profile.num_layers, devices=p.devices)
            res = simulate(plan, p.profile, p.cluster, training=p.training)
            assert res.valid, (ACTIONS[a], res.error)
            checked += 1
        _, reward, term, trunc, info = e.step(_random_allowed(e, rng))
        assert isinstance(reward, float) and isinstance(term, bool) and isinstance(trunc, bool)
        if term or trunc:
            break
    assert checked > 20


def test_masked_action_is_a_noop():
    e = _small_env()
    obs, info = e.reset(seed=3)
    masked = int(np.flatnonzero(~e.action_masks())[0])
    calls = info["sim_calls"]
    _, reward, term, trunc, info = e.step(masked)
    assert info["sim_calls"] == calls and info["edit"] == "masked" and reward < 0 and not term


def test_seeding_gives_identical_episodes():
    def episode(seed: int):
        e = _small_env()
        rng = np.random.default_rng(7)
        obs, info = e.reset(seed=seed)
        out = [(info["iteration_time"], obs["plan"].tolist())]
        done = False
        while not done:
            obs, r, term, trunc, info = e.step(_random_allowed(e, rng))
            out.append((r, info["iteration_time"], obs["stages"][:, 2].tolist()))
            done = term or trunc
        return out

    assert episode(11) == episode(11)
    assert episode(11) != episode(12)


def test_fixed_scenario_and_start_options():
    scenario = Scenario(uniform_profile(12), ideal_cluster(4), 8)
    start = Candidate((9, 1, 1, 1), (0, 1, 2, 3), "list", (4.0, 3.0, 2.0, 1.0))
    e = _small_env()
    obs, info = e.reset(options={"scenario": scenario, "start": start, "reference": "megatron"})
    assert info["candidate"] == start and info["sim_calls"] == 1
    assert observation_space().contains(obs)
    rebalance = next(i for i, a in enumerate(ACTIONS) if a.kind == "rebalance")
    _, reward, _, _, info = e.step(rebalance)
    assert info["kept"] and reward > 0.5  # 9 layers on one device -> 3 each: about 2.5x faster
    assert info["best_candidate"].sizes == (3, 3, 3, 3) and e.editor.best_plan.stage_sizes == (3, 3, 3, 3)
    obs, info = e.reset(options={"profile": uniform_profile(20), "cluster": ideal_cluster(3), "microbatches": 6})
    assert e.editor.scenario.devices == 3 and e.editor.scenario.microbatches == 6


def test_max_calls_truncates():
    e = _small_env(max_calls=12)
    rng = np.random.default_rng(0)
    _, info = e.reset(seed=4)
    done = trunc = False
    while not done:
        _, _, term, trunc, info = e.step(_random_allowed(e, rng))
        done = term or trunc
    assert info["sim_calls"] <= 12


@pytest.mark.parametrize("mode", ["ansi", "rgb_array"])
def test_render(mode):
    e = _small_env(render_mode=mode)
    e.reset(seed=0)
    out = e.render()
    if mode == "ansi":
        assert "dev  0 |" in out
    else:
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


def test_subproc_vec_env():
    from stable_baselines3.common.vec_env import SubprocVecEnv

    vec = SubprocVecEnv([_small_env, _small_env])
    vec.seed(0)
    obs = vec.reset()
    assert obs["plan"].shape[0] == 2
    masks = vec.env_method("action_masks")
    acts = [int(np.flatnonzero(m[1:])[0]) + 1 for m in masks]
    obs, rewards, dones, infos = vec.step(np.array(acts))
    assert rewards.shape == (2,) and "action_mask" in infos[0]
    vec.close()


def test_env_edits_plans_over_finer_units():
    from pipeline.zoo import zoo_profile

    fine = zoo_profile("tiny-hybrid", granularity="sublayer", head_shards=2)
    scenario = Scenario(fine, ideal_cluster(2), 4)
    env = _small_env()
    obs, info = env.reset(seed=0, options={"scenario": scenario})
    rng = np.random.default_rng(0)
    for _ in range(6):
        obs, reward, terminated, truncated, info = env.step(_random_allowed(env, rng))
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        if terminated or truncated:
            break
    plan = env.editor.plan
    validate_plan(plan, num_layers=fine.num_layers, devices=2)
    assert plan.num_layers == 13


@pytest.mark.parametrize("seed", [0, 5])
def test_targets_match_the_single_action_reference(seed):
    """The batched mask (targets) and the readable one-action version (target) agree, after edits too."""
    e = _small_env(max_steps=8)
    rng = np.random.default_rng(seed)
    e.reset(seed=seed)
    for _ in range(6):
        ed = e.editor
        want = []
        for a in range(N_ACTIONS):
            t = ed.target(a)
            if t is not None and (t == ed.current or t in ed.tried or ed.ev.known(t)):
                t = None
            want.append(t)
        assert ed.targets() == want
        assert np.array_equal(e.action_masks()[1:], np.array([t is not None for t in want[1:]]))
        _, _, term, trunc, _ = e.step(_random_allowed(e, rng))
        if term or trunc:
            break


def test_repeated_scenario_counts_calls_as_a_fresh_one():
    """A repeated scenario's episode (sharing the memo of the earlier one) sees the same masks,
    calls, rewards and observations as a fresh environment on that scenario."""
    def episode(env: PipelineEnv, **reset) -> list:
        rng = np.random.default_rng(1)
        obs, info = env.reset(**reset)
        out = [obs["plan"].tolist(), info["sim_calls"]]
        done = False
        while not done:
            obs, r, term, trunc, info = env.step(_random_allowed(env, rng))
            out.append((r, info["sim_calls"], info["iteration_time"], env.action_masks().tolist(),
                        obs["stages"].tolist()))
            done = term or trunc
        return out

    shared = _small_env(repeat_scenario=2, max_steps=8)
    first = episode(shared, seed=4)
    scenario = shared.editor.scenario
    second = episode(shared)
    assert shared.editor.scenario is scenario
    assert second == first
    assert episode(_small_env(max_steps=8), options={"scenario": scenario}) == second


@pytest.mark.parametrize("devices", [2, 32])
def test_one_layout_serves_2_to_32_devices(devices):
    from env.scenarios import TRAIN_SCENARIO, sample_scenario

    cfg = ScenarioConfig(min_devices=devices, max_devices=devices, min_blocks=40, max_blocks=40,
                         microbatches=(64,))
    scenario = sample_scenario(np.random.default_rng(0), cfg)
    e = PipelineEnv(max_calls=14)
    obs, info = e.reset(options={"scenario": scenario, "start": "single"})
    assert info["sim_calls"] <= 2 and observation_space().contains(obs)
    S = e.editor.current.num_stages
    assert obs["stages"][:, 0].sum() == S and obs["devices"][:, 0].sum() == devices
    assert not obs["stages"][S:].any() and not obs["devices"][devices:].any()
    mask = e.action_masks()
    assert not mask[1 + S - 1:1 + 127].any()  # no boundary past the last stage
    assert TRAIN_SCENARIO.max_devices == 32


def test_train_and_heldout_scenarios_are_disjoint():
    from env.scenarios import HELDOUT_SCENARIO, TRAIN_SCENARIO, zoo_family

    assert "hybrid-mamba" not in TRAIN_SCENARIO.families
    assert not {zoo_family(m) for m in TRAIN_SCENARIO.zoo_models} & {"hybrid-mamba"}
    assert set(HELDOUT_SCENARIO.families) == {"hybrid-mamba"}
    assert HELDOUT_SCENARIO.min_blocks > TRAIN_SCENARIO.max_blocks
    rng = np.random.default_rng(0)
    from env.scenarios import sample_scenario

    draws = [sample_scenario(rng, TRAIN_SCENARIO) for _ in range(40)]
    assert all(2 <= p.devices <= 32 and 8 <= p.microbatches <= 256 for p in draws)
    assert not any("nemotron" in p.profile.name or "hybrid-mamba" in p.profile.name for p in draws)
    assert any(p.cluster.gpus_per_node and p.devices > p.cluster.gpus_per_node for p in draws)
    assert any(len(set(p.cluster.speeds)) > 1 for p in draws)
    assert max(p.devices for p in draws) > 8


def test_stop_masked_while_edits_are_left():
    e = _small_env(allow_stop=False)
    _, info = e.reset(seed=2)
    mask = e.action_masks()
    assert mask[1:].any() and not mask[0]
    calls = info["sim_calls"]
    _, reward, term, trunc, info = e.step(0)
    assert info["edit"] == "masked" and not term and info["sim_calls"] == calls


def test_fit_memory_repairs_a_plan_that_overflows():
    from env.editor import fit_memory
    from pipeline.evaluator import Evaluator

    scenario = Scenario(uniform_profile(12, params=10, act=10**6), ideal_cluster(4), 16)
    ev = Evaluator(scenario)
    free = Candidate((3, 3, 3, 3), (0, 1, 2, 3), "list", None)
    res = ev.result(free)
    need = max(res.peak_memory)
    tight = Scenario(scenario.profile, scenario.cluster.with_memory(0.6 * need / 2**30), 16)
    ev = Evaluator(tight)
    res = ev.result(free)
    assert res.valid and not res.feasible
    fixed = fit_memory(free, res, ev)
    assert fixed is not None and fixed.budgets is not None and ev.result(fixed).feasible
    assert fit_memory(fixed, ev.result(fixed), ev) is None  # fits already: nothing to do
