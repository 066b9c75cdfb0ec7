"""pipeline.engine.pack_job: the Python share of a batch job (placement check and argument packing)."""

from __future__ import annotations

import pytest

from pipeline import engine
from pipeline.engine import ScheduleJob, pack_job
from pipeline.errors import PlanError
from pipeline.hardware import build_cluster
from pipeline.list_scheduler import ListSchedulerConfig
from pipeline.plan import partition_from_sizes
from pipeline.simulator import stage_costs
from pipeline.zoo import zoo_profile


def _job(placement: tuple[int, ...], devices: int = 4) -> ScheduleJob:
    profile = zoo_profile("gemma-small", gpu="h100", seq_len=2048)
    sizes = [profile.num_layers // 8 + (1 if s < profile.num_layers % 8 else 0) for s in range(8)]
    costs = stage_costs(profile, build_cluster("h100", devices=4), partition_from_sizes(sizes),
                        placement=(0, 1, 2, 3, 3, 2, 1, 0))
    return ScheduleJob(costs, placement, devices, 8, ListSchedulerConfig(split_backward=False))


def test_a_placement_the_engines_cannot_index_is_refused() -> None:
    with pytest.raises(PlanError, match="placement.*names device 4"):
        pack_job(_job((0, 1, 2, 3, 4, 2, 1, 0)))
    with pytest.raises(PlanError, match="placement.*7 entries for 8 stages"):
        pack_job(_job((0, 1, 2, 3, 3, 2, 1)))


@pytest.mark.skipif(not engine.compiled(), reason="the compiled engine is not built (make engine)")
def test_the_packed_arguments_are_what_the_compiled_engine_runs() -> None:
    from pipeline import _engine

    job = _job((0, 1, 2, 3, 3, 2, 1, 0))
    args = pack_job(job)
    assert args[7:10] == ([0, 1, 2, 3, 3, 2, 1, 0], 4, 8)
    ok, makespan, busy, peak = _engine.schedule_and_simulate(*args)
    assert engine.Outcome(ok, makespan, tuple(busy), tuple(peak)) == engine.schedule_and_simulate(
        job.costs, job.placement, job.devices, microbatches=job.microbatches, config=job.config)
