"""The compiled environment core (pipeline/_native/env_core.hpp, env/native_core.py) against the
Python reference: identical observations, rewards, flags, masks, infos and simulator-call counts
over thousands of seeded random trajectories, and a fuzz of its step with bad action arrays."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from env import native_core
from env.editor import N_ACTIONS
from env.pipeline_env import PipelineEnv
from env.scenarios import TRAIN_SCENARIO, ScenarioConfig
from env.vector_env import PipelineVectorEnv
from pipeline import engine

pytestmark = pytest.mark.skipif(engine.env_core(1) is None, reason="needs the compiled engine ('make engine')")

#: Episodes of the differential tests (environment variable to run more or fewer).
EPISODES = int(os.environ.get("ADAPTIS_NATIVE_DIFF_EPISODES", "2000"))
SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))
#: Single-environment configurations the core is checked on: make()'s defaults; training's draws
#: (2-32 devices, several nodes, mixed speeds, zoo models) with a call budget, stop masked and
#: zero-shot starts; small scenarios with a tight call budget (episodes end on calls).
CONFIGS = {
    "default": {},
    "train": {"scenario": TRAIN_SCENARIO, "max_calls": 40, "allow_stop": False, "single_start_share": 0.3},
    "small-calls": {"scenario": SMALL, "max_calls": 20, "max_steps": 30, "step_cost": 0.01},
}


def _action(mask: np.ndarray, rng: np.random.Generator) -> int:
    """Mostly a random allowed edit; now and then stop or a masked action (both must behave alike)."""
    u = rng.random()
    if u < 0.03:
        return 0
    if u < 0.08 and not mask.all():
        return int(rng.choice(np.flatnonzero(~mask)))
    allowed = np.flatnonzero(mask[1:]) + 1
    return int(rng.choice(allowed)) if len(allowed) else 0


def _same_state(core, env: PipelineEnv, obs: dict, info: dict) -> None:
    for k, arr in (("stages", core.stages[0]), ("devices", core.devices[0]), ("plan", core.plan[0])):
        assert np.array_equal(obs[k], arr), k
    assert np.array_equal(info["action_mask"].astype(bool), core.masks[0])
    assert info["sim_calls"] == core.sim_calls[0]
    assert info["iteration_time"] == core.iteration_time[0]
    assert info["best_iteration_time"] == core.best_iteration_time[0]
    assert info["feasible"] == core.feasible[0]
    assert native_core.candidate_of(core.candidate(0, False)) == info["candidate"]
    assert native_core.candidate_of(core.candidate(0, True)) == info["best_candidate"]


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_core_steps_as_the_python_env(config):
    """Each config's share of :data:`EPISODES` seeded episodes (2,001 in all by default): the Python
    env is reset, its state handed to the core, and both take the same random actions (allowed
    ones, masked ones, stop)."""
    _differential(config, max(1, -(-EPISODES // len(CONFIGS))), first_seed=0)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_core_steps_as_the_python_env_quick(config):
    """:func:`test_core_steps_as_the_python_env` on 20 other episodes per config (``make test-fast``)."""
    _differential(config, 20, first_seed=10**5)


def _differential(config: str, episodes: int, *, first_seed: int) -> None:
    kwargs = CONFIGS[config]
    core = engine.env_core(1)
    rng = np.random.default_rng(len(config) + first_seed)
    steps = kept = masked = 0
    for ep in range(episodes):
        env = PipelineEnv(**kwargs)
        obs, info = env.reset(seed=first_seed + 1000 * len(config) + ep)
        assert native_core.load(core, 0, env)
        _same_state(core, env, obs, info)
        done = False
        while not done:
            a = _action(info["action_mask"].astype(bool), rng)
            obs, reward, term, trunc, info = env.step(a)
            engine.env_step(core, np.array([a], dtype=np.int64), np.array([True]))
            assert reward == core.rewards[0] and term == core.terminated[0] and trunc == core.truncated[0]
            assert info["kept"] == core.kept[0] and info["edit"] == native_core.edit_name(int(core.edits[0]))
            _same_state(core, env, obs, info)
            steps += 1
            kept += info["kept"]
            masked += info["edit"] == "masked"
            done = term or trunc
    assert steps > 3 * episodes and kept > 0 and masked > 0  # the trajectories did edit, keep and mask


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "threads"), [(AutoresetMode.NEXT_STEP, 2), (AutoresetMode.SAME_STEP, 1)])
def test_vector_env_native_equals_python(mode, threads):
    """PipelineVectorEnv on the core against the same vector env stepped in Python (which
    tests/env/test_vector_env.py holds equal to N single environments), through autoresets, until
    half of :data:`EPISODES` episodes have ended; with 2 threads the core steps beside the autoresets."""
    n, kw = 32, {"scenario": SMALL, "max_steps": 12, "single_start_share": 0.2}
    nat = PipelineVectorEnv(n, autoreset_mode=mode, native=True, engine_threads=threads, **kw)
    ref = PipelineVectorEnv(n, autoreset_mode=mode, native=False, **kw)
    o1, i1 = nat.reset(seed=7)
    o2, i2 = ref.reset(seed=7)
    assert nat._native.all() and not ref._native.any()
    rng = np.random.default_rng(7)
    ended = 0
    while ended < EPISODES // 2:
        assert all(np.array_equal(o1[k], o2[k]) for k in o1)
        _same_infos(i1, i2)
        masks = nat.action_masks()
        assert np.array_equal(masks, ref.action_masks())
        acts = np.array([_action(m, rng) for m in masks])
        o1, r1, t1, u1, i1 = nat.step(acts)
        o2, r2, t2, u2, i2 = ref.step(acts)
        assert np.array_equal(r1, r2) and np.array_equal(t1, t2) and np.array_equal(u1, u2)
        ended += int((t1 | u1).sum())


def _same_infos(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], dict):
            _same_infos(a[k], b[k])
        elif k == "final_obs":
            for u, v in zip(a[k], b[k]):
                assert (u is None) == (v is None)
                assert u is None or all(np.array_equal(u[j], v[j]) for j in u)
        else:
            assert a[k].dtype == b[k].dtype and (a[k] == b[k]).all(), k


def test_fuzz_the_core_step_with_bad_arrays():
    """Random shapes, dtypes and values straight into ``EnvCore.step``: each call steps (finite
    rewards, masks with an allowed action) or raises one TypeError / ValueError naming the problem;
    a refused call changes nothing (the arrays read as before)."""
    n = 4
    core = engine.env_core(n, threads=2)
    envs = [PipelineEnv(scenario=SMALL, max_steps=50) for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        assert native_core.load(core, i, env)
    rng = np.random.default_rng(3)
    stepped = refused = 0
    for _ in range(400):
        shape = [(n,), (n,), (n,), (n - 1,), (n, 2), (), (n + 1,)][rng.integers(7)]
        kind = rng.integers(6)
        if kind == 0:
            acts = rng.integers(-3, N_ACTIONS + 3, size=shape)
        elif kind == 1:
            acts = rng.integers(0, N_ACTIONS, size=shape)
        elif kind == 2:
            acts = rng.uniform(-1, N_ACTIONS, size=shape)
        elif kind == 3:
            acts = rng.integers(0, 100, size=shape).astype(rng.choice([np.int8, np.uint16, np.int32]))
        elif kind == 4:
            acts = rng.integers(0, 2, size=shape).astype(bool)
        else:
            acts = np.array([rng.choice(np.flatnonzero(m)) for m in core.masks], dtype=np.int64)
        which = rng.random(n) < 0.7 if rng.random() < 0.9 else rng.integers(0, 2, size=n)
        before = core.plan.copy(), core.masks.copy(), core.sim_calls.copy()
        try:
            core.step(acts, which)
        except (TypeError, ValueError) as exc:
            assert str(exc) and "\n" not in str(exc).strip()
            assert np.array_equal(before[0], core.plan) and np.array_equal(before[1], core.masks)
            assert np.array_equal(before[2], core.sim_calls)
            refused += 1
            continue
        stepped += 1
        assert np.isfinite(core.rewards).all() and core.masks.any(axis=1).all()
        assert np.isfinite(core.plan).all() and (np.abs(core.plan) <= 8).all()
    assert stepped > 50 and refused > 50
    with pytest.raises(IndexError):
        core.candidate(n, False)
    with pytest.raises(IndexError):
        core.deactivate(-1)
    core.deactivate(1)
    with pytest.raises(ValueError, match="environment 1 is not loaded"):
        core.step(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        engine.env_core(0)


def test_masked_action_costs_a_step_and_no_call():
    """A masked action changes nothing, costs no simulator call, uses a step and gives -step_cost."""
    core = engine.env_core(1)
    env = PipelineEnv(scenario=SMALL, max_steps=3)
    env.reset(seed=2)
    assert native_core.load(core, 0, env)
    masked = int(np.flatnonzero(~core.masks[0])[0])
    calls, plan = int(core.sim_calls[0]), core.plan[0].copy()
    for k in range(3):
        core.step(np.array([masked], dtype=np.int64), np.array([True]))
        assert core.rewards[0] == -env.step_cost and not core.kept[0] and core.edits[0] == -2
        assert core.truncated[0] == (k == 2) and not core.terminated[0]
    assert core.sim_calls[0] == calls and np.array_equal(core.plan[0][:25], plan[:25])


def test_episodes_the_core_does_not_port_step_in_python():
    """An episode on a caller's evaluator is left to Python (its calls are counted there)."""
    from env.editor import SharedEvaluator
    from env.scenarios import sample_scenario

    scenario = sample_scenario(np.random.default_rng(0), SMALL)
    vec = PipelineVectorEnv(2, scenario=SMALL)
    vec.reset(seed=0, options={"evaluator": SharedEvaluator(scenario)})
    assert not vec._native.any()
    vec.reset(seed=0)
    assert vec._native.all()
    with pytest.raises(ValueError, match="native must be"):
        PipelineVectorEnv(1, native="yes")


