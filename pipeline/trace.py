"""Timelines in the Chrome trace event format (Perfetto, chrome://tracing, beside torch.profiler traces).

One process per timeline (``predicted``, ``measured``), one track (thread) per device, one
complete event (``"ph": "X"``) per action, named in PyTorch's pipelining notation (``3F0``,
``0I2``, ``2W3``, ``1B0``). Predicted transfers go on a track per sending device, named like
PyTorch's communication actions (``3SEND_F0`` for stage 3's activation of micro-batch 0,
``4SEND_B0`` for stage 4's gradient back). Times are microseconds, as the format wants.

Input timelines use the shared format of :meth:`pipeline.simulator.Result.timeline_dict` and the
executor's measured timelines: ``{"time_unit", "devices", "events": [{"device", "action",
"start", "end"}]}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.plan import parse_action

__all__ = ["US_PER_UNIT", "SEND_TRACK", "timeline_events", "transfer_events", "chrome_trace", "write_trace",
           "validate_trace"]

#: Microseconds per timeline time unit.
US_PER_UNIT = {"s": 1e6, "ms": 1e3, "us": 1.0}
#: Thread ids of transfer tracks: ``SEND_TRACK + device``.
SEND_TRACK = 1000


def _scale(timeline: Mapping[str, Any]) -> float:
    unit = timeline.get("time_unit", "ms")
    if unit not in US_PER_UNIT:
        raise ConfigError(f"unknown time unit {unit!r}; use one of {sorted(US_PER_UNIT)}", field="time_unit")
    return US_PER_UNIT[unit]


def _meta(pid: int, tid: int | None, name: str, sort: int) -> list[dict[str, Any]]:
    if tid is None:
        return [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}},
                {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": sort}}]
    return [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": sort}}]


def timeline_events(timeline: Mapping[str, Any], *, pid: int, label: str) -> list[dict[str, Any]]:
    """Metadata plus one complete event per action of ``timeline`` (process ``pid`` named ``label``)."""
    us = _scale(timeline)
    events = list(timeline.get("events", []))
    devices = int(timeline.get("devices") or 1 + max((int(e["device"]) for e in events), default=0))
    out = _meta(pid, None, label, pid)
    for d in range(devices):
        out += _meta(pid, d, f"device {d}", d)
    for e in events:
        a = parse_action(e["action"], source=label)
        out.append({"name": str(a), "cat": a.op, "ph": "X", "pid": pid, "tid": int(e["device"]),
                    "ts": float(e["start"]) * us, "dur": max(0.0, float(e["end"]) - float(e["start"])) * us,
                    "args": {"stage": a.stage, "op": a.op, "microbatch": a.mb}})
    return out


def transfer_events(timeline: Mapping[str, Any], *, pid: int, placement: Sequence[int],
                    comm: Sequence[float]) -> list[dict[str, Any]]:
    """The transfers a predicted timeline implies: after ``F(s, m)`` the activation goes to stage
    ``s+1``'s device, after ``I``/``B(s+1, m)`` the gradient comes back; ``comm[s]`` is the
    transfer time between stages ``s`` and ``s+1`` in the timeline's unit (0: same device)."""
    us = _scale(timeline)
    out: list[dict[str, Any]] = []
    senders: set[int] = set()
    S = len(placement)
    for e in timeline.get("events", []):
        a = parse_action(e["action"])
        if a.op == "F" and a.stage + 1 < S and comm[a.stage] > 0:
            s, dst = a.stage, placement[a.stage + 1]
            name, kind = f"{s}SEND_F{a.mb}", "SEND_F"
        elif a.op in ("I", "B") and a.stage > 0 and comm[a.stage - 1] > 0:
            s, dst = a.stage - 1, placement[a.stage - 1]
            name, kind = f"{a.stage}SEND_B{a.mb}", "SEND_B"
        else:
            continue
        src = int(e["device"])
        senders.add(src)
        out.append({"name": name, "cat": kind, "ph": "X", "pid": pid, "tid": SEND_TRACK + src,
                    "ts": float(e["end"]) * us, "dur": comm[s] * us,
                    "args": {"from_device": src, "to_device": dst, "microbatch": a.mb}})
    meta: list[dict[str, Any]] = []
    for d in sorted(senders):
        meta += _meta(pid, SEND_TRACK + d, f"device {d} sends", SEND_TRACK + d)
    return meta + out


def chrome_trace(*, predicted: Mapping[str, Any] | None = None, measured: Mapping[str, Any] | None = None,
                 placement: Sequence[int] | None = None, comm: Sequence[float] | None = None,
                 title: str = "") -> dict[str, Any]:
    """A Chrome trace (JSON object) of the predicted and/or measured timeline; transfers of the
    predicted one when ``placement`` and ``comm`` (per-stage transfer times) are given."""
    if predicted is None and measured is None:
        raise ConfigError("give a predicted or a measured timeline", field="timeline")
    events: list[dict[str, Any]] = []
    if measured is not None:
        events += timeline_events(measured, pid=1, label=f"measured{': ' + title if title else ''}")
    if predicted is not None:
        events += timeline_events(predicted, pid=2, label=f"predicted{': ' + title if title else ''}")
        if placement is not None and comm is not None:
            events += transfer_events(predicted, pid=2, placement=placement, comm=comm)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "adaptis", "title": title}}


def write_trace(path: str | Path, trace: Mapping[str, Any]) -> Path:
    """Validate and write ``trace`` as JSON; returns the path."""
    validate_trace(trace)
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace) + "\n")
    return path


def validate_trace(trace: Any) -> None:
    """Check the JSON object format of the Chrome trace event format as used here: a
    ``traceEvents`` list; every event has ``ph``, ``pid``, ``name``; complete events (``X``) have
    numeric ``ts`` and ``dur >= 0`` and a ``tid``; metadata events (``M``) carry ``args``."""
    if not isinstance(trace, Mapping) or not isinstance(trace.get("traceEvents"), list):
        raise ConfigError("a trace is a JSON object with a 'traceEvents' list", field="traceEvents")
    for k, e in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{k}]"
        if not isinstance(e, Mapping) or not {"ph", "pid", "name"} <= set(e):
            raise ConfigError(f"{where} needs 'ph', 'pid' and 'name'", field=where)
        if e["ph"] == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0 or "tid" not in e:
                raise ConfigError(f"{where} is a complete event: it needs numeric 'ts', 'dur' >= 0 and a 'tid'",
                                  field=where)
        elif e["ph"] == "M":
            if not isinstance(e.get("args"), Mapping):
                raise ConfigError(f"{where} is a metadata event: it needs 'args'", field=where)
        else:
            raise ConfigError(f"{where} has phase {e['ph']!r}; this writer uses 'X' and 'M' only", field=where)
