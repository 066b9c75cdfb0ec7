"""Budget.parse: the --budget text of search, sweep, run and reproduce."""

from __future__ import annotations

import pytest

from agents.base import Budget


@pytest.mark.parametrize("text,budget", [("500", Budget(500, None)), ("1", Budget(1, None)),
                                         ("30s", Budget(None, 30.0)), (" 0.5S ", Budget(None, 0.5))])
def test_calls_or_seconds(text: str, budget: Budget) -> None:
    assert Budget.parse(text) == budget


@pytest.mark.parametrize("text", ["0", "-5", "0s", "-1s", "nans", "infs"])
def test_nothing_to_spend_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="at least 1 simulator call"):
        Budget.parse(text)


@pytest.mark.parametrize("text", ["lots", "", "s", "1.5"])
def test_not_a_budget_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad budget"):
        Budget.parse(text)


def test_anytime_history_has_seconds_and_leaves_out_plans_that_do_not_fit() -> None:
    from agents.base import SearchResult

    r = SearchResult("m", None, None, 9, 1.0, history=[(1, 50.0), (4, 80.0), (9, 70.0)],
                     history_seconds=[0.01, 0.2, 0.9], history_fits=[False, True, True])
    assert r.anytime() == [[4, 0.2, 80.0], [9, 0.9, 70.0]]
    assert SearchResult("m", None, None, history=[(2, 5.0)]).anytime() == [[2, None, 5.0]]


def test_a_tuner_search_records_when_each_improvement_came_and_whether_it_fits() -> None:
    from agents.tuner import AdaptisTuner
    from pipeline.candidates import Scenario
    from pipeline.spec import Cluster
    from pipeline.zoo import zoo_profile

    scenario = Scenario(zoo_profile("gemma-small", seq_len=2048), Cluster(devices=4), 16)
    res = AdaptisTuner().search(scenario, budget=Budget(sim_calls=80), seed=0)
    assert len(res.history_seconds) == len(res.history) == len(res.history_fits)
    assert res.history_seconds == sorted(res.history_seconds) and res.history_seconds[-1] <= res.seconds
    assert all(f is not None for f in res.history_fits) and res.history_fits[-1] is True


def test_fits_of_counts_any_plan_of_that_time_that_fits() -> None:
    """Two plans of one iteration time may differ in memory (budgets [2,2] against [2,1]): an entry of
    that time fits if any of them did by then."""
    from pipeline.candidates import Scenario
    from pipeline.evaluator import Evaluator
    from pipeline.spec import Cluster
    from pipeline.zoo import zoo_profile

    ev = Evaluator(Scenario(zoo_profile("gemma-small", seq_len=2048), Cluster(devices=4), 16))

    class R:
        def __init__(self, t: float, fits: bool) -> None:
            self.iteration_time, self.valid, self.feasible = t, True, fits

    for t, fits in ((10.0, True), (9.0, False), (10.0, False), (8.0, False)):
        ev.calls += 1
        ev._record(R(t, fits))
    assert ev.fits_of(3, 10.0) is True and ev.fits_of(4, 9.0) is False and ev.fits_of(1, 9.0) is None
    assert ev.fits_of(4, 8.0) is False and ev.seconds_at(4) >= ev.seconds_at(1) > 0
