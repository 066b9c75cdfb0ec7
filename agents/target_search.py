"""Search restricted to what a deployment target runs, and each target's best plan.

* ``megatron+layout`` (:class:`MegatronLayoutSearch`): Megatron-LM's own order (1F1B for one
  chunk, interleaved 1F1B for ``v`` chunks) on the looped placement, at an uneven cost-balanced
  layout: every chunk count Megatron allows, seeded by the cost-aware DP split and Megatron's
  even split, then local boundary moves (one layer across a stage boundary, the busiest device's
  boundaries first) while the performance model says faster. Every plan it returns runs in
  Megatron unchanged (``--pipeline-model-parallel-layout``).
* ``adaptis@torchtitan``: the AdaPtis tuner restricted to loop or V placements (any schedule).
* ``adaptis`` itself is the executor's search: no restriction.

:func:`target_rows` reports, for each target, the fastest feasible plan among search results
that the target can run and its speedup over the Megatron baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from agents.base import Budget, BudgetClock, ImproveCallback, SearchResult, finish
from agents.tuner import AdaptisTuner
from pipeline.candidates import Candidate, Scenario, move_layers, objective_key
from pipeline.evaluator import Evaluator
from pipeline.megatron import megatron_chunk_counts
from pipeline.plan import interleaved_placement
from pipeline.start_recipes import fixed_order_candidate, split_sizes
from pipeline.targets import TARGETS, model_reason, placement_reason, target_reason

__all__ = ["TARGET_METHODS", "MegatronLayoutSearch", "target_filter", "target_searcher", "target_rows",
           "torchtitan_tuner"]

#: The search method that stays inside each target's plan space.
TARGET_METHODS = {"executor": "adaptis", "torchtitan": "adaptis@torchtitan", "megatron": "megatron+layout"}

Key = tuple[int, float, float]


def target_filter(target: str, devices: int) -> Callable[[Candidate], bool] | None:
    """A predicate on candidates' placements for the tuner (None: everything is allowed)."""
    if target == "executor":
        return None
    return lambda c: placement_reason(target, c.placement, devices) is None


def _mtp_ok(profile_kinds: Sequence[str], sizes: Sequence[int], devices: int) -> bool:
    """All MTP layers in one stage, and that stage in the last chunk (Megatron's rule)."""
    mtp = [i for i, k in enumerate(profile_kinds) if k == "mtp"]
    if not mtp:
        return True
    start, holders = 0, set()
    for s, n in enumerate(sizes):
        holders |= {s for i in mtp if start <= i < start + n}
        start += n
    return len(holders) == 1 and min(holders) >= len(sizes) - devices


def _mtp_repair(kinds: Sequence[str], sizes: Sequence[int]) -> tuple[int, ...]:
    """Move the boundary before the first MTP layer so the last stage holds every MTP layer."""
    first = kinds.index("mtp")
    out = list(sizes)
    total = len(kinds)
    while len(out) > 1 and total - out[-1] > first:
        # grow the last stage by taking layers from the stages before it (keep them non-empty)
        k = max(s for s in range(len(out) - 1) if out[s] > 1) if any(n > 1 for n in out[:-1]) else None
        if k is None:
            break
        out[k] -= 1
        out[-1] += 1
    return tuple(out)


