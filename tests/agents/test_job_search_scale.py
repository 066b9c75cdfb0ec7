"""agents.job_search at scale: the reference configuration, activation checkpointing as a searched
knob, and an MoE model's expert degrees."""

from __future__ import annotations

import pytest

from agents.job_search import JobConfig, candidate_degrees, parse_reference, price_reference, search_job
from pipeline.errors import ConfigError
from pipeline.zoo import load_zoo_architecture
from tests.agents.test_job_search import cfg


def test_a_reference_is_read_with_its_schedule_and_defaults() -> None:
    ref = parse_reference("tp2,pp2,dp2,interleaved", cfg())
    assert (ref.par.tp, ref.par.pp, ref.par.dp, ref.par.cp, ref.par.microbatch_size) == (2, 2, 2, 1, 1)
    assert ref.schedule == "interleaved" and ref.chunks is None and ref.chunk_choices([1, 2, 3]) == [2, 3]
    ref = parse_reference("pp2, tp2, mbs=2, 1f1b, ac=full, zero=fsdp", cfg())
    assert ref.par.dp == 2 and ref.chunks == 1 and ref.ac == "full" and ref.par.zero_stage == 3
    assert parse_reference("tp2,pp4,interleaved:3", cfg()).chunk_choices([1, 2, 3]) == [3]


@pytest.mark.parametrize("text,hint", [
    ("tp3,pp2", "does not divide 8 GPUs"),
    ("tp2,pp2,dp4", "use dp2 or leave dp out"),
    ("tp2,pp2,sometimes", "cannot read 'sometimes'"),
    ("tp2,pp2,1f1b,interleaved", "two schedules"),
    ("tp2,tp2", "tp given twice"),
    ("tp8,interleaved", "needs pp >= 2"),
    ("tp2,pp2,interleaved:1", "at least 2 chunks"),
    ("tp2,pp2,mbs=0", "cannot read 'mbs=0'"),
    ("tp16", "does not divide"),
])
def test_a_bad_reference_is_one_error_naming_the_flag(text: str, hint: str) -> None:
    with pytest.raises(ConfigError, match="field '--reference'") as err:
        parse_reference(text, cfg())
    assert hint in str(err.value) and "\n" not in str(err.value)


def test_a_chunk_count_megatron_cannot_run_is_refused_with_the_counts_it_can() -> None:
    ref = parse_reference("tp1,pp4,dp2,interleaved:5", cfg())  # 12 blocks on 4 devices: at most 3 chunks
    with pytest.raises(ConfigError, match=r"field '--reference'.*it can: \[1, 2, 3\]"):
        price_reference(cfg(), ref)


def test_the_reference_is_priced_beside_the_search_and_in_its_rows() -> None:
    c = cfg(reference=parse_reference("tp2,pp2,dp2,1f1b", cfg()))
    found = search_job(c)
    ref = found.reference
    assert ref is not None and ref.method == "reference" and ref.feasible
    assert ref.estimate.plan.num_stages == 2  # 1F1B: one chunk per device
    assert ref in found.rows and found.best is not ref
    assert found.best.iteration_s <= ref.iteration_s
    assert found.speedup_over(ref) == pytest.approx(ref.iteration_s / found.best.iteration_s)
    row = ref.as_dict()
    assert row["method"] == "reference" and row["tp"] == 2 and row["ac"] in ("none", "selective", "full")


def test_megatrons_row_takes_the_lightest_checkpointing_that_fits() -> None:
    from agents.job_search import _megatron
    from pipeline.parallelism import Parallelism
    par = Parallelism(tp=1, pp=4, dp=2, microbatch_size=8, global_batch=128)
    roomy = _megatron((cfg(global_batch=128, memory_gb=40.0), par, 0.0))
    assert roomy.feasible and roomy.estimate.par.ac == "none"
    modes = []
    for gb in (30.0, 25.0, 20.0, 15.0):
        row = _megatron((cfg(global_batch=128, memory_gb=gb), par, 0.0))
        modes.append(row.estimate.par.ac if row.feasible else "no fit")
    assert "selective" in modes or "full" in modes
    order = {"none": 0, "selective": 1, "full": 2, "no fit": 3}
    assert [order[m] for m in modes] == sorted(order[m] for m in modes)  # less memory, more recomputation
    only_none = _megatron((cfg(global_batch=128, memory_gb=20.0, ac_modes=("none",)), par, 0.0))
    assert not only_none.feasible


def test_an_moe_search_tries_expert_degrees_and_prices_their_imbalance() -> None:
    arch = load_zoo_architecture("deepseek-small")
    c = JobConfig(arch=arch, gpus=16, global_batch=32, seq_len=2048, microbatch_sizes=(1,), max_cp=1,
                  pp_choices=(1, 2), tp_choices=(1,), calls_per_config=40, tune_top=1)
    eps = {p.ep for p in candidate_degrees(c)}
    assert {1, 2, 4, 8, 16} <= eps
    even = search_job(JobConfig(**{**c.__dict__, "moe_imbalance": 1.0}))
    hot = search_job(JobConfig(**{**c.__dict__, "moe_imbalance": 2.0}))
    assert even.best is not None and hot.best is not None
    assert hot.best.iteration_s > even.best.iteration_s
    def degrees(r):
        return (r.par.tp, r.par.pp, r.par.dp, r.par.ep, r.par.microbatch_size)

    evens = {degrees(r): r for r in even.rows if r.method == "megatron" and r.feasible}
    pairs = [(r, evens[degrees(r)]) for r in hot.rows
             if r.method == "megatron" and r.feasible and degrees(r) in evens]
    assert any(r.par.ep > 1 for r, _ in pairs)
    for r, same in pairs:  # the imbalance slows every expert-parallel configuration, and no other
        if r.par.ep > 1:
            assert r.iteration_s > same.iteration_s
        else:
            assert r.iteration_s == pytest.approx(same.iteration_s)
