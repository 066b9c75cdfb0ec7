"""The compiled engine's batches: the same outcomes on any number of threads, from several Python
threads at once and in a forked child (its helper threads are kept between batches; a batch of
under 2,000 actions runs on the calling thread alone)."""

from __future__ import annotations

import os
import pickle
import threading

import pytest

from pipeline import engine
from pipeline.engine import ScheduleJob, python_reference, schedule_and_simulate_many
from pipeline.errors import PlanError
from pipeline.hardware import build_cluster
from pipeline.list_scheduler import ListSchedulerConfig
from pipeline.plan import partition_from_sizes
from pipeline.simulator import stage_costs
from pipeline.zoo import zoo_profile

pytestmark = pytest.mark.skipif(not engine.compiled(), reason="the compiled engine is not built (make engine)")


def _jobs() -> list[ScheduleJob]:
    """Tiny jobs (a batch of them runs inline) and large ones (on helper threads), capped and not."""
    profile = zoo_profile("gemma-small", gpu="h100", seq_len=2048)
    cluster = build_cluster("h100", devices=4)
    L = profile.num_layers
    out = []
    for S, M in ((4, 1), (4, 2), (8, 16), (16, 32), (8, 64)):
        sizes = [L // S + (1 if s < L % S else 0) for s in range(S)]
        placement = tuple(s % 4 for s in range(S))
        costs = stage_costs(profile, cluster, partition_from_sizes(sizes), placement=placement)
        for cfg in (ListSchedulerConfig(), ListSchedulerConfig(caps=(3 * max(costs.act),) * 4),
                    ListSchedulerConfig(split_backward=False, depth_first=False)):
            out.append(ScheduleJob(costs, placement, 4, M, cfg))
    return out


JOBS = _jobs()
SMALL = [j for j in JOBS if j.microbatches <= 2]


@pytest.fixture(scope="module")
def reference() -> list:
    with python_reference():
        return schedule_and_simulate_many(JOBS)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_a_batch_is_the_same_on_any_number_of_threads(threads: int, reference: list) -> None:
    for _ in range(3):  # the helper threads are reused from batch to batch
        assert schedule_and_simulate_many(JOBS, threads=threads) == reference
        assert schedule_and_simulate_many(SMALL, threads=threads) == reference[:len(SMALL)]


def test_batches_from_several_python_threads_at_once(reference: list) -> None:
    out: dict[int, list] = {}

    def work(k: int) -> None:
        out[k] = [schedule_and_simulate_many(JOBS, threads=2) for _ in range(5)]

    workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert all(run == reference for runs in out.values() for run in runs) and len(out) == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_runs_threaded_batches(reference: list) -> None:
    schedule_and_simulate_many(JOBS, threads=2)  # the parent's helper threads exist now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own helpers (the parent's are not there)
        try:
            os.close(read)
            data = pickle.dumps([schedule_and_simulate_many(JOBS, threads=2) for _ in range(3)])
            os.write(write, data)
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert pickle.loads(b"".join(chunks)) == [reference] * 3
    assert schedule_and_simulate_many(JOBS, threads=2) == reference


def test_clocked_counts_the_jobs_and_time_of_its_block_on_either_engine() -> None:
    job = JOBS[0]
    schedule_and_simulate_many(JOBS[:2])  # outside any block: counted nowhere
    with engine.clocked() as outer:
        schedule_and_simulate_many(JOBS[:3], threads=1)  # one native batch
        with engine.clocked() as inner:
            engine.schedule_and_simulate(job.costs, job.placement, job.devices, microbatches=job.microbatches)
            with python_reference():
                schedule_and_simulate_many(JOBS[:2])  # the reference: one job at a time
    assert (outer.jobs, inner.jobs) == (6, 3)
    assert outer.seconds > inner.seconds > 0
    with engine.clocked() as bad, pytest.raises(PlanError):
        engine.schedule_and_simulate(job.costs, (9,) * len(job.placement), job.devices, microbatches=1)
    assert bad.jobs == 0  # a placement the facade refuses reaches no engine


def test_a_clock_that_counted_nothing_leaves_the_others_running() -> None:
    with engine.clocked() as outer:
        with engine.clocked() as inner:
            pass  # both read 0 seconds and 0 jobs here: the inner one leaves, not the outer one
        schedule_and_simulate_many(JOBS[:2], threads=1)
    assert (outer.jobs, inner.jobs) == (2, 0)
