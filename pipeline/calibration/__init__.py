"""Calibration from measured replays: torch-free, so planners and reports use it without torch.

* :mod:`pipeline.calibration.fidelity`: runtime factors and overheads fitted from replays;
* :mod:`pipeline.calibration.agreement`: predictions against measurements, plan by plan;
* :mod:`pipeline.calibration.drift`: the machine's drift between rounds of a job, taken out;
* :mod:`pipeline.calibration.selection`: choosing among replayed plans by measurement.

The executor (:mod:`executor`) measures; these modules only read its numbers.
"""
