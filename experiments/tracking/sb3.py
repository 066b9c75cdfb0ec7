"""The stable-baselines3 bridge: SB3's recorded metrics go to a :class:`~experiments.tracking.Tracker`.

``wandb.integration.sb3.WandbCallback`` does not log SB3's training metrics by itself (it
relies on TensorBoard syncing). :func:`make_sb3_logger` builds an SB3 ``Logger`` whose
``WandbKVWriter`` output sends each ``logger.dump(step)`` to ``Tracker.log_metrics``;
:func:`sb3_logger_output` gives just that writer. Importing this module does not import SB3
or torch: the writer class is built on first use.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.logger import KVWriter, Logger

    from experiments.tracking import Tracker

__all__ = ["make_sb3_logger", "sb3_logger_output"]  # and WandbKVWriter, built on first access

_WRITER_CLASS: type | None = None


def _writer_class() -> type[KVWriter]:
    """Build the KVWriter subclass on first use, so importing this module does not import torch."""
    global _WRITER_CLASS
    if _WRITER_CLASS is None:
        from stable_baselines3.common.logger import KVWriter, filter_excluded_keys

        class WandbKVWriter(KVWriter):
            """SB3 output format that forwards each ``logger.dump(step)`` to ``Tracker.log_metrics``.

            Scalars (Python or numpy numbers, 1-element arrays/tensors) and strings go to W&B
            at W&B step ``step`` (SB3's ``num_timesteps``); videos, figures, images and
            hyper-parameters are skipped. Keys recorded with ``exclude="wandb"`` are skipped.
            ``close()`` leaves the run open: the tracker's owner finishes it.
            """

            def __init__(self, tracker: Tracker, *, prefix: str = "", use_step: bool = True) -> None:
                self.tracker = tracker
                self.prefix = prefix
                self.use_step = use_step

            def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]],
                      step: int = 0) -> None:
                out: dict[str, Any] = {}
                for key, value in filter_excluded_keys(key_values, key_excluded, "wandb").items():
                    scalar = _sb3_scalar(value)
                    if scalar is not None:
                        out[self.prefix + key] = scalar
                if out and not self.tracker.finished:
                    self.tracker.log_metrics(out, step=int(step) if self.use_step else None)

            def close(self) -> None:
                return None

        _WRITER_CLASS = WandbKVWriter
    return _WRITER_CLASS


def _sb3_scalar(value: Any) -> Any:
    """A loggable scalar from an SB3 value (numpy/torch one-element values via ``item()``), else None."""
    if isinstance(value, bool | int | float | str):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            out = item()  # numpy and torch raise for more than one element
        except (ValueError, RuntimeError, TypeError):
            return None
        return out if isinstance(out, bool | int | float) else None
    return None


def sb3_logger_output(tracker: Tracker, *, prefix: str = "", use_step: bool = True) -> KVWriter:
    """An SB3 ``KVWriter`` that forwards recorded metrics to ``tracker`` (see ``WandbKVWriter``).

    ``wandb.integration.sb3.WandbCallback`` does not log SB3's metrics by itself; add this to
    a logger's ``output_formats`` or use :func:`make_sb3_logger`.
    """
    return _writer_class()(tracker, prefix=prefix, use_step=use_step)


def make_sb3_logger(tracker: Tracker, folder: str | Path | None = None,
                    formats: Sequence[str] = ("stdout",), *, prefix: str = "") -> Logger:
    """An SB3 ``Logger`` writing ``formats`` plus ``tracker``; pass it to ``model.set_logger``.

    ``formats`` are SB3's (``stdout``, ``log``, ``csv``, ``json``, ``tensorboard``) plus
    ``stderr``; file formats need ``folder``. Commands printing ``--json`` should use
    ``("stderr",)`` or ``()`` so SB3's tables stay off stdout.
    """
    from stable_baselines3.common.logger import HumanOutputFormat, Logger, make_output_format

    outputs: list[KVWriter] = []
    for fmt in formats:
        if fmt == "stdout":
            outputs.append(HumanOutputFormat(sys.stdout))
        elif fmt == "stderr":
            outputs.append(HumanOutputFormat(sys.stderr))
        elif folder is None:
            raise ValueError(f"SB3 log format {fmt!r} writes files; pass folder=... or use stdout/stderr")
        else:
            outputs.append(make_output_format(fmt, str(folder)))
    outputs.append(sb3_logger_output(tracker, prefix=prefix))
    return Logger(folder=None if folder is None else str(folder), output_formats=outputs)


def __getattr__(name: str) -> Any:
    if name == "WandbKVWriter":
        return _writer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

