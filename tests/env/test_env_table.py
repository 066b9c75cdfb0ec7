"""A scenario's table derived in the engine from its raw columns (``env.native_core.direct_table``,
pipeline/_native/env_table.hpp) is the table ``table_fields`` reads off a ``PipelineEnv``
preparation: the portfolio starts made from both are the same bytes (a start carries its whole
table: columns, prefix sums, bound, constants, device rows, family splits), the bound is the
preparation's, and where the Python reference keeps the table to itself so does the engine."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from env import native_core, reset_worker
from env.pipeline_env import PipelineEnv, _Prep
from env.reset_worker import StartSpec, prepared_starts, redraw
from env.scenarios import TRAIN_SCENARIO, ScenarioConfig
from pipeline import engine
from pipeline.candidates import Scenario

pytestmark = pytest.mark.skipif(engine.env_core(1) is None, reason="needs the compiled engine ('make engine')")

#: Draws with every kind of cluster: one node or several, mixed speeds, tight memory, up to 32 devices.
CONFIGS = {
    "default": ScenarioConfig(),
    "train": TRAIN_SCENARIO,
    "mixed": replace(ScenarioConfig(), mixed_speed_share=0.6, gpus_per_node=(None, 2, 4), max_devices=32,
                     tight_memory_share=0.8),
}
SPEC = StartSpec(max_steps=24, step_cost=0.002, max_calls=None, allow_stop=True, share_results=True)


def _start(table, bound: float) -> bytes:
    start = reset_worker._portfolio_start(table, bound, max_calls=None, max_steps=24, step_cost=0.002, allow_stop=True)
    assert start is not None
    return pickle.dumps(start[0])


@pytest.mark.parametrize("config", CONFIGS)
def test_the_derived_table_is_the_preparations_byte_for_byte(config: str) -> None:
    seed = np.random.SeedSequence(11)
    for i in range(120):
        scenario = redraw(CONFIGS[config], seed, i)
        assert native_core.unsupported(scenario) is None
        prep = _Prep(scenario)
        table = native_core.direct_table(scenario)
        assert table is not None, (config, i)
        assert table.bound == prep.reference("bound")
        reference = _start(native_core.scenario_table(prep), prep.reference("bound"))
        assert _start(table, table.bound) == reference, (config, i)


def test_sums_past_exact_doubles_leave_the_table_to_the_reference() -> None:
    """table_fields gives no table where a byte column's sums are not exact in doubles; neither does the
    engine (and the worker then sends no start for it)."""
    scenario = redraw(ScenarioConfig(), np.random.SeedSequence(2), 0)
    layers = list(scenario.profile.layers)
    layers[0] = replace(layers[0], act_bytes=2**53)
    huge = Scenario(replace(scenario.profile, layers=tuple(layers)), scenario.cluster, scenario.microbatches)
    assert native_core.table_fields(_Prep(huge)) is None
    assert native_core.direct_table(huge) is None
    assert prepared_starts(huge, SPEC) == {}


def test_the_worker_starts_the_same_without_the_derived_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepared_starts from the engine's table and, with direct_table switched off, from the
    preparation's: the same starts, and the zero-shot ones (always from a preparation) beside them."""
    spec = replace(SPEC, singles=(False, True))
    seed = np.random.SeedSequence(5)
    scenarios = [redraw(PipelineEnv().scenario, seed, i) for i in range(30)]
    direct = [{k: (pickle.dumps(s), r) for k, (s, r) in prepared_starts(z, spec).items()} for z in scenarios]
    monkeypatch.setattr(native_core, "direct_table", lambda scenario: None)
    via_prep = [{k: (pickle.dumps(s), r) for k, (s, r) in prepared_starts(z, spec).items()} for z in scenarios]
    assert direct == via_prep
    assert all(set(d) == {spec.key(False), spec.key(True)} for d in direct)


def test_bad_columns_are_refused_with_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = redraw(ScenarioConfig(), np.random.SeedSequence(3), 0)
    seen: dict = {}  # the columns direct_table hands the engine, caught on their way in
    real = engine.env_scenario_derived
    monkeypatch.setattr(engine, "env_scenario_derived", lambda columns: seen.update(columns) or real(columns))
    assert native_core.direct_table(scenario) is not None
    with pytest.raises(ValueError, match="one cost"):
        real({**seen, "cost": [1.0]})
    with pytest.raises(ValueError, match="one cost"):
        real({**seen, "act": seen["act"][:-1]})
    with pytest.raises(ValueError, match="lacks 'f'"):
        real({k: v for k, v in seen.items() if k != "f"})
    with pytest.raises(ValueError, match="7 families"):
        real({**seen, "families": seen["families"][:3]})
