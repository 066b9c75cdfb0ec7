"""pipeline.torchtitan_job and titan_pp_run: a job-search configuration on torchtitan's runtime."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.errors import ConfigError
from pipeline.parallelism import Parallelism
from pipeline.torchtitan_job import titan_best_own, titan_job_estimate, titan_job_of, titan_model_of
from pipeline.torchtitan_model import TitanJob, TitanModel
from pipeline.torchtitan_pp import titan_pp_run
from pipeline.zoo import load_zoo_architecture

L405B = TitanModel("llama3-405b", 126, 16384, 53248, 128, 8, 128256)
TABLE5 = TitanJob(gpus=512, dp_shard=8, tp=8, pp=8, local_batch=32, microbatches=8, compile=True, float8=True,
                  async_tp=True, ac="full")


@pytest.mark.parametrize("job", [TABLE5, replace(TABLE5, schedule="Interleaved1F1B", chunks=2)])
def test_a_given_plan_is_priced_as_torchtitans_own(job: TitanJob) -> None:
    """The tuner's plans are priced by the same function: torchtitan's own plan, given back, costs the
    same step, and the simulator's memory on the profile agrees with torch's warm-up count."""
    own = titan_pp_run(L405B, job)
    given = titan_pp_run(L405B, job, plan=own.plan)
    assert given.step.step_s == pytest.approx(own.step.step_s, rel=1e-9)
    assert given.step.peak_memory_gib == pytest.approx(own.step.peak_memory_gib, rel=0.02)


def test_the_zoo_405b_is_torchtitans_model_and_the_job_maps_its_degrees() -> None:
    arch = load_zoo_architecture("llama3.1-405b")
    model = titan_model_of(arch)
    assert (model.layers, model.hidden, model.ffn_hidden, model.heads, model.kv_heads, model.vocab) == \
        (L405B.layers, L405B.hidden, L405B.ffn_hidden, L405B.heads, L405B.kv_heads, L405B.vocab)
    par = Parallelism(tp=8, pp=8, dp=8, microbatch_size=4, global_batch=256).with_ac("full")
    job = titan_job_of(par, seq_len=8192)
    assert (job.dp_shard, job.tp, job.pp, job.local_batch, job.microbatches, job.ac) == (8, 8, 8, 32, 8, "full")
    est = titan_job_estimate(arch, par, gpu="h100", seq_len=8192, memory_gb=96.0)
    assert est.tokens_per_s_per_gpu == pytest.approx(titan_pp_run(L405B, job).step.tokens_per_s_per_gpu)
    assert est.iteration_s == pytest.approx(est.pipeline_s + est.tail.seconds)
    assert est.par.zero_stage == 3 and 0 < est.mfu < 1


def test_the_lightest_mode_that_fits_and_refusals_name_the_field() -> None:
    arch = load_zoo_architecture("llama3.1-405b")
    par = Parallelism(tp=8, pp=8, dp=8, microbatch_size=4, global_batch=256)
    est, k = titan_best_own(arch, par, ("none", "selective", "full"), gpu="h100", seq_len=8192, memory_gb=96.0)
    assert k == 2 and est.fits and est.par.ac == "full"  # torchtitan ran it with full AC
    none, k = titan_best_own(arch, par, ("none",), gpu="h100", seq_len=8192)
    assert k == 0 and not none.fits and none.iteration_s < est.iteration_s
    with pytest.raises(ConfigError) as err:
        titan_model_of(load_zoo_architecture("deepseek-small"))
    assert err.value.field == "runtime"
    with pytest.raises(ConfigError) as err:
        titan_job_of(par, seq_len=8192, features=("fp4",))
    assert err.value.field == "titan_features"
