"""The one loop that runs search methods on a scenario: every command that compares methods calls it.

``search``, ``run`` (the workflow's search phase), ``baselines``, ``evaluate-agent`` and ``sweep``
all go through :func:`run_methods`: it builds each method's searcher (:func:`agents.registry.make_searcher`),
applies its typed settings (:func:`configure`), runs it within its budget and seed, shows progress on
stderr, and on Ctrl-C or SIGTERM raises :class:`Interrupted` carrying the finished methods' results.
:func:`with_baseline` is where "the Megatron baseline is always searched" lives.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.base import Budget, ImproveCallback, Searcher, SearchResult
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError
from pipeline.plan import Plan
from pipeline.simulator import Result

__all__ = ["BASELINE", "Interrupted", "configure", "run_methods", "setting_type", "with_baseline"]

#: The method every speedup is over: Megatron-LM's interleaved 1F1B at its even split.
BASELINE = "megatron"

#: A budget for each method, given its name and the results of the methods before it.
BudgetOf = Callable[[str, Sequence[SearchResult]], Budget]

_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str, "str | None": str,
                           "int | None": int, "float | None": float, "bool | None": bool}


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped :func:`run_methods`; ``results`` are the methods that had finished,
    ``stop`` the KeyboardInterrupt or SystemExit (its exit code: :func:`experiments.common.interrupt_code`)."""

    def __init__(self, stop: BaseException, results: list[SearchResult]) -> None:
        super().__init__(f"interrupted after {len(results)} methods")
        self.stop = stop
        self.results = results


def with_baseline(methods: Sequence[str], *, first: bool = True) -> list[str]:
    """``methods`` without duplicates and with :data:`BASELINE` (first, or last with ``first=False``)
    when missing: every speedup is over it."""
    out = list(dict.fromkeys(methods))
    if BASELINE not in out:
        out.insert(0 if first else len(out), BASELINE)
    return out


def setting_type(searcher: Any, key: str) -> type | None:
    """The scalar type of setting ``key`` of a dataclass ``searcher`` (None: no such scalar setting)."""
    if not dataclasses.is_dataclass(searcher):
        return None
    for f in dataclasses.fields(searcher):
        if f.name == key:
            kind = f.type if isinstance(f.type, type) else _TYPES.get(str(f.type))
            return kind if kind in (int, float, bool, str) else None
    return None


def _fits(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def configure(searcher: Searcher, settings: Mapping[str, Any], *, optional: Mapping[str, Any] | None = None,
              field: str = "--param") -> Searcher:
    """A copy of ``searcher`` with ``settings`` (its dataclass fields, e.g. the tuner's ``perturb_moves``),
    each checked by name and type; ``optional`` settings apply only where the searcher has them (e.g.
    ``policy_path`` to the RL methods). A name or value the searcher does not take is a :class:`ConfigError`."""
    changes: dict[str, Any] = {}
    for key, value in settings.items():
        kind = setting_type(searcher, key)
        if kind is None:
            raise ConfigError(f"method {searcher.name!r} has no setting {key!r}", field=f"{field} {key}")
        if value is not None and not _fits(value, kind):
            raise ConfigError(f"{key} of method {searcher.name!r} takes {kind.__name__}, got {value!r}",
                              field=f"{field} {key}")
        changes[key] = value
    for key, value in (optional or {}).items():
        if value is not None and setting_type(searcher, key) is not None:
            changes[key] = value
    return dataclasses.replace(searcher, **changes) if changes else searcher  # type: ignore[type-var]


def _searcher(name: str, make: Callable[[str], Searcher], settings: Mapping[str, Any],
              optional: Mapping[str, Any]) -> Searcher:
    return configure(make(name), settings, optional=optional)


def run_methods(scenario: Scenario, methods: Sequence[str], *, budget: Budget | BudgetOf, seed: int = 0,
                settings: Mapping[str, Mapping[str, Any]] | None = None, policy: str | None = None,
                ranker: str | None = None, make: Callable[[str], Searcher] | None = None,
                on_improve: Callable[[str, Plan, Result], None] | None = None,
                on_result: Callable[[list[SearchResult]], None] | None = None,
                skip: Callable[[str, Exception], str | None] | None = None,
                progress: str | None = None) -> list[SearchResult]:
    """Search ``scenario`` with each of ``methods`` in order; their results, in that order.

    ``budget``: one for every method, or a function of (method, results so far). ``settings`` maps a
    method to its searcher's settings (:func:`configure`); ``policy`` and ``ranker`` go to the methods
    that take them (``policy_path``, ``ranker_path``). ``make`` builds a searcher from a name (default
    :func:`agents.registry.make_searcher`). ``on_improve(method, plan, result)`` sees every better plan
    found; ``on_result`` the results so far after each method. ``skip(method, error)`` may turn a
    method's error into a note (its result then has no plan and that note) or return None to raise it.
    ``progress``: a tqdm bar on stderr with this label (None: no bar). Ctrl-C or SIGTERM raises
    :class:`Interrupted` with the finished results.
    """
    if make is None:
        from agents.registry import make_searcher as make
    optional = {"policy_path": policy, "ranker_path": ranker}
    results: list[SearchResult] = []
    bar = None
    if progress is not None:
        from tqdm import tqdm

        bar = tqdm(total=len(methods), desc=progress, unit="method", file=sys.stderr, disable=None)
    try:
        for name in methods:
            if bar is not None:
                bar.set_postfix_str(name)
            improve: ImproveCallback | None = None
            if on_improve is not None:
                def improve(plan: Plan, result: Result, _name: str = name) -> None:
                    on_improve(_name, plan, result)
            try:
                searcher = _searcher(name, make, (settings or {}).get(name, {}), optional)
                spend = budget(name, results) if callable(budget) else budget
                res = searcher.search(scenario, budget=spend, seed=seed, on_improve=improve)
            except (ConfigError, ImportError, OSError, RuntimeError, ValueError) as exc:
                note = skip(name, exc) if skip is not None else None
                if note is None:
                    raise
                res = SearchResult(name, None, None, note=note)
            results.append(res)
            if bar is not None:
                bar.update()
            if on_result is not None:
                on_result(results)
    except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C, or SIGTERM (experiments.cli makes it SystemExit)
        raise Interrupted(stop, results) from None
    finally:
        if bar is not None:
            bar.close()
    return results
