"""Unknown per-layer profile fields are kept, and named in one ProfileWarning (a typo such as b_ful)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from pipeline.spec import ModelProfile, ProfileWarning
from pipeline.zoo import zoo_profile
from tests.conftest import ROOT

PROFILE = ROOT / "experiments/configs/profiles/hetero-head-16.json"


def _with_fields(tmp_path: Path, **per_layer: dict[str, object]) -> Path:
    raw = json.loads(PROFILE.read_text())
    for index, fields in per_layer.items():
        raw["layers"][int(index.removeprefix("l"))].update(fields)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_misspelt_layer_field_is_named_with_the_likely_one(tmp_path: Path) -> None:
    path = _with_fields(tmp_path, l3={"b_ful": 1.0}, l5={"b_ful": 2.0}, l2={"note": "mine"})
    with pytest.warns(ProfileWarning) as caught:
        profile = ModelProfile.load(path)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert str(path) in text and "'b_ful' (layer 'layer2' and 1 more; did you mean 'b_full'?)" in text
    assert "'note' (layer 'layer1')" in text
    assert profile.layers[3].extra == {"b_ful": 1.0} and profile.layers[2].extra == {"note": "mine"}


@pytest.mark.parametrize("granularity,shards", [("layer", 1), ("sublayer", 2)])
def test_the_toolkits_own_profiles_read_without_a_warning(granularity: str, shards: int, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    zoo_profile("tiny-hybrid", granularity=granularity, head_shards=shards).save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        ModelProfile.load(path)
        ModelProfile.load(PROFILE)
        ModelProfile.load(_with_fields(tmp_path, l1={"b_full": 1.0, "mem_peak_bytes": 5}))
