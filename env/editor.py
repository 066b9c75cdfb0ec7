"""The plan editor behind the environments: discrete edits of a :class:`~pipeline.candidates.Candidate`.

:class:`PlanEditor` holds one scenario, one :class:`~pipeline.evaluator.Evaluator` (which counts
simulator calls and caches repeats), the current candidate and the best one seen. An edit that
makes the plan better (by :func:`pipeline.candidates.objective_key`) is kept; one that does not is
rolled back, as the AdaPtis tuner does, and masked until the plan changes again. Every edit
costs one simulator call; an edit whose result is already known is masked.

The action table (:data:`ACTIONS`) has a fixed size for up to :data:`MAX_STAGES` stages and
:data:`MAX_DEVICES` devices, so one policy serves every scenario; its per-boundary and
per-device entries are what a size-independent policy scores token by token
(:mod:`agents.rl.net`).

Speed: the editor runs one native call per edit (:meth:`Evaluator.result`, no Python plan);
plans are built only when asked for (:attr:`PlanEditor.plan`, :attr:`PlanEditor.best_plan`).
:class:`SharedEvaluator` lets the episodes of one scenario share what is a pure function of the
scenario (DP splits, stage costs, simulated results) while each episode still counts its own
simulator calls.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.budgets import microbatch_bytes, preset_budgets
from pipeline.candidates import Candidate, Scenario, make_placement, move_layers, objective_key, recompute_for
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.plan import Plan
from pipeline.simulator import Result
from pipeline.start_recipes import preset_candidate

__all__ = [
    "MAX_DEVICES",
    "MAX_STAGES",
    "PLACEMENT_FAMILIES",
    "BUDGET_PRESETS",
    "ACTIONS",
    "N_ACTIONS",
    "GROW_LEFT",
    "GROW_RIGHT",
    "BUDGET_UP",
    "BUDGET_DOWN",
    "GLOBAL_ACTIONS",
    "Edit",
    "PlanEditor",
    "SharedEvaluator",
    "family_of",
    "presets_of",
    "fit_memory",
    "preset_budgets",
    "portfolio",
    "PORTFOLIO_PICKS",
    "REPAIR_STARTS",
    "score",
]

MAX_DEVICES = 32
MAX_STAGES = 128
#: Placement families (kind, chunks per device); an action picks one with the DP-balanced split.
PLACEMENT_FAMILIES: tuple[tuple[str, int], ...] = (("sequential", 1), ("interleaved", 2), ("interleaved", 3),
                                                   ("interleaved", 4), ("v", 2), ("wave", 3), ("wave", 4))
#: Activation-budget presets (per device, in micro-batches) after the named schedules.
BUDGET_PRESETS = ("zb-h1", "zb-h2", "zbv", "v-half", "unlimited")
_MPW = (None, 2, "P")
_KNOBS = ("split_backward", "eager_w", "depth_first", "cap_counts_w")


@dataclass(frozen=True)
class Edit:
    """One entry of the action table."""

    kind: str
    """``stop``, ``grow-left``, ``grow-right``, ``family``, ``rebalance``, ``budget-up``,
    ``budget-down``, ``all-up``, ``all-down``, ``preset``, ``toggle``, ``pending-w``,
    ``relieve-hot``, ``feed-cold``, ``fit-memory``."""
    arg: int | str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}({self.arg})"


def _action_table() -> tuple[Edit, ...]:
    acts = [Edit("stop")]
    acts += [Edit("grow-left", i) for i in range(MAX_STAGES - 1)]
    acts += [Edit("grow-right", i) for i in range(MAX_STAGES - 1)]
    acts += [Edit("family", k) for k in range(len(PLACEMENT_FAMILIES))]
    acts.append(Edit("rebalance"))
    acts += [Edit("budget-up", d) for d in range(MAX_DEVICES)]
    acts += [Edit("budget-down", d) for d in range(MAX_DEVICES)]
    acts += [Edit("all-up"), Edit("all-down")]
    acts += [Edit("preset", name) for name in BUDGET_PRESETS]
    acts += [Edit("toggle", knob) for knob in _KNOBS]
    acts += [Edit("pending-w", k) for k in range(len(_MPW))]
    acts += [Edit("relieve-hot"), Edit("feed-cold"), Edit("fit-memory")]
    return tuple(acts)


#: Every action, by index: ``ACTIONS[a]`` is what action ``a`` does.
ACTIONS: tuple[Edit, ...] = _action_table()
N_ACTIONS = len(ACTIONS)
#: First index of the per-boundary and per-device blocks (``GROW_LEFT + i`` is ``grow-left(i)``).
GROW_LEFT = 1
GROW_RIGHT = GROW_LEFT + MAX_STAGES - 1
_FAMILY = GROW_RIGHT + MAX_STAGES - 1
_REBALANCE = _FAMILY + len(PLACEMENT_FAMILIES)
BUDGET_UP = _REBALANCE + 1
BUDGET_DOWN = BUDGET_UP + MAX_DEVICES
_ALL_UP = BUDGET_DOWN + MAX_DEVICES
_PRESET = _ALL_UP + 2
_TOGGLE = _PRESET + len(BUDGET_PRESETS)
_PENDING = _TOGGLE + len(_KNOBS)
_HOT = _PENDING + len(_MPW)
_FIT = _HOT + 2
#: Indices of the actions tied to no boundary and no device (stop, families, presets, knobs...).
GLOBAL_ACTIONS: tuple[int, ...] = (0, *range(_FAMILY, BUDGET_UP), *range(_ALL_UP, N_ACTIONS))
assert _FIT + 1 == N_ACTIONS and all(ACTIONS[GROW_RIGHT + i] == Edit("grow-right", i) for i in range(3))

_new = object.__new__


def _with(c: Candidate, **changes) -> Candidate:
    """``dataclasses.replace`` without the constructor's cost (the mask builds dozens a step)."""
    out = _new(Candidate)
    d = out.__dict__
    d.update(c.__dict__)
    d.pop("_hash", None)  # the hash of c's fields (Candidate.__hash__)
    d.update(changes)
    return out


