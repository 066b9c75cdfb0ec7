"""RL searchers: a trained policy edits plans in ``adaptis/Pipeline-v0``, alone or seeding the tuner.

Two learned parts work together. The **start ranker** (:mod:`agents.rl.starts`, a contextual
bandit over ~240 starting recipes) picks, from the scenario alone, which starting plans to
simulate first; the **edit policy** (MaskablePPO with :class:`agents.rl.net.EntityPolicy`,
imitation of a one-step look-ahead oracle then PPO, :mod:`agents.rl.imitation`) then edits the
best of them, one simulator call per edit.

``rl`` simulates the ranker's top ``start_arms`` recipes (named hand-built schedules among them
are simulated as plans), then runs one deterministic rollout and sampled ones (best-of-K) while
calls are left, all sharing one :class:`~pipeline.evaluator.Evaluator`, so repeated plans are free
and every call is counted. It spends at most ``max_calls`` (default 40, a tenth of the tuner's
default budget). ``RLSearcher(zero_shot=True)`` is zero-shot planning: the ranker's top 4
recipes and a greedy edit (on mixed device speeds its top 3 in both device orders), at
most 5 simulator calls. Without a ranker file
(``ranker_path="none"``) the rollouts start from the hand-written :func:`start_candidates`.

``rl+tuner`` spends the same budget as the tuner alone. By default (``order="policy-first"``) the
policy's phase (a tenth of the budget: the ranker's top recipes, the named schedules among them,
and one greedy rollout) comes first; the tuner then starts from the policy's best plans, the
ranker's recipes and its own native seeds with the rest (it skips its Python-built named plans:
the ranker's cover them), reusing the policy phase's stage costs and splits. The better of the
two is returned; it is not better than the tuner by construction. ``order="tuner-first"``: the
tuner's own search with all but a tenth of the budget, then the policy polishes its best plan.
``python -m experiments evaluate-agent`` measures where each wins.

Both are listed in :mod:`agents.registry`'s table of methods.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Budget, ImproveCallback, SearchResult, finish, history_marks
from pipeline.candidates import Candidate, Scenario, objective_key
from pipeline.evaluator import Evaluator
from pipeline.plan import Plan
from pipeline.simulator import Result

__all__ = ["RLSearcher", "RLTunerSearcher", "beyond_reach", "rollout", "start_candidates"]

_POLICIES: dict[str, tuple[Any, dict[str, Any]]] = {}


def _policy(path: str | Path | None) -> tuple[Any, dict[str, Any]]:
    from agents.rl.policy import DEFAULT_POLICY, load_policy

    key = str(Path(path).resolve()) if path else str(DEFAULT_POLICY)
    if key not in _POLICIES:
        import torch as th

        # The policy's batch-1 forward passes are tiny: more threads only contend (10-100x slower
        # on a busy machine).
        th.set_num_threads(1)
        _POLICIES[key] = load_policy(key)
    return _POLICIES[key]


def beyond_reach(scenario: Scenario) -> str | None:
    """Why the policy cannot plan ``scenario`` (its action table and observation hold at most
    :data:`env.editor.MAX_DEVICES` devices), or None when it can: the one-line note of a skipped row."""
    from env.editor import MAX_DEVICES

    if scenario.devices > MAX_DEVICES:
        return f"skipped: rl plans up to {MAX_DEVICES} devices, got {scenario.devices}"
    return None


def rollout(policy: Any, env: Any, *, scenario: Scenario, evaluator: Evaluator, max_calls: int,
            deterministic: bool, rng: np.random.Generator | None = None,
            start: list[Candidate] | str | None = None, deadline: float | None = None
            ) -> tuple[Candidate, Plan, Result]:
    """One episode of ``policy`` on ``scenario`` in ``env``; returns the best (candidate, plan, result)
    (the plan is built by ``evaluator.plan`` and cached there).
    ``policy=None`` picks uniformly among the allowed edits (the baseline a policy must beat).
    ``deadline`` (a ``time.perf_counter()`` value) ends the episode early."""
    _run_episode(policy, env, scenario=scenario, evaluator=evaluator, max_calls=max_calls, deterministic=deterministic,
                 rng=rng, start=start, deadline=deadline)
    ed = env.editor
    return ed.best, ed.best_plan, ed.best_result


def _run_episode(policy: Any, env: Any, *, scenario: Scenario, evaluator: Evaluator, max_calls: int,
                 deterministic: bool, rng: np.random.Generator | None = None,
                 start: list[Candidate] | str | None = None, deadline: float | None = None) -> None:
    import time

    import torch as th

    options: dict[str, Any] = {"scenario": scenario, "evaluator": evaluator, "max_calls": max_calls,
                               "reference": "bound"}
    if start:
        options["start"] = start
    obs, info = env.reset(options=options)
    done = False
    while not done and (deadline is None or time.perf_counter() < deadline):
        mask = env.action_masks()
        if policy is None:
            rng = rng if rng is not None else np.random.default_rng(0)
            allowed = np.flatnonzero(mask[1:]) + 1
            action = int(rng.choice(allowed)) if len(allowed) else 0
        elif deterministic or rng is None:
            action, _ = _predict(policy, obs, mask, deterministic=True)
        else:
            with th.no_grad():
                obs_t, _ = policy.obs_to_tensor(obs)
                dist = _distribution(policy, obs_t, mask)
                probs = dist.distribution.probs.cpu().numpy()[0].astype(np.float64)
            probs = np.where(mask, probs, 0.0)
            probs = probs / probs.sum() if probs.sum() > 0 else mask / mask.sum()
            action = int(rng.choice(len(probs), p=probs))
        obs, _, terminated, truncated, info = env.step(int(action))
        done = terminated or truncated


def _rollout_best(policy: Any, env: Any, **kwargs: Any) -> tuple[Candidate, Result]:
    """:func:`rollout` without building the plan: the best (candidate, result)."""
    _run_episode(policy, env, **kwargs)
    ed = env.editor
    return ed.best, ed.best_result


def _distribution(policy: Any, obs_t: Any, mask: np.ndarray) -> Any:
    if hasattr(policy, "get_distribution") and "action_masks" in policy.get_distribution.__code__.co_varnames:
        return policy.get_distribution(obs_t, action_masks=mask)
    return policy.get_distribution(obs_t)


def _predict(policy: Any, obs: dict, mask: np.ndarray, *, deterministic: bool) -> tuple[int, Any]:
    """Greedy action among the allowed ones (PPO policies know no masks: mask their logits)."""
    import torch as th

    with th.no_grad():
        obs_t, _ = policy.obs_to_tensor(obs)
        dist = _distribution(policy, obs_t, mask)
        probs = dist.distribution.probs.cpu().numpy()[0]
    probs = np.where(mask, probs, -1.0)
    return int(np.argmax(probs)), None


def start_candidates(scenario: Scenario) -> list[Candidate]:
    """Where the policy's rollouts start: the zero-shot starts (:func:`env.scenarios.zero_shot_starts`,
    memory-aware), the environment's portfolio (list-scheduled families), the hand-built orders
    of the named schedules (ZB-V, interleaved 1F1B, 1F1B) and interleaved placements of 2-4
    chunks under even budgets, all at the DP-balanced split."""
    from env.editor import MAX_STAGES, portfolio
    from env.scenarios import zero_shot_starts
    from pipeline.plan import interleaved_placement, sequential_placement, v_placement
    from pipeline.start_recipes import fixed_order_candidate, preset_candidate

    P, L = scenario.devices, scenario.profile.num_layers
    ev = Evaluator(scenario)
    out = zero_shot_starts(scenario, ev)
    out += [c for c in portfolio(scenario, ev.balanced_sizes) if c not in out]
    fixed = [sequential_placement(P)]
    if P >= 2 and 2 * P <= L:
        fixed += [v_placement(P), interleaved_placement(P, 2)]
    out += [fixed_order_candidate(ev.balanced_sizes(placement), placement, devices=P) for placement in fixed]
    # Interleaved placements under an even per-device budget (the portfolio's 1F1B-style
    # decreasing budgets starve the last devices of a multi-chunk placement).
    for chunks in (2, 3, 4):
        if P >= 2 and P * chunks <= min(L, MAX_STAGES):
            placement = interleaved_placement(P, chunks)
            out.append(preset_candidate(ev.balanced_sizes(placement), placement, "zbv", devices=P))
    return out


@dataclass
class RLSearcher:
    """A trained policy's plan: deterministic rollout plus sampled ones (see the module docstring)."""

    name: str = "rl"
    policy_path: str | None = None
    """Policy file (``.pth`` with its ``.json``); ``None``: the shipped default policy."""
    samples: int = 4
    """K: sampled rollouts after the deterministic one, while calls are left."""
    max_calls: int = 40
    """Most simulator calls one search spends (also capped by the budget)."""
    max_steps: int = 24
    """Edits per rollout."""
    zero_shot: bool = False
    """At most 5 calls: ``zero_shot_starts`` of the ranker's starts (without a ranker,
    :func:`env.scenarios.zero_shot_starts`) and one greedy rollout (no samples)."""
    random_edits: bool = False
    """No policy: uniformly random allowed edits from the same starts with the same budget (the
    baseline ``evaluate-agent`` calls ``rl-random``)."""
    ranker_path: str | None = None
    """Start ranker (:mod:`agents.rl.starts`, ``.pt`` with its ``.json``); ``None``: the shipped one.
    ``"none"`` (or no shipped file): the rollouts start from the hand-written
    :func:`start_candidates` (zero-shot: :func:`env.scenarios.zero_shot_starts`)."""
    start_arms: int = 10
    """How many of the ranker's top recipes to simulate first (zero-shot: ``zero_shot_starts``)."""
    zero_shot_starts: int = 4
    """Zero-shot on equal devices: the ranker's top recipes it simulates (the last one fitting by
    construction) before one greedy edit, of its 5 calls. On devices of mixed speeds it takes
    the top 3, each followed by its slow-first twin, and the calls run out at the third recipe.
    Chosen on draws used for nothing else (3 and 5 starts, and on mixed speeds 2 recipes and
    their twins, planned worse there)."""
    speed_twins: bool = True
    """On devices of mixed speeds, follow each list recipe with its devices-by-speed twin
    (:func:`agents.rl.starts.ranked_starts`); False: the ranker's recipes in index order only."""
    best_candidates: list[Candidate] = field(default_factory=list, repr=False)
    """After a search: the distinct best candidates of the rollouts, best first."""
    start_list: list[Candidate] = field(default_factory=list, repr=False)
    """After a search: the ranker's start candidates (empty without a ranker)."""
    evaluator: Evaluator | None = field(default=None, repr=False)
    """After a search: its evaluator (its stage costs and splits can serve a tuner that follows)."""
    extra_starts: list[Candidate] = field(default_factory=list, repr=False)
    """Candidates to start from besides the ranker's (e.g. the tuner's best plan, to polish)."""
    scenario_caches: Evaluator | None = field(default=None, repr=False)
    """An evaluator of the same scenario whose stage costs and splits to reuse."""
    named_arms: bool = True
    """Simulate the ranker's named hand-built schedules too (off when a tuner simulated them already)."""
    lazy: bool = False
    """Return no plan (``best_plan()`` builds it): for callers that may not need it."""
    best: tuple | None = field(default=None, repr=False)
    """After a search: (key, candidate or None, named plan or None, result) of the best plan."""

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        from env.pipeline_env import PipelineEnv

        if (why := beyond_reach(scenario)) is not None:
            return SearchResult(self.name, None, None, note=why)

        policy, meta = (None, {"config": {"allow_stop": False}}) if self.random_edits else _policy(self.policy_path)
        ev = self.evaluator = Evaluator(scenario)
        if self.scenario_caches is not None:
            ev.share_scenario_caches(self.scenario_caches)
        max_calls, samples = (min(5, self.max_calls), 0) if self.zero_shot else (self.max_calls, self.samples)
        cap = max_calls if budget.sim_calls is None else min(max_calls, budget.sim_calls)
        env = PipelineEnv(max_steps=self.max_steps, allow_stop=bool(meta.get("config", {}).get("allow_stop", True)))
        rng = np.random.default_rng(seed)
        found: list[tuple[tuple, Candidate, Plan, Result]] = []
        history: list[tuple[int, float]] = []
        best_key = None
        deadline = None if budget.seconds is None else time.perf_counter() + budget.seconds
        starts = self._starts(scenario, ev, found, cap, deadline)
        if self.extra_starts:
            starts = list(dict.fromkeys(self.extra_starts + (starts if isinstance(starts, list) else [])))
        for key, _, plan, res in found:
            if res.valid and (best_key is None or key < best_key):
                best_key = key
                history.append((ev.calls, res.iteration_time))
                if on_improve is not None:
                    on_improve(plan, res)
        for k in range(1 + samples):
            if k and (ev.calls >= cap or (deadline is not None and time.perf_counter() >= deadline)):
                break
            calls_before = ev.calls
            c, res = _rollout_best(policy, env, scenario=scenario, evaluator=ev, max_calls=cap,
                                   deterministic=k == 0, rng=rng, start=starts, deadline=deadline)
            key = objective_key(res)
            found.append((key, c, None, res))
            if res.valid and (best_key is None or key < best_key):
                best_key = key
                history.append((ev.calls, res.iteration_time))
                if on_improve is not None:
                    on_improve(ev.plan(c), res)
            if k and ev.calls == calls_before:
                break  # a sampled rollout found nothing new: the rest would repeat it
        found.sort(key=lambda x: x[0])
        seen: list[Candidate] = []
        for _, c, _, _ in found:
            if c is not None and c not in seen:
                seen.append(c)
        self.best_candidates = seen
        self.best = found[0] if found else None
        note = found[0][2].meta.get("method", "") if found and found[0][1] is None else (
            seen[0].describe() if seen else "")
        if self.lazy:
            return SearchResult(self.name, None, None, ev.calls, ev.seconds, history, note,
                                *history_marks(ev, history))
        return finish(self.name, scenario, self.best_plan(), evaluator=ev, history=history, note=note)

    def best_plan(self) -> Plan | None:
        """The plan of the last search's best (built on demand), None when it found no valid plan."""
        if self.best is None or not self.best[3].valid:
            return None
        _, c, plan, _ = self.best
        return plan if c is None else self.evaluator.plan(c)

    def ranker(self):
        """The start ranker this searcher uses (loaded once), or None for the hand-written starts."""
        from agents.rl.starts import DEFAULT_RANKER, load_ranker

        path = self.ranker_path or DEFAULT_RANKER
        if self.ranker_path == "none" or (self.ranker_path is None and not Path(path).with_suffix(".json").is_file()):
            return None
        return load_ranker(path)

    def _starts(self, scenario: Scenario, ev: Evaluator, found: list, cap: int,
                deadline: float | None = None) -> list[Candidate] | str:
        """Where the rollouts start: the ranker's top recipes (named ones simulated here, into
        ``found``), or without a ranker file the hand-written starts."""
        from agents.rl.starts import named_result, ranked_starts
        from pipeline.candidates import slow_first

        ranker = self.ranker()
        if ranker is None:
            return "single" if self.zero_shot else start_candidates(scenario)
        k = self.start_arms
        if self.zero_shot:
            mixed = self.speed_twins and slow_first(scenario.cluster.speeds) is not None
            k = 3 if mixed else self.zero_shot_starts
        arms = ranked_starts(scenario, ev, ranker, k=k, deadline=deadline, speed_twins=self.speed_twins)
        cands = [a.candidate for a in arms if a.candidate is not None]
        for arm in arms:
            if (arm.method is not None and self.named_arms and ev.calls < cap - (1 if cands else 0)
                    and (deadline is None or time.perf_counter() < deadline)):
                plan, res = named_result(arm, scenario, ev)
                if res is not None:
                    found.append((objective_key(res), None, plan, res))
        if cands:
            self.start_list = cands
            return cands
        from env.scenarios import zero_shot_starts

        return zero_shot_starts(scenario, ev)


