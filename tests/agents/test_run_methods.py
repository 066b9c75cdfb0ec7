"""agents.run_methods: the one loop over methods, its typed settings and what an interruption keeps."""

from __future__ import annotations

import pytest

from agents.base import Budget
from agents.registry import make_searcher
from agents.run_methods import Interrupted, configure, run_methods, with_baseline
from pipeline.candidates import Scenario
from pipeline.errors import ConfigError
from tests.conftest import ideal_cluster, uniform_profile


def _scenario() -> Scenario:
    return Scenario(uniform_profile(8), ideal_cluster(2), 4)


def test_with_baseline_adds_megatron_once() -> None:
    assert with_baseline(["zbv", "adaptis"]) == ["megatron", "zbv", "adaptis"]
    assert with_baseline(["zbv"], first=False) == ["zbv", "megatron"]
    assert with_baseline(["zbv", "megatron", "zbv"]) == ["zbv", "megatron"]


def test_configure_checks_names_and_types() -> None:
    tuner = make_searcher("adaptis")
    assert configure(tuner, {"perturb_moves": 2}).perturb_moves == 2 and tuner.perturb_moves == 3
    with pytest.raises(ConfigError, match="no setting 'nope'"):
        configure(tuner, {"nope": 1})
    with pytest.raises(ConfigError, match="takes int"):
        configure(tuner, {"perturb_moves": "two"})
    assert configure(tuner, {}, optional={"policy_path": "p.pth"}) is tuner  # the tuner takes no policy


def test_runs_each_method_in_order_with_its_budget_and_reports_progress() -> None:
    seen: list[tuple[str, Budget]] = []
    improved: set[str] = set()
    done: list[int] = []

    def budget(method: str, results) -> Budget:
        seen.append((method, Budget(10 + len(results))))
        return seen[-1][1]

    results = run_methods(_scenario(), ["megatron", "random", "adaptis"], budget=budget, seed=1,
                          settings={"adaptis": {"perturb_moves": 1}},
                          on_improve=lambda m, plan, result: improved.add(m),
                          on_result=lambda rs: done.append(len(rs)))
    assert [r.method for r in results] == ["megatron", "random", "adaptis"]
    assert [b.sim_calls for _, b in seen] == [10, 11, 12] and done == [1, 2, 3]
    assert improved == {"megatron", "random", "adaptis"}
    assert all(r.ok for r in results) and results[1].sim_calls <= 11


def test_skip_turns_an_error_into_a_note_or_raises() -> None:
    def broken(name: str):
        if name == "rl":
            raise RuntimeError("no policy")
        return make_searcher(name)

    results = run_methods(_scenario(), ["megatron", "rl"], budget=Budget(5), make=broken,
                          skip=lambda m, exc: f"skipped: {exc}" if m == "rl" else None)
    assert results[1].plan is None and results[1].note == "skipped: no policy"
    with pytest.raises(RuntimeError):
        run_methods(_scenario(), ["rl"], budget=Budget(5), make=broken)


def test_an_interruption_keeps_the_finished_methods() -> None:
    def stop_at_adaptis(name: str):
        if name == "adaptis":
            raise KeyboardInterrupt
        return make_searcher(name)

    with pytest.raises(Interrupted) as caught:
        run_methods(_scenario(), ["megatron", "zbv", "adaptis"], budget=Budget(5), make=stop_at_adaptis)
    assert [r.method for r in caught.value.results] == ["megatron", "zbv"]
    assert isinstance(caught.value.stop, KeyboardInterrupt)
