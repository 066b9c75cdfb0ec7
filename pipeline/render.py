"""Pictures of a timeline: a Gantt chart (PNG) and a text rendering.

Both take the timeline format shared by the simulator (``Result.timeline_dict()``) and the
executor: ``{"time_unit", "devices", "events": [{"device", "action", "start", "end"}]}``, with an
optional ``iteration_time`` (the simulator's priced total). Where that total exceeds the events'
end (the step after the schedule, compute contention), the chart shows the difference as a grey
band, so it ends at the printed time; where it is shorter (overlapping iterations' steady period),
a dashed line marks it. Idle shares are of that total, as the printed bubble is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.plan import parse_action

__all__ = ["OP_COLORS", "MAX_ROWS", "axis_end", "chart_span", "gantt_png", "gantt_text", "gantt_side_by_side"]

OP_COLORS = {"F": "#4C72B0", "I": "#DD8452", "W": "#55A868", "B": "#C44E52"}


#: Most device rows one chart draws; a larger cluster's chart shows evenly spaced devices (its
#: picture stays within PIL's pixel limit; the title says how many are shown).
MAX_ROWS = 64


def chart_span(timeline: dict[str, Any]) -> float:
    """Where a chart of ``timeline`` ends: the priced ``iteration_time`` when it has one, else the
    last event's end."""
    end = max((e["end"] for e in timeline["events"]), default=0.0)
    total = timeline.get("iteration_time")
    return float(total) if isinstance(total, (int, float)) and total > 0 and total != float("inf") else end


def _shown_devices(devices: int) -> list[int]:
    if devices <= MAX_ROWS:
        return list(range(devices))
    return sorted({round(k * (devices - 1) / (MAX_ROWS - 1)) for k in range(MAX_ROWS)})


def _draw(ax: Any, timeline: dict[str, Any], title: str, xmax: float | None = None) -> None:
    devices = int(timeline.get("devices") or 1 + max((e["device"] for e in timeline["events"]), default=0))
    shown = _shown_devices(devices)
    row = {d: i for i, d in enumerate(shown)}
    by_op: dict[str, list[tuple[int, float, float]]] = {op: [] for op in OP_COLORS}
    events_end = 0.0
    for e in timeline["events"]:
        events_end = max(events_end, e["end"])
        if e["device"] in row:
            op = parse_action(e["action"]).op
            by_op[op].append((row[e["device"]], e["start"], e["end"] - e["start"]))
    end = chart_span(timeline)
    unit = timeline.get("time_unit", "ms")
    if end > events_end:
        ax.broken_barh([(events_end, end - events_end)], (-0.5, len(shown)), facecolors="#DDDDDD", hatch="//",
                       edgecolor="#999999", linewidth=0.0, label="step + contention")
    elif end < events_end:
        ax.axvline(end, color="black", linestyle="--", linewidth=0.8, label="steady period")
    devices_drawn = len(shown)
    for op, bars in by_op.items():
        for d in range(devices_drawn):
            segs = [(s, w) for dev, s, w in bars if dev == d]
            if segs:
                ax.broken_barh(segs, (d - 0.4, 0.8), facecolors=OP_COLORS[op], edgecolor="white", linewidth=0.3,
                               label=op if d == min(dev for dev, _, _ in bars) else None)
    busy = {d: 0.0 for d in shown}
    for e in timeline["events"]:
        if e["device"] in busy:
            busy[e["device"]] += e["end"] - e["start"]
    for d in shown:
        bubble = 100 * max(0.0, 1 - busy[d] / end) if end > 0 else 0.0
        ax.text(1.005, row[d], f"{bubble:.0f}% idle", transform=ax.get_yaxis_transform(), va="center", fontsize=7)
    ax.set_yticks(range(devices_drawn))
    ax.set_yticklabels([f"dev {d}" for d in shown])
    ax.invert_yaxis()
    ax.set_xlim(0, xmax or max(end, events_end) or 1.0)
    ax.set_xlabel(f"time ({unit})")
    some = f" ({devices_drawn} of {devices} devices shown)" if devices_drawn < devices else ""
    ax.set_title(f"{title}  —  {end:.4g} {unit}{some}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=7, frameon=False)


def gantt_png(timeline: dict[str, Any], path: str | Path, *, title: str = "pipeline timeline",
              xmax: float | None = None) -> Path:
    """Draw one timeline as a Gantt chart: a row per device, F/I/W/B coloured, gaps are bubbles
    (``xmax``: the time axis's end, to share it with another chart)."""
    return gantt_side_by_side([timeline], [title], path, xmax=xmax)


def axis_end(timelines: Sequence[dict[str, Any]]) -> float:
    """One time axis for charts compared side by side: the longest span (or last event) among them."""
    return max((max(chart_span(t), max((e["end"] for e in t["events"]), default=0.0)) for t in timelines),
               default=1.0) or 1.0


def gantt_side_by_side(timelines: Sequence[dict[str, Any]], titles: Sequence[str], path: str | Path, *,
                       same_scale: bool = True, xmax: float | None = None) -> Path:
    """Draw several timelines stacked, on one time axis when ``same_scale`` (compare plans at a
    glance); ``xmax`` sets that axis's end (to share it with charts in other files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [len(_shown_devices(max(1, int(t.get("devices") or 1)))) for t in timelines]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, sum(0.35 * r + 1.0 for r in rows)), squeeze=False,
                             gridspec_kw={"height_ratios": rows})
    if xmax is None and same_scale:
        xmax = axis_end(timelines)
    for ax, t, title in zip(axes[:, 0], timelines, titles):
        _draw(ax, t, title, xmax)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gantt_text(timeline: dict[str, Any], *, width: int = 100) -> str:
    """A text Gantt chart: one line per device, a letter per op, ``.`` for idle time."""
    events = timeline["events"]
    devices = int(timeline.get("devices") or 1 + max((e["device"] for e in events), default=0))
    span = chart_span(timeline)
    end = max([span] + [e["end"] for e in events])
    if end <= 0:
        return "\n".join(f"dev {d:>2} |" for d in range(devices))
    scale = width / end
    rows = [["."] * width for _ in range(devices)]
    for e in events:
        op = parse_action(e["action"]).op
        a = int(e["start"] * scale)
        b = max(a + 1, int(round(e["end"] * scale)))
        for x in range(a, min(b, width)):
            rows[e["device"]][x] = op
    lines = [f"dev {d:>2} |{''.join(r)}|" for d, r in enumerate(rows)]
    lines.append(f"        0{'':{width - 12}}{span:>10.4g} {timeline.get('time_unit', 'ms')}")
    return "\n".join(lines)
