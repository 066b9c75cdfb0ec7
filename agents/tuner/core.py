"""The AdaPtis tuner: phase-by-phase co-optimisation of partition, placement and schedule.

After the paper's method: start from the best named schedule; find the bottleneck device (most
work, most bubble, memory pressure); try changes to the **partition** (move boundary layers of
the bottleneck's stages; with several stages per device, carry units along a chain of stages from
the busiest device to the idlest and lighten the first stage of a memory-full device), the
**placement** (sequential, interleaved, V, wave with 1-4 chunks per device with a stage-balanced
or a device-balanced split, :mod:`pipeline.balance`; on mixed device speeds each family also with
the devices ordered slowest first, fastest last, :func:`pipeline.candidates.slow_first`; swap the
devices of two stages) and the
**schedule** (the list scheduler's per-device activation budgets, i.e. how deep the warm-up runs,
among them the budgets that fill each device's memory; deferred or eager W; fused B; forward
priority); keep a change only when the performance model says it is faster and
feasible, roll back otherwise. When a full round of phases finds nothing, perturb the best plan
(random boundary moves and budget changes) and search again from there, so the tuner does not
stall in the first local optimum. Deterministic for a given seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import Any

from agents.base import Budget, ImproveCallback, SearchResult, finish
from agents.tuner.clock import READ_MARGIN, NamedTimer, TunerClock, calls_room, candidate_kind, would_overrun
from agents.tuner.start_prior import NamedStart, named_plan, named_starts, ordered_starts, start_features
from pipeline.balance import device_loads
from pipeline.budgets import preset_budgets
from pipeline.candidates import (
    Candidate,
    Scenario,
    make_placement,
    move_layers,
    objective_key,
    recompute_for,
    slow_first,
)
from pipeline.evaluator import Evaluator
from pipeline.plan import Plan
from pipeline.simulator import Result
from pipeline.start_recipes import (
    PLACEMENT_CHOICES,
    SEED_PRESETS,
    SPLITS,
    fixed_order_candidate,
    preset_candidate,
    split_sizes,
    with_filled_budgets,
    with_roomy_budgets,
)

__all__ = ["AdaptisTuner", "Progress", "seed_candidates", "iter_seed_candidates", "slow_first_seeds",
           "lighten_first_stage"]

Key = tuple[int, float, float]
#: Called at each improvement of a search with (its simulator calls so far, its result), the plan not
#: built: the search's ``history`` (calls, time) with the whole result, e.g. whether the plan fits.
Progress = Callable[[int, Result], None]
#: Rounds in a row without a new simulator call after which the tuner stops early.
MAX_IDLE_ROUNDS = 50


def seed_candidates(scenario: Scenario, evaluator: Evaluator | None = None, *,
                    speed_order: bool = True) -> list[Candidate]:
    """Starting points (recipes of :mod:`pipeline.start_recipes`): every placement family with
    Megatron's, the DP-balanced and (several stages per device) the device-balanced split, under the
    activation budgets of the named schedules (1F1B/ZB-H1, ZB-H2, ZB-V, V-Half, unlimited) and under
    budgets that fill each device's memory; with ``speed_order``, on mixed device speeds,
    :func:`slow_first_seeds` too."""
    return list(iter_seed_candidates(scenario, evaluator, speed_order=speed_order))


def iter_seed_candidates(scenario: Scenario, evaluator: Evaluator | None = None, *,
                         speed_order: bool = True, fits_first: bool = False) -> Iterator[Candidate]:
    """:func:`seed_candidates` one placement family at a time, so a search under a budget in seconds
    evaluates the first ones before it spends time splitting the later ones (the device-balanced
    splits of 32 devices were 0.4-0.8 s). ``fits_first``: each family's memory-filling candidates
    first (a short budget at a large size then has a plan that fits before its time is up)."""
    P, L = scenario.devices, scenario.profile.num_layers
    ev = evaluator if evaluator is not None else Evaluator(scenario)
    for kind, chunks in PLACEMENT_CHOICES:
        out: list[Candidate] = []
        S = P * chunks
        if S > L:
            continue
        placement = make_placement(kind, P, chunks)
        splits = {sizes for split in SPLITS if (sizes := split_sizes(ev, placement, split)) is not None}
        for sizes in sorted(splits):
            out += [preset_candidate(sizes, placement, name, devices=P) for name in SEED_PRESETS]
            filled = with_filled_budgets(Candidate(sizes, placement, "list"), ev)
            if fits_first:
                out.insert(0, filled)
            else:
                out.append(filled)
            out.append(with_roomy_budgets(Candidate(sizes, placement, "list"), ev))
            if S > P and sizes == ev.device_balanced_sizes(placement):
                lighter = lighten_first_stage(Candidate(sizes, placement, "list"), 0, scenario)
                out += [with_filled_budgets(c, ev) for c in lighter]
            if kind == "interleaved" or chunks == 1:
                out.append(fixed_order_candidate(sizes, placement, devices=P))
        yield from out
    if speed_order:
        yield from slow_first_seeds(scenario, ev)


def slow_first_seeds(scenario: Scenario, ev: Evaluator) -> list[Candidate]:
    """On a cluster of mixed speeds, every placement family again with the devices in
    :func:`pipeline.candidates.slow_first` order (fastest last), at its DP-balanced and (several stages
    per device) device-balanced split, under ZB-V's budgets, memory-filling and roomy ones. Empty
    where every device is as fast."""
    P, L = scenario.devices, scenario.profile.num_layers
    order = slow_first(scenario.cluster.speeds)
    if order is None:
        return []
    out: list[Candidate] = []
    for kind, chunks in PLACEMENT_CHOICES:
        if P * chunks > L:
            continue
        placement = tuple(order[d] for d in make_placement(kind, P, chunks))
        splits = {sizes for split in ("dp", "devbal")
                  if (sizes := split_sizes(ev, placement, split)) is not None}
        for sizes in sorted(splits):
            c = preset_candidate(sizes, placement, "zbv", devices=P, device_order=order)
            out += [c, with_filled_budgets(c, ev), with_roomy_budgets(c, ev)]
    return out


#: Chain moves (see :func:`_chain_moves`) offered per partition phase.
CHAIN_NEIGHBOURS = 4


def _chain_moves(c: Candidate, hot: int, cold: int, scenario: Scenario) -> list[Candidate]:
    """Up to :data:`CHAIN_NEIGHBOURS` moves of one or two units from a stage of the ``hot`` device to
    a stage of the ``cold`` one, every boundary in between shifting with them (the stages between
    keep their sizes): those that lower the heaviest device's load per micro-batch the most."""
    cost = [x.f + x.b + x.w for x in scenario.profile.layers]
    speeds = scenario.cluster.speeds
    P = scenario.devices
    now = device_loads(cost, c.sizes, c.placement, devices=P, speeds=speeds)
    scored = []
    for s, d in enumerate(c.placement):
        if d != hot:
            continue
        for t, e in enumerate(c.placement):
            if e != cold:
                continue
            for n in (1, 2):
                new = move_layers(c.sizes, s, t, n=n)
                if new is None:
                    continue
                loads = device_loads(cost, new, c.placement, devices=P, speeds=speeds)
                if loads.max() < now.max() - 1e-9:
                    scored.append((float(loads.max()), float((loads ** 2).sum()), new))
    return [replace(c, sizes=sizes) for *_, sizes in sorted(scored)[:CHAIN_NEIGHBOURS]]


