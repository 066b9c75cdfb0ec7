"""Reset workers (env.reset_worker): the pool's draws prepared in other processes, the same episodes."""

from __future__ import annotations

import numpy as np
import pytest

from env import vector_env
from env.pipeline_env import PipelineEnv
from env.reset_worker import ResetFeeder, StartSpec, draw_rng, prepared_starts, redraw
from env.scenarios import ScenarioConfig
from env.vector_env import PipelineVectorEnv

SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))


def _rollout(workers: int, *, seed: int = 3, n: int = 12, steps: int = 30, threads: int = 1, **kw) -> list[tuple]:
    """Every step's masks, observations, rewards, flags and info columns; episodes of 4 steps, a fresh
    pooled scenario at each reset."""
    vec = PipelineVectorEnv(n, scenario=SMALL, max_steps=4, scenario_pool=n, pool_reuse=1, pool_workers=workers,
                            engine_threads=threads, **kw)
    obs, _ = vec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = [tuple(obs.values())]
    for _ in range(steps):
        masks = vec.action_masks()
        obs, rewards, terms, truncs, infos = vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
        out.append((masks, *obs.values(), rewards, terms, truncs, infos["sim_calls"], infos["reference_time"],
                    infos["iteration_time"], infos["best_iteration_time"]))
    vec.close()
    return out


def _same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert np.array_equal(u, v), f"step {k} differs"


def _count_python_resets(monkeypatch) -> list[int]:
    """A list that grows by one at every Python reset (``PipelineEnv.reset_rounds``) from now on."""
    calls: list[int] = []
    rounds = PipelineEnv.reset_rounds

    def counted(self, **kw):
        calls.append(1)
        return rounds(self, **kw)

    monkeypatch.setattr(PipelineEnv, "reset_rounds", counted)
    return calls


def test_workers_give_the_episodes_of_the_in_process_pool(monkeypatch) -> None:
    """Trajectories are identical with 0, 1 and 2 workers, and with workers no reset runs in this
    process after the first (every start is loaded from a worker's packet)."""
    here = _rollout(0)
    calls = _count_python_resets(monkeypatch)
    _same(here, _rollout(1))
    assert len(calls) == 12  # the seeded first reset of each environment, none of the ~90 autoresets
    _same(here, _rollout(2, threads=2))


def test_compiled_starts_give_the_episodes_of_python_resets(monkeypatch) -> None:
    """The in-process pool's autoresets start from the compiled portfolio start (no Python reset after
    the seeded first one); with it switched off each runs the Python reset: the same trajectories."""
    calls = _count_python_resets(monkeypatch)
    compiled = _rollout(0)
    assert len(calls) == 12
    monkeypatch.setattr(vector_env, "portfolio_start", lambda *a, **k: None)
    _same(compiled, _rollout(0))
    assert len(calls) > 12 + 60


def test_a_seeded_reset_draws_its_scenarios_here_without_waiting_for_the_workers() -> None:
    """A seeded reset runs each environment's own reset (it seeds it), so it takes no packet: its draws are
    made here at once and their packets dropped when they come; the autoresets after it take packets."""
    vec = PipelineVectorEnv(6, scenario=SMALL, max_steps=1, scenario_pool=6, pool_reuse=1, pool_workers=1)
    vec.reset(seed=4)
    feeder = vec.scenario_pool._feeder
    assert feeder.made_here == 6 and feeder.index == 6
    vec.step(np.zeros(6, dtype=np.int64))
    vec.step(np.zeros(6, dtype=np.int64))  # (the autoresets of the 1-step episodes)
    assert feeder.made_here == 6 and feeder.index == 12
    vec.close()


def test_a_reseeded_worker_repeats_its_draws() -> None:
    vec = PipelineVectorEnv(6, scenario=SMALL, max_steps=2, scenario_pool=6, pool_reuse=1, pool_workers=1)
    runs = []
    for _ in range(2):
        vec.reset(seed=11)
        rng = np.random.default_rng(0)
        seen = []
        for _ in range(8):
            masks = vec.action_masks()
            obs, rewards, *_ = vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
            seen.append((obs["stages"].copy(), rewards.copy()))
        runs.append(seen)
    vec.close()
    for (oa, ra), (ob, rb) in zip(*runs):
        assert np.array_equal(oa, ob) and np.array_equal(ra, rb)


def test_packets_hold_the_starts_a_reset_here_would_load() -> None:
    """A packet's scenario is the pool's draw of its index, and its start what this process prepares."""
    spec = StartSpec(max_steps=4, step_cost=0.002, max_calls=None, allow_stop=True, share_results=True,
                     singles=(False, True))
    seed = np.random.SeedSequence(5)
    feeder = ResetFeeder(SMALL, spec, seed, workers=2, ahead=4)
    try:
        for index in range(4):
            packet = feeder.next()
            assert packet.index == index
            here = prepared_starts(redraw(SMALL, seed, index), spec)
            assert packet.starts.keys() == here.keys() == {spec.key(False), spec.key(True)}
            for key, (start, reference) in packet.starts.items():  # (the same bytes: every float bit for bit)
                assert start.to_bytes() == here[key][0].to_bytes() and reference == here[key][1]
    finally:
        feeder.close()
    assert not feeder.alive


