"""The model zoo: HF-style configs in ``experiments/configs/models/<name>.json``.

The pipeline package may not import ``experiments``, so the folder is located by path. Each entry
is read by :func:`pipeline.hf.load_hf_config` and may carry a default ``seq_len``.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.arch import Architecture
from pipeline.costs import CostOptions, profile_from_architecture
from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec
from pipeline.hf import load_hf_config
from pipeline.spec import ModelProfile

__all__ = ["ZOO_DIR", "PAPER_MODELS", "PAPER_SIZES", "list_models", "zoo_config_path", "load_zoo_architecture",
           "zoo_profile", "auto_head_shards"]

#: The AdaPtis paper's model families (zoo names ``<family>-<size>``) ...
PAPER_MODELS = ("gemma", "deepseek", "nemotronh")
#: ... and its depths, with the devices each runs on.
PAPER_SIZES = {"small": 4, "medium": 8, "large": 16}

#: Folder of the zoo's config files.
ZOO_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "models"


def list_models() -> list[str]:
    """Names of the zoo's models, sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(path.stem for path in ZOO_DIR.glob("*.json"))


def zoo_config_path(name: str) -> Path:
    """The config file of zoo model ``name``; unknown names raise ConfigError listing the known ones."""
    path = ZOO_DIR / f"{name}.json"
    if not name or "/" in name or "\\" in name or not path.is_file():
        raise ConfigError(f"unknown model {name!r}; the zoo ({ZOO_DIR}) has: {', '.join(list_models()) or 'nothing'}",
                          field="model")
    return path


def load_zoo_architecture(name: str, *, granularity: str = "layer", head_shards: int = 1) -> Architecture:
    """The :class:`Architecture` of zoo model ``name`` (units: see :func:`pipeline.arch.refine_architecture`)."""
    return load_hf_config(zoo_config_path(name), name=name, granularity=granularity, head_shards=head_shards)


def zoo_profile(name: str, *, gpu: str | GPUSpec = "h100", seq_len: int | None = None, microbatch_size: int = 1,
                tp: int = 1, granularity: str = "layer", head_shards: int = 1,
                options: CostOptions | None = None) -> ModelProfile:
    """Analytic profile of zoo model ``name`` on ``gpu`` (sequence length: given, else the model's, else 4096;
    ``options``: the cost conventions, default :class:`pipeline.costs.CostOptions`)."""
    arch = load_zoo_architecture(name, granularity=granularity, head_shards=head_shards)
    return profile_from_architecture(arch, gpu=gpu, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp,
                                     options=options)


def auto_head_shards(profile: ModelProfile, *, limit: int = 16) -> int:
    """Shards that make the head no heavier than the heaviest other unit (at most ``limit``)."""
    heads = [x for x in profile.layers if x.kind == "head"]
    others = [x.f + x.b + x.w for x in profile.layers if x.kind != "head"]
    if not heads or not others or max(others) <= 0:
        return 1
    head = sum(x.f + x.b + x.w for x in heads)
    return max(1, min(limit, math.ceil(head / max(others) - 1e-9)))
