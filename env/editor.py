"""The plan editor behind the environments: discrete edits of a :class:`~pipeline.space.Candidate`.

:class:`PlanEditor` holds one scenario, one :class:`~pipeline.space.Evaluator` (which counts
simulator calls and caches repeats), the current candidate and the best one seen. An edit that
makes the plan better (by :func:`pipeline.space.objective_key`) is kept; one that does not is
rolled back, as the AdaPtis tuner does, and masked until the plan changes again. Every edit
costs one simulator call; an edit whose result is already known is masked.

The action table (:data:`ACTIONS`) has a fixed size for up to :data:`MAX_STAGES` stages and
:data:`MAX_DEVICES` devices, so one policy serves every scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.errors import PlanError
from pipeline.plan import Plan
from pipeline.simulator import Result
from pipeline.space import (
    Candidate,
    Evaluator,
    Problem,
    balanced_sizes,
    make_placement,
    objective_key,
    preset_budgets,
)

__all__ = [
    "MAX_LAYERS",
    "MAX_DEVICES",
    "MAX_STAGES",
    "FAMILIES",
    "BUDGET_PRESETS",
    "ACTIONS",
    "N_ACTIONS",
    "Edit",
    "PlanEditor",
    "family_of",
    "preset_budgets",
    "portfolio",
    "score",
]

MAX_LAYERS = 160
MAX_DEVICES = 16
MAX_STAGES = 64
#: Placement families (kind, chunks per device); an action picks one with the DP-balanced split.
FAMILIES: tuple[tuple[str, int], ...] = (("sequential", 1), ("interleaved", 2), ("interleaved", 3),
                                         ("interleaved", 4), ("v", 2), ("wave", 3), ("wave", 4))
#: Activation-budget presets (per device, in micro-batches) after the named schedules.
BUDGET_PRESETS = ("zb-h1", "zb-h2", "zbv", "v-half", "unlimited")
_MPW = (None, 2, "P")


@dataclass(frozen=True)
class Edit:
    """One entry of the action table."""

    kind: str
    """``stop``, ``grow-left``, ``grow-right``, ``family``, ``rebalance``, ``budget-up``,
    ``budget-down``, ``all-up``, ``all-down``, ``preset``, ``toggle``, ``pending-w``,
    ``relieve-hot``, ``feed-cold``."""
    arg: int | str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}({self.arg})"


def _action_table() -> tuple[Edit, ...]:
    acts = [Edit("stop")]
    acts += [Edit("grow-left", i) for i in range(MAX_STAGES - 1)]
    acts += [Edit("grow-right", i) for i in range(MAX_STAGES - 1)]
    acts += [Edit("family", k) for k in range(len(FAMILIES))]
    acts.append(Edit("rebalance"))
    acts += [Edit("budget-up", d) for d in range(MAX_DEVICES)]
    acts += [Edit("budget-down", d) for d in range(MAX_DEVICES)]
    acts += [Edit("all-up"), Edit("all-down")]
    acts += [Edit("preset", name) for name in BUDGET_PRESETS]
    acts += [Edit("toggle", knob) for knob in ("split_backward", "eager_w", "depth_first", "cap_counts_w")]
    acts += [Edit("pending-w", k) for k in range(len(_MPW))]
    acts += [Edit("relieve-hot"), Edit("feed-cold")]
    return tuple(acts)


#: Every action, by index: ``ACTIONS[a]`` is what action ``a`` does.
ACTIONS: tuple[Edit, ...] = _action_table()
N_ACTIONS = len(ACTIONS)


def family_of(c: Candidate, devices: int) -> int:
    """Index in :data:`FAMILIES` of the candidate's placement, or -1 for another mapping."""
    S = c.num_stages
    for k, (kind, chunks) in enumerate(FAMILIES):
        if devices * chunks == S and make_placement(kind, devices, chunks) == c.placement:
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


def portfolio(problem: Problem, sizes_of=None) -> list[Candidate]:
    """Cheap starting candidates: a few placement families under schedule-budget presets,
    each with the DP-balanced split. The editor starts from the best of them."""
    P, L = problem.devices, problem.profile.num_layers
    if sizes_of is None:
        def sizes_of(placement):
            return balanced_sizes(problem.profile, placement, problem.cluster)
    picks = (("sequential", 1, "zb-h2"), ("v", 2, "zbv"), ("interleaved", 2, "zb-h2"), ("sequential", 1, "zb-h1"),
             ("v", 2, "v-half"), ("interleaved", 3, "zb-h1"), ("wave", 3, "zbv"), ("interleaved", 2, "zb-h1"),
             ("interleaved", 4, "zb-h1"), ("sequential", 1, "unlimited"))
    out = []
    for kind, chunks, preset in picks:
        if P * chunks > min(L, MAX_STAGES):
            continue
        placement = make_placement(kind, P, chunks)
        counts_w = preset not in ("zb-h1", "zb-h2")
        out.append(Candidate(sizes_of(placement), placement, "list", preset_budgets(preset, P),
                             cap_counts_w=counts_w, max_pending_w=None if counts_w else P))
    return out


