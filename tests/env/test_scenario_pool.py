"""The scenario pool of the batched environment: today's reset distribution, reproducible, same steps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from env.scenario_pool import PoolEntry, ScenarioPool
from env.scenarios import ScenarioConfig, sample_scenario
from env.vector_env import PipelineVectorEnv
from pipeline.candidates import Scenario

SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))
SEEDS = (0, 1, 2)
#: Total-variation bound between pooled and fresh draws of one feature (about 0.02-0.06 measured
#: for the pool, above 0.15 for the biased one below; 3 x 640 resets of 160 draws a seed).
TV_BOUND = 0.1


def _features(z: Scenario) -> dict[str, object]:
    return {"devices": z.devices, "family": z.profile.name.rsplit("-", 1)[0], "gpu": z.profile.extra["gpu"],
            "microbatches/devices": z.microbatches // z.devices, "layers": min(z.profile.num_layers // 4, 4),
            "tight": bool(min(z.cluster.memory_limits_bytes) < 40 * 2**30)}


def _tv(a: list[Scenario], b: list[Scenario]) -> dict[str, float]:
    """Total-variation distance between the two samples' distributions of each feature."""
    fa, fb = [_features(z) for z in a], [_features(z) for z in b]
    out = {}
    for key in fa[0]:
        ca, cb = Counter(f[key] for f in fa), Counter(f[key] for f in fb)
        out[key] = 0.5 * sum(abs(ca[v] / len(a) - cb[v] / len(b)) for v in set(ca) | set(cb))
    return out


def _fresh(n: int, seed: int) -> list[Scenario]:
    """Today's draws: ``sample_scenario`` from a seeded generator, one after another."""
    rng = np.random.default_rng(10_000 + seed)
    return [sample_scenario(rng, SMALL) for _ in range(n)]


def _pooled_resets(seed: int, *, steps: int = 20, n: int = 32, native: bool | None = None,
                   pool: type[ScenarioPool] | None = None) -> tuple[list[Scenario], PipelineVectorEnv]:
    """The scenario of every reset of a vector env whose episodes last one step (each step resets all)."""
    vec = PipelineVectorEnv(n, scenario=SMALL, max_steps=1, autoreset_mode=AutoresetMode.SAME_STEP,
                            scenario_pool=n, pool_reuse=4, native=native)
    if pool is not None:
        vec._pool = pool(n, reuse=4, config=SMALL)
    seen: list[Scenario] = []
    pooled = vec._pooled

    def record(i: int, s: int | None, options: dict | None) -> PoolEntry | None:
        entry = pooled(i, s, options)
        seen.append(entry.scenario)
        return entry

    vec._pooled = record
    vec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        masks = vec.action_masks()
        vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
    return seen, vec


class _LengthBiasedPool(ScenarioPool):
    """A wrong pool: entries of small clusters serve one reset, the others ``reuse`` (a bias that
    depends on the scenario, as refreshing by episode length or cost would be)."""

    def take(self, **kw) -> PoolEntry:
        entry = super().take(**kw)
        if entry.scenario.devices <= 2:
            entry.uses = self.reuse
        return entry


