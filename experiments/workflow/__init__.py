"""The ``run`` workflow: one config, its phases, its report.

* :mod:`~experiments.workflow.config` — :class:`WorkflowConfig`, which is also ``run``'s command line;
* :mod:`~experiments.workflow.runner` — :func:`run_workflow`: costs, (training), search, replay, summary;
* :mod:`~experiments.workflow.phases` — each phase usable alone (profile or analytic costs,
  calibration, policy training, search, replay);
* :mod:`~experiments.workflow.report` — the comparison per method and where the time went.
"""

from experiments.workflow.config import DEFAULT_METHODS, WorkflowConfig
from experiments.workflow.runner import SEARCH_ROWS, WorkflowReport, run_workflow

__all__ = ["WorkflowConfig", "WorkflowReport", "run_workflow", "DEFAULT_METHODS", "SEARCH_ROWS"]
