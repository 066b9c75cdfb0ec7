"""The Gantt chart tells the printed numbers (issue 47): its span is the priced iteration time,
its idle shares are the printed bubbles, charts side by side share one axis, and a huge cluster's
chart stays small."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from experiments.cli import main
from pipeline.render import MAX_ROWS, chart_span, gantt_png, gantt_side_by_side
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster
from tests.conftest import ROOT

PROFILE = ROOT / "experiments/configs/profiles/hetero-head-16.json"
CLUSTER = ROOT / "experiments/configs/clusters/h100x4.json"


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The axes of every figure saved (their time axis, title and idle labels)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    seen: list = []
    real = Figure.savefig

    def keep(fig, *a, **k):
        seen.append([(ax.get_xlim(), ax.get_title(), [t.get_text() for t in ax.texts]) for ax in fig.axes])
        return real(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return seen


def _contended(hetero_profile):
    """A CPU-like profile: two devices computing at once run 40% slower (a term the events do not show)."""
    return dataclasses.replace(hetero_profile, compute_contention=0.4)


def test_chart_ends_at_the_priced_time_and_idles_as_printed(tmp_path, hetero_profile, h100x4, drawn) -> None:
    prof = _contended(hetero_profile)
    r = simulate(build_plan("1f1b", prof, h100x4, microbatches=8), prof, h100x4)
    events_end = max(e["end"] for e in r.timeline_dict()["events"])
    assert r.iteration_time > events_end * 1.01  # the case the issue found: the engine's timeline is shorter
    assert chart_span(r.timeline_dict()) == pytest.approx(r.iteration_time)
    gantt_png(r.timeline_dict(), tmp_path / "g.png", title="1f1b")
    (xlim, title, texts), = drawn[0]
    assert xlim[1] == pytest.approx(r.iteration_time)
    assert f"{r.iteration_time:.4g}" in title
    assert texts == [f"{100 * b:.0f}% idle" for b in r.bubble]


def test_simulate_gantt_says_what_simulate_prints(tmp_path, hetero_profile, h100x4, drawn, capsys) -> None:
    prof = _contended(hetero_profile)
    prof_file = tmp_path / "contended.json"
    prof_file.write_text(json.dumps(prof.to_dict()))
    plan = build_plan("zb-h1", prof, h100x4, microbatches=8)
    plan.save(tmp_path / "plan.json")
    assert main(["simulate", "--plan", str(tmp_path / "plan.json"), "--profile", str(prof_file), "--cluster",
                 str(CLUSTER), "--gantt", str(tmp_path / "g.png")]) == 0
    printed = float(re.search(r"iteration time ([\d.]+)", capsys.readouterr().out).group(1))
    (xlim, title, _), = drawn[0]
    assert f"{xlim[1]:.4g}" == f"{printed:.4g}" and f"{printed:.4g}" in title


def test_side_by_side_share_one_axis(tmp_path, hetero_profile, h100x4, drawn) -> None:
    slow = simulate(build_plan("gpipe", hetero_profile, h100x4, microbatches=8), hetero_profile, h100x4)
    fast = simulate(build_plan("zb-h1", hetero_profile, h100x4, microbatches=8), hetero_profile, h100x4)
    gantt_side_by_side([fast.timeline_dict(), slow.timeline_dict()], ["a", "b"], tmp_path / "g.png")
    a, b = drawn[0]
    assert a[0] == b[0] and a[0][1] == pytest.approx(max(slow.iteration_time, fast.iteration_time))


def test_search_writes_its_two_charts_on_one_axis(tmp_path, drawn) -> None:
    assert main(["search", "--profile", str(PROFILE), "--cluster", str(CLUSTER), "--microbatches", "8",
                 "--method", "zb-h1", "--budget", "10", "--out", str(tmp_path)]) == 0
    assert len(drawn) == 2 and drawn[0][0][0] == drawn[1][0][0]


def test_a_huge_cluster_draws_a_bounded_picture(tmp_path, hetero_profile) -> None:
    from PIL import Image

    timeline = {"time_unit": "ms", "devices": 4096, "iteration_time": 10.0,
                "events": [{"device": d, "action": "0F0", "start": 0.0, "end": 1.0} for d in range(0, 4096, 7)]}
    path = gantt_png(timeline, tmp_path / "big.png")
    with Image.open(path) as im:
        w, h = im.size
    assert w * h < Image.MAX_IMAGE_PIXELS and h < 0.5 * MAX_ROWS * 110


def test_overlapping_iterations_keep_their_events(hetero_profile) -> None:
    cluster = Cluster.load(CLUSTER)
    r = simulate(build_plan("1f1b", hetero_profile, cluster, microbatches=8), hetero_profile, cluster)
    assert chart_span({**r.timeline_dict(), "iteration_time": None}) == pytest.approx(
        max(e["end"] for e in r.timeline_dict()["events"]))