def test_balanced_split_is_the_python_dp():
    """The compiled DP split (:func:`pipeline.engine.balanced_split`) equals
    :func:`pipeline.balance.balanced_sizes` on drawn scenarios, every family placement, mixed speeds."""
    from dataclasses import replace

    from env.editor import PLACEMENT_FAMILIES
    from env.scenarios import sample_scenario
    from pipeline.balance import balanced_sizes
    from pipeline.candidates import make_placement
    from pipeline.spec import Device

    rng = np.random.default_rng(5)
    checked = 0
    for k in range(150):
        z = sample_scenario(rng, TRAIN_SCENARIO)
        if k % 3 == 0:  # mixed speeds on every third
            speeds = [float(rng.choice([0.5, 0.65, 0.8, 1.0])) for _ in range(z.devices)]
            z = replace(z, cluster=replace(z.cluster, device_list=tuple(
                Device(speed=s, memory_gb=z.cluster.memory_gb) for s in speeds)))
        env = PipelineEnv()
        env.reset(seed=k, options={"scenario": z})
        prep = env.episode_state()["prep"]
        for kind, chunks in PLACEMENT_FAMILIES:
            if z.devices * chunks > z.profile.num_layers:
                continue
            placement = make_placement(kind, z.devices, chunks)
            expected = balanced_sizes(z.profile, placement, z.cluster)
            # (the engine itself: balanced_of may answer from the memo the evaluators share)
            assert engine.balanced_split(prep.prefix.tolist(), [z.cluster.speeds[d] for d in placement]) == expected
            assert native_core.balanced_of(prep, placement) == expected
            checked += 1
    assert checked > 400


