"""Lower bounds hold for every named schedule; the Gantt chart and text rendering draw the timeline."""

from __future__ import annotations

import pytest

from pipeline.bounds import lower_bound
from pipeline.render import gantt_png, gantt_text
from pipeline.schedules import NAMED_METHODS, build_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile


def test_bounds_by_hand() -> None:
    lb = lower_bound(uniform_profile(8), ideal_cluster(4), 16)
    assert lb.work == pytest.approx(16 * 8 * 3 / 4)
    assert lb.heaviest_layer == pytest.approx(16 * 3)
    assert lb.chain == pytest.approx(8 * 2 + 1)
    assert lb.value == lb.work and lb.binding == "work"


@pytest.mark.parametrize("method", NAMED_METHODS)
def test_no_schedule_beats_the_bound(hetero_profile, h100x4, method: str) -> None:
    r = simulate(build_plan(method, hetero_profile, h100x4, 8), hetero_profile, h100x4)
    assert r.iteration_time >= lower_bound(hetero_profile, h100x4, 8).value - 1e-9


def test_heavy_layer_bound_binds_for_a_heavy_head(hetero_profile, h100x4) -> None:
    lb = lower_bound(hetero_profile, h100x4, 64)
    assert lb.binding in ("work", "heaviest_layer")
    assert lb.heaviest_layer == pytest.approx(64 * (4.0 + 4.0 + 3.6))


def test_gantt_png_and_text(tmp_path, hetero_profile, h100x4) -> None:
    r = simulate(build_plan("zb-h1", hetero_profile, h100x4, 4), hetero_profile, h100x4)
    path = gantt_png(r.timeline_dict(), tmp_path / "g.png", title="zb-h1")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = gantt_text(r.timeline_dict(), width=60)
    lines = text.splitlines()
    assert len(lines) == 5 and all(len(line) == len(lines[0]) for line in lines[:4])
    assert {"F", "I", "W"} <= set(text) and "." in lines[0]