class PlanEditor:
    """Greedy plan editing for one problem (see the module docstring)."""

    def __init__(self, problem: Problem, *, evaluator: Evaluator | None = None, reference: float | None = None,
                 max_calls: int | None = None) -> None:
        if problem.devices > MAX_DEVICES:
            raise PlanError(f"the environment holds at most {MAX_DEVICES} devices, got {problem.devices}",
                            field="devices")
        if problem.profile.num_layers > MAX_LAYERS:
            raise PlanError(f"the environment holds at most {MAX_LAYERS} layers, got {problem.profile.num_layers}",
                            field="layers")
        self.problem = problem
        self.ev = evaluator if evaluator is not None else Evaluator(problem)
        self.max_calls = max_calls
        self.reference = reference
        self._sizes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.current: Candidate | None = None
        self.result: Result | None = None
        self.plan: Plan | None = None
        self.best: Candidate | None = None
        self.best_result: Result | None = None
        self.best_plan: Plan | None = None
        self.tried: set[Candidate] = set()
        self._targets: list[Candidate | None] | None = None

    # ------------------------------------------------------------------ setup

    def balanced(self, placement: tuple[int, ...]) -> tuple[int, ...]:
        """DP-balanced sizes of a placement (cached per editor)."""
        hit = self._sizes.get(placement)
        if hit is None:
            hit = balanced_sizes(self.problem.profile, placement, self.problem.cluster)
            self._sizes[placement] = hit
        return hit

    def budget_left(self) -> bool:
        return self.max_calls is None or self.ev.calls < self.max_calls

    def start(self, candidates: Sequence[Candidate] | None = None) -> None:
        """Evaluate the starting candidates (default :func:`portfolio`) and start from the best."""
        cands = list(candidates) if candidates is not None else portfolio(self.problem, self.balanced)
        if not cands:
            raise PlanError("no starting candidate fits this problem", field="start")
        best_c, best_k = None, None
        for c in cands:
            if best_c is not None and not self.budget_left():
                break
            _, res = self.ev.evaluate(c)
            k = objective_key(res)
            if best_k is None or k < best_k:
                best_c, best_k = c, k
        assert best_c is not None
        self._set_current(best_c)
        self.best, self.best_result, self.best_plan = self.current, self.result, self.plan

    def _set_current(self, c: Candidate) -> None:
        self.current = c
        self.plan, self.result = self.ev.evaluate(c)
        self.tried = set()
        self._targets = None

    # ------------------------------------------------------------------ actions

    def target(self, a: int) -> Candidate | None:
        """The candidate action ``a`` leads to, or ``None`` where it does not apply."""
        c, p = self.current, self.problem
        assert c is not None and self.result is not None
        e = ACTIONS[a]
        P, L, S = p.devices, p.profile.num_layers, c.num_stages
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
            kind, chunks = FAMILIES[int(e.arg)]
            if P * chunks > min(L, MAX_STAGES) or (chunks > 1 and P < 2):
                return None
            placement = make_placement(kind, P, chunks)
            return replace(c, placement=placement, sizes=self.balanced(placement))
        if k == "rebalance":
            return replace(c, sizes=self.balanced(c.placement))
        if k in ("budget-up", "budget-down", "all-up", "all-down"):
            if c.budgets is None:
                return None
            cap = float(max(p.microbatches, 1))
            delta = 1.0 if k in ("budget-up", "all-up") else -1.0
            b = list(c.budgets)
            devs = range(P) if k in ("all-up", "all-down") else [int(e.arg)]
            if max(devs, default=P) >= P:
                return None
            for d in devs:
                b[d] = min(cap, max(1.0, b[d] + delta))
            return replace(c, budgets=tuple(b))
        if k == "preset":
            return replace(c, budgets=preset_budgets(str(e.arg), P))
        if k == "toggle":
            return replace(c, **{str(e.arg): not getattr(c, str(e.arg))})
        if k == "pending-w":
            v = _MPW[int(e.arg)]
            return replace(c, max_pending_w=P if v == "P" else v)
        if k in ("relieve-hot", "feed-cold"):
            return self._bottleneck_move(hot=k == "relieve-hot")
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

    def stage_times(self, c: Candidate) -> list[float]:
        """Per-stage f+b+w over the device's speed."""
        layers = self.problem.profile.layers
        speeds = self.problem.cluster.speeds
        out, start = [], 0
        for s, n in enumerate(c.sizes):
            out.append(sum(x.f + x.b + x.w for x in layers[start:start + n]) / speeds[c.placement[s]])
            start += n
        return out

    def targets(self) -> list[Candidate | None]:
        """Candidate of each action (``None`` where masked), computed once per state."""
        if self._targets is None:
            out: list[Candidate | None] = []
            for a in range(N_ACTIONS):
                t = self.target(a)
                if t is not None and (t == self.current or t in self.tried or self.ev.known(t)):
                    t = None
                out.append(t)
            self._targets = out
        return self._targets

    def mask(self) -> list[bool]:
        """Allowed actions: stop, and every edit that leads to a new plan."""
        m = [t is not None for t in self.targets()]
        m[0] = True
        if not self.budget_left():
            m = [False] * N_ACTIONS
            m[0] = True
        return m

    def apply(self, a: int) -> tuple[bool, Result | None]:
        """Try action ``a``: evaluate its candidate, keep it if better. Returns (kept, its result)."""
        t = self.targets()[a] if a else None
        if t is None:
            return False, None
        _, res = self.ev.evaluate(t)
        assert self.result is not None
        if objective_key(res) < objective_key(self.result):
            self._set_current(t)
            if self.best_result is None or objective_key(res) < objective_key(self.best_result):
                self.best, self.best_result, self.best_plan = t, res, self.plan
            return True, res
        self.tried.add(t)
        targets = self._targets or []
        for i, other in enumerate(targets):
            if other is not None and (other is t or other == t):
                targets[i] = None
        return False, res


def _move(c: Candidate, src: int, dst: int) -> Candidate | None:
    if c.sizes[src] <= 1:
        return None
    sizes = list(c.sizes)
    sizes[src] -= 1
    sizes[dst] += 1
    return replace(c, sizes=tuple(sizes))
