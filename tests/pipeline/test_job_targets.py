"""pipeline.job_targets: a whole job's degrees in Megatron-LM's arguments and torchtitan's config fields."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from pipeline.errors import ConfigError
from pipeline.job_targets import megatron_job_args, torchtitan_job_fragment
from pipeline.parallelism import Parallelism, job_cluster, job_profile, megatron_job_plan
from pipeline.zoo import load_zoo_architecture

PAR = Parallelism(tp=2, pp=2, dp=2, cp=2, microbatch_size=1, global_batch=32, recompute=True)


def _job(par: Parallelism = PAR):
    arch = load_zoo_architecture("llama-control")
    profile = job_profile(arch, par, gpu="h100", seq_len=4096)
    return megatron_job_plan(profile, job_cluster(par, gpu="h100"), par), profile


def test_megatron_args_carry_every_degree_and_the_whole_batch() -> None:
    plan, profile = _job()
    text = megatron_job_args(plan, profile, PAR, seq_len=4096)
    lines = text.splitlines()
    for line in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2", "--context-parallel-size 2",
                 "--expert-model-parallel-size 1", "--global-batch-size 32", "--seq-length 4096",
                 "--micro-batch-size 1", "--sequence-parallel", "--use-distributed-optimizer",
                 "--overlap-grad-reduce", "--overlap-param-gather", "--recompute-granularity full"):
        assert line in lines
    assert sum(x.startswith("--seq-length") for x in lines) == 1  # the CP share's length is replaced
    with pytest.raises(ConfigError, match="ZeRO-2"):
        megatron_job_args(plan, profile, dataclasses.replace(PAR, zero_stage=2), seq_len=4096)
    fsdp = megatron_job_args(plan, profile, dataclasses.replace(PAR, zero_stage=3), seq_len=4096)
    assert "--use-torch-fsdp2" in fsdp and "--use-distributed-optimizer" not in fsdp


def test_megatron_flags_are_megatron_core_config_fields() -> None:
    core = pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig
    del core
    fields = {f.name for cls in (TransformerConfig, DistributedDataParallelConfig) for f in dataclasses.fields(cls)}
    script_only = {"micro_batch_size", "global_batch_size", "seq_length", "use_torch_fsdp2"}
    plan, profile = _job()
    for line in megatron_job_args(plan, profile, PAR, seq_len=4096).splitlines():
        name = line.split()[0].lstrip("-").replace("-", "_")
        assert name in fields or name in script_only, name


def test_torchtitan_fragment_fields_are_torchtitan_config_fields() -> None:
    plan, profile = _job()
    cfg = tomllib.loads(torchtitan_job_fragment(plan, profile, PAR, csv_path="plan.csv", seq_len=4096))
    par, train = cfg["parallelism"], cfg["training"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (2, 2, 2, 2, 1)
    assert par["enable_sequence_parallel"] is True
    assert (train["global_batch_size"], train["local_batch_size"], train["seq_len"]) == (32, 16, 4096)
    configs = pytest.importorskip("torchtitan.config.configs")
    assert set(par) <= {f.name for f in dataclasses.fields(configs.ParallelismConfig)}
    assert set(train) <= {f.name for f in dataclasses.fields(configs.TrainingConfig)}


def test_a_plan_of_another_pipeline_size_is_refused() -> None:
    plan, profile = _job()
    with pytest.raises(ConfigError, match="field 'pp'"):
        megatron_job_args(plan, profile, dataclasses.replace(PAR, pp=4, dp=1), seq_len=4096)
