"""The Gantt chart and text rendering draw the timeline (the bounds' tests are in test_bounds.py)."""

from __future__ import annotations

from pipeline.render import gantt_png, gantt_text
from pipeline.schedules import build_plan
from pipeline.simulator import simulate


def test_gantt_png_and_text(tmp_path, hetero_profile, h100x4) -> None:
    r = simulate(build_plan("zb-h1", hetero_profile, h100x4, microbatches=4), hetero_profile, h100x4)
    path = gantt_png(r.timeline_dict(), tmp_path / "g.png", title="zb-h1")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = gantt_text(r.timeline_dict(), width=60)
    lines = text.splitlines()
    assert len(lines) == 5 and all(len(line) == len(lines[0]) for line in lines[:4])
    assert {"F", "I", "W"} <= set(text) and "." in lines[0]