_PLACEMENTS: dict[tuple[int, int], tuple[tuple[int, ...] | None, ...]] = {}


def _family_placements(devices: int, layers: int) -> tuple[tuple[int, ...] | None, ...]:
    """The placement of each family on ``devices`` (None where it does not fit ``layers``)."""
    key = (devices, layers)
    hit = _PLACEMENTS.get(key)
    if hit is None:
        hit = tuple(make_placement(kind, devices, chunks)
                    if devices * chunks <= min(layers, MAX_STAGES) and (chunks == 1 or devices >= 2) else None
                    for kind, chunks in PLACEMENT_FAMILIES)
        _PLACEMENTS[key] = hit
    return hit


_PRESETS: dict[int, tuple[tuple[float, ...] | None, ...]] = {}


def _presets(devices: int) -> tuple[tuple[float, ...] | None, ...]:
    hit = _PRESETS.get(devices)
    if hit is None:
        hit = _PRESETS[devices] = tuple(preset_budgets(name, devices) for name in BUDGET_PRESETS)
    return hit


def presets_of(devices: int) -> tuple[tuple[float, ...] | None, ...]:
    """:func:`preset_budgets` of each of :data:`BUDGET_PRESETS` on ``devices`` (cached; None: unlimited)."""
    return _presets(devices)


def family_of(c: Candidate, devices: int) -> int:
    """Index in :data:`PLACEMENT_FAMILIES` of the candidate's placement, or -1 for another mapping."""
    for k, placement in enumerate(_family_placements(devices, c.num_stages)):
        if placement == c.placement:
            return k
    return -1


def score(result: Result, reference: float) -> float:
    """Throughput relative to a reference iteration time; infeasible plans score below -1."""
    if not result.valid:
        return -3.0
    if not result.feasible:
        over = sum(max(0.0, p - lim) / lim for p, lim in zip(result.peak_memory, result.memory_limit))
        return -1.0 - min(1.0, over / max(1, len(result.peak_memory)))
    return reference / result.iteration_time


def portfolio(scenario: Scenario, sizes_of=None) -> list[Candidate]:
    """Cheap starting candidates: a few placement families under schedule-budget presets,
    each with the DP-balanced split. The editor starts from the best of them."""
    if sizes_of is None:
        sizes_of = Evaluator(scenario).balanced_sizes
    return [_with(pick, sizes=sizes_of(pick.placement))
            for pick in _portfolio_picks(scenario.devices, scenario.profile.num_layers)]


