"""env.scenarios: draws are a function of the seed, inside the configured ranges; hold-outs stay held out."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from env.scenarios import (
    HELDOUT_MIXED_SPEEDS,
    HELDOUT_SCENARIO,
    MODEL_FAMILIES,
    TRAIN_SCENARIO,
    ScenarioConfig,
    memory_estimate_gb,
    sample_architecture,
    sample_scenario,
    zero_shot_starts,
    zoo_family,
)
from pipeline.arch import LayerSpec
from pipeline.budgets import preset_budgets
from pipeline.evaluator import Evaluator
from pipeline.hardware import get_gpu
from pipeline.spec import GIB, TrainingConfig
from tests.conftest import uniform_profile

SYNTHETIC = re.compile(r"synthetic-(?P<family>[a-z-]+)-(?P<blocks>\d+)$")


def _draws(config: ScenarioConfig, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [sample_scenario(rng, config) for _ in range(n)]


@pytest.mark.parametrize("config", [ScenarioConfig(), TRAIN_SCENARIO, HELDOUT_SCENARIO, HELDOUT_MIXED_SPEEDS],
                         ids=["default", "train", "heldout", "heldout-mixed"])
def test_a_seed_fixes_the_scenario(config: ScenarioConfig) -> None:
    for seed in (0, 7, 123):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        first, second = sample_scenario(a, config), sample_scenario(b, config)
        assert first == second
        assert a.random() == b.random()  # and consumes the generator the same way
    names = {(p.profile.name, p.devices, p.microbatches, p.cluster.memory_gb) for p in _draws(config, 12)}
    assert len(names) > 6  # different seeds, different scenarios


def test_default_draws_stay_in_their_ranges() -> None:
    config = ScenarioConfig()
    draws = _draws(config, 150)
    devices = [p.devices for p in draws]
    assert min(devices) == config.min_devices and max(devices) == config.max_devices  # both ends are drawn
    for p in draws:
        assert config.min_devices <= p.devices <= config.max_devices
        assert p.microbatches % p.devices == 0 and p.microbatches // p.devices in config.microbatch_factors
        assert p.profile.seq_len in config.seq_lens
        assert p.cluster.extra["gpu"] in {get_gpu(g).name for g in config.gpus}
        m = SYNTHETIC.match(p.profile.name)
        assert m and m["family"] in config.families
        blocks = int(m["blocks"])
        assert max(config.min_blocks, p.devices) <= blocks <= config.max_blocks
        assert p.profile.num_layers in (blocks + 2, blocks + 3)  # embedding and head, maybe an MTP layer
        assert p.profile.layers[0].kind == "embedding" and p.profile.layers[-1].kind == "head"
        assert p.cluster.gpus_per_node is None and len(set(p.cluster.speeds)) == 1
    assert {SYNTHETIC.match(p.profile.name)["family"] for p in draws} == set(MODEL_FAMILIES)


def test_microbatch_counts_and_the_work_cap() -> None:
    config = replace(ScenarioConfig(max_devices=32), microbatches=(8, 64, 256), max_work=512)
    for p in _draws(config, 80):
        assert p.microbatches >= p.devices
        assert p.devices * p.microbatches <= config.max_work or p.microbatches == p.devices
        # halved from a drawn count until it fits (never below the devices)
        assert any(p.microbatches in (max(p.devices, m >> k) for k in range(9)) for m in config.microbatches)


def test_tight_memory_sits_near_what_1f1b_needs() -> None:
    tight = _draws(replace(ScenarioConfig(), tight_memory_share=1.0), 40)
    for p in tight:
        need = memory_estimate_gb(p.profile, p.devices)
        usable = p.cluster.memory_gb - p.cluster.memory_reserve_gb
        assert usable == pytest.approx(1.0) or 0.7 * need - 1e-9 <= usable <= 1.6 * need + 1e-9
    roomy = _draws(replace(ScenarioConfig(), tight_memory_share=0.0), 20)
    assert all(p.cluster.memory_gb == get_gpu(p.cluster.extra["gpu"]).capacity_gib for p in roomy)


def test_mixed_speeds_and_nodes() -> None:
    config = replace(ScenarioConfig(min_devices=6, max_devices=16), mixed_speed_share=1.0, gpus_per_node=(4,))
    for p in _draws(config, 30):
        speeds = set(p.cluster.speeds)
        assert speeds <= {1.0, 0.5, 0.65, 0.8} and len(speeds - {1.0}) <= 1  # one slow speed per cluster
        assert p.cluster.gpus_per_node == 4
    assert any(len(set(p.cluster.speeds)) == 2 for p in _draws(config, 30))


def test_zoo_draws_come_from_the_named_models() -> None:
    config = replace(ScenarioConfig(max_devices=4), zoo_models=("gemma-small", "deepseek-small"), zoo_share=1.0)
    names = {p.profile.name for p in _draws(config, 10)}
    assert names and all(not SYNTHETIC.match(n) for n in names)
    assert all(n.startswith(("gemma", "deepseek")) for n in names)


def test_training_never_draws_what_is_held_out() -> None:
    for p in _draws(TRAIN_SCENARIO, 60, seed=3):
        m = SYNTHETIC.match(p.profile.name)
        if m:
            assert m["family"] != "hybrid-mamba" and int(m["blocks"]) <= 48
        else:
            assert zoo_family(p.profile.name) != "hybrid-mamba" and "large" not in p.profile.name
    for p in _draws(HELDOUT_SCENARIO, 30, seed=3):
        m = SYNTHETIC.match(p.profile.name)
        if m:
            assert m["family"] == "hybrid-mamba" and 56 <= int(m["blocks"]) <= 96
        else:
            assert p.profile.name in HELDOUT_SCENARIO.zoo_models


@pytest.mark.parametrize("family", MODEL_FAMILIES)
def test_each_family_has_its_layer_shapes(family: str) -> None:
    rng = np.random.default_rng(5)
    for _ in range(5):
        arch = sample_architecture(rng, blocks=12, families=(family,))
        body = [x for x in arch.layers if x.kind not in ("embedding", "head", "mtp")]
        assert arch.name == f"synthetic-{family}-12" and len(body) == 12
        mixers, ffns = [x.mixer for x in body], [x.ffn for x in body]
        if family == "dense":
            assert set(mixers) == {"attention"} and set(ffns) == {"mlp"}
        elif family == "sliding":
            assert mixers[0::2] == ["sliding_attention"] * 6 and mixers[1::2] == ["attention"] * 6
        elif family == "moe":
            first = ffns.index("moe")  # dense layers first, then MoE
            assert set(ffns[:first]) <= {"mlp"} and set(ffns[first:]) == {"moe"} and first <= 4
        elif family == "hybrid-mamba":
            assert "mamba" in mixers and "attention" in mixers
        else:
            assert mixers.count("attention") == 3 and mixers.count("linear_attention") == 9


def test_coins_draw_as_one_call_each_and_equal_layers_are_one_object() -> None:
    """The draw's shortcuts keep its stream and values: ``_coins`` takes the generator's doubles as
    one ``random()`` call each (between bounded integers, which buffer half a word), and the layers
    of a drawn model are shared objects equal to those built one by one."""
    from env.scenarios import _coins

    one, many = np.random.default_rng(11), np.random.default_rng(11)
    for n in (0, 1, 5, 32):
        assert one.integers(7) == many.integers(7)
        assert [one.random() < 0.6 for _ in range(n)] == _coins(many, n, 0.6)
    assert one.random() == many.random()
    arch = sample_architecture(np.random.default_rng(5), blocks=12, families=("hybrid-mamba",))
    body = arch.layers[1:13]
    assert all(x == LayerSpec(mixer=x.mixer, ffn=x.ffn) for x in body)
    assert len({id(x) for x in body}) == len(set(body)) < len(body)


def test_zoo_family_and_the_memory_estimate() -> None:
    assert zoo_family("gemma-large") == "sliding" and zoo_family("nemotronh-small") == "hybrid-mamba"
    assert zoo_family("unknown-model") == "dense"
    profile = uniform_profile(8, act=2 * GIB, params=10**9)
    training = TrainingConfig()
    want = (training.bytes_per_param * 8 * 10**9 / 4 + 16 * GIB * training.activation_scale) / GIB
    assert memory_estimate_gb(profile, 4) == pytest.approx(want)


@pytest.mark.parametrize("seed", range(6))
def test_zero_shot_starts_cost_no_simulator_call(seed: int) -> None:
    scenario = sample_scenario(np.random.default_rng(seed), TRAIN_SCENARIO)
    ev = Evaluator(scenario)
    starts = zero_shot_starts(scenario, ev)
    assert ev.calls == 0 and 1 <= len(starts) <= 2
    P = scenario.devices
    for c in starts:
        assert sum(c.sizes) == scenario.profile.num_layers and min(c.sizes) >= 1
        assert c.order == "list" and len(c.placement) == c.num_stages
    assert starts[0].num_stages == P or len(starts) == 1
    if starts[0].num_stages == P:  # one stage per device: ZB-H1's budgets, cut to what memory holds
        assert all(b <= h for b, h in zip(starts[0].budgets, preset_budgets("zb-h1", P)))
