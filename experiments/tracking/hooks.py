"""The one way commands open a W&B run from their parsed arguments."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["tracked_run"]


@contextmanager
def tracked_run(args: argparse.Namespace, *, command: str, config: dict[str, Any],
                group: str | None = None, job_type: str | None = None) -> Iterator[Any]:
    """Open an (offline by default) W&B run for ``command`` with the arguments in its config."""
    from experiments.tracking import start_run

    full = {k: v for k, v in vars(args).items() if not k.startswith("_") and isinstance(v, (str, int, float, bool))}
    full.update(config)
    with start_run(command=command, config=full, project=getattr(args, "wandb_project", None) or "adaptis",
                   group=group, job_type=job_type or command) as tracker:
        yield tracker