#: Most units :func:`lighten_first_stage` moves at once.
LIGHTEN_UNITS = 4


def lighten_first_stage(c: Candidate, device: int, scenario: Scenario) -> list[Candidate]:
    """Moves of 1 to :data:`LIGHTEN_UNITS` units from ``device``'s first stage to each of its later
    stages (every boundary in between shifting) that leave the heaviest device's load per
    micro-batch as it is. The first stage's activations live longest (from its forward until the
    backward has come back through every later stage; stage 0 keeps them until its W), so where
    that device's memory caps the warm-up, a lighter first stage lets more micro-batches in."""
    stages = [s for s, d in enumerate(c.placement) if d == device]
    if len(stages) < 2:
        return []
    cost = [x.f + x.b + x.w for x in scenario.profile.layers]
    speeds = scenario.cluster.speeds
    P = scenario.devices
    top = device_loads(cost, c.sizes, c.placement, devices=P, speeds=speeds).max()
    first = stages[0]
    out = []
    for t in stages[1:]:
        for n in range(1, LIGHTEN_UNITS + 1):
            new = move_layers(c.sizes, first, t, n=n)
            if new is None:
                break
            if device_loads(cost, new, c.placement, devices=P, speeds=speeds).max() <= top + 1e-9:
                out.append(replace(c, sizes=new))
    return out


