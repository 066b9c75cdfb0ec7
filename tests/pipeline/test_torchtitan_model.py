"""The torchtitan runtime model: each flag moves the step the way torchtitan's own tables say."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime import RUNTIMES
from pipeline.torchtitan_model import TITAN_FITS, TitanJob, TitanModel, titan_fit_for, titan_step
from pipeline.torchtitan_pp import titan_pp_step

L8B = TitanModel("llama3-8b", 32, 4096, 14336, 32, 8, 128256)
L405B = TitanModel("llama3-405b", 126, 16384, 53248, 128, 8, 128256)
BASE = TitanJob(gpus=8, dp_shard=8, local_batch=2)


def tps(job: TitanJob, model: TitanModel = L8B) -> float:
    return titan_step(model, job).tokens_per_s_per_gpu


def test_compile_and_float8_are_each_faster() -> None:
    eager, compiled = tps(BASE), tps(replace(BASE, compile=True))
    assert compiled > eager
    assert tps(replace(BASE, compile=True, float8=True)) > compiled


def test_full_ac_is_slower_and_lighter_than_selective_and_none_heaviest() -> None:
    steps = {ac: titan_step(L8B, replace(BASE, ac=ac)) for ac in ("none", "selective", "full")}
    assert steps["full"].tokens_per_s_per_gpu < steps["selective"].tokens_per_s_per_gpu < \
        steps["none"].tokens_per_s_per_gpu
    assert steps["full"].peak_memory_gib < steps["selective"].peak_memory_gib < steps["none"].peak_memory_gib


def test_cp_memory_falls_with_degree_at_a_fixed_sequence() -> None:
    mem = [titan_step(L8B, TitanJob(gpus=8, dp_shard=8 // cp, cp=cp, seq_len=65536, local_batch=1, ac="full"))
           .peak_memory_gib for cp in (1, 2, 4, 8)]
    assert mem == sorted(mem, reverse=True) and mem[0] > 2 * mem[-1]


def test_attention_makes_long_sequences_slower_per_token() -> None:
    short = tps(TitanJob(gpus=8, dp_shard=8, seq_len=8192, local_batch=1, ac="full"))
    long = tps(TitanJob(gpus=8, dp_shard=8, seq_len=65536, local_batch=1, ac="full"))
    assert long < 0.7 * short


def test_async_tp_is_faster_and_more_gpus_never_faster_per_gpu() -> None:
    job = TitanJob(gpus=64, dp_shard=8, tp=8, local_batch=4, ac="full", compile=True, float8=True)
    assert tps(replace(job, async_tp=True)) > tps(job)
    assert tps(replace(BASE, gpus=128, dp_shard=128)) <= tps(BASE)


def test_sharding_over_more_ranks_holds_less_state() -> None:
    wide = titan_step(L8B, replace(BASE, gpus=128, dp_shard=128))
    assert wide.peak_memory_gib < titan_step(L8B, BASE).peak_memory_gib


def test_bad_jobs_name_their_field() -> None:
    with pytest.raises(ConfigError, match="product"):
        titan_step(L8B, replace(BASE, dp_shard=4))
    with pytest.raises(ConfigError, match="activation"):
        titan_step(L8B, replace(BASE, ac="sometimes"))
    with pytest.raises(ConfigError, match="fitted"):
        titan_fit_for("a100")


def test_pipelined_405b_interleaved_beats_1f1b() -> None:
    """torchtitan's Table 5 order (1F1B ~100 < interleaved ~128 tokens/s/GPU): a sanity check, not fitted."""
    job = TitanJob(gpus=512, dp_shard=8, tp=8, pp=8, local_batch=16, microbatches=16, compile=True, float8=True,
                   ac="full")
    one = titan_pp_step(L405B, job).tokens_per_s_per_gpu
    inter = titan_pp_step(L405B, replace(job, schedule="Interleaved1F1B", chunks=2)).tokens_per_s_per_gpu
    assert 0 < one < inter
    with pytest.raises(ConfigError, match="schedule"):
        titan_pp_step(L405B, replace(job, schedule="GPipe"))


def test_resharding_under_pp_costs_time_and_saves_memory() -> None:
    job = TitanJob(gpus=64, dp_shard=8, pp=8, local_batch=8, microbatches=8, ac="full", compile=True)
    keep, reshard = titan_pp_step(L8B, job), titan_pp_step(L8B, replace(job, reshard_after_forward=True))
    assert reshard.tokens_per_s_per_gpu <= keep.tokens_per_s_per_gpu
    assert reshard.peak_memory_gib < keep.peak_memory_gib


def test_the_runtime_is_registered_with_the_fit() -> None:
    rt = RUNTIMES["torchtitan"]
    assert rt.compute_scale > 1.0 and rt.optimizer_bytes_per_param > 0
    assert rt.fitted_on == TITAN_FITS["h100"].fitted_on


def test_pp_holds_the_stage_gradients_unsharded_in_fp32() -> None:
    """Under PP FSDP2 keeps the stage's bf16 weights gathered and accumulates the gradients it does not
    reduce-scatter in reduce_dtype (fp32): 6 bytes per parameter of the stage on its TP rank."""
    from pipeline.torchtitan_model import memory_parts
    job = TitanJob(gpus=512, dp_shard=8, tp=8, pp=8, local_batch=32, microbatches=8, ac="full")
    params = 16 * L405B.block_params + L405B.vocab * L405B.hidden
    parts = memory_parts(L405B, job, 4, inflight_layers=128, stage_params=params, head_here=True)
    assert parts["fsdp_buffers"] == pytest.approx(params / 8 * 6.0 / 2**30)
    resharded = memory_parts(L405B, replace(job, reshard_after_forward=True), 4, inflight_layers=128,
                             stage_params=params, head_here=True)
    assert resharded["fsdp_buffers"] < parts["fsdp_buffers"] / 5
