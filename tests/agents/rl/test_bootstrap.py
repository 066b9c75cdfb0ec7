"""agents/rl/bootstrap.py: time-limit bootstraps in one batched pass, as SB3's own loop gives them."""

from __future__ import annotations

import numpy as np

from agents.rl.train import silent_sb3_logger


def test_batched_bootstrap_gives_sb3s_own_rewards() -> None:
    """The truncated episodes' bootstrapped rewards, one batched pass per step, are those of SB3's
    per-environment loop (same seeds: the same rollout), and that loop then adds nothing."""
    import torch as th
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import VecMonitor

    from agents.rl.bootstrap import batched_bootstrap
    from agents.rl.net import EntityPolicy
    from agents.vec_adapter import make_vec_env
    from env.scenarios import ScenarioConfig

    small = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))
    th.set_num_threads(1)

    def rollout(callbacks: list) -> tuple[np.ndarray, np.ndarray]:
        vec = VecMonitor(make_vec_env(8, scenario=small, max_steps=3, allow_stop=False))
        vec.seed(0)
        model = MaskablePPO(EntityPolicy, vec, n_steps=8, batch_size=64, n_epochs=1, seed=0, device="cpu",
                            policy_kwargs={"hidden": 16})
        model.set_logger(silent_sb3_logger())
        model.learn(64, callback=callbacks)
        buf = model.rollout_buffer
        vec.close()
        return buf.rewards.copy(), buf.episode_starts.copy()

    boot = batched_bootstrap()
    ours, starts = rollout([boot])
    sb3, sb3_starts = rollout([])
    assert boot.bootstrapped >= 8  # episodes of 3 edits end by their time limit
    np.testing.assert_array_equal(starts, sb3_starts)
    np.testing.assert_allclose(ours, sb3, rtol=1e-5, atol=1e-6)
