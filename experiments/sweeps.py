"""Sweeps without a server: a grid (or, when installed, Optuna) over search and agent settings.

Each trial searches one scenario with one method under one combination of settings and is logged
as its own offline W&B run in the sweep's group; :func:`run_sweep` returns every trial, best first.

Settings (``--param KEY=V1,V2``):

* scenario: ``microbatches``, ``memory_gb``, ``devices``, ``runtime``;
* search: ``budget`` (simulator calls, or seconds as ``30s``), ``seed``, ``method``;
* anything else is an attribute of the method's searcher, e.g. ``perturb_moves`` (the tuner),
  ``samples`` or ``max_calls`` (the RL policy); unknown names, values of another type than the
  setting's (a whole number, a number, true/false, text) and values out of range (below 0; a
  share outside 0..1) are refused before any trial runs, as are more devices than layers.

W&B's own sweeps need a W&B server (the sweep controller lives there); this runs offline.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.base import Budget
from agents.run_methods import BASELINE, run_methods, setting_type
from experiments.common import memory_advice
from experiments.results import MethodRow
from pipeline.errors import ConfigError
from pipeline.runtime import RUNTIMES
from pipeline.spec import GIB, Cluster, ModelProfile, TrainingConfig

__all__ = ["SCENARIO_KEYS", "SEARCH_KEYS", "Trial", "parse_params", "grid", "check_params", "run_trial", "run_sweep",
           "save_trials", "infeasible_reason"]

#: Settings that change the scenario, not the searcher.
SCENARIO_KEYS = ("microbatches", "memory_gb", "devices", "runtime")
#: Settings of the search call itself.
SEARCH_KEYS = ("budget", "seed", "method")


def _value(text: str) -> Any:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"`` -> True, ``"30s"`` / ``"adaptis"`` stay text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_params(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["seed=0,1", "memory-gb=40,80"]`` -> ``{"seed": [0, 1], "memory_gb": [40, 80]}``."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        vals = [_value(v) for v in values.split(",") if v.strip()]
        if not sep or not key or not vals:
            raise ConfigError(f"bad --param {item!r}; write KEY=V1,V2 (e.g. seed=0,1,2)", field="--param")
        if key in out:
            raise ConfigError(f"--param {key} given twice; list all its values once", field="--param")
        out[key] = vals
    return out


def grid(params: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """Every combination of the values, in order (the last key varies fastest)."""
    keys = list(params)
    for combo in itertools.product(*(params[k] for k in keys)):
        yield dict(zip(keys, combo))


#: The type of a searcher's setting, from its dataclass annotation (a string under postponed annotations).
#: Settings with a range narrower than "a number >= 0".
_SETTING_RANGES: dict[str, tuple[float, float]] = {"rl_share": (0.0, 1.0)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_setting(key: str, values: Sequence[Any], kind: type, method: str) -> None:
    """Each value of searcher setting ``key`` has its type (``kind``) and is in range."""
    low, high = _SETTING_RANGES.get(key, (0.0, math.inf))
    field_name = f"--param {key}"
    for v in values:
        if kind is bool and not isinstance(v, bool):
            raise ConfigError(f"{key} of method {method!r} takes true or false, got {v!r}", field=field_name)
        if kind is int and not _is_int(v):
            raise ConfigError(f"{key} of method {method!r} takes whole numbers, got {v!r}", field=field_name)
        if kind is float and not (_is_int(v) or isinstance(v, float)):
            raise ConfigError(f"{key} of method {method!r} takes numbers, got {v!r}", field=field_name)
        if kind in (int, float) and not (low <= v <= high and math.isfinite(v)):
            where = f"between {low:g} and {high:g}" if math.isfinite(high) else f">= {low:g}"
            raise ConfigError(f"{key} of method {method!r} must be {where}, got {v!r}", field=field_name)
        if kind is str and not isinstance(v, str):
            raise ConfigError(f"{key} of method {method!r} takes text, got {v!r}", field=field_name)


def check_params(params: dict[str, list[Any]], default_method: str) -> None:
    """Refuse unknown settings and bad values (type and range) before any trial runs, naming the field."""
    from agents.registry import make_searcher

    methods = params.get("method", [default_method])
    for key, values in params.items():
        if key == "budget":
            for v in values:
                try:
                    Budget.parse(str(v))
                except ValueError as exc:
                    raise ConfigError(str(exc), field="--param budget") from None
        elif key == "method":
            for m in values:
                make_searcher(str(m))  # an unknown method is refused here, naming the known ones
        elif key == "seed" and not all(_is_int(v) for v in values):
            raise ConfigError(f"seed takes whole numbers, got {values}", field="--param seed")
        elif key in ("microbatches", "devices") and not all(_is_int(v) and v >= 1 for v in values):
            raise ConfigError(f"{key} takes whole numbers >= 1, got {values}", field=f"--param {key}")
        elif key == "runtime" and not all(str(v) in RUNTIMES for v in values):
            bad = next(v for v in values if str(v) not in RUNTIMES)
            raise ConfigError(f"unknown runtime {bad!r}; use one of {', '.join(RUNTIMES)}", field="--param runtime")
        elif key == "memory_gb" and not all((_is_int(v) or isinstance(v, float)) and 0 < v < math.inf
                                            for v in values):
            raise ConfigError(f"memory_gb takes positive numbers, got {values}", field="--param memory_gb")
        elif key not in SCENARIO_KEYS + SEARCH_KEYS:
            for m in methods:
                kind = setting_type(make_searcher(str(m)), key)
                if kind is None:
                    raise ConfigError(f"{key!r} is neither a scenario setting ({', '.join(SCENARIO_KEYS)}), a search "
                                      f"setting ({', '.join(SEARCH_KEYS)}) nor a setting of method {m!r}",
                                      field=f"--param {key}")
                _check_setting(key, values, kind, str(m))


@dataclass
class Trial:
    """One combination of settings and what its search found (its :class:`experiments.results.MethodRow`)."""

    index: int
    params: dict[str, Any]
    method: str
    found: MethodRow | None = None
    """The search's row: speedup over the Megatron baseline of the same scenario (None before it ran)."""
    plan: Any = field(default=None, repr=False)
    run_dir: str | None = None
    reason: str | None = None
    """Why the trial has no plan that fits (None when it has one): what ``search`` says of the same result."""

    @property
    def iteration_time(self) -> float | None:
        return self.found.iteration_time if self.found else None

    @property
    def speedup(self) -> float | None:
        return self.found.speedup if self.found else None

    @property
    def feasible(self) -> bool:
        return bool(self.found and self.found.feasible)

    @property
    def peak_memory_max_gb(self) -> float | None:
        return self.found.peak_memory_max_gb if self.found else None

    @property
    def objective(self) -> float:
        """What the sweep minimises: the predicted iteration time of a plan that fits (inf otherwise)."""
        return self.iteration_time if self.feasible and self.iteration_time is not None else math.inf

    def row(self) -> dict[str, Any]:
        """``trials.jsonl``'s row: the trial's number and settings, then its method row (no history)."""
        found = {k: v for k, v in self.found.as_dict().items() if k != "history"} if self.found else {}
        return {"trial": self.index, **self.params, **found, "method": self.method, "reason": self.reason}