@dataclass
class RLTunerSearcher:
    """The policy proposes, the tuner refines, within the tuner's own budget.

    ``rl`` runs first (at most ``max_calls`` simulator calls); the AdaPtis tuner then gets what
    is left of ``budget`` (calls and seconds) and starts from the policy's ``seeds`` best
    distinct plans besides its own seeds. The better of the two plans is returned.
    """

    name: str = "rl+tuner"
    policy_path: str | None = None
    ranker_path: str | None = None
    """Start ranker file (``None``: the shipped one)."""
    samples: int = 0
    """Sampled rollouts after the greedy one (0: the greedy rollout only; the tuner gets the time)."""
    max_calls: int = 40
    seeds: int = 3
    """How many of the policy's best distinct plans seed the tuner."""
    rl_share: float = 0.1
    """Most of the budget (calls, at least 5, and seconds) the policy may use; the tuner gets the rest."""
    start_arms: int = 10
    """How many of the ranker's top recipes the policy simulates (and the tuner starts from)."""
    own_seeds: bool = True
    """``policy-first``: whether the tuner also simulates its own ~100 seeds (native calls, batched)
    besides the policy's plans and the ranker's recipes; the named schedules, slow to build, it
    leaves to the ranker either way."""
    order: str = "policy-first"
    """``policy-first``: the policy proposes (the ranker's top recipes, one greedy rollout, a tenth
    of the budget), then the tuner refines from its plans, the ranker's recipes and its own seeds.
    ``tuner-first``: the tuner runs its own search with all but ``rl_share`` of the budget, then the
    policy starts from the tuner's best plan and the ranker's recipes with the rest."""

    def search(self, scenario: Scenario, *, budget: Budget = Budget(), seed: int = 0,
               on_improve: ImproveCallback | None = None) -> SearchResult:
        if self.order not in ("tuner-first", "policy-first"):
            raise ValueError(f"order {self.order!r}: use tuner-first or policy-first")
        if (why := beyond_reach(scenario)) is not None:
            return SearchResult(self.name, None, None, note=why)
        rl = RLSearcher(policy_path=self.policy_path, ranker_path=self.ranker_path, samples=self.samples,
                        max_calls=self.max_calls, start_arms=self.start_arms)
        _policy(self.policy_path)  # loading the policy and ranker files is not search time
        rl.ranker()
        if self.order == "tuner-first":
            return self._tuner_first(rl, scenario, budget=budget, seed=seed, on_improve=on_improve)
        from agents.tuner import AdaptisTuner

        t0 = time.perf_counter()
        share = Budget(None if budget.sim_calls is None else max(5, int(self.rl_share * budget.sim_calls)),
                       None if budget.seconds is None else self.rl_share * budget.seconds)
        first = rl.search(scenario, budget=share, seed=seed, on_improve=on_improve)
        used = time.perf_counter() - t0
        rest = Budget(sim_calls=None if budget.sim_calls is None else max(1, budget.sim_calls - first.sim_calls),
                      seconds=None if budget.seconds is None else max(0.0, budget.seconds - used))
        start = list(dict.fromkeys(rl.best_candidates[:self.seeds] + rl.start_list))
        own = self.own_seeds or not rl.start_list  # without a ranker, the tuner keeps its own seeds
        tuned = AdaptisTuner().search(scenario, budget=rest, seed=seed, on_improve=on_improve,
                                      start=start, own_seeds=own, scenario_caches=rl.evaluator,
                                      named_plans=not rl.start_list)
        parts = [first, tuned]
        ok = [p for p in parts if p.result is not None and p.result.valid]
        best = min(ok, key=lambda p: objective_key(p.result)) if ok else tuned
        history, seconds, fits = _stitched(first, tuned, used)
        return SearchResult(self.name, _renamed(best.plan, self.name), best.result, first.sim_calls + tuned.sim_calls,
                            time.perf_counter() - t0, history, best.note, seconds, fits)

    def _tuner_first(self, rl: RLSearcher, scenario: Scenario, *, budget: Budget, seed: int,
                     on_improve: ImproveCallback | None) -> SearchResult:
        from agents.tuner import AdaptisTuner

        t0 = time.perf_counter()
        keep = 1.0 - self.rl_share
        tuner = AdaptisTuner()
        tuned = tuner.search(scenario, budget=Budget(None if budget.sim_calls is None else
                                                     max(1, int(keep * budget.sim_calls)),
                                                     None if budget.seconds is None else keep * budget.seconds),
                             seed=seed, on_improve=on_improve)
        used = time.perf_counter() - t0
        rest = Budget(sim_calls=None if budget.sim_calls is None else max(1, budget.sim_calls - tuned.sim_calls),
                      seconds=None if budget.seconds is None else max(1e-3, budget.seconds - used))
        rl.extra_starts = [tuner.best_candidate] if tuner.best_candidate is not None else []
        rl.scenario_caches = tuner.evaluator
        rl.lazy = True  # the tuner's plan is built already; the policy's only if it is better
        rl.named_arms = False  # the tuner simulated the named schedules already
        polished = rl.search(scenario, budget=rest, seed=seed, on_improve=on_improve)
        history, seconds, fits = _stitched(tuned, polished, used)
        calls = tuned.sim_calls + polished.sim_calls
        better = rl.best is not None and rl.best[3].valid and (
            tuned.result is None or not tuned.result.valid or rl.best[0] < objective_key(tuned.result))
        if better:
            out = finish(self.name, scenario, rl.best_plan(), evaluator=rl.evaluator, history=history,
                         note=polished.note)
            return SearchResult(self.name, out.plan, out.result, calls, time.perf_counter() - t0, history,
                                polished.note, seconds, fits)
        return SearchResult(self.name, _renamed(tuned.plan, self.name), tuned.result, calls,
                            time.perf_counter() - t0, history, tuned.note, seconds, fits)


def _stitched(first: SearchResult, then: SearchResult, offset: float) -> tuple[list, list, list]:
    """(history, seconds, fits) of two searches run one after the other (``then`` began ``offset``
    seconds after ``first``): calls and seconds continue from ``first``'s."""
    (s1, f1), (s2, f2) = first.history_marks(), then.history_marks()
    history = first.history + [(first.sim_calls + n, t) for n, t in then.history]
    return history, s1 + [None if s is None else offset + s for s in s2], f1 + f2


def _renamed(plan: Plan | None, method: str) -> Plan | None:
    if plan is None:
        return None
    return Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                {**plan.meta, "method": method}, recompute=plan.recompute)