def test_pooled_resets_draw_todays_scenarios() -> None:
    seen = [_pooled_resets(seed)[0] for seed in SEEDS]
    resets = [z for s in seen for z in s]
    assert len(resets) == len(SEEDS) * 32 * 21  # the first reset and one a step
    assert len({id(z) for z in resets}) < len(resets) / 3  # the pool serves most resets (reuse 4)
    tv = _tv(resets, [z for seed in SEEDS for z in _fresh(len(resets) // len(SEEDS), seed)])
    assert max(tv.values()) < TV_BOUND, tv


def test_the_distribution_check_fails_for_a_biased_pool() -> None:
    resets = [z for seed in SEEDS for z in _pooled_resets(seed, pool=_LengthBiasedPool)[0]]
    tv = _tv(resets, [z for seed in SEEDS for z in _fresh(len(resets) // len(SEEDS), seed)])
    assert tv["devices"] > TV_BOUND, tv


def test_pool_picks_do_not_depend_on_the_draws() -> None:
    """Slot picks come from their own generator: the same seed picks the same slots whatever the draws."""
    a, b = ScenarioPool(8, reuse=2, config=SMALL, seed=5), ScenarioPool(8, reuse=2, config=ScenarioConfig(), seed=5)
    picks_a = [a._pick() for _ in range(50)]
    assert picks_a == [b._pick() for _ in range(50)]
    a.seed(5)
    takes = [a.take() for _ in range(40)]
    assert a.draws == len({id(e) for e in takes}) and all(e.uses <= 2 for e in takes)
    assert Counter(id(e) for e in takes).most_common(1)[0][1] <= 2  # an entry serves at most `reuse` resets
    b.config = SMALL
    b.seed(5)
    assert b.prefetch(lambda: True, limit=3) == 3 and b.prefetch(lambda: True, limit=3) == 0
    ahead = [b.take() for _ in range(40)]  # drawing ahead changes no draw
    assert [e.scenario for e in ahead] == [e.scenario for e in takes]


@pytest.mark.parametrize("single_start_share", [0.0, 0.5])
def test_pooled_vector_env_is_reproducible_and_native_equals_python(single_start_share: float) -> None:
    def rollout(native: bool | None, threads: int = 1) -> list:
        vec = PipelineVectorEnv(16, scenario=SMALL, max_steps=6, scenario_pool=8, pool_reuse=3, native=native,
                                single_start_share=single_start_share, engine_threads=threads)
        rng = np.random.default_rng(3)
        out = []
        obs, info = vec.reset(seed=7)
        out.append((obs, info["sim_calls"], info["iteration_time"]))
        for _ in range(30):
            masks = vec.action_masks()
            obs, rew, term, trunc, info = vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
            out.append((obs, rew, term, trunc, info["sim_calls"], info["iteration_time"], info["reference_time"],
                        info["action_mask"], [c.describe() for c in info["best_candidate"]]))
        assert vec.scenario_pool.draws < 16 + 30 * 16 // 3
        return out

    def same(a: list, b: list) -> None:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            for u, v in zip(x, y):
                if isinstance(u, dict):
                    assert all(np.array_equal(u[k], v[k]) for k in u)
                else:
                    assert np.array_equal(np.asarray(u), np.asarray(v))

    first = rollout(None)
    same(first, rollout(None))  # reset(seed=...) twice: the same trajectories
    same(first, rollout(False))  # the compiled core's kept starts as the Python resets
    same(first, rollout(None, threads=2))  # scenarios drawn ahead while the core steps: the same draws


def test_pool_leaves_named_scenarios_and_fixed_subclasses_alone() -> None:
    vec = PipelineVectorEnv(2, scenario=SMALL, scenario_pool=4)
    z = sample_scenario(np.random.default_rng(0), SMALL)
    vec.reset(seed=0, options={"scenario": z})
    assert all(e.editor.scenario is z for e in vec.envs)
    assert vec.scenario_pool.draws == 0
    vec.reset(seed=1)
    assert vec.scenario_pool.draws >= 1


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_pool_arguments(bad) -> None:
    with pytest.raises(ValueError, match="scenario_pool"):
        PipelineVectorEnv(2, scenario=SMALL, scenario_pool=bad)
    with pytest.raises(ValueError, match="pool_reuse"):
        PipelineVectorEnv(2, scenario=SMALL, scenario_pool=2, pool_reuse=0)
    with pytest.raises(ValueError, match="reuse"):
        ScenarioPool(2, reuse=0)


def test_sb3_adapter_steps_a_pooled_vector_env() -> None:
    from agents.vec_adapter import make_vec_env

    vec = make_vec_env(4, scenario=SMALL, max_steps=2, scenario_pool=4, pool_reuse=2)
    vec.seed(0)
    obs = vec.reset()
    rng = np.random.default_rng(0)
    dones = 0
    for _ in range(6):
        masks = np.stack(vec.env_method("action_masks"))
        obs, rewards, done, infos = vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
        assert all("terminal_observation" in info for info, d in zip(infos, done) if d)
        dones += int(done.sum())
    assert dones >= 4 and vec.vector_env.scenario_pool.draws >= 1
    vec.close()


def test_a_two_thread_vector_env_draws_ahead_while_its_core_steps_and_restores_the_switch_interval() -> None:
    import sys

    switch = sys.getswitchinterval()
    vec = PipelineVectorEnv(8, scenario=SMALL, max_steps=50, scenario_pool=8, pool_reuse=1, engine_threads=2,
                            allow_stop=False)
    vec.reset(seed=1)
    rng = np.random.default_rng(0)
    drawn = []
    for _ in range(6):  # no episode ends (50 steps each, no stop): the core steps on its thread, the pool draws
        masks = vec.action_masks()
        vec.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
        drawn.append(vec.scenario_pool.ahead)
        assert sys.getswitchinterval() == switch
    assert drawn[-1] > 0 and max(drawn) <= 8  # at most one scenario ahead per environment
    assert drawn == sorted(drawn)
    vec.close()