def test_one_split_memo_per_scenario(monkeypatch):
    """balanced_of keeps its splits in the memo the scenario's evaluators share: a zero-shot start after
    a portfolio start finds them there and runs no Python DP."""
    import pipeline.evaluator

    env = PipelineEnv()
    env.reset(seed=3, options={"start": "portfolio"})
    prep = env.episode_state()["prep"]
    assert prep.native_balanced is prep.evaluator.balanced_memo
    z = prep.scenario

    def no_dp(*args, **kwargs):
        raise AssertionError("the Python DP ran")

    monkeypatch.setattr(pipeline.evaluator, "balanced_sizes", no_dp)
    env.reset(options={"scenario": z, "start": "single"})
    sizes = env.editor.current.sizes
    assert sizes in {native_core.balanced_of(prep, p) for p in prep.native_balanced if p and p[0] != "speeds"}


def test_table_fields_lists_are_the_callers_own():
    """What table_fields caches (link matrices, families, presets) reaches each caller as its own lists."""
    env = PipelineEnv(scenario=TRAIN_SCENARIO)
    env.reset(seed=11)
    prep = env.episode_state()["prep"]
    first = native_core.table_fields(prep)
    for placement, _, _ in first["families"]:
        placement.clear()
    for budgets in first["presets"]:
        if budgets is not None:
            budgets.clear()
    for v in first.values():
        if type(v) is list:
            v.clear()
    second = native_core.table_fields(prep)
    assert second["latency"] and second["bandwidth"] and second["prefix"] and second["families"][0][0]
    assert all(v is None or v for v in second["presets"])
    assert second == native_core.table_fields(prep)


@pytest.mark.parametrize("t", [((4, 4), (0, 1), (1.0, 2.0), True, False, True, None, True),
                               ((2, 3, 3), (0, 1, 0), None, False, True, False, 2, False)])
def test_candidate_of_is_the_dataclasss_own(t):
    """candidate_of fills Candidate's fields without its __init__: the same object, field for field,
    hash, equality, description and pickle."""
    import pickle

    from pipeline.candidates import Candidate

    sizes, placement, budgets, split, eager, depth, mpw, counts_w = t
    made = Candidate(sizes, placement, "list", budgets, split_backward=split, eager_w=eager, depth_first=depth,
                     max_pending_w=mpw, cap_counts_w=counts_w)
    fast = native_core.candidate_of(t)
    assert fast.__dict__ == made.__dict__ and list(fast.__dict__) == list(made.__dict__)
    assert fast == made and hash(fast) == hash(made) and fast.describe() == made.describe()
    assert pickle.loads(pickle.dumps(fast)) == made
