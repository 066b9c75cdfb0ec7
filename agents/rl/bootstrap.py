"""Time-limit bootstraps of a PPO rollout step in one forward pass (an SB3 callback)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["batched_bootstrap"]


def batched_bootstrap() -> Any:
    """An SB3 callback that bootstraps the step's truncated episodes in **one** forward pass.

    SB3's ``collect_rollouts`` adds ``gamma x V(terminal observation)`` to the reward of each
    environment whose episode was cut by its time limit (``info["TimeLimit.truncated"]``), one
    forward pass per environment (each episode here ends so: with hundreds of environments, a
    tenth of them a step). It calls the callbacks (``on_step``, after ``update_locals``) right
    before that loop, so this callback adds the same values from one batched pass to the step's
    ``rewards`` and clears ``TimeLimit.truncated`` of those environments (``TimeLimit.bootstrapped``
    says they were), which leaves SB3's loop nothing to do. It must be the last callback (the ones
    before it read the infos as the environment gave them); ``bootstrapped`` counts the episodes.
    Where the locals are not SB3's ``collect_rollouts``' (another algorithm), it does nothing.
    ``tests/agents/rl/test_bootstrap.py`` holds the rewards to SB3's own loop."""
    import torch as th
    from stable_baselines3.common.callbacks import BaseCallback

    class BatchedBootstrap(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.bootstrapped = 0

        def _on_step(self) -> bool:
            loc = self.locals
            rewards, dones, infos = loc.get("rewards"), loc.get("dones"), loc.get("infos")
            if not isinstance(rewards, np.ndarray) or dones is None or infos is None or "n_rollout_steps" not in loc:
                return True
            idx = [i for i in np.flatnonzero(dones).tolist() if infos[i].get("TimeLimit.truncated", False)
                   and infos[i].get("terminal_observation") is not None]
            if not idx:
                return True
            finals = [infos[i]["terminal_observation"] for i in idx]
            obs = ({k: np.stack([o[k] for o in finals]) for k in finals[0]} if isinstance(finals[0], dict)
                   else np.stack(finals))
            policy = self.model.policy
            with th.no_grad():
                values = policy.predict_values(policy.obs_to_tensor(obs)[0]).cpu().numpy().reshape(-1)
            rewards[idx] += (self.model.gamma * values).astype(rewards.dtype)
            for i in idx:
                infos[i]["TimeLimit.truncated"] = False
                infos[i]["TimeLimit.bootstrapped"] = True
            self.bootstrapped += len(idx)
            return True

    return BatchedBootstrap()
