"""Scenarios for the environments: heterogeneous synthetic models on clusters of 2-16 devices.

A scenario is a :class:`pipeline.space.Problem` (profile + cluster + micro-batches + memory
limit). :func:`sample_problem` draws one from a ``numpy`` generator, so ``env.reset(seed=...)``
fixes it. Models are built as :class:`pipeline.arch.Architecture` objects and priced by
:func:`pipeline.costs.profile_from_architecture`, so their layer costs have the shapes real
models have: a vocabulary-heavy embedding and head, MoE layers after dense ones, Mamba or
linear-attention mixers beside attention, optional multi-token-prediction heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import profile_from_architecture
from pipeline.hardware import build_cluster
from pipeline.space import Problem
from pipeline.spec import GIB, ModelProfile, TrainingConfig

__all__ = ["FAMILIES", "ScenarioConfig", "sample_architecture", "sample_problem", "memory_estimate_gb"]

#: Model families the generator draws from.
FAMILIES = ("dense", "sliding", "moe", "hybrid-mamba", "linear-hybrid")


@dataclass(frozen=True)
class ScenarioConfig:
    """Ranges of the scenario generator (defaults keep one simulation in the millisecond range)."""

    min_devices: int = 2
    """Fewest pipeline devices."""
    max_devices: int = 8
    """Most pipeline devices (the observation holds up to 16)."""
    min_blocks: int = 6
    """Fewest repeated blocks (embedding and head come on top)."""
    max_blocks: int = 48
    """Most repeated blocks (the observation holds up to 160 layers)."""
    microbatch_factors: tuple[int, ...] = (1, 2, 3, 4)
    """Micro-batches per iteration = devices x one of these."""
    seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192)
    """Sequence lengths."""
    tight_memory_share: float = 0.4
    """Share of scenarios whose memory limit is set near what a plain 1F1B plan needs."""
    gpus: tuple[str, ...] = ("h100", "a100", "h200")
    """GPU presets."""


def _choice(rng: np.random.Generator, options: tuple | list):
    return options[int(rng.integers(len(options)))]


def sample_architecture(rng: np.random.Generator, *, blocks: int) -> Architecture:
    """A random heterogeneous architecture with ``blocks`` repeated layers plus embedding and head."""
    family = _choice(rng, FAMILIES)
    hidden = int(_choice(rng, (512, 1024, 1536, 2048, 3072, 4096)))
    heads = max(1, hidden // 128)
    vocab = int(_choice(rng, (32000, 50304, 102400, 128256, 151936, 256000)))
    kw: dict = {"intermediate_size": int(hidden * float(_choice(rng, (2.7, 3.5, 4.0, 8.0))))}
    mixers = ["attention"] * blocks
    ffns = ["mlp"] * blocks
    if family == "sliding":
        window = int(_choice(rng, (512, 1024, 4096)))
        specs = [LayerSpec(mixer="sliding_attention" if i % 2 == 0 else "attention", window=window)
                 for i in range(blocks)]
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
            ffns = ["mlp" if rng.random() < 0.6 else "none" for _ in range(blocks)]
            kw.update(mamba_num_heads=max(1, 2 * hidden // 64), mamba_head_dim=64)
        elif family == "linear-hybrid":
            mixers = ["attention" if i % 4 == 3 else "linear_attention" for i in range(blocks)]
            if rng.random() < 0.5:
                ffns = ["moe"] * blocks
                kw.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=max(256, hidden // 2),
                          num_shared_experts=1)
        specs = [LayerSpec(mixer=m, ffn=f) for m, f in zip(mixers, ffns)]
    layers = [LayerSpec(kind="embedding"), *specs]
    if rng.random() < 0.15:
        layers.append(LayerSpec(kind="mtp"))
    layers.append(LayerSpec(kind="head"))
    return Architecture(name=f"synthetic-{family}-{blocks}", model_type="synthetic", hidden_size=hidden,
                        vocab_size=vocab, layers=tuple(layers), num_attention_heads=heads,
                        num_key_value_heads=max(1, heads // int(_choice(rng, (1, 4, 8)))), **kw)


def memory_estimate_gb(profile: ModelProfile, devices: int, training: TrainingConfig = TrainingConfig()) -> float:
    """Per-device memory a plain 1F1B plan with an even split needs, GiB (static share + one
    micro-batch of every layer's activations, which device 0 holds at 1F1B's warm-up depth)."""
    params = sum(x.params for x in profile.layers)
    act = sum(x.act_bytes for x in profile.layers) * training.activation_scale
    return (training.bytes_per_param * params / devices + act) / GIB


def sample_problem(rng: np.random.Generator, config: ScenarioConfig = ScenarioConfig()) -> Problem:
    """One random scenario (see the module docstring); deterministic for a given generator state."""
    P = int(rng.integers(config.min_devices, config.max_devices + 1))
    lo = max(config.min_blocks, P)
    blocks = int(rng.integers(lo, max(lo, config.max_blocks) + 1))
    arch = sample_architecture(rng, blocks=blocks)
    gpu = str(_choice(rng, config.gpus))
    seq_len = int(_choice(rng, config.seq_lens))
    profile = profile_from_architecture(arch, gpu=gpu, seq_len=seq_len)
    cluster = build_cluster(gpu, devices=P)
    if rng.random() < config.tight_memory_share:
        need = memory_estimate_gb(profile, P)
        # usable memory (capacity less the preset's reserve) near the need, as before the reserve existed
        cluster = cluster.with_memory(float(max(1.0, need * rng.uniform(0.7, 1.6))) + cluster.memory_reserve_gb)
    M = P * int(_choice(rng, config.microbatch_factors))
    return Problem(profile, cluster, M)
