"""``adaptis/Pipeline-v0``: improve one pipeline plan by discrete edits, one simulator call a step.

Over 600 lines: a fifth of it is the environment's card (the class docstring Gymnasium shows).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.editor import (
    ACTIONS,
    MAX_DEVICES,
    MAX_STAGES,
    N_ACTIONS,
    PLACEMENT_FAMILIES,
    PlanEditor,
    SharedEvaluator,
    family_of,
    portfolio,
    score,
)
from env.native_core import balanced_of
from env.scenarios import ScenarioConfig, sample_scenario, zero_shot_starts
from pipeline.bounds import lower_bound
from pipeline.candidates import Candidate, Scenario
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.schedules import build_plan
from pipeline.simulator import Result, simulate
from pipeline.spec import Cluster, ModelProfile

__all__ = ["PipelineEnv", "OBS_VERSION", "GLOBAL_FEATURES", "STAGE_FEATURES", "DEVICE_FEATURES",
           "observation_space", "megatron_time", "prep_of", "round_to_simulate"]

#: Version of the observation and action layout; saved with every policy and checked on load.
OBS_VERSION = "pipeline-v1.0"
#: Columns of the ``stages`` observation (one row per stage, padded to MAX_STAGES rows).
STAGE_FEATURES: tuple[str, ...] = (
    "present", "layers/mean", "time/mean", "time/max", "first_layer/mean_time", "last_layer/mean_time",
    "activations/mean", "position", "device/devices", "chunk/chunks", "device_busy", "device_memory",
    "on_busiest", "on_idlest", "next_crosses_node",
)
#: Columns of the ``devices`` observation (one row per device, padded to MAX_DEVICES rows).
DEVICE_FEATURES: tuple[str, ...] = (
    "present", "busy", "memory/limit", "budget/devices", "budget_unlimited", "speed/mean", "stages/chunks",
    "busiest", "idlest", "node/nodes", "limit/mean",
)
#: Names of the entries of the ``plan`` observation.
GLOBAL_FEATURES: tuple[str, ...] = (
    "log2(devices)/5", "log2(microbatches)/8", "log2(layers)/8", "chunks/4", "microbatches/stages",
    *[f"family={k}{c}" for k, c in PLACEMENT_FAMILIES], "family=other",
    "split_backward", "eager_w", "depth_first", "cap_counts_w", "pending_w=none", "pending_w=2", "pending_w=P",
    "budgets=unlimited", "log(time/bound)", "log(start/time)", "feasible", "memory_overflow",
    "steps_left", "calls_left", "last_kept", "comm_share", "head_share", "memory_tightness", "multi_node",
    "speed_spread",
)
_CLIP = 8.0
_NS, _ND, _NG = len(STAGE_FEATURES), len(DEVICE_FEATURES), len(GLOBAL_FEATURES)


def observation_space() -> spaces.Dict:
    """The observation space (fixed sizes; see :class:`PipelineEnv`)."""
    def box(*shape: int) -> spaces.Box:
        return spaces.Box(low=-_CLIP, high=_CLIP, shape=shape, dtype=np.float32)

    return spaces.Dict({"stages": box(MAX_STAGES, _NS), "devices": box(MAX_DEVICES, _ND), "plan": box(_NG)})


def megatron_time(scenario: Scenario) -> tuple[float, int]:
    """Iteration time of the Megatron baseline and the simulator calls it took (one per chunk count)."""
    from pipeline.megatron import megatron_chunk_counts

    p = scenario
    plan = build_plan("megatron", p.profile, p.cluster, microbatches=p.microbatches, training=p.training)
    res = simulate(plan, p.profile, p.cluster, training=p.training, validate=False, record_timeline=False)
    return res.iteration_time, len(megatron_chunk_counts(p.profile, p.devices, p.microbatches))


class _Prep:
    """What an episode needs that depends on the scenario only (kept while the scenario repeats)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.references: dict[str, float] = {}
        self.evaluator = SharedEvaluator(scenario)
        layers = scenario.profile.layers
        cl = scenario.cluster
        P = scenario.devices
        self.cost = np.array([x.f + x.b + x.w for x in layers], dtype=np.float64)
        act = np.array([x.act_bytes for x in layers], dtype=np.float64)
        # Prefix sums from 0.0, added in order in float64 as np.cumsum adds them (the same floats).
        self.prefix_list: list[float] = [0.0, *accumulate(self.cost.tolist())]
        """:attr:`prefix` as a list (read only: DP splits take it)."""
        self.prefix = np.array(self.prefix_list)
        self.act_prefix = np.array([0.0, *accumulate(act.tolist())])
        self.portfolio: list[Candidate] | None = None
        self.bound = lower_bound(scenario.profile, cl, scenario.microbatches, packing=False).value
        self.speeds = np.asarray(cl.speeds, dtype=np.float64)
        self.limits = np.asarray(cl.memory_limits_bytes, dtype=np.float64)
        gpn = cl.gpus_per_node or P
        self.node = np.arange(P) // gpn
        nodes = int(self.node[-1]) + 1
        total = max(float(self.cost.sum()), 1e-12)
        out = [x.out_bytes for x in layers]
        send = {n: cl.transfer_seconds(0, min(1, P - 1), n) for n in set(out)}  # (a model repeats its sizes)
        comm = sum([send[n] for n in out])
        static = sum([x.params for x in layers]) * scenario.training.bytes_per_param / P
        mean_limit, mean_speed = self.limits.mean(), self.speeds.mean()
        self.consts = (comm / scenario.profile.seconds_per_unit / total, float(self.cost[-1]) / total,
                       static / float(mean_limit), float(nodes > 1),
                       float(self.speeds.max() / self.speeds.min() - 1.0))
        dev = np.zeros((MAX_DEVICES, _ND), np.float32)
        dev[:P, 0] = 1.0
        dev[:P, 5] = self.speeds / mean_speed
        dev[:P, 9] = self.node / max(1, nodes - 1)
        dev[:P, 10] = self.limits / mean_limit
        self.devices = dev
        self._placements: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}
        self.obs_cache: dict[tuple[Candidate, float], tuple] = {}
        # env.native_core's: DP splits by placement and by the stages' speeds (the engine's split is the
        # Python DP's: one memo with the evaluators', so a split either computes serves both), the
        # compiled core's table (None: not built, False: none)
        self.native_balanced: dict[tuple, tuple[int, ...]] = self.evaluator.balanced_memo
        self.native_table: Any = None

    def reference(self, kind: str) -> float:
        hit = self.references.get(kind)
        if hit is None:
            if kind == "megatron":
                hit = megatron_time(self.scenario)[0]
            elif kind == "bound":
                hit = self.bound
            else:
                raise ValueError(f"reference must be 'megatron' or 'bound', got {kind!r}")
            self.references[kind] = hit
        return hit

    def placement(self, placement: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        """(devices, chunk index / chunks, crosses a node to the next stage, stages per device) of a placement."""
        hit = self._placements.get(placement)
        if hit is None:
            pl = np.asarray(placement, dtype=np.int64)
            P = self.scenario.devices
            per_dev = np.bincount(pl, minlength=P).astype(np.float64)
            seen = np.zeros(P, dtype=np.int64)
            chunk = np.zeros(len(pl))
            for s, d in enumerate(placement):
                chunk[s] = seen[d]
                seen[d] += 1
            chunk /= np.maximum(per_dev[pl] - 1, 1)
            cross = np.zeros(len(pl))
            cross[:-1] = self.node[pl[:-1]] != self.node[pl[1:]]
            hit = (pl, chunk, cross, per_dev)
            if len(self._placements) > 1024:
                self._placements.clear()
            self._placements[placement] = hit
        return hit


#: The preparation of each scenario object some environment holds (``id(scenario)`` -> its
#: ``_Prep``, kept while an environment keeps it): environments handed one scenario object (a
#: vector env of a fixed scenario) share its pure caches (stage costs, DP splits, observations
#: and, with ``share_results``, simulated results, each still counting as a call of the episode).
_PREPS: weakref.WeakValueDictionary[int, _Prep] = weakref.WeakValueDictionary()


def _prep_of(scenario: Scenario) -> _Prep:
    hit = _PREPS.get(id(scenario))
    if hit is None or hit.scenario is not scenario:  # (a prep holds its scenario: its id is not reused meanwhile)
        hit = _PREPS[id(scenario)] = _Prep(scenario)
    return hit


def prep_of(scenario: Scenario) -> _Prep:
    """The preparation of ``scenario`` its environments share, built on first use and kept while
    something holds it (an environment, a scenario pool: :mod:`env.scenario_pool`)."""
    return _prep_of(scenario)


def round_to_simulate(evaluator: Evaluator, hint: list[Candidate]) -> list[Candidate]:
    """What a batch simulates of one round of :meth:`PipelineEnv.reset_rounds` (``hint``): the plans
    ``evaluator`` does not know yet, up to the first one the scenario's memo holds (the reset adopts
    that one in turn, and the calls keep their order)."""
    out = []
    for t in hint:
        if evaluator.known(t):
            continue
        if evaluator.remembers(t):
            break
        out.append(t)
    return out


class PipelineEnv(gym.Env):
    """Improve a pipeline-parallel plan (partition, placement, schedule) by discrete edits.

    ## Description

    An episode works on one scenario: a model profile, a cluster (2-32 devices, possibly on
    several nodes, possibly of mixed speeds), the micro-batches of one iteration and a memory
    limit per device (a :class:`pipeline.candidates.Scenario`). The state is an editable plan
    description, a :class:`pipeline.candidates.Candidate`. The episode starts from the best of a
    small portfolio of cheap plans (placement families with the DP-balanced split under the
    activation budgets of the named schedules, up to 10 simulator calls; see
    :func:`env.editor.portfolio`) or, with ``options["start"] = "single"`` (and in a share
    ``single_start_share`` of the episodes), from the better of one or two plans chosen without
    a simulator call (:func:`env.scenarios.zero_shot_starts`, one or two calls). Each step tries
    one edit: the performance model simulates the edited plan (one simulator call); the edit is
    kept when the plan gets better (feasible first, then less memory overflow, then faster) and
    rolled back otherwise, as the AdaPtis tuner does. An edit whose outcome is already known is
    masked, so no step repeats a call.

    ## Action Space

    ``Discrete(344)``; :data:`env.editor.ACTIONS` names each index:

    | index   | edit                                                                          |
    |---------|-------------------------------------------------------------------------------|
    | 0       | stop                                                                          |
    | 1-127   | ``grow-left(i)``: stage ``i`` takes the first layer of stage ``i+1``          |
    | 128-254 | ``grow-right(i)``: stage ``i+1`` takes the last layer of stage ``i``          |
    | 255-261 | placement family (sequential, interleaved 2/3/4, V, wave 3/4), DP-balanced    |
    | 262     | rebalance: DP-balanced split of the current placement                         |
    | 263-294 | activation budget of device ``d`` + 1 micro-batch                             |
    | 295-326 | activation budget of device ``d`` - 1 micro-batch                             |
    | 327-328 | every device's budget + 1 / - 1                                               |
    | 329-333 | budget preset: ZB-H1, ZB-H2, ZB-V, V-Half, unlimited                          |
    | 334-337 | toggle I/W split, eager W, depth-first forwards, W counted against the cap    |
    | 338-340 | deferred-W limit: none, 2, number of devices                                  |
    | 341     | relieve-hot: one boundary layer off the busiest device's heaviest stage       |
    | 342     | feed-cold: one layer onto the idlest device's lightest stage                  |
    | 343     | fit-memory: cut every device's budget to what its memory holds                |

    The boundary actions belong to a pair of stage rows of the observation and the budget
    actions to a device row, so a policy can score them row by row and serve any size
    (:mod:`agents.rl.net`). A masked action changes nothing, costs no simulator call, uses a
    step and gives ``-step_cost``. Illegal actions (boundaries past the last stage, devices past
    the cluster, a stage that would be empty, more stages than layers, budgets when they are
    unlimited, edits whose result is known) are masked: ``action_masks()`` (sb3-contrib's
    MaskablePPO) and ``info["action_mask"]`` (a ``np.int8`` array). Stop is allowed unless
    ``allow_stop=False`` and an edit is left.

    ## Observation Space

    A ``Dict`` of ``float32`` ``Box`` es in ``[-8, 8]``; times are shares or ratios so one
    policy serves any model scale, and rows past the scenario's stages or devices are zero
    (their ``present`` column tells them apart):

    * ``stages`` (128 x 15): one row per stage, columns :data:`STAGE_FEATURES` (layers, time,
      cost of its first and last layer, activations, position, device, chunk, its device's
      busy share and memory, whether the link to the next stage crosses nodes);
    * ``devices`` (32 x 11): one row per device, columns :data:`DEVICE_FEATURES` (busy share,
      peak memory over limit, activation budget, speed, node...);
    * ``plan`` (33): scenario and plan features, :data:`GLOBAL_FEATURES` (sizes, placement
      family, scheduler knobs, log iteration time over the lower bound, feasibility, steps and
      calls left...).

    ## Rewards

    With ``T_ref`` the reference iteration time (default: the lower bound
    :func:`pipeline.bounds.lower_bound`, ``packing=False``; ``reference="megatron"``: the
    Megatron baseline), a plan scores ``T_ref / T`` when it fits in memory, ``-1 - overflow
    share`` when it does not and ``-3`` when it is invalid. The reward of a step is the change of
    the score of the kept plan minus ``step_cost`` (default 0.002, the price of a simulator
    call); stop gives 0. The return of an episode is therefore the gain over the starting plan,
    in units of the reference throughput, less the calls it took.

    ## Starting State

    A scenario drawn by :func:`env.scenarios.sample_scenario` from ``self.np_random`` (seeded by
    ``reset(seed=...)``), or given by ``options``: ``{"scenario": Scenario}`` (or ``"problem"``) or
    ``{"profile": ModelProfile, "cluster": Cluster | int, "microbatches": int}``;
    ``{"start": Candidate | [Candidate, ...] | "single" | "portfolio"}`` picks the start;
    ``{"evaluator": Evaluator}`` shares a simulator-call counter and cache (the RL searcher's);
    ``{"max_calls": int}`` caps the simulator calls of the episode (the start included);
    ``{"reference": "bound" | "megatron"}`` picks ``T_ref``. With ``repeat_scenario=k`` a drawn
    scenario serves ``k`` episodes in a row (training: its preparation is paid once).

    ## Episode End

    Terminated on stop or when no edit is left; truncated after ``max_steps`` edits (default
    24) or when ``max_calls`` is spent.

    ## Info

    ``action_mask``, ``iteration_time`` (current plan), ``best_iteration_time``, ``feasible``,
    ``sim_calls`` (of the evaluator), ``reference_time``, ``kept`` (the step's edit was kept),
    ``edit`` (its name), ``candidate`` (the current Candidate) and ``best_candidate``; the
    best plan itself is ``env.editor.best_plan`` (a :class:`pipeline.plan.Plan`, built on
    demand; ``.to_dict()`` gives its JSON).

    ## Arguments

    ``gymnasium.make("adaptis/Pipeline-v0", max_steps=24, step_cost=0.002, max_calls=None,
    scenario=ScenarioConfig(), single_start_share=0.0, repeat_scenario=1, share_results=True,
    render_mode=None)``. ``share_results``: the episodes of one scenario share its simulated results
    (a result another episode found still counts as a call of this one); ``False`` simulates
    every step afresh (what the benchmark's ``small-fresh`` case measures).

    ## Version History

    * v0, observation ``pipeline-v1.0``: per-stage and per-device rows up to 128 stages and 32
      devices, 344 actions, lower-bound reference, memory repair of the starting plans; steps
      run one native call and build no plan.
    * v0, observation ``pipeline-v0.1``: flat padded vectors, 16 devices, 183 actions.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, *, max_steps: int = 24, step_cost: float = 0.002, max_calls: int | None = None,
                 scenario: ScenarioConfig | None = None, single_start_share: float = 0.0, repeat_scenario: int = 1,
                 share_results: bool = True, allow_stop: bool = True, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if not 0.0 <= single_start_share <= 1.0:
            raise ValueError(f"single_start_share must be in [0, 1], got {single_start_share!r}")
        if repeat_scenario < 1:
            raise ValueError(f"repeat_scenario must be >= 1, got {repeat_scenario!r}")
        self.max_steps = int(max_steps)
        self.step_cost = float(step_cost)
        self.max_calls = max_calls
        self.scenario = scenario or ScenarioConfig()
        self.single_start_share = float(single_start_share)
        self.repeat_scenario = int(repeat_scenario)
        self.share_results = bool(share_results)
        self.allow_stop = bool(allow_stop)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.observation_space = observation_space()
        self.editor: PlanEditor | None = None
        self.reference = 1.0
        self.steps = 0
        self._last_kept = False
        self._start_time = math.inf
        self._prep: _Prep | None = None
        self._drawn: Scenario | None = None
        self._drawn_uses = 0
        self._calls_cap = 1
        self._calls_at_start = 0
        self._obs_cache: tuple | None = None
        self._scored: tuple[Result, float, float] | None = None
        self._own_evaluator = True

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        for _ in self.reset_rounds(seed=seed, options=options):
            pass
        return self._obs(), self.info(kept=False, edit="start")

    def step(self, action):
        reward, terminated, truncated, kept, edit = self.step_core(action)
        return self._obs(), reward, terminated, truncated, self.info(kept=kept, edit=edit)

    def action_masks(self, *, copy: bool = True) -> np.ndarray:
        """Allowed actions as a boolean array (what MaskablePPO reads); ``copy=False``: the editor's own."""
        mask = self._editor().mask()
        return mask.copy() if copy else mask

    # ----------------------------------- batched stepping (env.vector_env: one native batch a step)
    @property
    def steps_in_parts(self) -> bool:
        """Whether :meth:`step` is :meth:`step_core`, :meth:`observation_parts` and :meth:`info`, with
        :meth:`action_masks` the editor's (a subclass that overrides one is stepped by its step)."""
        return self._own("step", "action_masks", "_obs", "observation_parts", "info")

    @property
    def resets_in_rounds(self) -> bool:
        """Whether :meth:`reset` is :meth:`reset_rounds`, :meth:`observation_parts` and :meth:`info`
        (a subclass that overrides one, to fix the scenario say, is reset by its reset)."""
        return self._own("reset", "_obs", "observation_parts", "info")

    def _own(self, *names: str) -> bool:
        return all(getattr(type(self), name) is getattr(PipelineEnv, name) for name in names)

    def would_simulate(self, action: int) -> tuple[Evaluator, Candidate] | None:
        """What ``step(action)`` would simulate: ``(evaluator, plan)`` for an allowed edit whose plan the
        evaluator neither knows nor :meth:`~pipeline.evaluator.Evaluator.remembers` (the step adopts
        it), else None. Simulated beforehand on that evaluator, the step finds it ready."""
        ed = self.editor
        if ed is None or not 0 < action < N_ACTIONS or not ed.mask()[action]:
            return None
        t = ed.targets()[action]
        ev = ed.ev
        if t is None or ev.known(t) or ev.remembers(t):
            return None
        return ev, t

    def draw_single_start(self) -> bool:
        """Whether the next episode starts from one plan (``single_start_share`` of them, zero-shot
        practice): one draw of the environment's generator where the share is above 0, none else."""
        return self.single_start_share > 0 and bool(self.np_random.random() < self.single_start_share)

    def reset_rounds(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                     ) -> Iterator[list[Candidate]]:
        """:meth:`reset` without its observation and info, in rounds: it yields the starting plans each
        round surely simulates (:meth:`env.editor.PlanEditor.starting`), for a batch to simulate first."""
        super().reset(seed=seed)
        options = dict(options or {})
        scenario = _scenario_from(options)
        if scenario is None:
            if seed is not None or self._drawn is None or self._drawn_uses >= self.repeat_scenario:
                self._drawn, self._drawn_uses = sample_scenario(self.np_random, self.scenario), 0
            self._drawn_uses += 1
            scenario = self._drawn
        evaluator = options.get("evaluator")
        if evaluator is not None and evaluator.scenario is not scenario:
            scenario = evaluator.scenario
        prep = self._prep if self._prep is not None and self._prep.scenario is scenario else _prep_of(scenario)
        self._prep = prep
        self.reference = prep.reference(options.get("reference", "bound"))
        self._scored = None
        self._own_evaluator = evaluator is None
        if evaluator is None:
            evaluator = SharedEvaluator(scenario, share=prep.evaluator, results=self.share_results)
        max_calls = options.get("max_calls", self.max_calls)
        self.editor = PlanEditor(scenario, evaluator=evaluator, reference=self.reference, max_calls=max_calls,
                                 prefix=prep.prefix)
        self.editor.allow_stop = self.allow_stop
        start = options.get("start")
        if start is None and self.draw_single_start():
            start = "single"
        if start == "single":
            start = zero_shot_starts(scenario, evaluator)
        elif start is None or start == "portfolio":
            if prep.portfolio is None:
                prep.portfolio = portfolio(scenario, lambda placement: balanced_of(prep, placement))
            start = prep.portfolio
        elif isinstance(start, Candidate):
            start = [start]
        yield from self.editor.starting(start)
        self.steps = 0
        self._last_kept = False
        self._start_time = self.editor.result.iteration_time
        self._calls_cap = max(1, (max_calls or self.max_steps + 10) - evaluator.calls)
        self._calls_at_start = evaluator.calls
        self._obs_cache = None

    def episode_state(self) -> dict[str, Any]:
        """What a reset leaves beside the editor and the public fields, for the compiled core to step
        the episode on (:func:`env.native_core.load`): the scenario's preparation, whether the
        episode's evaluator is its own (not ``options["evaluator"]``), its call budget for the
        ``calls_left`` feature (``calls_cap``, ``calls_at_start``) and its starting iteration time."""
        self._editor()
        return {"prep": self._prep, "own_evaluator": self._own_evaluator, "calls_cap": self._calls_cap,
                "calls_at_start": self._calls_at_start, "start_time": self._start_time}

    def step_core(self, action) -> tuple[float, bool, bool, bool, str]:
        """:meth:`step` without its observation and info: ``(reward, terminated, truncated, kept, edit)``
        (the observation is :meth:`observation_parts` after it, the info ``info(kept=kept, edit=edit)``)."""
        ed = self._editor()
        a = int(action)
        if not 0 <= a < N_ACTIONS:
            raise ValueError(f"action {action!r} is outside Discrete({N_ACTIONS})")
        if a == 0 and ed.mask()[0]:
            return 0.0, True, False, False, "stop"
        if not ed.mask()[a]:
            # A masked edit changes nothing and costs no simulator call; it still uses a step.
            self.steps += 1
            self._last_kept = False
            return -self.step_cost, False, bool(self.steps >= self.max_steps), False, "masked"
        before = self._score(ed.result)
        kept, _ = ed.apply(a)
        self.steps += 1
        self._last_kept = kept
        reward = float(self._score(ed.result) - before - self.step_cost)
        mask = ed.mask()
        terminated = not mask[1:].any() and ed.budget_left()
        truncated = (self.steps >= self.max_steps or not ed.budget_left()) and not terminated
        return reward, bool(terminated), bool(truncated), bool(kept), str(ACTIONS[a])

    def _score(self, result: Result) -> float:
        """:func:`env.editor.score` of ``result`` against the reference (the last one kept: a step
        that keeps no edit scores the same result before and after)."""
        hit = self._scored
        if hit is None or hit[0] is not result or hit[1] != self.reference:
            hit = self._scored = (result, self.reference, score(result, self.reference))
        return hit[2]

    def render(self):
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'rgb_array'")
            return None
        ed = self._editor()
        p = ed.scenario
        res = simulate(ed.plan, p.profile, p.cluster, training=p.training)
        title = f"{p.profile.name}: {ed.current.describe()}"
        if self.render_mode == "ansi":
            from pipeline.render import gantt_text

            return f"{title}\n{gantt_text(res.timeline_dict())}\n"
        return _gantt_array(res, title)

    # ------------------------------------------------------------------ helpers

    def _editor(self) -> PlanEditor:
        if self.editor is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        return self.editor

    def _obs(self) -> dict[str, np.ndarray]:
        st, dev, g = self.observation_parts()
        return {"stages": st.copy(), "devices": dev.copy(), "plan": g}

    def observation_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stages, devices, plan)`` of the observation; ``stages`` and ``devices`` are the cached
        arrays of the current plan (never to be written: :meth:`step` and :meth:`reset` copy them)."""
        ed = self._editor()
        cache = self._obs_cache
        if cache is None or cache[0] is not ed.current:
            prep = self._prep
            key = (ed.current, self._start_time)
            hit = prep.obs_cache.get(key)
            if hit is None:
                if len(prep.obs_cache) > 512:
                    prep.obs_cache.clear()
                hit = prep.obs_cache[key] = self._state_obs()
            cache = self._obs_cache = (ed.current, *hit)
        _, st, dev, head, tail = cache
        calls_left = (self._calls_cap - (ed.ev.calls - self._calls_at_start)) / self._calls_cap
        g = np.array([*head, (self.max_steps - self.steps) / self.max_steps, max(0.0, calls_left),
                      float(self._last_kept), *tail], dtype=np.float32)
        return st, dev, g

    def _state_obs(self) -> tuple[np.ndarray, np.ndarray, list[float], list[float]]:
        """The parts of the observation that depend on the current plan only."""
        ed = self._editor()
        prep = self._prep
        assert prep is not None
        p, c, res = ed.scenario, ed.current, ed.result
        P, M, S = p.devices, p.microbatches, c.num_stages
        pl, chunk, cross, per_dev = prep.placement(c.placement)
        sizes = np.asarray(c.sizes, dtype=np.float64)
        ends = np.cumsum(c.sizes)
        starts = ends - sizes.astype(np.int64)
        sp = prep.speeds[pl]
        times = (ed.prefix[ends] - ed.prefix[starts]) / sp
        mean_t = max(float(times.sum()) / S, 1e-12)
        act = prep.act_prefix[ends] - prep.act_prefix[starts]
        valid = res.valid
        busy = np.asarray(res.busy, dtype=np.float64) / max(res.iteration_time, 1e-12) if valid else np.zeros(P)
        mem = np.asarray(res.peak_memory, dtype=np.float64) / prep.limits
        hot, cold = (int(busy.argmax()), int(busy.argmin())) if valid else (-1, -1)
        st = np.zeros((MAX_STAGES, _NS), np.float32)
        st[:S, 0] = 1.0
        st[:S, 1] = sizes * (S / float(sizes.sum()))
        st[:S, 2] = times / mean_t
        st[:S, 3] = times / max(float(times.max()), 1e-12)
        st[:S, 4] = prep.cost[starts] / sp / mean_t
        st[:S, 5] = prep.cost[ends - 1] / sp / mean_t
        st[:S, 6] = act * (S / max(float(act.sum()), 1e-12))
        st[:S, 7] = np.arange(S) / max(1, S - 1)
        st[:S, 8] = (pl + 1) / P
        st[:S, 9] = chunk
        st[:S, 10] = busy[pl]
        st[:S, 11] = mem[pl]
        st[:S, 12] = pl == hot
        st[:S, 13] = pl == cold
        st[:S, 14] = cross
        dev = prep.devices.copy()
        dev[:P, 1] = busy
        dev[:P, 2] = mem
        if c.budgets is not None:
            dev[:P, 3] = np.asarray(c.budgets) / P
        else:
            dev[:P, 4] = 1.0
        dev[:P, 6] = per_dev * (P / S)
        if valid:
            dev[hot, 7] = 1.0
            dev[cold, 8] = 1.0
        np.clip(st, -_CLIP, _CLIP, out=st)
        np.clip(dev, -_CLIP, _CLIP, out=dev)
        fam = family_of(c, P)
        onehot = [0.0] * (len(PLACEMENT_FAMILIES) + 1)
        onehot[fam] = 1.0
        mpw = c.max_pending_w
        comm_share, head_share, tight, multi, spread = prep.consts
        bound = prep.bound
        t = res.iteration_time if valid else math.inf
        over = float(np.maximum(mem - 1.0, 0.0).sum())
        head = [math.log2(P) / 5, math.log2(M) / 8, math.log2(p.profile.num_layers) / 8, S / P / 4, M / S,
                *onehot, float(c.split_backward), float(c.eager_w), float(c.depth_first), float(c.cap_counts_w),
                float(mpw is None), float(mpw == 2), float(mpw == P), float(c.budgets is None),
                math.log(t / bound) if math.isfinite(t) and bound > 0 else _CLIP,
                math.log(self._start_time / t) if math.isfinite(t) and math.isfinite(self._start_time) else 0.0,
                float(res.feasible), over]
        tail = [comm_share, head_share, tight, multi, spread]
        head = [min(_CLIP, max(-_CLIP, v)) for v in head]
        tail = [min(_CLIP, max(-_CLIP, v)) for v in tail]
        return st, dev, head, tail

    def info(self, *, kept: bool, edit: str) -> dict[str, Any]:
        """The info of the current state after the edit ``edit``, ``kept`` or not (the class docstring's)."""
        ed = self._editor()
        return {
            "action_mask": ed.mask().astype(np.int8),
            "iteration_time": float(ed.result.iteration_time),
            "best_iteration_time": float(ed.best_result.iteration_time),
            "feasible": bool(ed.result.feasible),
            "sim_calls": int(ed.ev.calls),
            "reference_time": float(self.reference),
            "kept": bool(kept),
            "edit": edit,
            "candidate": ed.current,
            "best_candidate": ed.best,
        }


def _scenario_from(options: dict[str, Any]) -> Scenario | None:
    for key in ("scenario", "problem", "evaluator"):  # ("problem": its name before 6 Dec 2026)
        if options.get(key) is not None:
            return options[key].scenario if key == "evaluator" else options[key]
    profile = options.get("profile")
    if profile is None:
        return None
    if not isinstance(profile, ModelProfile):
        raise PlanError("options['profile'] must be a ModelProfile", field="profile")
    cluster = options.get("cluster", 4)
    if isinstance(cluster, int):
        from pipeline.hardware import build_cluster

        cluster = build_cluster(str(profile.extra.get("gpu", "h100")), devices=cluster)
    if not isinstance(cluster, Cluster):
        raise PlanError("options['cluster'] must be a Cluster or a device count", field="cluster")
    return Scenario(profile, cluster, int(options.get("microbatches", 2 * cluster.devices)))


def _gantt_array(result: Result, title: str) -> np.ndarray:
    import tempfile
    from pathlib import Path

    import matplotlib.image

    from pipeline.render import gantt_png

    with tempfile.TemporaryDirectory() as tmp:
        path = gantt_png(result.timeline_dict(), Path(tmp) / "gantt.png", title=title[:90])
        img = matplotlib.image.imread(str(path))
    rgb = img[..., :3]
    if rgb.dtype != np.uint8:
        rgb = (np.clip(rgb, 0.0, 1.0) * 255).astype(np.uint8)
    return rgb

