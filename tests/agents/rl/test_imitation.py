"""Imitation of the one-step oracle: targets, labelled states from real rollouts, a fit that learns."""

from __future__ import annotations

import numpy as np
import pytest

from agents.rl.imitation import ImitationConfig, collect_states, fit_policy, imitation_targets


def test_targets_favour_bigger_gains_and_ignore_rollbacks():
    gains = np.array([[0.0, 0.02, 0.01, 0.0, -0.0], [0.0, 0.0, 0.0, 0.3, 0.0]])
    t = imitation_targets(gains, temperature=0.25)
    assert np.allclose(t.sum(axis=1), 1.0)
    assert t[0, 1] > t[0, 2] > 0 and t[0, 0] == t[0, 3] == 0.0
    assert t[1, 3] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def states() -> dict[str, np.ndarray]:
    return collect_states(120, seed=3, max_steps=8, max_calls=20)


def test_collected_states_are_labelled_by_real_simulations(states):
    mask, gains = states["mask"], states["gains"]
    assert len(mask) == 120 and states["stages"].shape[0] == 120
    assert (gains.max(axis=1) > 0).all()  # only states where some edit improves are kept
    assert not (gains[~mask] > 0).any()  # a gain only on allowed edits
    assert ((gains > 0).sum(axis=1) < mask.sum(axis=1)).mean() > 0.5  # most allowed edits do not improve


def test_fit_learns_to_pick_improving_edits(states):
    from sb3_contrib import MaskablePPO

    from agents.rl.net import EntityPolicy
    from env.pipeline_env import PipelineEnv

    policy = MaskablePPO(EntityPolicy, PipelineEnv(), seed=0, device="cpu").policy
    history = fit_policy(policy, states, config=ImitationConfig(epochs=15, batch_size=32, learning_rate=3e-3))
    assert history[-1]["imitation/loss"] < 0.8 * history[0]["imitation/loss"]
    # On the states it was fitted to, its pick improves far more often than a random allowed edit.
    import torch as th

    with th.no_grad():
        obs = {k: th.as_tensor(states[k]) for k in ("stages", "devices", "plan")}
        latent = policy.mlp_extractor.forward_actor(policy.extract_features(obs, policy.pi_features_extractor))
        logits = policy.action_net(latent).masked_fill(~th.as_tensor(states["mask"]), -1e9)
    pick = logits.argmax(dim=1).numpy()
    picked_improves = (states["gains"][np.arange(len(pick)), pick] > 0).mean()
    random_improves = ((states["gains"] > 0).sum(1) / states["mask"][:, 1:].sum(1)).mean()
    assert picked_improves > random_improves + 0.2, (picked_improves, random_improves)
