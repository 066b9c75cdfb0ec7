"""agents.job_search: degrees, micro-batch size and the pipeline plan inside, on a small model."""

from __future__ import annotations

import pytest

from agents.job_search import JobConfig, candidate_degrees, search_job
from pipeline.arch import Architecture, LayerSpec
from pipeline.parallelism import Parallelism, validate_job


def small() -> Architecture:
    layers = (LayerSpec("embedding"),) + (LayerSpec(),) * 12 + (LayerSpec("head"),)
    return Architecture("small", "gpt", 1024, 128000, layers, num_attention_heads=8, num_key_value_heads=8,
                        intermediate_size=4096, gated_mlp=False, seq_len=2048)


def cfg(**kw) -> JobConfig:
    base = dict(arch=small(), gpus=8, global_batch=32, seq_len=2048, calls_per_config=60, tune_top=2,
                microbatch_sizes=(1, 2))
    return JobConfig(**{**base, **kw})


def test_candidates_are_valid_and_multiply_to_the_gpus() -> None:
    c = cfg()
    pars = candidate_degrees(c)
    assert pars and len(set(pars)) == len(pars)
    for par in pars:
        assert par.gpus == 8 and par.tp <= 8 and par.ep == 1
        validate_job(c.arch, par, seq_len=2048, gpus=8)
    assert Parallelism(tp=2, pp=2, dp=2, global_batch=32, microbatch_size=1) in pars
    assert all(par.cp == 1 for par in candidate_degrees(cfg(max_cp=1)))


def test_search_returns_rows_with_the_degrees_and_beats_or_ties_megatron() -> None:
    found = search_job(cfg())
    assert found.best is not None and found.best.feasible
    assert found.megatron_best is not None
    assert found.best.iteration_s <= found.megatron_best.iteration_s * (1 + 1e-9)
    assert found.speedup is not None and found.speedup >= 1.0
    row = found.best.as_dict(with_plan=True)
    assert {"tp", "pp", "dp", "cp", "ep", "microbatch_size", "microbatches", "tokens_per_s_per_gpu", "mfu",
            "peak_memory", "plan"} <= set(row)
    assert row["tp"] * row["pp"] * row["dp"] * row["cp"] == 8
    assert row["microbatches"] * row["microbatch_size"] * row["dp"] == 32
    assert found.configurations >= len({(r.par, r.method) for r in found.rows})


def test_a_batch_no_degrees_can_split_is_one_error() -> None:
    from pipeline.errors import ConfigError
    with pytest.raises(ConfigError, match="global_batch") as err:
        search_job(cfg(global_batch=3, microbatch_sizes=(2,)))
    assert "the nearest that has one is 2" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--pp 8") as err:
        search_job(cfg(pp_choices=(7,)))
    assert err.value.field == "--pp"


def test_workers_give_the_same_result_as_one_process() -> None:
    one, two = search_job(cfg()), search_job(cfg(), workers=2)
    assert [r.as_dict() for r in one.rows] == [r.as_dict() for r in two.rows]


@pytest.mark.slow
def test_a_local_ray_gives_the_same_result_as_two_workers() -> None:
    ray = pytest.importorskip("ray")
    try:
        by_ray = search_job(cfg(), ray_address="local")
    finally:
        ray.shutdown()
    two = search_job(cfg(), workers=2)
    assert [r.as_dict() for r in by_ray.rows] == [r.as_dict() for r in two.rows]


def test_megatrons_row_recomputes_when_it_does_not_fit_without() -> None:
    from agents.job_search import _megatron
    par = Parallelism(tp=1, pp=4, dp=2, microbatch_size=8, global_batch=128)
    roomy = _megatron((cfg(global_batch=128, memory_gb=40.0), par, 0.0))
    tight = _megatron((cfg(global_batch=128, memory_gb=20.0), par, 0.0))
    assert roomy.feasible and not roomy.estimate.par.recompute
    assert tight.feasible and tight.estimate.par.recompute and "recomputation" in tight.note
    assert tight.estimate.peak_memory_gb < roomy.estimate.peak_memory_gb
    assert tight.iteration_s > roomy.iteration_s
    assert tight.as_dict()["recompute"] is True


def test_the_degrees_tried_can_be_restricted() -> None:
    pars = candidate_degrees(cfg(pp_choices=(2,), tp_choices=(1, 2)))
    assert pars and {p.pp for p in pars} == {2} and {p.tp for p in pars} <= {1, 2}


def test_progress_reports_each_phase_up_to_its_total() -> None:
    seen: list[tuple[str, int, int]] = []
    found = search_job(cfg(), progress=lambda phase, done, total: seen.append((phase, done, total)))
    assert found.best is not None
    for phase in ("megatron", "tuner"):
        mine = [(d, t) for p, d, t in seen if p == phase]
        assert mine, phase
        assert [d for d, _ in mine] == sorted(d for d, _ in mine) and mine[-1][0] == mine[-1][1]
