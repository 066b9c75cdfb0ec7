"""The start rankers' shared label."""

import numpy as np

from agents.listwise import listwise_targets


def test_the_best_start_gets_the_largest_share_and_misfits_get_none():
    q = listwise_targets(np.array([1.0, 1.01, np.inf, 2.0]), 0.01)
    assert q.sum() == 1.0 or abs(q.sum() - 1.0) < 1e-12
    assert q[0] > q[1] > q[3] and q[2] == 0.0
    assert abs(q[1] / q[0] - (1 / 1.01) ** 100) < 1e-12  # exp(log(best / time) / temperature)


def test_rows_are_independent_and_a_row_without_a_fit_is_nan():
    rows = np.array([[2.0, 4.0], [np.nan, 3.0], [np.inf, np.nan]])
    q = listwise_targets(rows, 1.0)
    assert np.allclose(q[0], [2 / 3, 1 / 3]) and np.allclose(q[1], [0.0, 1.0])
    assert np.isnan(q[2]).all()
