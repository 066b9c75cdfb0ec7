"""Plans of every schedule kind for tiny-hybrid on two ranks (shared by the executor tests)."""

from __future__ import annotations

from pipeline.engine import list_schedule
from pipeline.list_scheduler import ListSchedulerConfig
from pipeline.plan import Plan, partition_from_sizes
from pipeline.schedules import build_plan
from pipeline.simulator import stage_costs
from pipeline.spec import Cluster, ModelProfile

__all__ = ["NAMED_METHODS", "named_plans", "richer_plans", "uneven_plan", "tiny_profile"]

NAMED_METHODS = ("gpipe", "1f1b", "i1f1b-v2", "zb-h1", "zbv")


def tiny_profile() -> ModelProfile:
    from pipeline.zoo import zoo_profile

    return zoo_profile("tiny-hybrid")


def uneven_plan(profile: ModelProfile, microbatches: int, *, split: bool = True) -> Plan:
    """A hand-made plan: uneven partition (3, 1, 2, 2 layers) and a non-sequential placement
    (rank 1 holds the first and the last stage, rank 0 the two middle ones)."""
    cluster = Cluster(devices=2)
    partition = partition_from_sizes([3, 1, 2, 2])
    placement = (1, 0, 0, 1)
    costs = stage_costs(profile, cluster, partition, placement=placement)
    order = list_schedule(costs, placement, 2, microbatches=microbatches,
                          config=ListSchedulerConfig(split_backward=split))
    return Plan(2, microbatches, partition, placement, order, {"method": "uneven-custom"})


def named_plans(microbatches: int = 4) -> list[tuple[str, Plan]]:
    profile = tiny_profile()
    cluster = Cluster(devices=2)
    plans = [(m, build_plan(m, profile, cluster, microbatches=microbatches)) for m in NAMED_METHODS]
    plans.append(("uneven-custom", uneven_plan(profile, microbatches)))
    return plans


def richer_plans(microbatches: int = 4) -> list[tuple[str, Plan]]:
    """The benchmark's plans over tiny-hybrid's finer units (experiments.benchmarks.richer_units)."""
    from experiments.benchmarks.richer_units import UNITS
    from experiments.benchmarks.richer_units import richer_plans as build
    from pipeline.zoo import zoo_profile

    return build(zoo_profile("tiny-hybrid", **UNITS), Cluster(devices=2), microbatches)
