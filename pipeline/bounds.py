"""Lower bounds on iteration time from the profile and the cluster alone (no plan)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.spec import Cluster, ModelProfile

__all__ = ["LowerBound", "lower_bound"]


@dataclass(frozen=True)
class LowerBound:
    """Each bound holds for every plan; ``value`` is the largest."""

    work: float
    """All work of all micro-batches spread perfectly over every device's speed."""
    heaviest_layer: float
    """A layer is never split: its device runs it for every micro-batch."""
    chain: float
    """One micro-batch's forward through every layer, then its input-gradient back, plus one W."""

    @property
    def value(self) -> float:
        return max(self.work, self.heaviest_layer, self.chain)

    @property
    def binding(self) -> str:
        """Which bound is the largest."""
        return max(("work", self.work), ("heaviest_layer", self.heaviest_layer), ("chain", self.chain),
                   key=lambda kv: kv[1])[0]


def lower_bound(profile: ModelProfile, cluster: Cluster, microbatches: int) -> LowerBound:
    """Lower bounds on iteration time, in the profile's time unit; communication counts as free."""
    speeds = cluster.speeds
    fastest = max(speeds)
    per_mb = [layer.f + layer.b + layer.w for layer in profile.layers]
    work = microbatches * sum(per_mb) / sum(speeds)
    heaviest = microbatches * max(per_mb) / fastest
    chain = (sum(layer.f + layer.b for layer in profile.layers) + min(layer.w for layer in profile.layers)) / fastest
    return LowerBound(work=work, heaviest_layer=heaviest, chain=chain)
