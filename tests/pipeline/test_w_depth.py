"""A split backward's W grows with the depth of its stage (the profile's ``w_depth``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.errors import ProfileError
from pipeline.simulator import stage_costs
from pipeline.spec import LayerCost, ModelProfile, TrainingConfig
from tests.conftest import ideal_cluster

LAYERS = tuple(LayerCost(f"l{i}", "x", 1.0, 2.0, 1.0, 0, 0, 0) for i in range(6))


def test_a_stage_of_n_layers_pays_w_depth_for_each_layer_past_the_first() -> None:
    plain = ModelProfile("p", LAYERS)
    deep = replace(plain, w_depth=0.2)
    partition, placement = ((0, 2), (2, 3), (3, 6)), (0, 1, 0)
    base = stage_costs(plain, ideal_cluster(2), partition, placement=placement)
    got = stage_costs(deep, ideal_cluster(2), partition, placement=placement)
    assert base.w == (2.0, 1.0, 3.0)
    # the first stage runs its whole backward at W (PyTorch): no depth; one layer: none either
    assert got.w == pytest.approx((2.0, 1.0, 3.0 * (1 + 0.2 * 2)))
    assert got.f == base.f and got.i == base.i  # only W walks the graph once per parameter group
    no_defer = stage_costs(deep, ideal_cluster(2), partition, placement=placement,
                           training=TrainingConfig(first_stage_defers_backward=False))
    assert no_defer.w[0] == pytest.approx(2.0 * 1.2)


def test_the_profile_keeps_its_w_depth_and_refuses_a_negative_one() -> None:
    prof = ModelProfile("p", LAYERS, w_depth=0.15)
    assert ModelProfile.from_dict(prof.to_dict()).w_depth == 0.15
    assert "w_depth" not in ModelProfile("p", LAYERS).to_dict()
    with pytest.raises(ProfileError, match="w_depth"):
        ModelProfile("p", LAYERS, w_depth=-0.1)
