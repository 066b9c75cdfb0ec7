"""Plans of every schedule kind for tiny-hybrid on two ranks (shared by the executor tests)."""

from __future__ import annotations

from pipeline.plan import Plan, partition_from_sizes
from pipeline.schedules import ListSchedulerConfig, build_plan, list_schedule
from pipeline.simulator import stage_costs
from pipeline.spec import Cluster, ModelProfile

__all__ = ["NAMED_METHODS", "RICHER_UNITS", "named_plans", "richer_plans", "uneven_plan", "tiny_profile"]

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
    costs = stage_costs(profile, cluster, partition, placement)
    order = list_schedule(costs, placement, 2, microbatches, ListSchedulerConfig(split_backward=split))
    return Plan(2, microbatches, partition, placement, order, {"method": "uneven-custom"})


def named_plans(microbatches: int = 4) -> list[tuple[str, Plan]]:
    profile = tiny_profile()
    cluster = Cluster(devices=2)
    plans = [(m, build_plan(m, profile, cluster, microbatches)) for m in NAMED_METHODS]
    plans.append(("uneven-custom", uneven_plan(profile, microbatches)))
    return plans


#: Units of the plans below: tiny-hybrid cut into sub-block units with the head in two shards.
RICHER_UNITS = {"granularity": "sublayer", "head_shards": 2}


def richer_plans(microbatches: int = 4) -> list[tuple[str, Plan]]:
    """Plans over tiny-hybrid's finer units (13: embed, 9 mixer/FFN units, head.0, head.1) on two
    ranks: one cutting inside blocks, one with the head's shards on different ranks, one that
    recomputes both stages; all with the I/W split."""
    from pipeline.zoo import zoo_profile

    profile = zoo_profile("tiny-hybrid", **RICHER_UNITS)
    cluster = Cluster(devices=2)
    out = []
    for name, sizes, placement, recompute in (
            ("sublayer-cut", (2, 4, 4, 3), (0, 1, 0, 1), None),
            ("split-head", (6, 6, 1), (0, 1, 0), None),
            ("recompute", (7, 6), (0, 1), (True, True))):
        partition = partition_from_sizes(sizes)
        costs = stage_costs(profile, cluster, partition, placement, recompute=recompute)
        order = list_schedule(costs, placement, 2, microbatches, ListSchedulerConfig(split_backward=True))
        out.append((name, Plan(2, microbatches, partition, placement, order, {"method": name}, recompute=recompute)))
    return out
