"""Read an offline W&B run folder back: config, history, summary, images, tables, artifacts.

:func:`read_offline_run` parses the run's ``run-<id>.wandb`` transaction log (W&B's
LevelDB-style record log of protobuf ``Record`` s, decoded with
``wandb.proto.wandb_internal_pb2``) without W&B's service or any network;
:func:`iter_transaction_log` yields the raw records.

Why not W&B's own reader: W&B 0.31 has none in Python. The old pure-Python
``wandb.sdk.internal.datastore`` is gone; the ``.wandb`` log is read only inside the Go
``wandb-core`` binary, by ``wandb sync`` / ``wandb beta sync`` (which upload the records to a
server and need credentials) and by ``wandb leet`` (an interactive terminal viewer), none of
which hands the records back to Python. ``wandb.Api`` reads runs from a server only, so an
offline run cannot be read through it before ``wandb sync``. Tests and commands need the
logged values on a machine without a network, hence this small reader of the documented
record format (it uses W&B's own protobuf classes for the records themselves).
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LoggedArtifact", "OfflineRun", "TransactionLogError", "iter_transaction_log", "read_offline_run"]

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