#: How many of the fastest starting plans that overflow memory a start tries to fit
#: (:attr:`PlanEditor.repair_starts`'s default).
REPAIR_STARTS = 2
#: The portfolio's starting plans, in the order the editor tries them: (placement kind, chunks per
#: device, budget preset of :func:`preset_candidate`). The compiled portfolio start takes them from
#: here (:func:`env.reset_worker.prepared_starts`).
PORTFOLIO_PICKS = (("sequential", 1, "zb-h2"), ("v", 2, "zbv"), ("interleaved", 2, "zb-h2"),
                   ("sequential", 1, "zb-h1"), ("v", 2, "v-half"), ("interleaved", 3, "zb-h1"), ("wave", 3, "zbv"),
                   ("interleaved", 2, "zb-h1"), ("interleaved", 4, "zb-h1"), ("sequential", 1, "unlimited"))
_PORTFOLIO: dict[tuple[int, int], tuple[Candidate, ...]] = {}


def _portfolio_picks(devices: int, layers: int) -> tuple[Candidate, ...]:
    """:func:`portfolio`'s candidates that fit ``devices`` and ``layers``, but for their split (empty):
    :func:`preset_candidate` of each pick, made once per ``(devices, stages)``."""
    key = (devices, min(layers, MAX_STAGES))
    hit = _PORTFOLIO.get(key)
    if hit is None:
        hit = tuple(preset_candidate((), make_placement(kind, devices, chunks), preset, devices=devices)
                    for kind, chunks, preset in PORTFOLIO_PICKS
                    if devices * chunks <= key[1] and (chunks == 1 or devices >= 2))
        if len(_PORTFOLIO) >= 4096:
            _PORTFOLIO.clear()
        _PORTFOLIO[key] = hit
    return hit


class SharedEvaluator(Evaluator):
    """An :class:`Evaluator` for one episode that shares the scenario's pure caches with earlier
    episodes (``share``): DP splits, stage costs and (``results=True``) simulated results. A result found in the
    shared memo still counts as one simulator call of this episode, so call budgets, masks
    (:meth:`known`) and ``sim_calls`` mean exactly what they mean with a fresh evaluator."""

    MEMO_LIMIT = 100_000

    def __init__(self, scenario: Scenario, *, share: SharedEvaluator | None = None, results: bool = True) -> None:
        super().__init__(scenario)
        self._memo: dict[Candidate, Result] = {}
        if share is not None and share.scenario is scenario:
            self.share_scenario_caches(share)
            if results:
                self._memo = share._memo

    def result(self, c: Candidate) -> Result:
        hit = self.cached(c)
        if hit is not None:
            return hit
        hit = self._memo.get(c)
        if hit is None:
            hit = super().result(c)
            self.remember(c, hit)
            return hit
        return self.adopt(c, hit)

    def evaluated(self) -> list[Candidate]:
        """The candidates this evaluator has results of (what :meth:`known` is true of), in order."""
        return list(self._cache)

    def remembers(self, c: Candidate) -> bool:
        """Whether the scenario's memo holds ``c`` (found by this or an earlier episode)."""
        return c in self._memo

    def remember(self, c: Candidate, result: Result) -> None:
        """Keep ``result`` of ``c`` in the scenario's memo (emptied when it holds :attr:`MEMO_LIMIT`)."""
        if len(self._memo) >= self.MEMO_LIMIT:
            self._memo.clear()
        self._memo[c] = result


