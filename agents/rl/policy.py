"""Saving and loading RL policies with a metadata file that is checked before the policy is used.

A policy is two files: ``NAME.pth`` (the SB3 policy: a **pickle** — load only files from a
trusted source, as unpickling runs code) and ``NAME.json`` (metadata: algorithm, network
(``entity``: :class:`agents.rl.net.EntityPolicy`, or ``mlp``), observation version, action
count, observation shapes, training command and seed). :func:`load_policy`
reads the JSON first and refuses a policy whose spaces do not match this version of the
environment. A full SB3 model zip (``model.zip`` of a training run, also a pickle) loads too
when a ``.json`` sits beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["ALGOS", "DEFAULT_POLICY", "space_signature", "save_policy", "load_policy",
           "read_metadata", "unreadable"]

#: Training algorithms: name -> (sb3 module path, class name).
ALGOS = {"maskable-ppo": ("sb3_contrib", "MaskablePPO"), "ppo": ("stable_baselines3", "PPO")}
#: The policy shipped with the repository (used when no --policy is given).
DEFAULT_POLICY = Path(__file__).resolve().parents[1] / "policies" / "default.pth"


def space_signature() -> dict[str, Any]:
    """What a policy must agree with: observation version, action count, observation shapes."""
    from env.editor import N_ACTIONS
    from env.pipeline_env import OBS_VERSION, observation_space

    return {"obs_version": OBS_VERSION, "n_actions": N_ACTIONS,
            "obs_shapes": {k: list(v.shape) for k, v in observation_space().spaces.items()}}


def save_policy(model: Any, path: str | Path, *, algo: str, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model.policy`` to ``path`` (``.pth``) and its metadata to ``path`` with ``.json``."""
    from agents.rl.net import EntityPolicy

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.policy.save(str(path))
    network = "entity" if isinstance(model.policy, EntityPolicy) else "mlp"
    meta = {"format": "adaptis-rl-policy/1", "algo": algo, "network": network, **space_signature(),
            "num_timesteps": int(getattr(model, "num_timesteps", 0)), **(extra or {})}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return path


def read_metadata(path: str | Path, *, what: str = "policy", field: str = "--policy") -> dict[str, Any]:
    """The metadata (``.json``) beside a policy or start-ranker file; ConfigError naming ``field``
    when missing or unreadable."""
    meta_path = Path(path).with_suffix(".json")
    if not meta_path.is_file():
        raise ConfigError(f"no metadata file {meta_path} beside the {what}; {what} files are saved with one "
                          "(python -m experiments train)", field=field)
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"bad {what} metadata {meta_path}: {exc}", field=field) from None
    if not isinstance(meta, dict):
        raise ConfigError(f"bad {what} metadata {meta_path}: expected a JSON object, got {type(meta).__name__}",
                          field=field)
    return meta


def unreadable(path: Path, exc: BaseException, *, what: str, field: str) -> ConfigError:
    """The one-line error for a corrupt or truncated pickle/zip file (whatever the unpickler raised)."""
    why = str(exc).strip().split("\n")[0].split(". ")[0][:100]
    return ConfigError(f"{what} {path} cannot be read ({type(exc).__name__}{': ' + why if why else ''}): the file is "
                       "corrupt, truncated or not one; train a new one with python -m experiments train, or name "
                       "another", field=field)


def load_policy(path: str | Path | None = None) -> tuple[Any, dict[str, Any]]:
    """(SB3 policy on CPU in eval mode, metadata) of ``path`` (default :data:`DEFAULT_POLICY`).

    The metadata is checked against :func:`space_signature` before the pickle is opened.
    Only load policy files from a trusted source.
    """
    path = Path(path) if path is not None else DEFAULT_POLICY
    if not path.is_file():
        raise ConfigError(f"policy file {path} not found", field="--policy")
    meta = read_metadata(path)
    want = space_signature()
    for key, value in want.items():
        if meta.get(key) != value:
            raise ConfigError(f"policy {path} was trained for {key}={meta.get(key)!r}, this environment has "
                              f"{value!r}; retrain it with python -m experiments train", field="--policy")
    algo = meta.get("algo")
    if algo not in ALGOS:
        raise ConfigError(f"policy {path}: unknown algo {algo!r}; known {sorted(ALGOS)}", field="--policy")
    import importlib

    module, cls_name = ALGOS[algo]
    if path.suffix == ".zip":
        loader = getattr(importlib.import_module(module), cls_name)
    elif meta.get("network", "mlp") == "entity":
        from agents.rl.net import EntityPolicy as loader
    elif algo == "maskable-ppo":
        from sb3_contrib.common.maskable.policies import MaskableMultiInputActorCriticPolicy as loader
    else:
        from stable_baselines3.common.policies import MultiInputActorCriticPolicy as loader
    try:
        loaded = loader.load(str(path), device="cpu")
    except Exception as exc:  # a corrupt pickle or zip raises anything (EOFError, UnpicklingError, ValueError...)
        raise unreadable(path, exc, what="policy file", field="--policy") from None
    policy = loaded.policy if path.suffix == ".zip" else loaded
    policy.set_training_mode(False)
    return policy, meta
