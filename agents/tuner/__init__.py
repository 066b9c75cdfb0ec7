"""The AdaPtis tuner and what belongs to it.

* :mod:`agents.tuner.core`: the tuner (:class:`AdaptisTuner`, method ``adaptis``), its seeds and moves;
* :mod:`agents.tuner.clock`: how it keeps a budget in seconds (:class:`~agents.tuner.clock.TunerClock`);
* :mod:`agents.tuner.learned`: its learned move guidance (method ``learned``) and the move prior's training;
* :mod:`agents.tuner.start_prior`: the learned order of its starting plans;
  :mod:`agents.tuner.start_training`: that order's training.

``from agents.tuner import AdaptisTuner`` is the tuner; the learned parts are imported from their
modules. Modules inside this package import each other by module, never through this file.
"""

from agents.tuner.core import (
    AdaptisTuner,
    Progress,
    iter_seed_candidates,
    lighten_first_stage,
    seed_candidates,
    slow_first_seeds,
)

__all__ = ["AdaptisTuner", "Progress", "seed_candidates", "iter_seed_candidates", "slow_first_seeds",
           "lighten_first_stage"]