class PlanEditor:
    """Greedy plan editing for one scenario (see the module docstring)."""

    def __init__(self, scenario: Scenario, *, evaluator: Evaluator | None = None, reference: float | None = None,
                 max_calls: int | None = None, prefix: np.ndarray | None = None) -> None:
        if scenario.devices > MAX_DEVICES:
            raise PlanError(f"the environment holds at most {MAX_DEVICES} devices, got {scenario.devices}",
                            field="devices")
        self.scenario = scenario
        self.ev = evaluator if evaluator is not None else Evaluator(scenario)
        self.max_calls = max_calls
        self.reference = reference
        self.repair_starts = REPAIR_STARTS
        """How many of the fastest starting plans that overflow memory get a :func:`fit_memory` try."""
        self.allow_stop = True
        """``False``: stop is masked while an edit is left (the episode runs to its step or call budget)."""
        """How many of the fastest starting plans that overflow memory get a :func:`fit_memory` try."""
        if prefix is None:
            prefix = np.concatenate([[0.0], np.cumsum([x.f + x.b + x.w for x in scenario.profile.layers])])
        self.prefix = prefix
        """Prefix sums of the layers' ``f + b + w``."""
        self._prefix_list = self.prefix.tolist()
        self.speeds = scenario.cluster.speeds
        self.current: Candidate | None = None
        self.result: Result | None = None
        self.key: tuple[int, float, float] | None = None
        self.best: Candidate | None = None
        self.best_result: Result | None = None
        self.tried: set[Candidate] = set()
        self._targets: list[Candidate | None] | None = None
        self._mask: np.ndarray | None = None
        self._allowed = np.zeros(N_ACTIONS, dtype=bool)
        self._index: dict[int, list[int]] = {}
        self._times: list[float] | None = None

    # ------------------------------------------------------------------ setup

    def balanced(self, placement: tuple[int, ...]) -> tuple[int, ...]:
        """DP-balanced sizes of a placement (cached by the evaluator)."""
        return self.ev.balanced_sizes(placement)

    @property
    def plan(self) -> Plan:
        """The current candidate's plan (built on demand)."""
        assert self.current is not None
        return self.ev.plan(self.current)

    @property
    def best_plan(self) -> Plan | None:
        """The best candidate's plan (built on demand)."""
        return None if self.best is None else self.ev.plan(self.best)

    def budget_left(self) -> bool:
        return self.max_calls is None or self.ev.calls < self.max_calls

    def start(self, candidates: Sequence[Candidate] | None = None) -> None:
        """Evaluate the starting candidates (default :func:`portfolio`) and start from the best."""
        for _ in self.starting(candidates):
            pass

    def starting(self, candidates: Sequence[Candidate] | None = None) -> Iterator[list[Candidate]]:
        """:meth:`start`, run step by step: before each round of evaluations it yields the
        candidates that round surely evaluates, in order, so a caller can simulate them beforehand
        in one batch (:class:`env.vector_env.PipelineVectorEnv`); what it does is :meth:`start`'s."""
        cands = list(candidates) if candidates is not None else portfolio(self.scenario, self.balanced)
        if not cands:
            raise PlanError("no starting candidate fits this scenario", field="start")
        # The call count as a start evaluating one candidate after another has it (the batch run
        # at the yield is ahead of it): what the call budget is checked against.
        calls = self.ev.calls
        yield cands[:self._surely(len(cands), first=True)]
        best_c, best_k = None, None
        over: list[tuple[float, Candidate]] = []
        for c in cands:
            if best_c is not None and not self._left(calls):
                break
            res = self.ev.result(c)
            calls = max(calls, self.ev.call_number(c))
            k = objective_key(res)
            if res.valid and not res.feasible:
                over.append((res.iteration_time, c))
            if best_k is None or k < best_k:
                best_c, best_k = c, k
        # Tight memory: the fastest plans that do not fit, with their budgets cut to fit.
        fastest = sorted(over, key=lambda x: x[0])[:self.repair_starts]
        repairs = [fixed for _, c in fastest if (fixed := fit_memory(c, self.ev.result(c), self.ev)) is not None]
        if repairs:
            yield repairs[:self._surely(len(repairs), first=False)]
        for fixed in repairs:
            if not self._left(calls):
                continue
            k = objective_key(self.ev.result(fixed))
            calls = max(calls, self.ev.call_number(fixed))
            if k < best_k:
                best_c, best_k = fixed, k
        assert best_c is not None
        self._set_current(best_c)
        self.best, self.best_result = self.current, self.result

    def _left(self, calls: int) -> bool:
        return self.max_calls is None or calls < self.max_calls

    def _surely(self, n: int, *, first: bool) -> int:
        """How many of ``n`` candidates evaluated in turn while calls are left are surely evaluated
        (each costs at most one call; ``first``: the first one is evaluated whatever is left)."""
        if self.max_calls is None:
            return n
        left = self.max_calls - self.ev.calls
        return min(n, max(left, 1 if first else 0))

    def _set_current(self, c: Candidate) -> None:
        self.current = c
        self.result = self.ev.result(c)
        self.key = objective_key(self.result)
        self.tried = set()
        self._targets = None
        self._mask = None
        self._times = None

    # ------------------------------------------------------------------ actions

    def target(self, a: int) -> Candidate | None:
        """The candidate action ``a`` leads to, or ``None`` where it does not apply."""
        c, p = self.current, self.scenario
        assert c is not None and self.result is not None
        e = ACTIONS[a]
        P, S = p.devices, c.num_stages
        k = e.kind
        if k == "stop":
            return None
        if k in ("grow-left", "grow-right"):
            i = int(e.arg)  # boundary between stage i and i+1
            if i + 1 >= S:
                return None
            src, dst = (i + 1, i) if k == "grow-left" else (i, i + 1)
            return _move(c, src, dst)
        if k == "family":
            placement = _family_placements(P, p.profile.num_layers)[int(e.arg)]
            if placement is None:
                return None
            return _with(c, placement=placement, sizes=self.balanced(placement),
                         recompute=recompute_for(c, len(placement)))
        if k == "rebalance":
            return _with(c, sizes=self.balanced(c.placement))
        if k in ("budget-up", "budget-down", "all-up", "all-down"):
            if c.budgets is None:
                return None
            cap = float(max(p.microbatches, 1))
            delta = 1.0 if k in ("budget-up", "all-up") else -1.0
            if k in ("all-up", "all-down"):
                return _with(c, budgets=tuple(min(cap, max(1.0, x + delta)) for x in c.budgets))
            d = int(e.arg)
            if d >= P:
                return None
            b = list(c.budgets)
            b[d] = min(cap, max(1.0, b[d] + delta))
            return _with(c, budgets=tuple(b))
        if k == "preset":
            return _with(c, budgets=_presets(P)[BUDGET_PRESETS.index(str(e.arg))])
        if k == "toggle":
            return _with(c, **{str(e.arg): not getattr(c, str(e.arg))})
        if k == "pending-w":
            v = _MPW[int(e.arg)]
            return _with(c, max_pending_w=P if v == "P" else v)
        if k in ("relieve-hot", "feed-cold"):
            return self._bottleneck_move(hot=k == "relieve-hot")
        if k == "fit-memory":
            return fit_memory(c, self.result, self.ev)
        raise AssertionError(k)

    def _bottleneck_move(self, *, hot: bool) -> Candidate | None:
        """Move one boundary layer off the busiest device's heaviest stage (``hot``), or onto the
        idlest device's lightest stage from its heavier neighbour."""
        c, res = self.current, self.result
        assert c is not None and res is not None
        if not res.valid or c.num_stages < 2:
            return None
        busy = res.busy
        pick = max if hot else min
        d = pick(range(len(busy)), key=busy.__getitem__)
        times = self.stage_times(c)
        stages = [s for s in range(c.num_stages) if c.placement[s] == d]
        s = pick(stages, key=times.__getitem__)
        nbs = [n for n in (s - 1, s + 1) if 0 <= n < c.num_stages]
        if hot:
            n = min(nbs, key=times.__getitem__)
            return _move(c, s, n)
        n = max(nbs, key=times.__getitem__)
        return _move(c, n, s)

    def stage_times(self, c: Candidate | None = None) -> list[float]:
        """Per-stage f+b+w over the device's speed (of ``c``, default the current candidate)."""
        if c is None or c is self.current:
            if self._times is None:
                self._times = self._stage_times(self.current)
            return self._times
        return self._stage_times(c)

    def _stage_times(self, c: Candidate) -> list[float]:
        pre, speeds, placement = self._prefix_list, self.speeds, c.placement
        out, j = [], 0
        for s, n in enumerate(c.sizes):
            out.append((pre[j + n] - pre[j]) / speeds[placement[s]])
            j += n
        return out

    def targets(self) -> list[Candidate | None]:
        """Candidate of each action (``None`` where masked), computed once per state."""
        if self._targets is None:
            c = self.current
            assert c is not None
            found: list[tuple[int, Candidate | None]] = []  # (action, its candidate) where it applies
            add = found.append
            S, P = c.num_stages, self.scenario.devices
            sizes = c.sizes
            for i in range(S - 1):
                if sizes[i + 1] > 1:
                    add((GROW_LEFT + i, _move(c, i + 1, i)))
                if sizes[i] > 1:
                    add((GROW_RIGHT + i, _move(c, i, i + 1)))
            p = self.scenario
            bal = self.ev.balanced_sizes
            for k, placement in enumerate(_family_placements(P, p.profile.num_layers)):
                if placement is not None:
                    add((_FAMILY + k, _with(c, placement=placement, sizes=bal(placement),
                                            recompute=recompute_for(c, len(placement)))))
            add((_REBALANCE, _with(c, sizes=bal(c.placement))))
            b = c.budgets
            if b is not None:
                cap = float(max(p.microbatches, 1))
                for d in range(P):
                    x = b[d]
                    up, down = min(cap, max(1.0, x + 1.0)), min(cap, max(1.0, x - 1.0))
                    if up != x:
                        add((BUDGET_UP + d, _with(c, budgets=(*b[:d], up, *b[d + 1:]))))
                    if down != x:
                        add((BUDGET_DOWN + d, _with(c, budgets=(*b[:d], down, *b[d + 1:]))))
                add((_ALL_UP, _with(c, budgets=tuple(min(cap, max(1.0, x + 1.0)) for x in b))))
                add((_ALL_UP + 1, _with(c, budgets=tuple(min(cap, max(1.0, x - 1.0)) for x in b))))
            for i, budgets in enumerate(_presets(P)):
                add((_PRESET + i, _with(c, budgets=budgets)))
            cd = c.__dict__
            for i, knob in enumerate(_KNOBS):
                add((_TOGGLE + i, _with(c, **{knob: not cd[knob]})))
            for i, v in enumerate(_MPW):
                add((_PENDING + i, _with(c, max_pending_w=P if v == "P" else v)))
            add((_HOT, self._bottleneck_move(hot=True)))
            add((_HOT + 1, self._bottleneck_move(hot=False)))
            add((_FIT, fit_memory(c, self.result, self.ev)))
            ev = self.ev
            known = ev.known_test  # Evaluator.known without a method call per candidate
            tried = self.tried
            out: list[Candidate | None] = [None] * N_ACTIONS
            index: dict[int, list[int]] = {}  # a candidate's hash -> the actions leading to it
            allowed = np.zeros(N_ACTIONS, dtype=bool)
            hc = hash(c)
            for a, t in found:
                if t is None:
                    continue
                h = hash(t)
                if (h == hc and t == c) or (tried and t in tried) or known(t):  # (equal ones hash alike)
                    continue
                out[a] = t
                hit = index.get(h)
                if hit is None:
                    index[h] = [a]
                else:
                    hit.append(a)
            allowed[[a for a, _ in found if out[a] is not None]] = True
            allowed[0] = self.allow_stop or not allowed.any()
            self._targets, self._allowed, self._index = out, allowed, index
        return self._targets

    def mask(self) -> np.ndarray:
        """Allowed actions (a bool array; do not modify it): stop, and every edit that leads to a new plan."""
        if self._mask is None:
            if self.budget_left():
                self.targets()
                m = self._allowed
            else:
                m = np.zeros(N_ACTIONS, dtype=bool)
                m[0] = True
            self._mask = m
        return self._mask

    def apply(self, a: int) -> tuple[bool, Result | None]:
        """Try action ``a``: evaluate its candidate, keep it if better. Returns (kept, its result)."""
        t = self.targets()[a] if a else None
        if t is None:
            return False, None
        res = self.ev.result(t)
        key = objective_key(res)
        assert self.key is not None
        self._mask = None
        if key < self.key:
            self._set_current(t)
            if self.best_result is None or key < objective_key(self.best_result):
                self.best, self.best_result = t, res
            return True, res
        self.tried.add(t)
        allowed = self._allowed.copy()
        targets = self._targets
        same = self._index.get(hash(t), ())
        for i in same:
            if targets[i] is not None and targets[i] == t:
                targets[i] = None
                allowed[i] = False
        if not allowed[1:].any():
            allowed[0] = True
        self._allowed = allowed
        return False, res


