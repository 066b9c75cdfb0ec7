"""pipeline.candidates: the objective's overflow sum."""

from __future__ import annotations

import math

import pytest

from pipeline.candidates import objective_key
from pipeline.simulator import Result


def _result(peak: tuple, limit: tuple) -> Result:
    return Result(True, None, 2.0, (1.0,) * len(peak), peak, limit, 8, 1.0, "ms", [], devices=len(peak))


@pytest.mark.parametrize(("peak", "limit"), [
    ((1.0, 2.0), (2.0, 2.0)), ((3.0, 2.0), (2.0, 1.0)), ((2.0, -0.0), (2.0, 0.0)), ((5, 7), (6, 3)),
    ((math.nan, 1.0), (1.0, 2.0)), ((math.inf, 1.0), (1.0, 2.0)), ((1e18, 3e17), (2e17, 3e17)), ((), ()),
])
def test_objective_key_sums_what_max_sums(peak: tuple, limit: tuple) -> None:
    """The overflow is sum(max(0.0, p - lim)): the same number and type, NaN and integers included."""
    key = objective_key(_result(peak, limit))
    over = sum(max(0.0, p - lim) for p, lim in zip(peak, limit))
    assert type(key[1]) is type(over)
    assert key[1] == over or (math.isnan(key[1]) and math.isnan(over))
    assert key[0] == (0 if over <= 0 else 1) and key[2] == 2.0
