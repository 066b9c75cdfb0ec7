"""The GPU check by its older name: ``python -m experiments.benchmarks.gpu_check`` runs
:mod:`experiments.gpu_check` (``python -m experiments gpu-check``), which ships with the product."""

from __future__ import annotations

import sys

from experiments.gpu_check import check_kinds, check_plan, kind_architectures, main, run

__all__ = ["main", "run", "kind_architectures", "check_kinds", "check_plan"]

if __name__ == "__main__":
    sys.exit(main())