def fit_memory(c: Candidate, result: Result, ev: Evaluator) -> Candidate | None:
    """``c`` with each device's activation budget cut to what its memory holds after the static
    share (list scheduler: a budget of ``k`` micro-batches caps activations at ``k`` times the
    device's per-micro-batch activations); ``None`` when ``c`` fits already, is not a list
    order, or static memory alone overflows."""
    if c.order != "list" or not result.valid or result.feasible:
        return None
    P = len(result.peak_memory)
    costs = ev.costs(c.sizes, c.placement)
    per_mb = microbatch_bytes(costs, c.placement, P, split_backward=c.split_backward)
    cur = c.budgets if c.budgets is not None else (float(ev.scenario.microbatches),) * P
    out = []
    for d in range(P):
        room = result.memory_limit[d] - costs.static_bytes[d]
        if room <= 0:
            return None
        fit = float(int(room / per_mb[d])) if per_mb[d] > 0 else cur[d]
        out.append(max(1.0, min(cur[d], fit)))
    budgets = tuple(out)
    return None if budgets == c.budgets else _with(c, budgets=budgets, cap_counts_w=True)


def _move(c: Candidate, src: int, dst: int) -> Candidate | None:
    sizes = move_layers(c.sizes, src, dst)
    return None if sizes is None else _with(c, sizes=sizes)
