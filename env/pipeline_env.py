"""``adaptis/Pipeline-v0``: improve one pipeline plan by discrete edits, one simulator call a step."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.editor import (
    ACTIONS,
    FAMILIES,
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_STAGES,
    N_ACTIONS,
    PlanEditor,
    family_of,
    score,
)
from env.scenarios import ScenarioConfig, sample_problem
from pipeline.bounds import lower_bound
from pipeline.errors import PlanError
from pipeline.schedules import build_plan
from pipeline.simulator import Result, simulate
from pipeline.space import Candidate, Evaluator, Problem
from pipeline.spec import Cluster, ModelProfile

__all__ = ["PipelineEnv", "OBS_VERSION", "GLOBAL_FEATURES", "observation_space", "megatron_time"]

#: Version of the observation and action layout; saved with every policy and checked on load.
OBS_VERSION = "pipeline-v0.1"
#: Names of the entries of the ``plan`` observation.
GLOBAL_FEATURES: tuple[str, ...] = (
    "devices/16", "log2(microbatches)/7", "layers/160", "stages/64", "microbatches/stages",
    *[f"family={k}{c}" for k, c in FAMILIES], "family=other",
    "split_backward", "eager_w", "depth_first", "cap_counts_w", "pending_w=none", "pending_w=2", "pending_w=P",
    "budgets=unlimited", "log(time/bound)", "log(start/time)", "feasible", "memory_overflow",
    "steps_left", "last_kept", "comm_share", "head_share", "memory_tightness",
)
_CLIP = 8.0


def observation_space() -> spaces.Dict:
    """The observation space (fixed sizes; see :class:`PipelineEnv`)."""
    def box(n: int) -> spaces.Box:
        return spaces.Box(low=-_CLIP, high=_CLIP, shape=(n,), dtype=np.float32)

    return spaces.Dict({
        "layer_cost": box(MAX_LAYERS), "layer_memory": box(MAX_LAYERS),
        "stage_size": box(MAX_STAGES), "stage_time": box(MAX_STAGES), "stage_device": box(MAX_STAGES),
        "device_busy": box(MAX_DEVICES), "device_memory": box(MAX_DEVICES), "device_budget": box(MAX_DEVICES),
        "plan": box(len(GLOBAL_FEATURES)),
    })


def megatron_time(problem: Problem) -> tuple[float, int]:
    """Iteration time of the Megatron baseline and the simulator calls it took (one per chunk count)."""
    from pipeline.megatron import megatron_chunk_counts

    p = problem
    plan = build_plan("megatron", p.profile, p.cluster, microbatches=p.microbatches, training=p.training)
    res = simulate(plan, p.profile, p.cluster, training=p.training, validate=False, record_timeline=False)
    return res.iteration_time, len(megatron_chunk_counts(p.profile, p.devices, p.microbatches))


class PipelineEnv(gym.Env):
    """Improve a pipeline-parallel plan (partition, placement, schedule) by discrete edits.

    ## Description

    An episode works on one scenario: a model profile, a cluster, the micro-batches of one
    iteration and a memory limit per device (a :class:`pipeline.space.Problem`). The state is an
    editable plan description, a :class:`pipeline.space.Candidate`. The episode starts from the
    best of a small portfolio of cheap plans (a few placement families with the DP-balanced
    split under the activation budgets of the named schedules, up to 10 simulator calls; see
    :func:`env.editor.portfolio`). Each step tries one edit: the performance model simulates the
    edited plan (one simulator call); the edit is kept when the plan gets better (feasible
    first, then less memory overflow, then faster) and rolled back otherwise, as the AdaPtis
    tuner does. An edit whose outcome is already known is masked, so no step repeats a call.

    ## Action Space

    ``Discrete(183)``; :data:`env.editor.ACTIONS` names each index:

    | index   | edit                                                                          |
    |---------|-------------------------------------------------------------------------------|
    | 0       | stop                                                                          |
    | 1-63    | ``grow-left(i)``: stage ``i`` takes the first layer of stage ``i+1``          |
    | 64-126  | ``grow-right(i)``: stage ``i+1`` takes the last layer of stage ``i``          |
    | 127-133 | placement family (sequential, interleaved 2/3/4, V, wave 3/4), DP-balanced    |
    | 134     | rebalance: DP-balanced split of the current placement                         |
    | 135-150 | activation budget of device ``d`` + 1 micro-batch                             |
    | 151-166 | activation budget of device ``d`` - 1 micro-batch                             |
    | 167-168 | every device's budget + 1 / - 1                                               |
    | 169-173 | budget preset: ZB-H1, ZB-H2, ZB-V, V-Half, unlimited                          |
    | 174-177 | toggle I/W split, eager W, depth-first forwards, W counted against the cap    |
    | 178-180 | deferred-W limit: none, 2, number of devices                                  |
    | 181     | relieve-hot: one boundary layer off the busiest device's heaviest stage       |
    | 182     | feed-cold: one layer onto the idlest device's lightest stage                  |

    A masked action changes nothing, costs no simulator call, uses a step and gives
    ``-step_cost``. Illegal actions (boundaries past the last stage, devices past the cluster, a stage that
    would be empty, more stages than layers, budgets when they are unlimited, edits whose
    result is known) are masked: ``action_masks()`` (sb3-contrib's MaskablePPO) and
    ``info["action_mask"]`` (a ``np.int8`` array). Stop is always allowed.

    ## Observation Space

    A ``Dict`` of 1-D ``float32`` ``Box`` es in ``[-8, 8]``, padded with zeros to 160 layers,
    64 stages and 16 devices; times are shares or ratios so one policy serves any model scale:

    * ``layer_cost`` (160): each layer's ``f + b + w`` over the largest layer's;
    * ``layer_memory`` (160): each layer's activation bytes over the largest layer's;
    * ``stage_size`` (64): layers per stage over the mean stage size;
    * ``stage_time`` (64): each stage's time over the mean stage time;
    * ``stage_device`` (64): ``(device + 1) / devices`` of each stage;
    * ``device_busy`` (16): busy share of the iteration per device;
    * ``device_memory`` (16): peak memory over the limit per device;
    * ``device_budget`` (16): activation budget over the number of devices (0: unlimited);
    * ``plan`` (30): scenario and plan features, named in :data:`GLOBAL_FEATURES` (device and
      micro-batch counts, placement family, scheduler knobs, log iteration time over the lower
      bound, feasibility, steps left...).

    ## Rewards

    With ``T_ref`` the Megatron baseline's iteration time
    (``pipeline.schedules.build_plan("megatron", ...)``), a plan scores ``T_ref / T`` (its
    throughput relative to Megatron's) when it fits in memory, ``-1 - overflow share`` when it
    does not and ``-3`` when it is invalid. The reward of a step is the change of the score of
    the kept plan minus ``step_cost`` (default 0.002, the price of a simulator call); stop
    gives 0. The return of an episode is therefore the gain over the starting plan, in units of
    Megatron's throughput, less the calls it took.

    ## Starting State

    The best plan of the portfolio for a scenario drawn by :func:`env.scenarios.sample_problem`
    from ``self.np_random`` (seeded by ``reset(seed=...)``), or given by ``options``:
    ``{"problem": Problem}`` or ``{"profile": ModelProfile, "cluster": Cluster | int,
    "microbatches": int}``; ``{"start": Candidate | [Candidate, ...]}`` replaces the portfolio;
    ``{"evaluator": Evaluator}`` shares a simulator-call counter and cache (the RL searcher's);
    ``{"max_calls": int}`` caps the simulator calls of the episode (the portfolio included);
    ``{"reference": "megatron" | "bound"}`` (default ``megatron``) picks ``T_ref``: ``bound``
    uses the lower bound and costs no simulation (searchers use it; rewards are then scaled
    differently).

    ## Episode End

    Terminated on stop or when no edit is left; truncated after ``max_steps`` edits (default
    24) or when ``max_calls`` is spent.

    ## Info

    ``action_mask``, ``iteration_time`` (current plan), ``best_iteration_time``, ``feasible``,
    ``sim_calls`` (of the evaluator), ``reference_time``, ``kept`` (the step's edit was kept),
    ``edit`` (its name), ``candidate`` (the current Candidate) and
    ``best_plan`` (a :class:`pipeline.plan.Plan`; ``.to_dict()`` gives its JSON).

    ## Arguments

    ``gymnasium.make("adaptis/Pipeline-v0", max_steps=24, step_cost=0.002, max_calls=None,
    scenario=ScenarioConfig(), render_mode=None)``; ``max_calls`` caps every episode's simulator
    calls (``options["max_calls"]`` overrides it); ``render_mode`` ``"ansi"`` (text Gantt chart)
    or ``"rgb_array"``.

    ## Version History

    * v0: initial version (observation layout ``pipeline-v0.1``).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, *, max_steps: int = 24, step_cost: float = 0.002, max_calls: int | None = None,
                 scenario: ScenarioConfig | None = None, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.max_steps = int(max_steps)
        self.step_cost = float(step_cost)
        self.max_calls = max_calls
        self.scenario = scenario or ScenarioConfig()
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.observation_space = observation_space()
        self.editor: PlanEditor | None = None
        self.reference = 1.0
        self.steps = 0
        self._last_kept = False
        self._start_time = math.inf
        self._static: dict[str, np.ndarray] = {}
        self._consts: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        problem = _problem_from(options) or sample_problem(self.np_random, self.scenario)
        evaluator = options.get("evaluator")
        if evaluator is not None and evaluator.problem is not problem:
            problem = evaluator.problem
        ref = options.get("reference", "megatron")
        if ref == "megatron":
            self.reference = megatron_time(problem)[0]
        elif ref == "bound":
            self.reference = lower_bound(problem.profile, problem.cluster, problem.microbatches, packing=False).value
        else:
            raise ValueError(f"reference must be 'megatron' or 'bound', got {ref!r}")
        self.editor = PlanEditor(problem, evaluator=evaluator or Evaluator(problem), reference=self.reference,
                                 max_calls=options.get("max_calls", self.max_calls))
        start = options.get("start")
        if isinstance(start, Candidate):
            start = [start]
        self.editor.start(start)
        self.steps = 0
        self._last_kept = False
        self._start_time = self.editor.result.iteration_time
        self._static = self._static_features(problem)
        return self._obs(), self._info(kept=False, edit="start")

    def step(self, action):
        ed = self._editor()
        a = int(action)
        if not 0 <= a < N_ACTIONS:
            raise ValueError(f"action {action!r} is outside Discrete({N_ACTIONS})")
        if a == 0:
            return self._obs(), 0.0, True, False, self._info(kept=False, edit="stop")
        if not ed.mask()[a]:
            # A masked edit changes nothing and costs no simulator call; it still uses a step.
            self.steps += 1
            self._last_kept = False
            truncated = self.steps >= self.max_steps
            return self._obs(), -self.step_cost, False, bool(truncated), self._info(kept=False, edit="masked")
        before = score(ed.result, self.reference)
        kept, _ = ed.apply(a)
        self.steps += 1
        self._last_kept = kept
        reward = float(score(ed.result, self.reference) - before - self.step_cost)
        mask = ed.mask()
        terminated = not any(mask[1:]) and ed.budget_left()
        truncated = (self.steps >= self.max_steps or not ed.budget_left()) and not terminated
        return self._obs(), reward, bool(terminated), bool(truncated), self._info(kept=kept, edit=str(ACTIONS[a]))

    def action_masks(self) -> np.ndarray:
        """Allowed actions as a boolean array (what sb3-contrib's MaskablePPO reads)."""
        return np.asarray(self._editor().mask(), dtype=bool)

    def render(self):
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'rgb_array'")
            return None
        ed = self._editor()
        p = ed.problem
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

    def _static_features(self, problem: Problem) -> dict[str, np.ndarray]:
        layers = problem.profile.layers
        L = len(layers)
        cost = np.array([x.f + x.b + x.w for x in layers], dtype=np.float64)
        mem = np.array([x.act_bytes for x in layers], dtype=np.float64)
        out = {"layer_cost": np.zeros(MAX_LAYERS, np.float32), "layer_memory": np.zeros(MAX_LAYERS, np.float32)}
        out["layer_cost"][:L] = cost / max(cost.max(), 1e-12)
        out["layer_memory"][:L] = mem / max(mem.max(), 1e-12)
        P = problem.devices
        total = max(float(cost.sum()), 1e-12)
        comm = sum(problem.cluster.transfer_seconds(0, min(1, P - 1), x.out_bytes) for x in layers)
        static = sum(x.params for x in layers) * problem.training.bytes_per_param / P
        self._consts = (lower_bound(problem.profile, problem.cluster, problem.microbatches, packing=False).value,
                        comm / problem.profile.seconds_per_unit / total, float(cost[-1]) / total,
                        static / (sum(problem.cluster.memory_limits_bytes) / P))
        return out

    def _obs(self) -> dict[str, np.ndarray]:
        ed = self._editor()
        p, c, res = ed.problem, ed.current, ed.result
        P, M, S = p.devices, p.microbatches, c.num_stages
        obs = {k: v.copy() for k, v in self._static.items()}
        times = np.array(ed.stage_times(c))
        sizes = np.array(c.sizes, dtype=np.float64)
        z = lambda n: np.zeros(n, np.float32)  # noqa: E731
        obs["stage_size"], obs["stage_time"], obs["stage_device"] = z(MAX_STAGES), z(MAX_STAGES), z(MAX_STAGES)
        obs["stage_size"][:S] = sizes / sizes.mean()
        obs["stage_time"][:S] = times / max(times.mean(), 1e-12)
        obs["stage_device"][:S] = (np.array(c.placement) + 1) / P
        obs["device_busy"], obs["device_memory"], obs["device_budget"] = z(MAX_DEVICES), z(MAX_DEVICES), z(MAX_DEVICES)
        if res.valid:
            obs["device_busy"][:P] = np.array(res.busy) / max(res.iteration_time, 1e-12)
        obs["device_memory"][:P] = np.array(res.peak_memory) / np.array(res.memory_limit)
        if c.budgets is not None:
            obs["device_budget"][:P] = np.array(c.budgets) / P
        fam = family_of(c, P)
        onehot = [0.0] * (len(FAMILIES) + 1)
        onehot[fam] = 1.0
        mpw = c.max_pending_w
        bound, comm_share, head_share, tight = self._consts
        t = res.iteration_time if res.valid else math.inf
        over = sum(max(0.0, a - b) / b for a, b in zip(res.peak_memory, res.memory_limit))
        g = [P / MAX_DEVICES, math.log2(M) / 7, p.profile.num_layers / MAX_LAYERS, S / MAX_STAGES, M / S,
             *onehot, float(c.split_backward), float(c.eager_w), float(c.depth_first), float(c.cap_counts_w),
             float(mpw is None), float(mpw == 2), float(mpw == P), float(c.budgets is None),
             math.log(t / bound) if math.isfinite(t) and bound > 0 else _CLIP,
             math.log(self._start_time / t) if math.isfinite(t) and math.isfinite(self._start_time) else 0.0,
             float(res.feasible), min(over, _CLIP), (self.max_steps - self.steps) / self.max_steps,
             float(self._last_kept), comm_share, head_share, tight]
        obs["plan"] = np.asarray(g, dtype=np.float32)
        for k in obs:
            np.clip(obs[k], -_CLIP, _CLIP, out=obs[k])
        return obs

    def _info(self, *, kept: bool, edit: str) -> dict[str, Any]:
        ed = self._editor()
        return {
            "action_mask": np.asarray(ed.mask(), dtype=np.int8),
            "iteration_time": float(ed.result.iteration_time),
            "best_iteration_time": float(ed.best_result.iteration_time),
            "feasible": bool(ed.result.feasible),
            "sim_calls": int(ed.ev.calls),
            "reference_time": float(self.reference),
            "kept": bool(kept),
            "edit": edit,
            "candidate": ed.current,
            "best_plan": ed.best_plan,
        }


def _problem_from(options: dict[str, Any]) -> Problem | None:
    if options.get("problem") is not None:
        return options["problem"]
    if options.get("evaluator") is not None:
        return options["evaluator"].problem
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
    return Problem(profile, cluster, int(options.get("microbatches", 2 * cluster.devices)))


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