def run_trial(index: int, params: dict[str, Any], *, profile: ModelProfile, cluster: Cluster, microbatches: int,
              method: str, budget: str, seed: int, references: dict[tuple, float | None],
              runtime: str = "pytorch") -> Trial:
    """Search once with ``params`` applied on top of the defaults; ``references`` caches Megatron's time
    (priced on the trial's runtime, as the searched plan is)."""
    from pipeline.candidates import Scenario

    mb = int(params.get("microbatches", microbatches))
    cl = cluster
    if "devices" in params:
        from dataclasses import replace

        cl = replace(cl, devices=int(params["devices"]), device_list=None)
    if "memory_gb" in params:
        cl = cl.with_memory(float(params["memory_gb"]))
    rt = str(params.get("runtime", runtime))
    scenario = Scenario(profile, cl, mb, TrainingConfig(runtime=rt))
    name = str(params.get("method", method))
    settings = {k: v for k, v in params.items() if k not in SCENARIO_KEYS + SEARCH_KEYS}
    ref_key = (mb, cl.devices, cl.memory_gb, rt)
    first = [BASELINE] if ref_key not in references else []
    spend = Budget.parse(str(params.get("budget", budget)))
    *mega, res = run_methods(scenario, [*first, name], budget=lambda m, _: Budget(1) if m in first else spend,
                             seed=int(params.get("seed", seed)), settings={name: settings})
    if mega:
        references[ref_key] = mega[0].iteration_time if mega[0].ok else None
    trial = Trial(index, dict(params), name, MethodRow.of(res, references[ref_key]), plan=res.plan)
    trial.reason = infeasible_reason(res, cl, profile, training=scenario.training)
    return trial


