"""Several budgets and anytime curves for ``evaluate-agent``: quality against wall time, every method.

Every search's row carries its ``history`` (``[[calls, seconds, best_time], ...]`` at each improvement
to a plan that fits, :meth:`agents.base.SearchResult.anytime`). :func:`anytime_figure` plots, per
method, the geometric mean over scenarios of ``best / best_time_so_far`` against the seconds since
the search began (``best``: the fastest plan any method found on the scenario at any budget), from
each method's run at the largest budget (a line starts once every scenario has a plan that fits), and
marks each budget's final plans at their mean seconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agents.base import Budget
from pipeline.errors import ConfigError

__all__ = ["parse_budgets", "anytime_figure", "quality_at"]


def parse_budgets(text: str, *, max_seconds: float | None = None) -> list[tuple[str, Budget]]:
    """``"400"``, ``"300,1000,3000"`` or ``"0.25s,1s"`` as (label, budget) pairs, in the given order;
    a budget in calls keeps ``max_seconds`` as its cap in seconds."""
    labels = [x.strip() for x in str(text).split(",") if x.strip()]
    if not labels:
        raise ConfigError("give at least one budget, e.g. --budget 400 or --budget 0.25s,1s", field="--budget")
    if len(set(labels)) < len(labels):
        raise ConfigError(f"budget {text!r} names one budget twice; list each once", field="--budget")
    out = []
    for label in labels:
        try:
            b = Budget.parse(label)
        except ValueError as exc:
            raise ConfigError(f"{label!r}: {exc}; write calls (400) or seconds (1s), comma-separated",
                              field="--budget") from None
        out.append((label, b if b.sim_calls is None else Budget(b.sim_calls, max_seconds)))
    return out


def quality_at(history: list[list[Any]], seconds: float, best: float) -> float | None:
    """``best`` over the best time so far at ``seconds`` (None: no plan that fits yet)."""
    t = None
    for _, s, time in history:
        if s is None or s > seconds:
            break
        t = time
    return None if t is None or t <= 0 else best / t


def _time(row: dict[str, Any]) -> float | None:
    """A row's iteration time (``iter_time`` in rows written before 5 Dec 2026)."""
    return row.get("iteration_time", row.get("iter_time"))


def _geo(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def anytime_figure(rows: list[dict[str, Any]], methods: list[str], png: Path) -> Path | None:
    """The anytime figure (see the module docstring); None when no row has a history with seconds."""
    key = [(r["scenario"], r["devices"]) for r in rows]
    best: dict[tuple, float] = {}
    for k, r in zip(key, rows):
        if r.get("feasible") and _time(r):
            best[k] = min(best.get(k, math.inf), _time(r))
    labels = list(dict.fromkeys(r["budget"] for r in rows))
    last = [r for r in rows if r["budget"] == labels[-1] and (r["scenario"], r["devices"]) in best]
    times = [s for r in last for _, s, _ in r.get("history", ()) if s is not None and s > 0]
    if not times:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = min(times), max(r["seconds"] for r in last)
    grid = [lo * (hi / lo) ** (i / 99) for i in range(100)] if hi > lo else [lo]
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for m in methods:
        mine = [r for r in last if r["method"] == m]
        xs, ys = [], []
        for x in grid:
            q = [quality_at(r.get("history", []), x, best[(r["scenario"], r["devices"])]) for r in mine]
            if mine and all(v is not None for v in q):
                xs.append(x)
                ys.append(_geo(q))
        line = ax.plot(xs, ys, lw=1.2, label=m)[0] if xs else None
        marks = []
        for b in labels:
            done = [r for r in rows if r["method"] == m and r["budget"] == b and (r["scenario"], r["devices"]) in best]
            if done and all(r.get("feasible") for r in done):
                q = _geo([best[(r["scenario"], r["devices"])] / _time(r) for r in done])
                marks.append((sum(r["seconds"] for r in done) / len(done), q))
        if marks:
            ax.plot(*zip(*marks), "o", ms=4, color=line.get_color() if line else None,
                    label=None if line else m)
    ax.set_xscale("log")
    ax.set_xlabel("seconds since the search began (lines: best so far; dots: each budget's finals)")
    ax.set_ylabel("best plan found / method's (geo-mean)")
    ax.set_title(f"anytime quality, {len(best)} scenarios, budgets {', '.join(labels)}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
