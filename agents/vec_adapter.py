"""Stable-Baselines3 on a Gymnasium 1.x VectorEnv: :class:`GymnasiumVecEnv`, a small SB3 ``VecEnv``.

SB3 (2.x) steps its own ``VecEnv`` API: ``step_async``/``step_wait`` returning ``(obs, rewards,
dones, infos)`` with one info dict per environment, an environment that ended reset in the same
step (``infos[i]["terminal_observation"]``, ``infos[i]["TimeLimit.truncated"]``), seeds set by
``seed()`` before ``reset()``. A Gymnasium VectorEnv with ``autoreset_mode=SAME_STEP`` gives the
same steps in one call; this adapter translates the rest. ``env_method("action_masks")`` and
``get_attr``/``set_attr`` reach the sub-environments (``vector_env.envs``), with
``env_method("action_masks")`` answered by the vector env's batched :meth:`action_masks` when it
has one, so sb3-contrib's MaskablePPO reads the masks::

    from agents.vec_adapter import make_vec_env
    from sb3_contrib import MaskablePPO

    vec = make_vec_env(256, max_calls=40)       # adaptis/Pipeline-v0 through gymnasium.make_vec
    model = MaskablePPO("MultiInputPolicy", vec, n_steps=16).learn(4096)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env import VecEnv

__all__ = ["GymnasiumVecEnv", "make_vec_env"]


class GymnasiumVecEnv(VecEnv):
    """SB3 ``VecEnv`` over a Gymnasium 1.x VectorEnv whose ``metadata["autoreset_mode"]`` is
    ``SAME_STEP`` (see the module docstring). ``info_keys``: the info entries copied into SB3's
    per-environment dicts (default: all; fewer is faster with hundreds of environments)."""

    def __init__(self, vector_env: gym.vector.VectorEnv, *, info_keys: Sequence[str] | None = None) -> None:
        mode = vector_env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(f"GymnasiumVecEnv needs a vector env with autoreset_mode=SAME_STEP (SB3 resets an "
                             f"environment in the step that ends it); got {mode!r}: build it with "
                             "autoreset_mode='SameStep'")
        self.vector_env = vector_env
        self.envs: list[Any] = list(getattr(vector_env, "envs", ()))
        self.info_keys = None if info_keys is None else tuple(info_keys)
        self._actions: np.ndarray | None = None
        super().__init__(vector_env.num_envs, vector_env.single_observation_space, vector_env.single_action_space)

    # ------------------------------------------------------------------ stepping

    def reset(self):
        opts = self._options
        if any(o != opts[0] for o in opts):
            raise ValueError("GymnasiumVecEnv passes one options dict to every environment; got different ones")
        obs, infos = self.vector_env.reset(seed=list(self._seeds), options=dict(opts[0]) or None)
        self.reset_infos = self._split(infos)
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async()")
        obs, rewards, terms, truncs, infos = self.vector_env.step(self._actions)
        self._actions = None
        dones = terms | truncs
        out = self._split(infos)
        if dones.any():
            final_obs = infos["final_obs"]
            final_infos = self._split(infos["final_info"])
            for i in np.flatnonzero(dones).tolist():
                self.reset_infos[i] = out[i]
                info = final_infos[i]
                info["terminal_observation"] = final_obs[i]
                info["TimeLimit.truncated"] = bool(truncs[i] and not terms[i])
                out[i] = info
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        self.vector_env.close()

    # ------------------------------------------------------------------ attributes and methods

    def _targets(self, indices: Any) -> list[Any]:
        if not self.envs:
            raise AttributeError(f"{type(self.vector_env).__name__} exposes no sub-environments (.envs)")
        return [self.envs[i] for i in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        if attr_name == "render_mode" and not self.envs:
            return [self.vector_env.render_mode] * self.num_envs
        return [getattr(e, attr_name) for e in self._targets(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        for e in self._targets(indices):
            setattr(e, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: Any = None, **method_kwargs) -> list[Any]:
        if method_name == "action_masks" and indices is None and hasattr(self.vector_env, "action_masks"):
            return list(self.vector_env.action_masks())
        return [getattr(e, method_name)(*method_args, **method_kwargs) for e in self._targets(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: Any = None) -> list[bool]:
        from stable_baselines3.common import env_util

        return [env_util.is_wrapped(e, wrapper_class) for e in self._targets(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs

    # ------------------------------------------------------------------ infos

    def _split(self, infos: dict[str, Any]) -> list[dict[str, Any]]:
        """Gymnasium's batched infos (arrays + ``_key`` masks) as one dict per environment."""
        out: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        keys: Iterable[str] = (k for k in infos if not k.startswith("_") and k not in ("final_obs", "final_info"))
        if self.info_keys is not None:
            keys = (k for k in keys if k in self.info_keys)
        for key in keys:
            values, present = infos[key], infos.get(f"_{key}")
            if isinstance(values, dict):
                for i, sub in enumerate(self._split(values)):
                    if present is None or present[i]:
                        out[i][key] = sub
                continue
            items = values.tolist() if values.dtype != object and values.ndim == 1 else values
            for i in range(self.num_envs) if present is None else np.flatnonzero(present).tolist():
                out[i][key] = items[i]
        return out


def make_vec_env(num_envs: int, *, info_keys: Sequence[str] | None = None, **env_kwargs: Any) -> GymnasiumVecEnv:
    """``gymnasium.make_vec("adaptis/Pipeline-v0", num_envs, vectorization_mode="vector_entry_point",
    autoreset_mode=SAME_STEP, **env_kwargs)`` wrapped for SB3 (``env_kwargs``: the single
    environment's arguments)."""
    import env as env_pkg

    vec = gym.make_vec(env_pkg.ENV_ID, num_envs=num_envs, vectorization_mode="vector_entry_point",
                       autoreset_mode=AutoresetMode.SAME_STEP, **env_kwargs)
    return GymnasiumVecEnv(vec, info_keys=info_keys)
