"""Finer plan units: blocks cut between mixer and FFN, the head cut into shards over the tokens."""

from __future__ import annotations

import pytest

from pipeline.arch import LayerSpec, head_shard_tokens, refine_architecture
from pipeline.errors import ConfigError
from pipeline.zoo import load_zoo_architecture


@pytest.mark.parametrize("model", ["tiny-hybrid", "gemma-small", "deepseek-small", "nemotronh-small"])
def test_sublayer_cuts_every_two_part_block(model: str) -> None:
    arch = load_zoo_architecture(model)
    fine = refine_architecture(arch, granularity="sublayer")
    two_part = sum(1 for x in arch.layers if x.kind == "block" and x.mixer != "none" and x.ffn != "none")
    assert len(fine.layers) == len(arch.layers) + two_part
    for spec in fine.layers:
        if spec.part == "mixer":
            assert spec.ffn == "none" and spec.mixer != "none"
        elif spec.part == "ffn":
            assert spec.mixer == "none" and spec.ffn != "none"
    assert fine.extra["granularity"] == "sublayer" and "granularity" not in arch.extra


def test_layer_granularity_is_the_same_architecture() -> None:
    arch = load_zoo_architecture("tiny-hybrid")
    assert refine_architecture(arch) is arch


@pytest.mark.parametrize("tokens,shards", [(4096, 4), (7, 3), (5, 5), (1000, 7)])
def test_head_shards_cover_every_token_once(tokens: int, shards: int) -> None:
    spans = [head_shard_tokens(tokens, j, shards) for j in range(shards)]
    assert spans[0][0] == 0 and spans[-1][1] == tokens
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 1


def test_head_shards_are_units_of_one_head() -> None:
    arch = refine_architecture(load_zoo_architecture("tiny-hybrid"), head_shards=3)
    heads = [x for x in arch.layers if x.kind == "head"]
    assert [(x.shard, x.shards) for x in heads] == [(0, 3), (1, 3), (2, 3)]
    assert arch.layers[-1].kind == "head"


@pytest.mark.parametrize("kwargs,field", [({"granularity": "block"}, "granularity"),
                                          ({"head_shards": 0}, "head_shards"), ({"head_shards": True}, "head_shards")])
def test_bad_refinement_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        refine_architecture(load_zoo_architecture("tiny-hybrid"), **kwargs)
    assert exc.value.field == field


def test_refining_twice_is_refused() -> None:
    fine = refine_architecture(load_zoo_architecture("tiny-hybrid"), granularity="sublayer")
    with pytest.raises(ConfigError, match="already refined"):
        refine_architecture(fine, granularity="sublayer")


def test_only_a_head_has_shards() -> None:
    with pytest.raises(ConfigError, match="only a head"):
        LayerSpec(kind="block", shard=0, shards=2)
