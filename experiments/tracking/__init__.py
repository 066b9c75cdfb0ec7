"""Log a command's run to Weights & Biases, offline by default: the run wrapper.

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

Beside it: :mod:`experiments.tracking.sb3` gives stable-baselines3 a logger whose metrics go
to the run, and :mod:`experiments.tracking.offline` reads an offline run folder back.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import math
import os
import re
import shutil
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pipeline.plan import Plan

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PROJECT",
    "FLUSH_INTERVAL_S",
    "Tracker",
    "artifact_name",
    "resolve_mode",
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


def artifact_name(text: str) -> str:
    """``text`` as a valid W&B artifact name: each run of other characters than letters, digits,
    '.', '_' and '-' becomes one '-' (``"megatron+layout"`` -> ``"megatron-layout"``), at most 128."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).lstrip("._-")[:128]
    return name or "artifact"


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
        ``metadata``. ``name`` is made valid (:func:`artifact_name`), e.g. a plan's method
        ``megatron+layout``. Returns the folder with the two files (``None`` when disabled).
        """
        self._check_open()
        name = artifact_name(name)
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

    def log_artifact(self, path: str | Path, name: str, type: str, *,
                     metadata: Mapping[str, Any] | None = None) -> Path | None:
        """Log a file or folder (e.g. a profile as type ``"profile"``) as artifact ``name``.

        The content is copied into the run folder first, so later edits of ``path`` do not
        change what ``wandb sync`` uploads; ``name`` is made valid (:func:`artifact_name`). Returns that
        copy's folder (``None`` when disabled).
        """
        self._check_open()
        name = artifact_name(name)
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

