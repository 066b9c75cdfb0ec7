"""Scenarios for the environments: heterogeneous models on clusters of 2-32 devices.

A scenario is a :class:`pipeline.candidates.Scenario` (profile + cluster + micro-batches + memory
limit). :func:`sample_scenario` draws one from a ``numpy`` generator, so ``env.reset(seed=...)``
fixes it. Models are either synthetic :class:`pipeline.arch.Architecture` objects of a family
(:data:`MODEL_FAMILIES`) or the zoo's models (``experiments/configs/models``), all priced by
:func:`pipeline.costs.profile_from_architecture`, so their layer costs have the shapes real
models have: a vocabulary-heavy embedding and head, MoE layers after dense ones, Mamba or
linear-attention mixers beside attention, optional multi-token-prediction heads. Clusters span
2-32 devices, 8-256 micro-batches, memory limits that bind, several nodes (a slower link between
them) and mixed device speeds.

Hold-outs: :data:`TRAIN_SCENARIO` leaves out the ``hybrid-mamba`` family and the zoo's
Nemotron-H hybrids (whole families) and every model deeper than 48 blocks (sizes);
:data:`HELDOUT_SCENARIO` draws only what training never sees.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from pipeline.arch import Architecture, LayerSpec
from pipeline.budgets import cut_budgets, preset_budgets
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.costs import profile_from_architecture
from pipeline.hardware import build_cluster
from pipeline.spec import GIB, Device, ModelProfile, TrainingConfig

__all__ = ["MODEL_FAMILIES", "ZOO_FAMILIES", "ScenarioConfig", "TRAIN_SCENARIO", "HELDOUT_SCENARIO",
           "HELDOUT_MIXED_SPEEDS", "sample_architecture", "sample_scenario", "memory_estimate_gb", "zero_shot_starts",
           "zoo_family"]

#: Synthetic model families the generator draws from.
MODEL_FAMILIES = ("dense", "sliding", "moe", "hybrid-mamba", "linear-hybrid")
#: The zoo's families (model name prefix -> synthetic family of the same kind).
ZOO_FAMILIES = {"gemma": "sliding", "deepseek": "moe", "nemotronh": "hybrid-mamba", "llama": "dense"}


def zoo_family(name: str) -> str:
    """The family of a zoo model (``gemma-large`` -> ``sliding``); unknown prefixes: ``dense``."""
    return ZOO_FAMILIES.get(name.split("-")[0], "dense")


@dataclass(frozen=True)
class ScenarioConfig:
    """Ranges of the scenario generator."""

    min_devices: int = 2
    """Fewest pipeline devices."""
    max_devices: int = 8
    """Most pipeline devices (the observation holds up to 32); drawn log-uniformly."""
    min_blocks: int = 6
    """Fewest repeated blocks of a synthetic model (embedding and head come on top)."""
    max_blocks: int = 48
    """Most repeated blocks of a synthetic model."""
    microbatch_factors: tuple[int, ...] = (1, 2, 3, 4)
    """Micro-batches per iteration = devices x one of these (ignored when ``microbatches`` is set)."""
    microbatches: tuple[int, ...] = ()
    """Micro-batch counts to draw from (at least the device count is used); empty: the factors."""
    seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192)
    """Sequence lengths."""
    tight_memory_share: float = 0.4
    """Share of scenarios whose memory limit is set near what a plain 1F1B plan needs."""
    gpus: tuple[str, ...] = ("h100", "a100", "h200")
    """GPU presets."""
    families: tuple[str, ...] = MODEL_FAMILIES
    """Synthetic families to draw from."""
    zoo_models: tuple[str, ...] = ()
    """Zoo models to draw from as well (``zoo_share`` of the draws)."""
    zoo_share: float = 0.0
    """Share of draws taken from ``zoo_models``."""
    gpus_per_node: tuple[int | None, ...] = (None,)
    """GPUs per node to draw from (None: one node); more devices than that span nodes."""
    mixed_speed_share: float = 0.0
    """Share of scenarios whose devices run at mixed speeds (some at 0.5-0.8 of the others)."""
    max_work: int = 1 << 62
    """Cap on devices x micro-batches (a step's cost grows with it): fewer micro-batches beyond it."""


#: What the shipped policy trains on: 2-32 devices, 8-256 micro-batches, four synthetic
#: families and the zoo's Gemma, DeepSeek and Llama models up to medium depth, tight memory,
#: several nodes, mixed speeds. Never: the hybrid-mamba family, the Nemotron-H models, models
#: deeper than 48 blocks (gemma-large, deepseek-large).
TRAIN_SCENARIO = ScenarioConfig(
    min_devices=2, max_devices=32, min_blocks=6, max_blocks=48, microbatches=(8, 16, 32, 64, 128, 256),
    families=("dense", "sliding", "moe", "linear-hybrid"),
    zoo_models=("gemma-small", "gemma-medium", "deepseek-small", "deepseek-medium", "llama-control"),
    zoo_share=0.25, gpus_per_node=(None, 8, 4), mixed_speed_share=0.25, max_work=2048)
#: Held out from training: the hybrid-mamba family, Nemotron-H, and deeper models (56-96 blocks).
HELDOUT_SCENARIO = replace(
    TRAIN_SCENARIO, min_blocks=56, max_blocks=96, families=("hybrid-mamba",),
    zoo_models=("nemotronh-small", "nemotronh-medium", "nemotronh-large", "gemma-large", "deepseek-large"),
    zoo_share=0.5)
#: The same draws with every cluster of mixed speeds (half the devices slower).
HELDOUT_MIXED_SPEEDS = replace(HELDOUT_SCENARIO, mixed_speed_share=1.0)


def _choice(rng: np.random.Generator, options: tuple | list):
    return options[int(rng.integers(len(options)))]


@lru_cache(maxsize=256, typed=True)
def _layer(kind: str, mixer: str = "attention", ffn: str = "mlp", window: int | None = None) -> LayerSpec:
    """The :class:`LayerSpec` of these fields: one shared (frozen) object for each, as a draw repeats a
    few layers many times (built once, and priced once per profile)."""
    return LayerSpec(kind=kind, mixer=mixer, ffn=ffn, window=window)


def _coins(rng: np.random.Generator, n: int, p: float) -> list[bool]:
    """``[rng.random() < p for _ in range(n)]`` in one call (the same draws: ``random(n)`` takes the
    generator's doubles one after another, as ``n`` calls do)."""
    return (rng.random(max(n, 0)) < p).tolist()


@lru_cache(maxsize=64, typed=True)
def _log_bounds(lo: int, hi: int) -> tuple[float, float]:
    """The bounds of the log-uniform device count (``np.log``, as drawn since the start)."""
    return np.log(lo), np.log(hi + 0.999)


def sample_architecture(rng: np.random.Generator, *, blocks: int, families: tuple[str, ...] = MODEL_FAMILIES
                        ) -> Architecture:
    """A random heterogeneous architecture with ``blocks`` repeated layers plus embedding and head."""
    family = _choice(rng, families)
    hidden = int(_choice(rng, (512, 1024, 1536, 2048, 3072, 4096)))
    heads = max(1, hidden // 128)
    vocab = int(_choice(rng, (32000, 50304, 102400, 128256, 151936, 256000)))
    kw: dict = {"intermediate_size": int(hidden * float(_choice(rng, (2.7, 3.5, 4.0, 8.0))))}
    mixers = ["attention"] * blocks
    ffns = ["mlp"] * blocks
    if family == "sliding":
        window = int(_choice(rng, (512, 1024, 4096)))
        pair = (_layer("block", "sliding_attention", "mlp", window), _layer("block", "attention", "mlp", window))
        specs = [pair[i % 2] for i in range(blocks)]
    else:
        if family == "moe":
            dense = int(rng.integers(0, min(4, blocks) + 1))
            ffns = ["mlp"] * dense + ["moe"] * (blocks - dense)
            kw.update(num_experts=int(_choice(rng, (8, 16, 64))), num_experts_per_tok=int(_choice(rng, (2, 4, 6))),
                      moe_intermediate_size=max(256, hidden // 2), num_shared_experts=int(rng.integers(0, 3)))
            if rng.random() < 0.5:
                mixers = ["mla"] * blocks
        elif family == "hybrid-mamba":
            every = int(_choice(rng, (3, 4, 6, 8)))
            mixers = ["attention" if i % every == every - 1 else "mamba" for i in range(blocks)]
            ffns = ["mlp" if coin else "none" for coin in _coins(rng, blocks, 0.6)]
            kw.update(mamba_num_heads=max(1, 2 * hidden // 64), mamba_head_dim=64)
        elif family == "linear-hybrid":
            mixers = ["attention" if i % 4 == 3 else "linear_attention" for i in range(blocks)]
            if rng.random() < 0.5:
                ffns = ["moe"] * blocks
                kw.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=max(256, hidden // 2),
                          num_shared_experts=1)
        specs = [_layer("block", m, f) for m, f in zip(mixers, ffns)]
    layers = [_layer("embedding"), *specs]
    if rng.random() < 0.15:
        layers.append(_layer("mtp"))
    layers.append(_layer("head"))
    return Architecture(name=f"synthetic-{family}-{blocks}", model_type="synthetic", hidden_size=hidden,
                        vocab_size=vocab, layers=tuple(layers), num_attention_heads=heads,
                        num_key_value_heads=max(1, heads // int(_choice(rng, (1, 4, 8)))), **kw)


def memory_estimate_gb(profile: ModelProfile, devices: int, training: TrainingConfig = TrainingConfig()) -> float:
    """Per-device memory a plain 1F1B plan with an even split needs, GiB (static share + one
    micro-batch of every layer's activations, which device 0 holds at 1F1B's warm-up depth)."""
    params = sum(x.params for x in profile.layers)
    act = sum(x.act_bytes for x in profile.layers) * training.activation_scale
    return (training.bytes_per_param * params / devices + act) / GIB


@lru_cache(maxsize=64)
def _zoo(name: str, gpu: str, seq_len: int) -> ModelProfile:
    from pipeline.zoo import zoo_profile

    return zoo_profile(name, gpu=gpu, seq_len=seq_len)


def sample_scenario(rng: np.random.Generator, config: ScenarioConfig = ScenarioConfig()) -> Scenario:
    """One random scenario (see the module docstring); deterministic for a given generator state."""
    lo, hi = config.min_devices, config.max_devices
    P = int(round(float(np.exp(rng.uniform(*_log_bounds(lo, hi)))) - 0.4999))
    P = min(hi, max(lo, P))
    gpu = str(_choice(rng, config.gpus))
    seq_len = int(_choice(rng, config.seq_lens))
    profile = None
    if config.zoo_models and rng.random() < config.zoo_share:
        name = str(_choice(rng, config.zoo_models))
        profile = _zoo(name, gpu, seq_len)
        if profile.num_layers < P:
            profile = None
    if profile is None:
        lo_b = max(config.min_blocks, P)
        blocks = int(rng.integers(lo_b, max(lo_b, config.max_blocks) + 1))
        arch = sample_architecture(rng, blocks=blocks, families=config.families)
        profile = profile_from_architecture(arch, gpu=gpu, seq_len=seq_len)
    cluster = build_cluster(gpu, devices=P, gpus_per_node=_choice(rng, config.gpus_per_node))
    if config.mixed_speed_share and rng.random() < config.mixed_speed_share:
        slow = float(_choice(rng, (0.5, 0.65, 0.8)))
        speeds = [slow if coin else 1.0 for coin in _coins(rng, P, 0.5)]
        cluster = replace(cluster, device_list=tuple(Device(speed=s, memory_gb=cluster.memory_gb) for s in speeds))
    if rng.random() < config.tight_memory_share:
        need = memory_estimate_gb(profile, P)
        # usable memory (capacity less the preset's reserve) near the need, as before the reserve existed
        cluster = cluster.with_memory(float(max(1.0, need * rng.uniform(0.7, 1.6))) + cluster.memory_reserve_gb)
    if config.microbatches:
        M = max(P, int(_choice(rng, config.microbatches)))
    else:
        M = P * int(_choice(rng, config.microbatch_factors))
    while M > P and config.max_work < P * M:
        M = max(P, M // 2)
    return Scenario(profile, cluster, M)


def zero_shot_starts(scenario: Scenario, evaluator) -> list[Candidate]:
    """The one or two plans a zero-shot episode starts from, chosen without a simulator call: one
    stage per device (ZB-H1 budgets) and the better of V and interleaved (ZB-V budgets), each at
    the DP-balanced split, with each device's activation budget cut to what its memory holds
    after the static share; a layout whose static memory leaves no room for one micro-batch is
    skipped, and V/interleaved only when cutting keeps at least a quarter of their budgets
    (``evaluator``: an :class:`~pipeline.evaluator.Evaluator` of ``scenario``, for its DP splits and
    stage costs)."""
    P, L = scenario.devices, scenario.profile.num_layers
    found: list[tuple[float, Candidate]] = []
    fallback = None
    for kind, chunks, preset in (("sequential", 1, "zb-h1"), ("v", 2, "zbv"), ("interleaved", 2, "zbv")):
        if P * chunks > L or (chunks > 1 and P < 2):
            continue
        placement = make_placement(kind, P, chunks)
        sizes = evaluator.balanced_sizes(placement)
        budgets = preset_budgets(preset, P)
        knobs = {"cap_counts_w": False, "max_pending_w": P} if preset == "zb-h1" else {}
        fallback = fallback or Candidate(sizes, placement, "list", budgets, **knobs)
        costs = evaluator.costs(sizes, placement)
        cut = cut_budgets(costs, placement, budgets)
        if cut is None:
            continue
        kept = min(c / b for c, b in zip(cut, budgets))
        if cut != budgets:
            knobs = {}  # W counted against the cut cap: the cap is what memory holds
        found.append((kept, Candidate(sizes, placement, "list", cut, **knobs)))
    seq = [c for k, c in found if c.num_stages == P]
    multi = sorted(((k, c) for k, c in found if c.num_stages != P and k >= 0.25), key=lambda x: -x[0])
    out = seq[:1] + [c for _, c in multi[:1]]
    if not out:
        out = [c for _, c in found[:1]] or [fallback]
    assert out[0] is not None
    return out