def infeasible_reason(res: Any, cluster: Cluster, profile: ModelProfile | None = None, *,
                      training: TrainingConfig | None = None) -> str | None:
    """Why a search result has no plan that fits, in the words ``search`` uses: the simulator's error
    (or the searcher's note) for no valid plan; for one out of memory, its peak and
    :func:`experiments.common.memory_advice` (``profile`` and ``training``: the trial's scenario)."""
    if res.ok and res.result.feasible:
        return None
    if not res.ok:
        return res.note or (res.result.error if res.result is not None else None) or "no plan"
    peak = max(res.result.peak_memory) / GIB
    return f"out of memory: the peak is {peak:.2f} GiB {memory_advice(cluster, profile, training)}"


def _optuna_combos(params: dict[str, list[Any]], trials: int, seed: int,
                   evaluate: Callable[[dict[str, Any]], float]) -> None:
    """Let Optuna's TPE pick ``trials`` combinations among the listed values (needs ``pip install optuna``)."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("Optuna is not installed; use --sampler grid (the default) or pip install optuna",
                          field="--sampler") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))

    def objective(t: Any) -> float:
        combo = {k: t.suggest_categorical(k, v) for k, v in params.items()}
        value = evaluate(combo)
        return value if math.isfinite(value) else 1e300

    study.optimize(objective, n_trials=trials)


def run_sweep(params: dict[str, list[Any]], *, profile: ModelProfile, cluster: Cluster, microbatches: int,
              method: str, budget: str, seed: int, max_trials: int | None = None, sampler: str = "grid",
              on_trial: Callable[[Trial], None] | None = None, runtime: str = "pytorch") -> list[Trial]:
    """Run the trials (grid order, or Optuna's choice), calling ``on_trial`` after each; best first."""
    check_params(params, method)
    deep = [d for d in params.get("devices", []) if d > profile.num_layers]
    if deep:
        raise ConfigError(f"{deep[0]} devices but {profile.name} has only {profile.num_layers} layers; every device "
                          f"needs a pipeline stage of at least one whole layer: list {profile.num_layers} or fewer",
                          field="--param devices")
    references: dict[tuple, float | None] = {}
    trials: list[Trial] = []

    def evaluate(combo: dict[str, Any]) -> float:
        trial = run_trial(len(trials), combo, profile=profile, cluster=cluster, microbatches=microbatches,
                          method=method, budget=budget, seed=seed, references=references, runtime=runtime)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        return trial.objective

    if sampler == "optuna":
        size = math.prod(len(v) for v in params.values())
        _optuna_combos(params, min(max_trials or size, size), seed, evaluate)
    elif sampler == "grid":
        for k, combo in enumerate(grid(params)):
            if max_trials is not None and k >= max_trials:
                break
            evaluate(combo)
    else:
        raise ConfigError(f"unknown sampler {sampler!r}; use grid or optuna", field="--sampler")
    return sorted(trials, key=lambda t: (t.objective, t.index))


def save_trials(trials: Sequence[Trial], out: Path) -> None:
    """``trials.jsonl`` (one row per trial, best first) and ``best_plan.json`` / ``best_plan.csv``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trials.jsonl", "w") as fh:
        for t in trials:
            fh.write(json.dumps(t.row()) + "\n")
    if trials and trials[0].plan is not None and trials[0].feasible:
        trials[0].plan.save(out / "best_plan.json")
        trials[0].plan.save_csv(out / "best_plan.csv")