@dataclass
class AdaptisTuner:
    """Phase-by-phase local search with perturbation restarts (see the module docstring)."""

    name: str = "adaptis"
    perturb_moves: int = 3
    best_candidate: Candidate | None = field(default=None, repr=False)
    """After a search: the best plan as an editable candidate (None when a named plan won)."""
    evaluator: Evaluator | None = field(default=None, repr=False)
    """After a search: its evaluator (stage costs and splits a later search can reuse)."""
    allowed: Callable[[Candidate], bool] | None = None
    """Only plans this accepts are kept (e.g. what a deployment target can run): filters the named
    plans (as a candidate of their sizes and placement), the seeds, the neighbours and perturbations."""
    speed_order: bool = True
    """On mixed device speeds, also seed and move to every placement family with the devices
    ordered slowest first, fastest last (:func:`slow_first_seeds`); False: index order only."""
    named_plans: bool | None = None
    """Default of :meth:`search`'s ``named_plans`` (None: with its own seeds). False skips the named
    schedules (built in Python, each dearer than a native call) for more local search in the
    same time (``evaluate-agent``'s ``adaptis-no-named``)."""
    move_policy: Any = field(default=None, repr=False)
    """Learned guidance of the local search (:class:`agents.tuner.learned.MovePolicy`: which phase next, which
    neighbours first, how many); None: every phase in order, every neighbour (the plain tuner)."""
    start_prior: Any = field(default=None, repr=False)
    """A learned order of the named plans and seeds (:class:`agents.tuner.start_prior.StartPrior`; under a
    budget in seconds of the named plans alone); None: the tuner's own order."""
    on_progress: Progress | None = field(default=None, repr=False)
    """Called at each improvement (:data:`Progress`): unlike ``on_improve``, no plan is built. Benchmarks
    log a search's progress with it (experiments.benchmarks.learned_tuner)."""

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None, start: Iterable[Candidate] = (),
               own_seeds: bool = True, scenario_caches: Evaluator | None = None,
               named_plans: bool | None = None) -> SearchResult:
        """Search within ``budget``. ``start``: extra candidates to start from (e.g. an RL policy's);
        ``own_seeds=False`` starts from ``start`` alone (a short refinement of given plans).
        ``scenario_caches``: an evaluator of the same scenario whose stage costs and splits to reuse
        (its results and calls are not). ``named_plans``: whether to simulate the named schedules
        first (default: with ``own_seeds``; a caller that simulated them already passes False)."""
        rng = random.Random(seed)
        ev = self.evaluator = Evaluator(scenario)
        self.best_candidate = None
        if scenario_caches is not None:
            ev.share_scenario_caches(scenario_caches)
        clock = TunerClock(budget, ev)
        history: list[tuple[int, float]] = []
        state = _State(ev, on_improve, history, self.allowed, on_progress=self.on_progress)

        # 1. The named schedules, at Megatron's split and at the cost-balanced split (the tuner can only
        #    improve on the best of them), and 2. the candidates the local search can edit, seeded by the
        #    caller (e.g. an RL policy) and by us; the best of those is where the local search starts.
        named_plans = self.named_plans if named_plans is None else named_plans
        named_plans = own_seeds if named_plans is None else named_plans
        named = named_starts(scenario) if named_plans else []
        seeds = chain(start, iter_seed_candidates(scenario, ev, speed_order=self.speed_order,
                                                  fits_first=budget.seconds is not None) if own_seeds else ())
        if self.start_prior is not None and budget.seconds is None:  # learned: the likeliest starts first
            current, current_key = ordered_starts(
                self.start_prior, named, list(seeds), scenario=scenario, ev=ev, state=state, clock=clock,
                build=lambda s: named_plan(scenario, ev, s, allowed=self.allowed))
        else:
            if self.start_prior is not None and named:  # in seconds: the named plans (the dear ones) best-scored first
                named = [named[i] for i in self.start_prior.order(start_features(scenario, ev, named))]
            current, current_key = self._plain_starts(named, seeds, scenario=scenario, ev=ev, state=state, clock=clock)
        if current is None:
            return finish(self.name, scenario, state.best_plan, evaluator=ev, history=history)
        # 3. Phases until the budget is spent; perturb when a round finds nothing.
        stall = 0
        idle_rounds = 0
        placement_moves = partial(self._placement_moves, speed_order=self.speed_order)
        while not clock.spent() and idle_rounds < MAX_IDLE_ROUNDS:
            calls_before = ev.calls
            improved = False
            phases = (self._partition_moves, placement_moves, self._schedule_moves)
            if self.move_policy is not None:  # learned guidance (agents.tuner.learned): which phase, which neighbours
                current, current_key, improved = self.move_policy.round(phases, current, current_key, scenario=scenario,
                                                                        rng=rng, ev=ev, state=state, clock=clock)
            else:
                for phase in phases:
                    if clock.spent():
                        break
                    result = ev.result(current)
                    neighbours = phase(current, result, scenario, rng, ev)  # read lazily: see offer_all
                    best_n, best_k = None, current_key
                    for n, k in state.offer_all(neighbours, clock):
                        if k < best_k:
                            best_n, best_k = n, k
                    if best_n is not None:
                        current, current_key = best_n, best_k
                        improved = True
            if improved:
                stall = 0
                continue
            stall += 1
            if clock.spent():
                break
            base = state.best_candidate or current
            current = self._perturb(base, scenario, rng, strength=self.perturb_moves + stall % 4)
            current_key = state.offer(current)
            # A small plan space can run out of new candidates (every one cached): stop then.
            idle_rounds = idle_rounds + 1 if ev.calls == calls_before else 0
        note = state.best_note
        self.best_candidate = state.best_candidate if state.best_is_candidate else None
        return finish(self.name, scenario, state.best_plan, evaluator=ev, history=history, note=note)

    def _plain_starts(self, named: list[NamedStart], seeds: Iterable[Candidate], *, scenario: Scenario,
                      ev: Evaluator, state: _State, clock: TunerClock) -> tuple[Candidate | None, Key | None]:
        """The named schedules, then the seeds, in the tuner's own order; the best seed and its key.
        Under a budget in seconds the named ones stop at their share of it (:class:`NamedTimer`)."""
        timed = NamedTimer(clock)
        for s in named:
            for chunks in timed.megatron_chunks(scenario) if s.method == "megatron" else (None,):
                if not timed.room():  # a budget in seconds: leave most of it to the local search
                    break
                t0 = clock.now()
                plan = named_plan(scenario, ev, s, chunks=chunks, allowed=self.allowed)
                if plan is None:
                    continue
                state.offer_plan(plan, ev.simulate_plan(plan), note=s.describe())
                timed.took(clock.now() - t0)
        clock.keep_back(timed.first)  # the winner's plan and its validated simulation at the end
        current: Candidate | None = None
        current_key: Key | None = None
        for c, key in state.offer_all(seeds, clock, at_least_one=True):
            if current_key is None or key < current_key:
                current, current_key = c, key
        return current, current_key

    # ------------------------------------------------------------------ phases

    @staticmethod
    def _partition_moves(c: Candidate, result: Result, scenario: Scenario, rng: random.Random, ev: Evaluator):
        """Move boundary layers of the busiest device's stages (and into the idlest device's)."""
        if not result.valid:
            return
        busy = result.busy
        hot = max(range(len(busy)), key=busy.__getitem__)
        cold = min(range(len(busy)), key=busy.__getitem__)
        sizes = c.sizes
        S = len(sizes)
        seen = set()
        for s in range(S):
            d = c.placement[s]
            for nb in (s - 1, s + 1):
                if not 0 <= nb < S:
                    continue
                if d == hot and sizes[s] > 1:
                    seen.add((s, nb))  # give a layer away
                if d == cold and sizes[nb] > 1:
                    seen.add((nb, s))  # take a layer
        for src, dst in sorted(seen):
            yield replace(c, sizes=move_layers(sizes, src, dst))
        if scenario.devices < S:  # several stages per device: balance devices, not stages
            yield from _chain_moves(c, hot, cold, scenario)
            full = max(range(len(busy)), key=lambda d: result.peak_memory[d] / result.memory_limit[d])
            if result.peak_memory[full] > 0.95 * result.memory_limit[full]:
                for n in lighten_first_stage(c, full, scenario):
                    yield with_filled_budgets(n, ev) if c.order == "list" and c.budgets is not None else n

    @staticmethod
    def _placement_moves(c: Candidate, result: Result, scenario: Scenario, rng: random.Random, ev: Evaluator, *,
                         speed_order: bool = True):
        """Other placement families (balanced split; with ``speed_order`` on mixed speeds, each
        also with the devices slowest first), and swapping two stages' devices."""
        P, L = scenario.devices, scenario.profile.num_layers
        order_knobs = c if c.order == "list" else replace(c, order="list", budgets=preset_budgets("zbv", P))
        fastest_last = slow_first(scenario.cluster.speeds) if speed_order else None
        device_orders = [None] if fastest_last is None else [None, fastest_last]
        # another placement family has other stages: per-stage recomputation does not carry over
        # (recomputing every stage does: recompute_for)
        for kind, chunks in PLACEMENT_CHOICES:
            if P * chunks > L:
                continue
            for order in device_orders:
                placement = make_placement(kind, P, chunks)
                if order is not None:  # the same family, fastest devices last (mixed clusters)
                    placement = tuple(order[d] for d in placement)
                if placement == c.placement:
                    continue
                knobs = replace(order_knobs, placement=placement, recompute=recompute_for(c, len(placement)))
                yield replace(knobs, sizes=ev.balanced_sizes(placement))
                if len(placement) > P:
                    yield with_filled_budgets(replace(knobs, sizes=ev.device_balanced_sizes(placement)), ev)
        if result.valid and P > 1:
            busy = result.busy
            hot = max(range(P), key=busy.__getitem__)
            cold = min(range(P), key=busy.__getitem__)
            hot_stages = [s for s, d in enumerate(c.placement) if d == hot]
            cold_stages = [s for s, d in enumerate(c.placement) if d == cold]
            for a in hot_stages:
                for b in cold_stages:
                    pl = list(c.placement)
                    pl[a], pl[b] = pl[b], pl[a]
                    yield replace(order_knobs, placement=tuple(pl))

    @staticmethod
    def _schedule_moves(c: Candidate, result: Result, scenario: Scenario, rng: random.Random, ev: Evaluator):
        """Activation budgets per device (warm-up depth), W deferral, fused B, forward priority."""
        P = scenario.devices
        base = c if c.order == "list" else replace(c, order="list", budgets=preset_budgets("zb-h1", P),
                                                   cap_counts_w=False, max_pending_w=P)
        if c.order != "list":
            yield base
        budgets = list(base.budgets) if base.budgets is not None else None
        if budgets is not None and result.valid:
            bubble = result.bubble
            worst = max(range(P), key=bubble.__getitem__)
            pressure = max(range(P), key=lambda d: result.peak_memory[d] / result.memory_limit[d])
            for d, delta in ((worst, 1.0), (pressure, -1.0), (worst, 2.0)):
                new = list(budgets)
                new[d] = max(1.0, new[d] + delta)
                yield replace(base, budgets=tuple(new))
            for delta in (1.0, -1.0):
                yield replace(base, budgets=tuple(max(1.0, b + delta) for b in budgets))
        yield replace(base, budgets=None)
        for refill in (with_filled_budgets(base, ev), with_roomy_budgets(base, ev)):
            if refill != base:
                yield refill
        if result.valid:  # memory binds: also recompute the fullest device's stages (as is, or with fused B,
            # which frees the recomputed activations at once instead of keeping W's inputs)
            full = max(range(P), key=lambda d: result.peak_memory[d] / result.memory_limit[d])
            old = base.recompute if base.recompute is not None else (False,) * base.num_stages
            new = tuple(r or d == full for r, d in zip(old, base.placement))
            if result.peak_memory[full] > 0.9 * result.memory_limit[full] and new != old:
                for split in {base.split_backward, False}:
                    yield replace(base, recompute=new, split_backward=split)
                yield with_roomy_budgets(replace(base, recompute=new), ev)  # budgets refreshed for the lighter device
        yield replace(base, split_backward=not base.split_backward)
        yield replace(base, eager_w=not base.eager_w)
        yield replace(base, depth_first=not base.depth_first)
        yield replace(base, cap_counts_w=not base.cap_counts_w)
        for mpw in (None, 2, P):
            if mpw != base.max_pending_w:
                yield replace(base, max_pending_w=mpw)

    @staticmethod
    def _perturb(c: Candidate, scenario: Scenario, rng: random.Random, strength: int) -> Candidate:
        sizes = list(c.sizes)
        S = len(sizes)
        for _ in range(strength):
            if S < 2:
                break
            s = rng.randrange(S - 1)
            src, dst = (s, s + 1) if rng.random() < 0.5 else (s + 1, s)
            sizes = list(move_layers(sizes, src, dst) or sizes)
        out = replace(c, sizes=tuple(sizes))
        P = scenario.devices
        if S > 1 and P > 1 and (sizes == list(c.sizes) or rng.random() < 0.3):
            # Swap the devices of two stages (also when no layer could move: 1-layer stages).
            a, b = rng.sample(range(S), 2)
            pl = list(out.placement)
            pl[a], pl[b] = pl[b], pl[a]
            out = replace(out, placement=tuple(pl), order="list",
                          budgets=out.budgets if out.order == "list" else preset_budgets("zbv", P))
        if out.order == "list" and rng.random() < 0.5:
            budgets = list(out.budgets) if out.budgets is not None else [float(2 * P)] * P
            d = rng.randrange(P)
            budgets[d] = max(1.0, budgets[d] + rng.choice((-1.0, 1.0)))
            out = replace(out, budgets=tuple(budgets))
        return out


