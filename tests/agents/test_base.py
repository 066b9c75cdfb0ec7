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
