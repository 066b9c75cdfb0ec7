"""The one table of search methods: a name gives a searcher, so commands take ``--method adaptis,zbv+dp``.

Every method is listed here and nowhere else; nothing registers itself on import. Each factory
imports its module only when the method is built (the RL agents import torch), and this module
imports no agent at load time, so no agent module needs to import it back.

* the named schedules (:data:`pipeline.schedules.NAMED_METHODS`, plus ``i1f1b-vN`` for any
  chunk count), each also with ``+dp`` (the cost-aware DP split instead of the even one);
* :data:`SEARCHERS`: ``random``, ``rl``, ``rl+tuner``, ``zb-opt`` (the exact schedule at ZB-H2's memory,
  :mod:`agents.zb_opt`), the deployment targets' own searches
  ``megatron+layout`` and ``adaptis@torchtitan`` (:mod:`agents.target_search`), ``learned`` (the tuner with
  learned move guidance, :mod:`agents.tuner.learned`) and ``adaptis``.

:func:`all_methods` is what ``--method all`` runs: every name above (``i1f1b-v2`` for the
``i1f1b-vN`` family).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from agents.base import Searcher
from pipeline.errors import ConfigError
from pipeline.schedules import NAMED_METHODS

__all__ = ["BALANCED", "SEARCHERS", "all_methods", "make_searcher"]


def _random() -> Searcher:
    from agents.baselines import RandomSearcher

    return RandomSearcher()


def _rl() -> Searcher:
    from agents.rl.searchers import RLSearcher

    return RLSearcher()


def _rl_tuner() -> Searcher:
    from agents.rl.searchers import RLTunerSearcher

    return RLTunerSearcher()


def _zb_opt() -> Searcher:
    from agents.zb_opt import ZbOptSearcher

    return ZbOptSearcher()


def _megatron_layout() -> Searcher:
    from agents.target_search import MegatronLayoutSearch

    return MegatronLayoutSearch()


def _adaptis_torchtitan() -> Searcher:
    from agents.target_search import torchtitan_tuner

    return torchtitan_tuner()


def _learned() -> Searcher:
    from agents.tuner.learned import learned_tuner

    return learned_tuner()


def _adaptis() -> Searcher:
    from agents.tuner import AdaptisTuner

    return AdaptisTuner()


#: The searchers that are not a named schedule, in the order ``--method all`` runs them (the tuner last).
SEARCHERS: Mapping[str, Callable[[], Searcher]] = MappingProxyType({
    "random": _random,
    "rl": _rl,
    "rl+tuner": _rl_tuner,
    "zb-opt": _zb_opt,
    "megatron+layout": _megatron_layout,
    "adaptis@torchtitan": _adaptis_torchtitan,
    "learned": _learned,
    "adaptis": _adaptis,
})
#: Named schedules with the cost-aware DP split (Megatron's baseline keeps its even split).
BALANCED = tuple(f"{m}+dp" for m in NAMED_METHODS if m != "megatron")


def all_methods() -> list[str]:
    """What ``--method all`` runs: every named schedule, its DP-balanced variant, then :data:`SEARCHERS`."""
    return list(NAMED_METHODS) + list(BALANCED) + list(SEARCHERS)


def make_searcher(name: str) -> Searcher:
    """A fresh searcher for method ``name``; an unknown name is a :class:`ConfigError` on ``--method``."""
    if name in SEARCHERS:
        return SEARCHERS[name]()
    base, _, suffix = name.partition("+")
    if (base in NAMED_METHODS or base.startswith("i1f1b-v")) and suffix in ("", "dp"):
        from agents.baselines import NamedSearcher

        return NamedSearcher(base, balanced=suffix == "dp")
    known = ", ".join(list(NAMED_METHODS) + ["<named>+dp", "i1f1b-vN"] + list(SEARCHERS))
    raise ConfigError(f"unknown method {name!r}; use one of {known}, or all", field="--method")
