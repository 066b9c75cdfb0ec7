"""Gymnasium environments over the pipeline performance model.

Importing :mod:`env` registers:

* ``adaptis/Pipeline-v0`` — :class:`env.pipeline_env.PipelineEnv`: improve one plan
  (partition, placement, schedule knobs) for one scenario by masked discrete edits;
  ``gymnasium.make_vec(ENV_ID, num_envs=N, vectorization_mode="vector_entry_point")`` gives
  :class:`env.vector_env.PipelineVectorEnv`, N of them stepped together with each step's
  simulations in one native batch.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from env.pipeline_env import OBS_VERSION, PipelineEnv
from env.scenarios import ScenarioConfig, sample_scenario

__all__ = ["ENV_ID", "OBS_VERSION", "PipelineEnv", "ScenarioConfig", "sample_scenario"]

#: The registered id of :class:`PipelineEnv`.
ENV_ID = "adaptis/Pipeline-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="env.pipeline_env:PipelineEnv",
             vector_entry_point="env.vector_env:PipelineVectorEnv", max_episode_steps=None)
