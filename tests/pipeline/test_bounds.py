"""Lower bounds: valid for every plan the simulator accepts, whatever cost fields it reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.bounds import lower_bound
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from tests.conftest import ideal_cluster, uniform_profile


def _fused(profile, b_full: float):
    """``profile`` with a measured fused-backward time on every layer."""
    return replace(profile, layers=tuple(replace(x, extra={"b_full": b_full}) for x in profile.layers))


@pytest.mark.parametrize("method", ["megatron", "1f1b", "gpipe", "zb-h1"])
def test_a_measured_fused_backward_stays_above_the_bound(method: str) -> None:
    # The case: f=b=w=1 and a fused backward of 1 (below b + w = 2); 1F1B ran at 0.672x the bound.
    prof, cluster = _fused(uniform_profile(4), 1.0), ideal_cluster(2)
    r = simulate(build_plan(method, prof, cluster, 64), prof, cluster)
    assert r.iteration_time >= lower_bound(prof, cluster, 64).value - 1e-9
