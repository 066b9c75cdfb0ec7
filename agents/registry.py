"""Method names -> searchers, so commands take ``--method adaptis,zbv+dp,random`` or ``all``."""

from __future__ import annotations

from collections.abc import Callable

from agents.base import Searcher
from agents.baselines import NamedSearcher, RandomSearcher
from agents.tuner import AdaptisTuner
from pipeline.errors import ConfigError
from pipeline.schedules import NAMED_METHODS

__all__ = ["EXTRA_METHODS", "all_methods", "make_searcher", "register"]

_FACTORIES: dict[str, Callable[[], Searcher]] = {
    "adaptis": AdaptisTuner,
    "random": RandomSearcher,
}
#: Named schedules with the cost-aware DP split.
BALANCED = tuple(f"{m}+dp" for m in NAMED_METHODS if m != "megatron")
EXTRA_METHODS = ("adaptis", "random")


def register(name: str, factory: Callable[[], Searcher]) -> None:
    """Add a method (the RL agents register ``rl`` and ``rl+tuner`` this way)."""
    _FACTORIES[name] = factory


def all_methods() -> list[str]:
    """What ``--method all`` runs: every named schedule, its DP-balanced variant, random, the tuner."""
    return list(NAMED_METHODS) + list(BALANCED) + [m for m in _FACTORIES if m not in ("adaptis",)] + ["adaptis"]


def make_searcher(name: str) -> Searcher:
    if name.startswith("rl") and name not in _FACTORIES:
        import agents.rl  # noqa: F401  (registers "rl" and "rl+tuner"; imports torch, so only on demand)
    if name in _FACTORIES:
        return _FACTORIES[name]()
    base, _, suffix = name.partition("+")
    if (base in NAMED_METHODS or base.startswith("i1f1b-v")) and suffix in ("", "dp"):
        return NamedSearcher(base, balanced=suffix == "dp")
    known = ", ".join(list(NAMED_METHODS) + ["<named>+dp", "i1f1b-vN"] + sorted(_FACTORIES))
    raise ConfigError(f"unknown method {name!r}; use one of {known}, or all", field="--method")
