"""Pictures of a timeline: a Gantt chart (PNG) and a text rendering.

Both take the timeline format shared by the simulator (``Result.timeline_dict()``) and the
executor: ``{"time_unit", "devices", "events": [{"device", "action", "start", "end"}]}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.plan import parse_action

__all__ = ["OP_COLORS", "gantt_png", "gantt_text", "gantt_side_by_side"]

OP_COLORS = {"F": "#4C72B0", "I": "#DD8452", "W": "#55A868", "B": "#C44E52"}


def _draw(ax: Any, timeline: dict[str, Any], title: str, xmax: float | None = None) -> None:
    devices = int(timeline.get("devices") or 1 + max((e["device"] for e in timeline["events"]), default=0))
    by_op: dict[str, list[tuple[int, float, float]]] = {op: [] for op in OP_COLORS}
    end = 0.0
    for e in timeline["events"]:
        op = parse_action(e["action"]).op
        by_op[op].append((e["device"], e["start"], e["end"] - e["start"]))
        end = max(end, e["end"])
    for op, bars in by_op.items():
        for d in range(devices):
            segs = [(s, w) for dev, s, w in bars if dev == d]
            if segs:
                ax.broken_barh(segs, (d - 0.4, 0.8), facecolors=OP_COLORS[op], edgecolor="white", linewidth=0.3,
                               label=op if d == min(dev for dev, _, _ in bars) else None)
    busy = [sum(e["end"] - e["start"] for e in timeline["events"] if e["device"] == d) for d in range(devices)]
    for d in range(devices):
        bubble = 100 * (1 - busy[d] / end) if end > 0 else 0.0
        ax.text(1.005, d, f"{bubble:.0f}% idle", transform=ax.get_yaxis_transform(), va="center", fontsize=7)
    ax.set_yticks(range(devices))
    ax.set_yticklabels([f"dev {d}" for d in range(devices)])
    ax.invert_yaxis()
    ax.set_xlim(0, xmax or end or 1.0)
    ax.set_xlabel(f"time ({timeline.get('time_unit', 'ms')})")
    ax.set_title(f"{title}  —  {end:.3g} {timeline.get('time_unit', 'ms')}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=7, frameon=False)


def gantt_png(timeline: dict[str, Any], path: str | Path, *, title: str = "pipeline timeline") -> Path:
    """Draw one timeline as a Gantt chart: a row per device, F/I/W/B coloured, gaps are bubbles."""
    return gantt_side_by_side([timeline], [title], path)


def gantt_side_by_side(timelines: Sequence[dict[str, Any]], titles: Sequence[str], path: str | Path, *,
                       same_scale: bool = True) -> Path:
    """Draw several timelines stacked, on one time axis when ``same_scale`` (compare plans at a glance)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [max(1, int(t.get("devices") or 1)) for t in timelines]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, sum(0.35 * r + 1.0 for r in rows)), squeeze=False,
                             gridspec_kw={"height_ratios": rows})
    xmax = max((e["end"] for t in timelines for e in t["events"]), default=1.0) if same_scale else None
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
    end = max((e["end"] for e in events), default=0.0)
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
    lines.append(f"        0{'':{width - 12}}{end:>10.4g} {timeline.get('time_unit', 'ms')}")
    return "\n".join(lines)
