"""pipeline.job_runtimes: a Megatron job on an H100-class GPU is priced at the H100 fit."""

from __future__ import annotations

from experiments.benchmarks.published_job import SOURCES, source_of
from pipeline.job_runtimes import H100_CLASS, MEGATRON_H100_COMPUTE_SCALE, job_runtime
from pipeline.runtime import RUNTIMES


def test_the_h100_scale_is_the_published_fit_and_only_megatron_on_h100_class_takes_it() -> None:
    assert SOURCES["h100"].compute_scale == MEGATRON_H100_COMPUTE_SCALE  # one number, fitted once
    for gpu in H100_CLASS:
        rt = job_runtime("megatron", gpu)
        assert source_of({"gpu_type": gpu.upper()}).compute_scale == MEGATRON_H100_COMPUTE_SCALE
        assert rt.compute_scale == MEGATRON_H100_COMPUTE_SCALE != RUNTIMES["megatron"].compute_scale
        assert rt.blocking_p2p and rt.optimizer_bytes_per_param == RUNTIMES["megatron"].optimizer_bytes_per_param
    assert job_runtime("megatron", "a100") == "megatron"
    assert job_runtime("zb", "h100") == "zb"


def test_the_job_search_prices_an_h100_megatron_job_slower_than_the_a100_fit_would() -> None:
    from dataclasses import replace

    from agents.job_search import job_setup
    from pipeline.parallelism import Parallelism, estimate_job, megatron_job_plan
    from pipeline.spec import TrainingConfig
    from tests.agents.test_job_search import cfg

    c = replace(cfg(), gpu="h100")
    par = Parallelism(tp=2, pp=2, dp=2, microbatch_size=1, global_batch=32)
    profile, cluster, training = job_setup(c, par)
    assert training.runtime.compute_scale == MEGATRON_H100_COMPUTE_SCALE
    plan = megatron_job_plan(profile, cluster, par, training=training)
    h100 = estimate_job(profile, cluster, plan, par=par, training=training, gpu="h100")
    a100_fit = estimate_job(profile, cluster, plan, par=par, training=par.training(TrainingConfig(runtime="megatron")),
                            gpu="h100")
    assert h100.pipeline_s > a100_fit.pipeline_s