class _State:
    """The best plan so far, from named plans or candidates; reports improvements. A candidate's
    plan is built only when it is the best and someone needs it (``on_improve`` or the end)."""

    def __init__(self, ev: Evaluator, on_improve: ImproveCallback | None, history: list[tuple[int, float]],
                 allowed: Callable[[Candidate], bool] | None = None, *, on_progress: Progress | None = None) -> None:
        self.ev = ev
        self.on_progress = on_progress
        self.allowed = allowed
        self.on_improve = on_improve
        self.history = history
        self.best_key: Key | None = None
        self._best_plan: Plan | None = None
        self.best_candidate: Candidate | None = None
        self._best_is_candidate = False
        self.best_note = ""
        self._seconds_per_call: dict[str, float] = {}
        """Per kind of candidate (:func:`agents.tuner.clock.candidate_kind`), seconds per new one in its
        last batch (sizes the batches of a budget in seconds)."""
        self._dearest_read = 0.0
        """The longest one candidate took to make (a placement family's splits: 0.1-0.2 s at 16-32 devices)."""
        self._last_batch: dict[str, int] = {}
        """Per kind, new candidates in its last batch (under a budget in seconds the next is at most twice as many)."""

    @property
    def best_is_candidate(self) -> bool:
        """Whether the best plan so far is a candidate (not a named plan)."""
        return self._best_is_candidate

    @property
    def best_plan(self) -> Plan | None:
        if self._best_is_candidate and self.best_candidate is not None:
            return self.ev.plan(self.best_candidate)
        return self._best_plan

    def offer_plan(self, plan: Plan, result: Result, note: str) -> Key:
        key = objective_key(result)
        if result.valid and (self.best_key is None or key < self.best_key):
            self.best_key, self._best_plan, self.best_note = key, plan, note
            self._best_is_candidate = False
            self._improved(plan, result)
        return key

    def set_best(self, key: Key, *, note: str, plan: Plan | None = None, candidate: Candidate | None = None) -> None:
        """Make the best so far ``candidate`` (else ``plan``), reporting nothing: how a reordered start
        phase (:func:`agents.tuner.start_prior.ordered_starts`) leaves the state as the tuner's own order would."""
        self.best_key, self.best_note, self._best_plan = key, note, plan
        self.best_candidate, self._best_is_candidate = candidate, candidate is not None

    def offer(self, c: Candidate) -> Key:
        if self.allowed is not None and not self.allowed(c):
            return (2, math.inf, math.inf)
        result = self.ev.result(c)
        key = objective_key(result)
        if result.valid and (self.best_key is None or key < self.best_key):
            self.best_key, self.best_candidate, self.best_note = key, c, c.describe()
            self._best_is_candidate = True
            self._improved(self.ev.plan(c) if self.on_improve is not None else None, result, c)
        return key

    def offer_all(self, candidates: Iterable[Candidate], clock: TunerClock, *, at_least_one: bool = False):
        """Offer candidates in order until the budget is spent, yielding (candidate, key); the new
        ones are evaluated in batches, each no larger than the calls the budget has left (and, for a
        budget in seconds, than the time left holds: :func:`_calls_room`), so the outcome is the same
        as offering them one by one. Candidates ``allowed`` refuses are skipped. ``candidates`` is
        read lazily, one batch at a time."""
        it = iter(candidates)
        if self.allowed is not None:
            it = (c for c in it if self.allowed(c))
        timed = clock.budget.seconds is not None
        ahead: list[Candidate] = []  # a candidate read but left for the next batch
        first = True

        def read() -> Candidate | None:
            if ahead:
                return ahead.pop()
            if timed and READ_MARGIN * self._dearest_read > clock.left() and not (at_least_one and first):
                return None  # making the next one might end past the budget: leave the rest unread
            t = clock.now()
            c = next(it, None)
            self._dearest_read = max(self._dearest_read, clock.now() - t)
            return c

        while True:
            if clock.spent() and not (at_least_one and first):
                return
            t0 = clock.now()
            c = read()
            if c is None:
                return
            kind = candidate_kind(c)
            known = self.ev.known(c)
            if timed and not known and not (at_least_one and first) and \
                    would_overrun(clock, self._seconds_per_call.get(kind)):
                clock.stop()  # the next one, at its kind's time per call, would end past the budget
                return
            room = calls_room(clock, self._seconds_per_call.get(kind), self._last_batch.get(kind, 0))
            batch, new = [c], (set() if known else {c})
            while room is None or len(new) < room:
                if timed and clock.spent():
                    break  # making the candidates (e.g. the seeds' splits) took the time
                c = read()
                if c is None:
                    break
                if timed and candidate_kind(c) != kind:
                    ahead.append(c)  # a budget in seconds times each kind of candidate on its own
                    break
                batch.append(c)
                if not self.ev.known(c):
                    new.add(c)
            self.ev.results(batch)
            for c in batch:
                yield c, self.offer(c)
            if new:  # the whole round: making, evaluating and offering (plans written on improvement)
                self._seconds_per_call[kind] = (clock.now() - t0) / len(new)
                self._last_batch[kind] = len(new)
            first = False

    def _improved(self, plan: Plan | None, result: Result, candidate: Candidate | None = None) -> None:
        calls = self.ev.calls if candidate is None else self.ev.call_number(candidate)
        self.history.append((calls, result.iteration_time))
        if self.on_improve is not None and plan is not None:
            self.on_improve(plan, result)
        if self.on_progress is not None:
            self.on_progress(calls, result)
