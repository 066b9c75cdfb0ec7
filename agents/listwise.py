"""The target both start rankers fit: a listwise softmax over the starts' simulated times.

:mod:`agents.tuner.start_prior` (a linear score over each start's own features, any number of
starts per scenario) and :mod:`agents.rl.starts` (an MLP from a scenario's features to a fixed set
of recipes) fit different models to the same label: for each scenario, the distribution
``softmax(log(best / time) / temperature)`` over its starts that fit in memory, so a start within
``temperature`` of the best (in log time) gets a share comparable to the best's. Only the label is
shared; the models and their features differ by design (see each module).
"""

from __future__ import annotations

import numpy as np

__all__ = ["listwise_targets"]


def listwise_targets(times: np.ndarray, temperature: float) -> np.ndarray:
    """Target distribution over the last axis of ``times`` (one row per scenario): ``exp(log(best /
    time) / temperature)`` normalised over the finite times; an infinite or NaN time (does not fit,
    not applicable) gets 0, and a row without a finite time is all NaN."""
    t = np.asarray(times, dtype=np.float64)
    finite = np.isfinite(t)
    best = np.min(np.where(finite, t, np.inf), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(finite, np.log(best / np.where(finite, t, 1.0)) / temperature, -np.inf)
        w = np.exp(q)
        return w / w.sum(axis=-1, keepdims=True)
