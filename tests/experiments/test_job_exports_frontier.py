"""experiments.commands.job_search.write_job_exports on a frontier job: the files carry the job's
activation checkpointing (the estimate's, not the configuration key's), batch and model flags, and
job.json says why a runtime's file is missing."""

from __future__ import annotations

import json
import tomllib

from agents.job_search import JobConfig, JobRow, JobSearchResult, job_setup
from experiments.commands.job_search import write_job_exports
from pipeline.parallelism import Parallelism, estimate_job, megatron_job_plan
from pipeline.zoo import load_zoo_architecture


def _found(model: str, par: Parallelism, *, gpus: int, batch: int, seq_len: int) -> tuple[JobConfig, JobSearchResult]:
    cfg = JobConfig(arch=load_zoo_architecture(model), gpus=gpus, global_batch=batch, seq_len=seq_len)
    priced = par.with_ac("full")  # the search's rows: keyed by the degrees (ac none), priced in the mode that fits
    profile, cluster, training = job_setup(cfg, priced)
    plan = megatron_job_plan(profile, cluster, priced, training=training, chunks=[1])
    est = estimate_job(profile, cluster, plan, par=priced, training=training, gpu=cfg.gpu, seq_len=seq_len)
    row = JobRow(par.with_ac("none"), "megatron", est, 0.0)
    return cfg, JobSearchResult([row], 1, 0, 0, 0.0, best=row, megatron_best=row)


def test_frontier_exports_carry_the_priced_checkpointing_batch_and_model(tmp_path) -> None:
    par = Parallelism(tp=8, pp=8, dp=8, global_batch=1024)
    cfg, found = _found("llama3.1-70b", par, gpus=512, batch=1024, seq_len=8192)
    files = write_job_exports(tmp_path, cfg, found)
    assert {"megatron_args.txt", "torchtitan.toml"} <= set(files)
    toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert toml["activation_checkpoint"]["mode"] == "full"  # not the key's "none"
    assert (toml["training"]["global_batch_size"], toml["training"]["local_batch_size"]) == (1024, 128)
    assert toml["parallelism"]["module_fqns_per_model_part"][-1][-2:] == ["norm", "lm_head"]
    assert "model_registry('70B')" in (tmp_path / "torchtitan.toml").read_text()
    args = (tmp_path / "megatron_args.txt").read_text().splitlines()
    for line in ("--recompute-granularity full", "--hidden-size 8192", "--num-query-groups 8", "--num-layers 80",
                 "--global-batch-size 1024", "--micro-batch-size 1", "--tensor-model-parallel-size 8"):
        assert line in args, line


def test_a_hybrid_model_gets_the_reason_megatron_cannot_take_its_layout(tmp_path) -> None:
    par = Parallelism(tp=8, pp=4, dp=2, global_batch=64)
    cfg, found = _found("nemotron-h-56b", par, gpus=64, batch=64, seq_len=4096)
    files = write_job_exports(tmp_path, cfg, found)
    assert "megatron_args.txt" not in files and "torchtitan.toml" in files
    exports = json.loads((tmp_path / "job.json").read_text())["exports"]
    assert "MambaStack" in exports["megatron_args_note"]


def test_gemma_gets_the_parallel_flags_and_the_reason_its_model_flags_are_missing(tmp_path) -> None:
    par = Parallelism(tp=8, pp=4, dp=2, global_batch=64)
    cfg, found = _found("gemma3-27b", par, gpus=64, batch=64, seq_len=4096)
    files = write_job_exports(tmp_path, cfg, found)
    assert "megatron_args.txt" in files and "torchtitan.toml" not in files
    args = (tmp_path / "megatron_args.txt").read_text()
    assert "--pipeline-model-parallel-layout" in args and "--hidden-size" not in args
    exports = json.loads((tmp_path / "job.json").read_text())["exports"]
    assert "Gemma" in exports["megatron_model_flags_note"]
    assert "tie_word_embeddings" in exports["torchtitan_note"]


def test_a_best_plan_neither_runtime_takes_falls_back_to_megatrons_for_both(tmp_path) -> None:
    from dataclasses import replace

    from pipeline.candidates import Candidate, Scenario, materialize
    from pipeline.plan import wave_placement

    par = Parallelism(tp=8, pp=4, dp=4, global_batch=256)
    cfg, found = _found("llama3.1-70b", par, gpus=128, batch=256, seq_len=8192)
    mega = found.best
    profile, cluster, training = job_setup(cfg, mega.estimate.par)
    sizes = (7,) * 10 + (6,) * 2  # 82 layers in 12 stages, placed as a wave: neither loop nor V
    wave = materialize(Candidate(sizes, wave_placement(4, 3), "list"), Scenario(profile, cluster, 64, training))
    est = estimate_job(profile, cluster, wave, par=mega.estimate.par, training=training, gpu=cfg.gpu, seq_len=8192)
    best = JobRow(mega.par, "adaptis", est, 0.0)
    files = write_job_exports(tmp_path, cfg, replace(found, rows=[best, mega], best=best))
    exports = json.loads((tmp_path / "job.json").read_text())["exports"]
    assert exports["torchtitan.toml"] == exports["megatron_args.txt"] == "Megatron's best configuration"
    assert "loop-style" in exports["torchtitan_note"] and "megatron_plan.csv" in files
    toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert toml["parallelism"]["pipeline_parallel_schedule_csv"].endswith("megatron_plan.csv")
    assert len(toml["parallelism"]["module_fqns_per_model_part"]) == mega.estimate.plan.num_stages
    assert (tmp_path / "megatron_plan.csv").read_text() != (tmp_path / "plan.csv").read_text()
