"""Log a command's run to Weights & Biases — offline by default — and read offline runs back.

Every command logs through :func:`start_run`::

    with start_run(command="search", config=vars(args)) as tr:
        tr.log_metrics({"iteration_ms": 812.5}, step=0)
        tr.log_plan(plan, name="best-plan")

Runs are **offline** unless ``WANDB_MODE`` says otherwise (``online``, ``offline`` or
``disabled``; ``disabled`` gives a no-op tracker that accepts every call). An offline run
never prompts and never touches the network; it lands in ``runs/wandb/offline-run-*/``
(``dir`` or ``WANDB_DIR`` move the ``wandb/`` folder) and ``wandb sync`` uploads it later.
W&B never writes to stdout: ``--json`` commands keep one JSON object per line there.

What was logged survives an interrupted process: the tracker finishes the run from
``__exit__`` (a ``finally``), from ``atexit``, and turns SIGTERM into ``SystemExit`` so
that both run; W&B flushes the run's ``.wandb`` log every ``flush_interval_s`` seconds,
which bounds what a ``SIGKILL`` loses.

:func:`read_offline_run` parses the ``.wandb`` transaction log (W&B's LevelDB-style
record log of protobuf ``Record`` s) into history, summary, config, images, tables and
artifacts without W&B's service or any network. :func:`make_sb3_logger` gives
stable-baselines3 a logger whose recorded metrics also go to the run.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import json
import math
import os
import re
import shutil
import signal
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from stable_baselines3.common.logger import KVWriter, Logger

    from pipeline.plan import Plan

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PROJECT",
    "FLUSH_INTERVAL_S",
    "LoggedArtifact",
    "OfflineRun",
    "Tracker",
    "TransactionLogError",
    "iter_transaction_log",
    "make_sb3_logger",
    "read_offline_run",
    "resolve_mode",
    "sb3_logger_output",
    "start_run",
]

Mode = Literal["online", "offline", "disabled"]

#: Parent of the ``wandb/`` folder that holds the runs, relative to the working directory.
DEFAULT_DIR = Path("runs")
#: The W&B project of every command unless ``--wandb-project`` names another.
DEFAULT_PROJECT = "adaptis"
#: Seconds between W&B's flushes of the ``.wandb`` log; what a ``SIGKILL`` can lose.
FLUSH_INTERVAL_S = 1.0

_MODE_ALIASES: dict[str, Mode] = {
    "online": "online", "run": "online",
    "offline": "offline", "dryrun": "offline",
    "disabled": "disabled",
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def resolve_mode(mode: str | None = None) -> Mode:
    """The tracking mode: ``mode`` if given, else ``WANDB_MODE``, else ``"offline"``.

    Accepts W&B's legacy spellings (``dryrun`` = offline, ``run`` = online); anything else is
    a ``ValueError`` naming the accepted values.
    """
    raw = mode if mode is not None else os.environ.get("WANDB_MODE", "")
    text = raw.strip().lower()
    if not text:
        return "offline"
    if text not in _MODE_ALIASES:
        raise ValueError(f"WANDB_MODE={raw!r} is not a tracking mode; use online, offline or disabled "
                         "(unset means offline)")
    return _MODE_ALIASES[text]


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{what} {name!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit, e.g. 'best-plan'")
    return name


def _jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a config value: paths and enums as text, dataclasses as dicts."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if not callable(v)}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return _jsonable(value.item())
    return str(value)


def _clean_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Drop callables (argparse ``set_defaults(func=...)``) and make the rest JSON-friendly."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}; pass vars(args) for argparse")
    return {str(k): _jsonable(v) for k, v in config.items() if not callable(v)}


# ---------------------------------------------------------------- the tracker


class Tracker:
    """One W&B run of one command; see :func:`start_run`, which makes it.

    Methods mirror what commands log: scalars over steps (:meth:`log_metrics`), tables
    (:meth:`log_table`), PNG images (:meth:`log_image`), plans (:meth:`log_plan`), other files
    such as profiles (:meth:`log_artifact`) and final values (:meth:`summary`). With
    ``mode == "disabled"`` every method checks its arguments and does nothing else.

    ``step`` follows W&B: a row with an explicit step stays open for more keys until a later
    step or :meth:`finish` commits it; without a step a call adds to the current row
    (``commit=True`` closes it). Steps must not decrease.

    Use it as a context manager, or call :meth:`finish` in a ``finally``; it is also finished
    at interpreter exit. Logging after :meth:`finish` raises ``RuntimeError``.
    """

    def __init__(self, run: Any, *, mode: Mode, command: str, handle_sigterm: bool = False) -> None:
        self._run = run
        self._mode: Mode = mode
        self._command = command
        self._finished = False
        self._versions: dict[str, int] = {}
        self._lock = threading.Lock()
        self._prev_sigterm: Any = None
        self._sigterm_installed = False
        if handle_sigterm:
            self._install_sigterm()
        atexit.register(self._atexit)

    # ------------------------------------------------------------ properties

    @property
    def mode(self) -> Mode:
        """``"online"``, ``"offline"`` or ``"disabled"``."""
        return self._mode

    @property
    def enabled(self) -> bool:
        """False for the no-op tracker of ``WANDB_MODE=disabled``."""
        return self._run is not None

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` ran."""
        return self._finished

    @property
    def command(self) -> str:
        """The command that started the run (also its ``job_type`` unless one was given)."""
        return self._command

    @property
    def run_id(self) -> str | None:
        """W&B's run id (``None`` when disabled)."""
        return None if self._run is None else str(self._run.id)

    @property
    def run_dir(self) -> Path | None:
        """The run's local folder, e.g. ``runs/wandb/offline-run-20260101_120000-abc123/`` (``None`` when disabled).

        It holds the ``run-<id>.wandb`` transaction log, ``files/`` (media) and ``artifacts/``
        (the files of logged artifacts); ``wandb sync`` takes this folder.
        """
        return None if self._run is None else Path(self._run.settings.sync_dir)

    @property
    def wandb_run(self) -> Any:
        """The underlying ``wandb.Run`` (``None`` when disabled), for what this class lacks."""
        return self._run

    # ------------------------------------------------------------ logging

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"the {self._command!r} run is finished; start a new run to log more")

    @staticmethod
    def _check_step(step: int | None) -> None:
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be a whole number >= 0 or None, got {step!r}")

    def _log(self, data: dict[str, Any], step: int | None, commit: bool | None) -> None:
        if self._run is not None:
            self._run.log(data, step=step, commit=commit)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, *,
                    commit: bool | None = None) -> None:
        """Log scalar metrics (numbers, or anything ``wandb.log`` takes) at ``step``."""
        self._check_open()
        self._check_step(step)
        if not isinstance(metrics, Mapping) or not all(isinstance(k, str) and k for k in metrics):
            raise TypeError("metrics must be a dict with non-empty string keys, e.g. {'iteration_ms': 812.5}")
        self._log(dict(metrics), step, commit)

    def log_table(self, key: str, rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] | None = None,
                  step: int | None = None) -> None:
        """Log ``rows`` (dicts) as a ``wandb.Table`` under ``key``.

        Columns are ``columns`` or every key of the rows in order of first appearance; a row
        without a column gets ``None`` there. Each column should hold one type (W&B checks).
        """
        self._check_open()
        self._check_step(step)
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        if isinstance(rows, Mapping | str):
            raise TypeError("rows must be a list of dicts, one per table row")
        rows = list(rows)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("rows must be a list of dicts, one per table row")
        cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
        if self._run is None:
            return
        import wandb

        table = wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])
        self._log({key: table}, step, None)

    def log_image(self, key: str, png_path: str | Path, *, caption: str | None = None,
                  step: int | None = None) -> None:
        """Log the image file ``png_path`` (e.g. a Gantt chart) under ``key``; W&B copies it into the run."""
        self._check_open()
        self._check_step(step)
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        path = Path(png_path)
        if not path.is_file():
            raise FileNotFoundError(f"image {str(path)!r} does not exist; render it before logging it")
        if self._run is None:
            return
        import wandb

        self._log({key: wandb.Image(str(path), caption=caption)}, step, None)

    def _artifact_folder(self, name: str) -> Path:
        """A fresh ``artifacts/<name>/v<k>/`` folder inside the run for one version of an artifact."""
        assert self.run_dir is not None
        with self._lock:
            version = self._versions.get(name, 0)
            self._versions[name] = version + 1
        folder = self.run_dir / "artifacts" / name / f"v{version}"
        folder.mkdir(parents=True, exist_ok=False)
        return folder

    def _log_folder_artifact(self, folder: Path, name: str, type: str, metadata: dict[str, Any]) -> None:
        import wandb

        artifact = wandb.Artifact(name, type=type, metadata=metadata)
        # The files stay inside the run folder (no copy to W&B's staging area), so the run
        # folder alone is what `wandb sync` needs; each version has its own folder.
        artifact.add_dir(str(folder), policy="immutable")
        self._run.log_artifact(artifact)

    def log_plan(self, plan: Plan, name: str, metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Log ``plan`` as an artifact of type ``"plan"`` holding ``plan.json`` and ``plan.csv``.

        The metadata records devices, micro-batches, stages, layers and method, then
        ``metadata``. Returns the folder with the two files (``None`` when disabled).
        """
        self._check_open()
        _check_name(name, "plan artifact name")
        meta = {
            "devices": plan.devices,
            "microbatches": plan.microbatches,
            "num_stages": plan.num_stages,
            "num_layers": plan.num_layers,
            "method": plan.method,
            **_clean_config(metadata or {}),
        }
        if self._run is None:
            return None
        folder = self._artifact_folder(name)
        plan.save(folder / "plan.json")
        plan.save_csv(folder / "plan.csv")
        self._log_folder_artifact(folder, name, "plan", meta)
        return folder

    def log_artifact(self, path: str | Path, name: str, type: str,
                     metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Log a file or folder (e.g. a profile as type ``"profile"``) as artifact ``name``.

        The content is copied into the run folder first, so later edits of ``path`` do not
        change what ``wandb sync`` uploads. Returns that copy's folder (``None`` when disabled).
        """
        self._check_open()
        _check_name(name, "artifact name")
        _check_name(type, "artifact type")
        src = Path(path)
        if not src.exists():
            raise FileNotFoundError(f"artifact source {str(src)!r} does not exist")
        meta = _clean_config(metadata or {})
        if self._run is None:
            return None
        folder = self._artifact_folder(name)
        if src.is_dir():
            shutil.copytree(src, folder, dirs_exist_ok=True)
        else:
            shutil.copy2(src, folder / src.name)
        self._log_folder_artifact(folder, name, type, meta)
        return folder

    def summary(self, values: Mapping[str, Any]) -> None:
        """Set final values of the run (``run.summary``), e.g. the best iteration time."""
        self._check_open()
        if not isinstance(values, Mapping):
            raise TypeError("summary values must be a dict")
        if self._run is not None:
            self._run.summary.update(dict(values))

    # ------------------------------------------------------------ ending

    def finish(self, exit_code: int | None = 0) -> None:
        """Finish the run (idempotent): commit the open row, write the exit record, flush.

        A non-zero ``exit_code`` marks the run failed. ``None`` lets W&B decide.
        """
        with self._lock:
            if self._finished:
                return
            self._finished = True
        try:
            if self._run is not None:
                self._run.finish(exit_code=exit_code)
        finally:
            self._restore_sigterm()
            atexit.unregister(self._atexit)

    def _atexit(self) -> None:
        self.finish(exit_code=None)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc_type is None:
            code = 0
        elif issubclass(exc_type, KeyboardInterrupt):
            code = 128 + signal.SIGINT
        elif isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        else:
            code = 1
        self.finish(exit_code=code)
        return False

    def __repr__(self) -> str:
        where = f" at {self.run_dir}" if self.run_dir else ""
        return f"Tracker(command={self._command!r}, mode={self._mode!r}, run_id={self.run_id!r}{where})"

    # ------------------------------------------------------------ SIGTERM

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Unwind like Ctrl-C does, so `finally`/__exit__ finish the run, then atexit runs.
        raise SystemExit(128 + signum)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone (maybe an outer tracker) handles it already, or it is ignored
        self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._sigterm_installed = True

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
        self._sigterm_installed = False


def _ensure_login(base_url: str | None) -> None:
    """Fail with a clear message instead of prompting when online mode has no credentials."""
    import wandb

    if not wandb.login(host=base_url, prompt=False, verify=False):
        raise RuntimeError("WANDB_MODE=online but no W&B credentials are configured; set WANDB_API_KEY "
                           "(and WANDB_BASE_URL for your own server) or run `wandb login`, or unset "
                           "WANDB_MODE to log offline and `wandb sync` later")


def start_run(*, command: str, config: Mapping[str, Any], project: str = DEFAULT_PROJECT,
              group: str | None = None, name: str | None = None, job_type: str | None = None,
              dir: str | Path | None = None, tags: Sequence[str] | None = None,
              mode: str | None = None, flush_interval_s: float | None = FLUSH_INTERVAL_S,
              handle_sigterm: bool = True, settings: Mapping[str, Any] | None = None) -> Tracker:
    """Start the W&B run of one command and return its :class:`Tracker`.

    Args:
        command: the command's name, e.g. ``"search"``; stored in the config as
            ``command`` and used as ``job_type`` unless one is given.
        config: the run's inputs, e.g. ``vars(args)``; callables are dropped, paths become text.
        project: W&B project.
        group: W&B group (e.g. one sweep or one benchmark).
        name: display name; W&B picks one when ``None``.
        job_type: W&B job type; defaults to ``command``.
        dir: parent of the ``wandb/`` folder of runs; default ``WANDB_DIR`` or ``./runs``.
        tags: W&B tags.
        mode: ``online``, ``offline`` or ``disabled``; default ``WANDB_MODE`` or offline.
        flush_interval_s: seconds between flushes of the ``.wandb`` log (bounds what a
            ``SIGKILL`` loses); ``None`` keeps W&B's default (15 s).
        handle_sigterm: turn SIGTERM into ``SystemExit(143)`` while the run is open (main
            thread only, and only if SIGTERM has its default handler), so the run finishes.
        settings: extra ``wandb.Settings`` fields, applied last.

    Output goes to stderr only (``silent``, no console capture), online mode never prompts
    for a key (it raises ``RuntimeError`` without credentials), and offline mode turns W&B's
    error reporting off (``WANDB_ERROR_REPORTING=false`` unless set) so nothing leaves the machine.
    """
    if not isinstance(command, str) or not command:
        raise ValueError("command must be the command's name, e.g. 'search'")
    cfg = _clean_config(config)
    cfg.setdefault("command", command)
    resolved = resolve_mode(mode)
    if resolved == "disabled":
        return Tracker(None, mode=resolved, command=command)

    root = Path(dir if dir is not None else os.environ.get("WANDB_DIR") or DEFAULT_DIR).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    if resolved == "offline":
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    # Keep stderr for our progress bars: no banners, no integration tips (W&B mistakes our
    # ``agents`` package for an LLM agents SDK and advertises Weave otherwise).
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    extra: dict[str, Any] = {"silent": True, "console": "off"}
    if flush_interval_s is not None and "x_transaction_log_flush_interval" in wandb.Settings.model_fields:
        extra["x_transaction_log_flush_interval"] = float(flush_interval_s)
    extra.update(settings or {})
    if resolved == "online":
        _ensure_login(os.environ.get("WANDB_BASE_URL"))
    run = wandb.init(
        project=project,
        group=group,
        name=name,
        job_type=job_type or command,
        dir=str(root.resolve()),
        tags=list(tags) if tags else None,
        config=cfg,
        mode=resolved,
        reinit="create_new",
        settings=wandb.Settings(**extra),
    )
    return Tracker(run, mode=resolved, command=command, handle_sigterm=handle_sigterm)


# ---------------------------------------------------------------- stable-baselines3


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


# ---------------------------------------------------------------- reading offline runs

_HEADER_LEN = 7
_BLOCK_LEN = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_IDENT = b":W&B"
_MAGIC = 0xBEE1
_CRC_SEED = [0] + [zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in range(1, 5)]


class TransactionLogError(ValueError):
    """A ``.wandb`` file is not a W&B transaction log (or of an unknown version)."""


def _find_log(path: str | Path) -> Path:
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise FileNotFoundError(f"no run folder or .wandb file at {str(p)!r}")
    logs = sorted(p.glob("run-*.wandb")) or sorted(p.glob("*.wandb"))
    if not logs:
        raise FileNotFoundError(f"{str(p)!r} has no run-*.wandb transaction log; is it a W&B run folder "
                                "(runs/wandb/offline-run-*)?")
    return logs[0]


def iter_transaction_log(path: str | Path, *, truncated: list[str] | None = None) -> Iterator[Any]:
    """Yield each ``wandb_internal_pb2.Record`` of a run's ``.wandb`` file, in order.

    The file is W&B's LevelDB-style log: a 7-byte header (``:W&B``, magic ``0xBEE1``,
    version 0), then 32 KiB blocks of chunks (CRC-32 seeded by the chunk type, 2-byte
    length, type FULL/FIRST/MIDDLE/LAST). The log of a running or killed process may end
    mid-chunk: reading stops there, and if ``truncated`` is given a reason is appended.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    log = _find_log(path)
    data = log.read_bytes()
    if len(data) < _HEADER_LEN:
        raise TransactionLogError(f"{log}: too short for a W&B transaction log header")
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER_LEN])
    if ident != _IDENT or magic != _MAGIC:
        raise TransactionLogError(f"{log}: not a W&B transaction log (bad header)")
    if version != 0:
        raise TransactionLogError(f"{log}: transaction log version {version} is unknown to this reader")

    def stop(reason: str) -> None:
        if truncated is not None:
            truncated.append(f"{log}: {reason}")

    pos, pending = _HEADER_LEN, bytearray()
    in_record = False
    while pos < len(data):
        left = _BLOCK_LEN - pos % _BLOCK_LEN
        if left < _HEADER_LEN:  # block trailer: zero padding
            pos += left
            continue
        if pos + _HEADER_LEN > len(data):
            stop(f"ends inside a chunk header at byte {pos}")
            return
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER_LEN])
        if crc == 0 and length == 0 and kind == 0:  # preallocated or padded tail
            pos += left
            continue
        body = data[pos + _HEADER_LEN:pos + _HEADER_LEN + length]
        if len(body) < length:
            stop(f"ends inside a chunk at byte {pos}")
            return
        if kind not in (_FULL, _FIRST, _MIDDLE, _LAST) or zlib.crc32(body, _CRC_SEED[kind]) & 0xFFFFFFFF != crc:
            stop(f"corrupt chunk at byte {pos}")
            return
        pos += _HEADER_LEN + length
        if kind in (_FULL, _FIRST):
            if in_record:
                stop(f"record interrupted at byte {pos}")
                return
            pending = bytearray(body)
            in_record = kind == _FIRST
        else:
            if not in_record:
                stop(f"continuation chunk without a start at byte {pos}")
                return
            pending += body
            in_record = kind == _MIDDLE
        if not in_record:
            record = pb.Record()
            record.ParseFromString(bytes(pending))
            yield record
    if in_record:
        stop("ends inside a multi-chunk record")


@dataclass(frozen=True)
class LoggedArtifact:
    """One artifact version logged by a run, as its transaction log records it."""

    name: str
    """Artifact name, e.g. ``best-plan``."""
    type: str
    """Artifact type, e.g. ``plan`` or ``profile``."""
    digest: str
    """W&B's content digest."""
    metadata: dict[str, Any]
    """The artifact's metadata."""
    files: dict[str, Path]
    """Path inside the artifact -> local file W&B will upload on ``wandb sync``."""


@dataclass
class OfflineRun:
    """What :func:`read_offline_run` recovers from a run folder."""

    run_dir: Path
    """The run folder."""
    run_id: str
    """W&B's run id."""
    project: str
    """W&B project."""
    name: str | None
    """Display name (``None`` when W&B had not named it)."""
    group: str | None
    """Group, if any."""
    job_type: str | None
    """Job type (our command name unless set)."""
    tags: tuple[str, ...]
    """Tags."""
    config: dict[str, Any]
    """The run's config, W&B's internal ``_wandb`` key removed."""
    history: list[dict[str, Any]]
    """Committed metric rows in order; each has ``_step`` (and W&B's ``_runtime``/``_timestamp``).
    Media values are W&B's dicts (``{"_type": "image-file", "path": ...}``)."""
    summary: dict[str, Any]
    """Final values: ours plus the last value of each history key; keys starting with ``_`` removed."""
    images: dict[str, list[Path]]
    """Image key -> the PNG copies W&B stored under ``files/``, in logging order."""
    tables: dict[str, list[dict[str, Any]]]
    """Table key -> rows (dicts) of the last table logged under that key."""
    artifacts: list[LoggedArtifact]
    """Artifacts logged (one entry per version)."""
    exit_code: int | None
    """The exit code :meth:`Tracker.finish` recorded; ``None`` when the run never finished."""
    truncated: list[str] = field(default_factory=list)
    """Why reading stopped early (a log cut short by a killed process), empty when complete."""

    @property
    def finished(self) -> bool:
        """True when the run recorded its exit."""
        return self.exit_code is not None

    def metric(self, key: str) -> list[tuple[int, Any]]:
        """``(step, value)`` for every committed row that has ``key``."""
        return [(int(row["_step"]), row[key]) for row in self.history if key in row]

    def artifact(self, name: str) -> LoggedArtifact:
        """The last logged version of artifact ``name`` (``KeyError`` if none)."""
        for art in reversed(self.artifacts):
            if art.name == name:
                return art
        raise KeyError(f"no artifact named {name!r}; logged: {sorted({a.name for a in self.artifacts})}")


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text


def _item_path(item: Any) -> list[str]:
    return list(item.nested_key) if len(item.nested_key) else [item.key]


def _set_path(target: dict[str, Any], path: list[str], value: Any) -> None:
    node = target
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _remove_path(target: dict[str, Any], path: list[str]) -> None:
    node: Any = target
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _apply(target: dict[str, Any], updates: Any, removes: Any = ()) -> None:
    for item in updates:
        _set_path(target, _item_path(item), _loads(item.value_json))
    for item in removes:
        _remove_path(target, _item_path(item))


def read_offline_run(run_dir: str | Path, *, wait_for_exit_s: float = 0.0) -> OfflineRun:
    """Read a run folder (or its ``.wandb`` file) back: config, history, summary, media, artifacts.

    ``wait_for_exit_s``: W&B's service may still be flushing a run that ``finish()`` just ended;
    re-read for up to this many seconds until the exit record is there.

    Works on finished runs and on runs whose process was interrupted (``exit_code`` is then
    ``None`` and a killed process's last rows may be missing). Needs no network and no
    ``wandb sync``. System metrics, console output and W&B's telemetry are not returned.
    """
    deadline = time.monotonic() + wait_for_exit_s
    run = _read_offline_run_once(run_dir)
    while run.exit_code is None and time.monotonic() < deadline:
        time.sleep(0.2)
        run = _read_offline_run_once(run_dir)
    return run


def _read_offline_run_once(run_dir: str | Path) -> OfflineRun:
    log = _find_log(run_dir)
    folder = log.parent
    reasons: list[str] = []
    run_id = project = ""
    name = group = job_type = None
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    artifacts: list[LoggedArtifact] = []
    exit_code: int | None = None
    for record in iter_transaction_log(log, truncated=reasons):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            run_id, project = run.run_id, run.project
            name = run.display_name or None
            group = run.run_group or None
            job_type = run.job_type or None
            tags = tuple(run.tags)
            _apply(config, run.config.update, run.config.remove)
            _apply(summary, run.summary.update, run.summary.remove)
        elif kind == "config":
            _apply(config, record.config.update, record.config.remove)
        elif kind == "summary":
            _apply(summary, record.summary.update, record.summary.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set_path(row, _item_path(item), _loads(item.value_json))
            row.setdefault("_step", record.history.step.num)
            history.append(row)
        elif kind == "artifact":
            art = record.artifact
            artifacts.append(LoggedArtifact(
                name=art.name, type=art.type, digest=art.digest,
                metadata=_loads(art.metadata) or {},
                files={e.path: Path(e.local_path) for e in art.manifest.contents},
            ))
        elif kind == "exit":
            exit_code = int(record.exit.exit_code)
    config.pop("_wandb", None)
    images: dict[str, list[Path]] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    for row in history:
        for key, value in row.items():
            if not isinstance(value, dict) or "path" not in value:
                continue
            if value.get("_type") == "image-file":
                images.setdefault(key, []).append(folder / "files" / value["path"])
            elif value.get("_type") == "table-file":
                tables[key] = _read_table(folder / "files" / value["path"])
    return OfflineRun(
        run_dir=folder, run_id=run_id, project=project, name=name, group=group, job_type=job_type,
        tags=tags, config=config, history=history,
        summary={k: v for k, v in summary.items() if not k.startswith("_")},
        images=images, tables=tables, artifacts=artifacts, exit_code=exit_code, truncated=reasons,
    )


def _read_table(path: Path) -> list[dict[str, Any]]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    columns = raw.get("columns", [])
    return [dict(zip(columns, row, strict=False)) for row in raw.get("data", [])]
