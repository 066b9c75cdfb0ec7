"""An episode's start as the compiled core loads it from another process (``EnvStart``,
pipeline/_native/env_start.hpp; :func:`pipeline.engine.env_start`): loading one is loading its
arguments, it pickles bit for bit, malformed bytes raise instead of crashing the core, and the
compiled portfolio start is the Python reset's, byte for byte."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from env import native_core
from env.pipeline_env import PipelineEnv
from env.reset_worker import StartSpec, prepared_starts, redraw
from env.scenarios import TRAIN_SCENARIO, ScenarioConfig
from pipeline import engine

pytestmark = pytest.mark.skipif(engine.env_core(1) is None, reason="needs the compiled engine ('make engine')")

SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))
_ARRAYS = ("stages", "devices", "plan", "masks", "rewards", "terminated", "truncated", "kept", "edits",
           "iteration_time", "best_iteration_time", "feasible", "sim_calls")


def _load_args(kwargs: dict, seed: int) -> tuple:
    env = PipelineEnv(**kwargs)
    env.reset(seed=seed)
    args = native_core.load_args(env)
    assert args is not None
    return args


def _same_slots(core, a: int, b: int) -> None:
    for name in _ARRAYS:
        arr = getattr(core, name)
        assert np.array_equal(arr[a], arr[b]), name
    assert core.candidate(a, False) == core.candidate(b, False)
    assert core.candidate(a, True) == core.candidate(b, True)


@pytest.mark.parametrize("kwargs", [{}, {"scenario": TRAIN_SCENARIO, "max_calls": 40, "allow_stop": False},
                                    {"scenario": SMALL, "max_calls": 12, "max_steps": 30}])
def test_a_start_loads_and_steps_as_its_arguments(kwargs: dict) -> None:
    """Slot 0 loads the arguments, slot 1 the start after a pickle round trip; both then take the same
    random allowed actions until their episodes end, with equal arrays after every step."""
    core = engine.env_core(2)
    rng = np.random.default_rng(3)
    for seed in range(8):
        args = _load_args(kwargs, seed)
        start = pickle.loads(pickle.dumps(engine.env_start(args)))
        core.load(0, *args)
        core.load_start(1, start)
        _same_slots(core, 0, 1)
        for _ in range(40):
            mask = core.masks[0]
            action = int(rng.choice(np.flatnonzero(mask))) if mask.any() else 0
            core.step(np.array([action, action], dtype=np.int64), np.ones(2, dtype=bool), 1)
            _same_slots(core, 0, 1)
            if core.terminated[0] or core.truncated[0]:
                break


@pytest.mark.parametrize("threads", [1, 2])
def test_loads_together_are_loads_one_by_one(threads: int) -> None:
    """EnvCore.load_starts (the step's autoresets, on the engine's threads) leaves every row as
    load_start one at a time does, then both step alike; repeated, missing or foreign indices raise."""
    starts = [engine.env_start(_load_args({"scenario": SMALL}, seed)) for seed in range(10)]
    one, together = engine.env_core(12), engine.env_core(12)
    rows = [11, 0, 5, 3, 7, 1, 9, 2, 8, 6]
    for i, s in zip(rows, starts):
        one.load_start(i, s)
    together.load_starts(rows, starts, threads=threads)
    which = np.zeros(12, dtype=bool)
    which[rows] = True
    rng = np.random.default_rng(1)
    for _ in range(6):
        for name in _ARRAYS:
            assert np.array_equal(getattr(one, name)[which], getattr(together, name)[which]), name
        assert all(one.candidate(i, True) == together.candidate(i, True) for i in rows)
        acts = np.array([int(rng.choice(np.flatnonzero(m))) if m.any() else 0 for m in one.masks], dtype=np.int64)
        live = which & ~one.terminated & ~one.truncated
        one.step(acts, live, 1)
        together.step(acts, live, threads)
    with pytest.raises(ValueError, match="named twice"):
        together.load_starts([1, 1], starts[:2])
    with pytest.raises(ValueError, match="one start per"):
        together.load_starts([1, 2], starts[:1])
    with pytest.raises((ValueError, IndexError)):
        together.load_starts([12], starts[:1])


def test_bytes_round_trip_exactly() -> None:
    args = _load_args({"scenario": TRAIN_SCENARIO}, 11)
    start = engine.env_start(args)
    data = start.to_bytes()
    back = type(start).from_bytes(data)
    assert back.to_bytes() == data
    assert pickle.loads(pickle.dumps(start)).to_bytes() == data
    assert back.reference == args[-1]["reference"] and back.table.devices == args[0].devices


def test_malformed_bytes_raise_value_errors() -> None:
    """Every truncation, bytes appended, another layout's magic, and random byte flips: a ValueError
    or (a flip of a value no check covers) a start the core loads; never a crash or a hang."""
    start = engine.env_start(_load_args({"scenario": SMALL}, 2))
    data = start.to_bytes()
    cls = type(start)
    for cut in range(0, len(data), max(1, len(data) // 300)):
        with pytest.raises(ValueError, match="episode start"):
            cls.from_bytes(data[:cut])
    with pytest.raises(ValueError, match="longer than its layout"):
        cls.from_bytes(data + b"\0")
    with pytest.raises(ValueError, match="not an episode start"):
        cls.from_bytes(b"XXXX" + data[4:])
    core = engine.env_core(1)
    rng = np.random.default_rng(0)
    loaded = 0
    for _ in range(400):
        flipped = bytearray(data)
        # (from byte 12: a flip of M, bytes 8-11, may give 2**30 micro-batches: a valid start, only slow)
        for k in rng.integers(12, len(data), size=int(rng.integers(1, 4))):
            flipped[k] ^= 1 << int(rng.integers(8))
        try:
            bad = cls.from_bytes(bytes(flipped))
        except ValueError:
            continue
        core.load_start(0, bad)
        core.step(np.array([0], dtype=np.int64), np.ones(1, dtype=bool), 1)
        loaded += 1
    assert loaded > 0  # (most flips hit floats, which no check can tell from others)


def test_bad_arguments_are_named() -> None:
    args = list(_load_args({}, 0))
    with pytest.raises(ValueError, match="max_steps"):
        engine.env_start((*args[:-1], {**args[-1], "max_steps": 0}))
    with pytest.raises((ValueError, TypeError)):
        engine.env_start((None, *args[1:]))
    with pytest.raises(ValueError, match="7-tuple.*got a tuple of 6"):
        engine.env_start(tuple(args[:-1]))
    with pytest.raises(ValueError, match="7-tuple.*got NoneType"):
        engine.env_start(None)
    with pytest.raises(ValueError, match="8-tuple"):
        engine.env_start((args[0], (1, 2), *args[2:]))


@pytest.mark.parametrize(("config", "spec", "draws"), [
    (ScenarioConfig(), StartSpec(24, 0.002, None, True, True), 150),
    (TRAIN_SCENARIO, StartSpec(24, 0.002, 40, False, True, (False, True)), 40),
    (SMALL, StartSpec(30, 0.01, 2, True, False), 150),  # (call budgets that stop the portfolio early)
    (SMALL, StartSpec(30, 0.01, 1, True, True), 100),
])
def test_the_compiled_portfolio_start_is_the_python_resets(config: ScenarioConfig, spec: StartSpec,
                                                            draws: int) -> None:
    """The reset worker's compiled portfolio start (pipeline.engine.env_portfolio_start) against the
    Python reset it replaces (reset_rounds, the starting plans, load_args), on fresh draws: the same
    bytes (every candidate, result, evaluated plan, counter and float), the same reference."""
    seed = np.random.SeedSequence(21)
    for index in range(draws):
        python = prepared_starts(redraw(config, seed, index), spec, compiled=False)
        compiled = prepared_starts(redraw(config, seed, index), spec)
        assert python.keys() == compiled.keys() and python
        for key, (start, reference) in python.items():
            assert compiled[key][0].to_bytes() == start.to_bytes(), (index, key)
            assert compiled[key][1] == reference


def test_a_portfolio_start_checks_its_arguments() -> None:
    table = engine.env_start(_load_args({}, 0)).table
    with pytest.raises(ValueError, match="max_calls"):
        engine.env_portfolio_start(table, [(0, 0, False)], repair_starts=2, max_calls=0, max_steps=24,
                                   step_cost=0.0, allow_stop=True, reference=1.0)
    with pytest.raises(ValueError, match="family"):
        engine.env_portfolio_start(table, [(7, 0, False)], repair_starts=2, max_calls=None, max_steps=24,
                                   step_cost=0.0, allow_stop=True, reference=1.0)
    assert engine.env_portfolio_start(table, [], repair_starts=2, max_calls=None, max_steps=24, step_cost=0.0,
                                      allow_stop=True, reference=1.0) is None