@dataclass
class _StepClock(BudgetClock):
    """A :class:`BudgetClock` that, under a budget in seconds, counts the budget spent once the
    next step (the dearest so far: each is a fixed order built in Python, ~0.15 s at 32 devices)
    and the final plan's build (as dear) would end past it, so the search ends within its budget
    rather than one step after it."""

    def __init__(self, budget: Budget, evaluator: Evaluator) -> None:
        super().__init__(budget, evaluator)
        self.dearest = 0.0

    @contextmanager
    def step(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.dearest = max(self.dearest, time.perf_counter() - t0)

    def spent(self) -> bool:
        if super().spent():
            return True
        b = self.budget
        return b.seconds is not None and time.perf_counter() - self.t0 + 2 * self.dearest > b.seconds


@dataclass
class MegatronLayoutSearch:
    """Megatron's own schedule at a searched chunk count and uneven layout (module docstring)."""

    name: str = "megatron+layout"

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        ev = Evaluator(scenario)
        profile, P, M = scenario.profile, scenario.devices, scenario.microbatches
        reason = model_reason("megatron", profile)
        if reason:
            return SearchResult(self.name, None, None, 0, ev.seconds, note=reason)
        clock = _StepClock(budget, ev)
        kinds = [x.kind for x in profile.layers]
        history: list[tuple[int, float]] = []
        best: tuple[Key, Candidate] | None = None

        def offer(c: Candidate) -> Key:
            nonlocal best
            if not _mtp_ok(kinds, c.sizes, P):
                return (2, math.inf, math.inf)
            with clock.step():
                result = ev.result(c)
            key = objective_key(result)
            if result.valid and (best is None or key < best[0]):
                best = (key, c)
                history.append((ev.calls, result.iteration_time))
                if on_improve is not None:
                    on_improve(ev.plan(c), result)
            return key

        seeds: list[tuple[Key, Candidate]] = []
        for v in megatron_chunk_counts(profile, P, M):
            if P * v > profile.num_layers:
                continue
            if seeds and budget.seconds is not None and clock.spent():
                break  # a budget in seconds: the splits and each seed's fixed order cost ~0.1 s at 32 devices
            placement = interleaved_placement(P, v)
            with clock.step():
                splits = {split_sizes(ev, placement, split) for split in ("dp", "megatron")}
            for sizes in sorted(splits):
                if seeds and budget.seconds is not None and clock.spent():
                    break
                if "mtp" in kinds and not _mtp_ok(kinds, sizes, P):
                    sizes = _mtp_repair(kinds, sizes)
                c = fixed_order_candidate(sizes, placement, devices=P)
                seeds.append((offer(c), c))
        seeds.sort(key=lambda kc: kc[0])
        for _, start in seeds:
            if clock.spent():
                break
            self._climb(start, ev, offer, clock)
        plan = ev.plan(best[1]) if best is not None else None
        return finish(self.name, scenario, plan, evaluator=ev, history=history,
                      note=best[1].describe() if best is not None else "no chunk count fits the model")

    @staticmethod
    def _climb(start: Candidate, ev: Evaluator, offer: Callable[[Candidate], Key], clock: BudgetClock) -> None:
        """First-improvement hill climb over one-layer boundary moves, hot device's boundaries first."""
        current, key = start, ev.key(start)
        while not clock.spent():
            result = ev.result(current)
            if not result.valid:
                return
            busy = result.busy
            sizes = current.sizes
            S = len(sizes)
            # Moves: (src, dst) adjacent stages; one layer from src to dst. Hottest source first.
            moves = [(s, t) for s in range(S) for t in (s - 1, s + 1) if 0 <= t < S and sizes[s] > 1]
            moves.sort(key=lambda m: (-busy[current.placement[m[0]]], busy[current.placement[m[1]]]))
            improved = False
            for src, dst in moves:
                if clock.spent():
                    return
                cand = replace(current, sizes=move_layers(sizes, src, dst))
                k = offer(cand)
                if k < key:
                    current, key, improved = cand, k, True
                    break
            if not improved:
                return


def target_searcher(target: str, devices: int):
    """The search method of ``target`` (see :data:`TARGET_METHODS`)."""
    if target == "megatron":
        return MegatronLayoutSearch()
    if target == "torchtitan":
        return AdaptisTuner(name=TARGET_METHODS["torchtitan"], allowed=target_filter("torchtitan", devices))
    return AdaptisTuner()


def target_rows(results: Sequence[SearchResult], scenario: Scenario, reference: float | None) -> list[dict]:
    """For each target: the fastest feasible plan among ``results`` that it can run, its method,
    iteration time and speedup over ``reference`` (the Megatron baseline's time)."""
    rows = []
    for target in TARGETS:
        ok = [r for r in results if r.ok and r.result.feasible
              and target_reason(target, r.plan, scenario.profile) is None]
        best = min(ok, key=lambda r: r.iteration_time, default=None)
        row = {"target": target, "method": best.method if best else None,
               "iteration_time": best.iteration_time if best else None,
               "speedup": (reference / best.iteration_time) if best and reference else None}
        if best is None:
            row["reason"] = model_reason(target, scenario.profile) or "no feasible plan this target runs"
        rows.append(row)
    return rows


class _TorchtitanAllowed:
    """Loop or V placement, for any device count (the registry builds searchers before the scenario
    is known; every candidate places a stage on every device, so the devices are its largest + 1)."""

    def __call__(self, c: Candidate) -> bool:
        P = max(c.placement) + 1 if c.placement else 1
        return placement_reason("torchtitan", c.placement, P) is None


def torchtitan_tuner() -> AdaptisTuner:
    """``adaptis@torchtitan``: the AdaPtis tuner restricted to loop and V placements."""
    return AdaptisTuner(name=TARGET_METHODS["torchtitan"], allowed=_TorchtitanAllowed())