@pytest.mark.parametrize("entropy", [7, list(range(256)), [2**70 + 5, 0, 2**32], None])
def test_draw_rng_is_the_seeds_spawned_child(entropy) -> None:
    """Whatever the seed's entropy (a vector env's pool takes one seed per environment), and for a seed
    that is itself a child (the pool's draws are its second), twice (the second from kept words)."""
    for seed in (np.random.SeedSequence(entropy), np.random.SeedSequence(entropy).spawn(2)[1]):
        twin = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key, pool_size=seed.pool_size)
        children = twin.spawn(40)
        for _ in range(2):
            for k in (0, 1, 39):
                assert draw_rng(seed, k).bit_generator.state == np.random.default_rng(children[k]).bit_generator.state


def test_a_failing_worker_is_reported_with_its_traceback() -> None:
    spec = StartSpec(max_steps="many", step_cost=0.002, max_calls=None, allow_stop=True, share_results=True)
    feeder = ResetFeeder(SMALL, spec, np.random.SeedSequence(0), timeout_s=60)
    with pytest.raises(RuntimeError, match="(?s)reset worker failed.*many"):
        feeder.next()
    feeder.close()


def test_a_worker_killed_midway_is_reported_within_seconds() -> None:
    import time

    feeder = ResetFeeder(SMALL, StartSpec(4, 0.002, None, True, True), np.random.SeedSequence(0), ahead=2,
                         timeout_s=600)
    feeder.next()
    feeder._processes[0].kill()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped"):
        for _ in range(4):  # (what it sent before it died comes first)
            feeder.next()
    assert time.monotonic() - t0 < 30  # not the 600 s wait
    feeder.close()


def test_a_worker_leaves_ctrl_c_to_the_stepping_process() -> None:
    """Ctrl-C reaches the whole process group; the worker ignores it (the stepping process stops it)."""
    import os
    import signal
    import time

    feeder = ResetFeeder(SMALL, StartSpec(4, 0.002, None, True, True), np.random.SeedSequence(0), ahead=2)
    feeder.next()
    os.kill(feeder._processes[0].pid, signal.SIGINT)
    time.sleep(0.5)
    assert feeder.alive and feeder.next().index == 1
    feeder.close()


def test_close_is_quick_with_a_full_queue() -> None:
    """A worker whose packets fill the pipe exits at once on close (it does not wait to flush them)."""
    import time

    feeder = ResetFeeder(SMALL, StartSpec(4, 0.002, None, True, True), np.random.SeedSequence(0), ahead=128)
    feeder.next()
    time.sleep(1.5)  # (128 packets of ~3 KB: more than a pipe holds)
    t0 = time.monotonic()
    feeder.close()
    assert not feeder.alive and time.monotonic() - t0 < 3.0  # (it was 5 s: the join's timeout, then terminate)


def test_close_stops_the_workers() -> None:
    vec = PipelineVectorEnv(4, scenario=SMALL, max_steps=1, scenario_pool=4, pool_reuse=1, pool_workers=2)
    vec.reset(seed=0)
    vec.step(np.zeros(4, dtype=np.int64))
    vec.step(np.zeros(4, dtype=np.int64))  # the autoresets take the workers' packets
    feeder = vec.scenario_pool._feeder
    assert feeder is not None and feeder.alive
    vec.close()
    assert not feeder.alive


@pytest.mark.parametrize("bad, field", [(-1, "pool_workers"), (9, "pool_workers"), (True, "pool_workers"),
                                        (1.5, "pool_workers")])
def test_bad_pool_workers(bad, field) -> None:
    with pytest.raises(ValueError, match=field):
        PipelineVectorEnv(2, scenario=SMALL, scenario_pool=2, pool_workers=bad)


def test_pool_workers_need_a_pool_the_core_and_plain_environments() -> None:
    with pytest.raises(ValueError, match="scenario_pool > 0"):
        PipelineVectorEnv(2, scenario=SMALL, pool_workers=1)
    with pytest.raises(ValueError, match="compiled core"):
        PipelineVectorEnv(2, scenario=SMALL, scenario_pool=2, pool_workers=1, native=False)

    class Own(PipelineEnv):
        pass

    with pytest.raises(ValueError, match="plain PipelineEnv"):
        PipelineVectorEnv(2, env_factory=Own, scenario_pool=2, pool_workers=1)
    with pytest.raises(ValueError, match="ahead"):
        ResetFeeder(SMALL, StartSpec(4, 0.002, None, True, True), np.random.SeedSequence(0), ahead=0)


def test_make_vec_and_the_sb3_adapter_take_pool_workers() -> None:
    import gymnasium as gym

    import env
    from agents.vec_adapter import make_vec_env

    vec = gym.make_vec(env.ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", scenario=SMALL, max_steps=2,
                       scenario_pool=3, pool_reuse=1, pool_workers=1)
    vec.reset(seed=0)
    for _ in range(4):
        vec.step(np.array([np.flatnonzero(m)[0] for m in vec.action_masks()]))
    assert vec.scenario_pool.draws > 3  # (autoresets took the worker's draws)
    vec.close()
    sb3 = make_vec_env(3, scenario=SMALL, max_steps=2, scenario_pool=3, pool_reuse=1, pool_workers=1)
    sb3.seed(0)
    sb3.reset()
    dones = 0
    for _ in range(4):
        masks = np.stack(sb3.env_method("action_masks"))
        _, _, done, infos = sb3.step(np.array([np.flatnonzero(m)[0] for m in masks]))
        assert all("terminal_observation" in info for info, d in zip(infos, done) if d)
        dones += int(done.sum())
    assert dones >= 3
    sb3.close()
    assert sb3.vector_env.scenario_pool._feeder is None  # (closed with it)
