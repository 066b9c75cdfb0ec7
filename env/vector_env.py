"""``adaptis/Pipeline-v0`` as a Gymnasium 1.x VectorEnv: N plan-editing environments stepped together.

``gymnasium.make_vec("adaptis/Pipeline-v0", num_envs=N, vectorization_mode="vector_entry_point")``
builds a :class:`PipelineVectorEnv`. It holds N :class:`env.pipeline_env.PipelineEnv` and steps
them together; the simulator calls of one step (one new plan per environment whose edit is
allowed) are scheduled and simulated in **one** native call
(:func:`pipeline.evaluator.results_across` -> :func:`pipeline.engine.schedule_and_simulate_many`, on
``engine_threads`` threads, default one), before each environment's own step finds its result
ready; the starting plans of the environments reset in that step (a reset simulates its
portfolio, up to 10 plans, and up to 2 memory repairs) join the same batch, the repairs a second
one (:meth:`env.editor.PlanEditor.starting` yields what a start surely simulates, and checks its
call budget against the one-by-one count). Everything else (masks, the edited candidates,
observations, rewards) is each environment's own code, so stepping the vector env is stepping N
single environments with the same seeds and actions: the same observations, rewards, flags,
masks, infos and simulator-call counts, in the same order (``tests/env/test_vector_env.py``
checks it against Gymnasium's ``SyncVectorEnv``). It runs on ``PipelineEnv``'s public seams only:
:meth:`~env.pipeline_env.PipelineEnv.would_simulate` (what a step will simulate),
:meth:`~env.pipeline_env.PipelineEnv.reset_rounds` and
:meth:`~env.pipeline_env.PipelineEnv.step_core` (reset and step without their observation and info),
and the evaluators' :meth:`~pipeline.evaluator.Evaluator.remembers` (a result the step adopts, not
simulated). Environments that reset / step in parts
(:attr:`~env.pipeline_env.PipelineEnv.resets_in_rounds`,
:attr:`~env.pipeline_env.PipelineEnv.steps_in_parts`) have their observations and infos stacked
column by column; a subclass that overrides a part is reset / stepped through its own ``reset`` /
``step`` (one reset after another).

* Spaces: ``single_observation_space`` / ``single_action_space`` are the single environment's
  (a ``Dict`` of ``Box`` es, ``Discrete(344)``); ``observation_space`` / ``action_space`` their
  batched versions (leading axis ``num_envs``; ``MultiDiscrete``).
* Autoreset: ``autoreset_mode`` (default ``AutoresetMode.NEXT_STEP``, in ``metadata``) as
  Gymnasium's ``SyncVectorEnv``: with ``NEXT_STEP`` an environment that ended is reset by the
  next ``step`` (its action ignored, reward 0, both flags False); ``SAME_STEP`` resets it in the
  step that ended it (``infos["final_obs"]``, ``infos["final_info"]``: what the SB3 adapter
  :mod:`agents.vec_adapter` uses); ``DISABLED`` leaves it to ``reset(options={"reset_mask": ...})``.
* Masks: :meth:`PipelineVectorEnv.action_masks` (``(num_envs, 344)`` bool) and
  ``infos["action_mask"]`` (``int8``), as the single environment's.
* Seeds: ``reset(seed=s)`` seeds environment ``i`` with ``s + i`` (a list: one seed each).
* ``render_mode`` is None (render one environment with ``vec.envs[i]``).

**The compiled core.** With the compiled engine built (``native=None``, the default, or ``True``), a
step does not run the environments' Python: the compiled environment core
(``pipeline/_native/env_core.hpp`` through :mod:`env.native_core`) holds each environment's current
and best plans, its edit table and mask and the plans its episode evaluated, applies the step's
edits, schedules and simulates the new plans in-process (on ``engine_threads`` of the engine's
persistent threads), and writes observations, rewards, flags, masks and the info columns into
arrays the step copies out; with ``engine_threads`` > 1 it steps on a side thread (the GIL
released) while the step's Python (the autoresets, environments stepped in Python) runs. Resets stay
Python's (:meth:`PipelineEnv.reset_rounds`: the scenario draw, its cost model, the portfolio), with
the starting plans simulated in one compiled batch and the DP splits compiled too, and hand their
state to the core (:func:`env.native_core.load`).
``tests/env/test_native_core.py`` holds it to the Python environment bit for bit (observations,
rewards, flags, masks, infos, simulator calls) over thousands of seeded trajectories. Episodes the
core does not port (a caller's ``options["evaluator"]``, other orders or recomputation, runtimes
with step costs, see :func:`env.native_core.unsupported`) and environments whose subclass
overrides a part step in Python as below. Stepped by the core, ``envs[i]`` keep the state their
reset left: read the episode from the infos (``candidate``, ``best_candidate``, ``sim_calls``).
``native=False`` steps every environment in Python.

**The scenario pool.** With ``scenario_pool=K`` (0, the default: none) the resets take their
scenario from a :class:`env.scenario_pool.ScenarioPool` of K prepared scenarios, each serving
``pool_reuse`` resets (default 4) before a reset that picks its slot draws its successor: the
scenario draw, its cost model, the core's table and the starting plans' simulations are paid once
per ``pool_reuse`` resets (the episodes of a scenario adopt its results as ``share_results`` has
them). Each reset's scenario keeps today's distribution (slots are picked uniformly by a generator
of their own, the draws are :func:`~env.scenarios.sample_scenario`'s, see the pool's docstring), but
up to ``pool_reuse`` episodes share one: correlated episodes. On the compiled core a scenario's
start is kept after its first reset and later resets of it are one ``EnvCore.load`` with no Python
reset (``envs[i]`` then keeps an earlier episode's state: read the episode from the infos); with
``engine_threads`` > 1 the pool's next draws are made while the core steps on its side thread (the
same draws in the same order, :meth:`ScenarioPool.prefetch`), in every step while fewer than one per
environment (at most 256) wait, so a wave of episodes that end together finds most of its scenarios
drawn and prepared; ``pool_reuse=1`` keeps a fresh scenario at every reset and still draws ahead.
Both paths use the pool alike (the same episodes, step for step); ``reset(seed=...)`` empties and
reseeds it, so seeded runs repeat. With ``pool_workers=N`` (0, the default: none) N processes make
the pool's draws ahead (:mod:`env.reset_worker`: the draw, its cost model, preparation and starting
plans' simulations, about 1.2 ms a scenario), and an autoreset here is the table's build and one
``EnvCore.load`` (about 0.1 ms): the same episodes, step for step, as without them. It needs the
compiled core and plain ``PipelineEnv`` environments of one setting; a script that uses it needs
the ``if __name__ == "__main__":`` guard (the workers are spawned); ``close()`` stops them. A seeded
reset resets every environment here (it seeds them) and draws its scenarios itself, at once.
Environments whose ``reset`` is their own, whose ``ScenarioConfig`` is not the first environment's,
and resets whose options name a scenario, reset as without a pool; an environment's
``repeat_scenario`` keeps its pooled scenario that many resets.

Over 600 lines: the step runs two paths side by side (the compiled core's and Python's), each
environment on one of them, and their infos and observations meet here.

The Python path: everything but the batched simulations (the edited candidates and their stage
costs, the scenario draw, cost model and DP splits at reset) runs one environment after another.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from env import native_core
from env.editor import portfolio
from env.pipeline_env import PipelineEnv, round_to_simulate
from env.reset_worker import StartSpec, portfolio_start
from env.scenario_pool import PoolEntry, ScenarioPool
from pipeline import engine
from pipeline.candidates import Candidate
from pipeline.evaluator import Evaluator, results_across

__all__ = ["PipelineVectorEnv", "check_room", "BYTES_PER_ENV"]

#: The observation's entries in the order of ``PipelineEnv.observation_parts``.
_PARTS = ("stages", "devices", "plan")
#: Pool entries drawn ahead at most (while the compiled core steps on its side thread): one per
#: environment up to this many (a wave of episodes ending together finds its scenarios drawn).
_AHEAD = 256
#: The interpreter's thread switch interval while the pool draws beside the core's step (Python's 5 ms
#: default would keep the core's thread waiting that long for the GIL to start and to end its step).
_SWITCH_S = 1e-4
#: Reset worker processes at most (``pool_workers``).
_WORKERS = 8
#: Reset options that name the episode's scenario (the pool does not replace it).
_NAMES_SCENARIO = ("scenario", "problem", "profile", "evaluator")
#: ``info["edit"]`` by ``EnvCore.edits`` code + 2 (-2 masked, -1 stop, else the action).
_EDIT_NAMES = np.array(["masked", "stop", *native_core.EDIT_NAMES], dtype=object)
#: Memory one environment may take, bytes: about 0.3 MiB measured after 30 steps of ``default``
#: (256 environments: 110 MiB RSS, 1,024: 315 MiB), with room for scenarios of 32 devices.
BYTES_PER_ENV = 2**20


def _available_bytes() -> int | None:
    """Memory the kernel says a new allocation can take (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_room(num_envs: int) -> None:
    """Refuse ``num_envs`` environments the machine's available memory cannot hold (a ValueError
    naming the largest number that fits); nothing where the memory is unknown."""
    room = _available_bytes()
    if room is not None and num_envs * BYTES_PER_ENV > room:
        raise ValueError(f"num_envs={num_envs} needs about {num_envs * BYTES_PER_ENV / 2**30:.1f} GiB "
                         f"(~{BYTES_PER_ENV / 2**20:.0f} MiB per environment) but {room / 2**30:.1f} GiB is available; "
                         f"use num_envs <= {max(1, room // BYTES_PER_ENV)}")


class PipelineVectorEnv(VectorEnv):
    """``num_envs`` :class:`~env.pipeline_env.PipelineEnv` stepped together (see the module docstring).

    ``PipelineVectorEnv(num_envs, *, autoreset_mode=AutoresetMode.NEXT_STEP, **kwargs)``: ``kwargs``
    are the single environment's arguments (``max_steps``, ``max_calls``, ``scenario``,
    ``repeat_scenario``, ``single_start_share``, ``share_results``, ``allow_stop``...), the same
    for every environment; or ``env_factory``, a callable that returns one new ``PipelineEnv``
    (a subclass with a fixed scenario, say) per environment. ``engine_threads``: threads of the
    native batch and of the compiled core's steps (default 1: the engine keeps its helper threads from
    batch to batch, but on a machine whose cores are busy a second thread that waits for a core holds
    up the whole step; 2 pays on idle cores; with ``pool_workers`` the core's step runs on this thread
    and the engine's, not beside the autoresets). ``pause_gc`` (default True): no cyclic garbage
    collection inside a step (see :attr:`pause_gc`). ``native``: step on the compiled environment
    core (None: where it is built; True: a ValueError where it is not; False: in Python; see the
    module docstring). ``scenario_pool``: resets take their scenario from a pool of that many prepared
    scenarios, each serving ``pool_reuse`` resets (:class:`env.scenario_pool.ScenarioPool`; 0, the default:
    a fresh draw at every reset, see the module docstring); ``pool_workers``: processes that make the
    pool's draws and their starts ahead (:mod:`env.reset_worker`; 0, the default: this process does).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, *, autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
                 render_mode: str | None = None, max_episode_steps: int | None = None,
                 env_factory: Callable[[], PipelineEnv] | None = None, engine_threads: int = 1,
                 pause_gc: bool = True, native: bool | None = None, scenario_pool: int = 0, pool_reuse: int = 4,
                 pool_workers: int = 0, **env_kwargs: Any) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a whole number >= 1, got {num_envs!r}")
        check_room(int(num_envs))
        if render_mode is not None:
            raise ValueError(f"{type(self).__name__} does not render (render_mode must be None, got {render_mode!r}); "
                             "render one environment with vec.envs[i]")
        if max_episode_steps is not None:
            env_kwargs.setdefault("max_steps", max_episode_steps)
        try:
            mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, "
                             f"got {autoreset_mode!r}") from None
        if isinstance(engine_threads, bool) or not isinstance(engine_threads, (int, np.integer)) or engine_threads < 1:
            raise ValueError(f"engine_threads must be a whole number >= 1, got {engine_threads!r}")
        self.num_envs = int(num_envs)
        self.engine_threads = int(engine_threads)
        self.pause_gc = bool(pause_gc)
        """Hold Python's cyclic garbage collector off during :meth:`step` (on again, if it was, when
        the step returns, so what a step leaves is collected after it): a step allocates tens of
        thousands of short-lived objects, and the young-generation passes they set off cost about
        a tenth of the step (``default``, 256 environments). Collection stays on between steps."""
        if env_factory is not None and env_kwargs:
            raise ValueError(f"pass the environments' arguments to env_factory, not beside it: {sorted(env_kwargs)}")
        make = env_factory if env_factory is not None else (lambda: PipelineEnv(**env_kwargs))
        self.envs = [make() for _ in range(self.num_envs)]
        if not all(isinstance(e, PipelineEnv) for e in self.envs):
            raise TypeError("env_factory must return PipelineEnv instances (a subclass is fine)")
        self.autoreset_mode = mode
        self.metadata = {**type(self).metadata, "autoreset_mode": mode}
        self.render_mode = None
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._keys = tuple(self.single_observation_space.spaces)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._obs: list[tuple[np.ndarray, ...] | None] = [None] * self.num_envs
        """Each environment's observation, its arrays in ``_PARTS`` order (never to be written)."""
        # Environments that step / reset in parts run them here (the others through step / reset).
        self._plain_step = [e.steps_in_parts for e in self.envs]
        self._plain_reset = [e.resets_in_rounds for e in self.envs]
        self._plain_masks = all(self._plain_step)
        self._sim_seconds = self._reset_seconds = 0.0
        if native not in (None, True, False):
            raise ValueError(f"native must be None (auto), True or False, got {native!r}")
        self._core = None if native is False else engine.env_core(self.num_envs, threads=self.engine_threads)
        if native and self._core is None:
            raise ValueError("native=True needs the compiled engine with its environment core: run 'make engine' "
                             "(or pass native=None to step in Python without it)")
        self._can_native = [p and r for p, r in zip(self._plain_step, self._plain_reset)]
        self._pool = self._make_pool(scenario_pool, pool_reuse, pool_workers)
        self._ahead_limit = min(self.num_envs, _AHEAD)
        self._pool_ok = [r and self._pool is not None and e.scenario == self._pool.config
                         for r, e in zip(self._plain_reset, self.envs)]
        self._held: list[list[Any] | None] = [None] * self.num_envs
        """Each environment's pooled scenario and the resets it served (its ``repeat_scenario``)."""
        self._native = np.zeros(self.num_envs, dtype=bool)
        """Environments whose episode the compiled core steps (:mod:`env.native_core`; set at each reset)."""
        self._side_thread: ThreadPoolExecutor | None = None
        self._native_seconds = 0.0
        # the core's current / best candidates as objects, and the versions they were built at
        self._cands = {b: (np.full(self.num_envs, None, dtype=object), np.zeros(self.num_envs, dtype=np.uint64))
                       for b in (False, True)}
        self.batched_calls = 0
        """Native batches run by :meth:`step`: the Python path's batches of simulations, the compiled
        core's steps and its batches of starting plans."""
        self.timings = {"step": 0.0, "prefetch": 0.0, "resets": 0.0, "native": 0.0}
        """Seconds spent in :meth:`step`, in its batched simulations (the edited candidates' and the
        starting plans' stage costs and the native calls) and in its autoresets less those
        simulations (the scenario draw, cost model, DP splits, first masks), and in the compiled core's
        steps (``native``): where a step's time goes."""

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every environment (or those of ``options["reset_mask"]``); seeds as ``SyncVectorEnv``."""
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={n}")
        options = dict(options) if options else {}
        if self._pool is not None and any(s is not None for s in seeds):
            self._pool.seed([s for s in seeds if s is not None])
            self._held = [None] * n
        mask = options.pop("reset_mask", None)
        if mask is None:
            which = list(range(n))
            self._obs = [None] * n
        else:
            mask = np.asarray(mask)
            if mask.shape != (n,) or mask.dtype != np.bool_ or not mask.any():
                raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},) with a True, "
                                 f"got {mask!r}")
            which = np.flatnonzero(mask).tolist()
        # One evaluator handed to every environment counts their calls in turn: one reset after another.
        infos = self._resets(which, seeds=seeds, options=options or None, batched="evaluator" not in options)
        self._autoreset[which] = False
        if any(o is None for o in self._obs):
            raise ValueError("reset with a reset_mask before every environment was reset once: call reset() first")
        return self._batch_obs(), self._infos(infos)

    def step(self, actions):
        if not (self.pause_gc and gc.isenabled()):
            return self._step_all(actions)
        gc.disable()  # see pause_gc
        try:
            return self._step_all(actions)
        finally:
            gc.enable()

    def _step_all(self, actions):
        n = self.num_envs
        acts = np.asarray(actions)
        if acts.shape != (n,):
            raise ValueError(f"step takes one action per environment, shape ({n},), got shape {acts.shape}")
        if acts.dtype.kind not in "iu":
            whole = acts.dtype.kind == "f" and bool(np.all(np.isfinite(acts) & (acts == np.round(acts))))
            if not whole:
                raise ValueError(f"actions must be whole numbers in [0, {self.single_action_space.n}) (an integer "
                                 f"array of shape ({n},)), got dtype {acts.dtype}: {acts[:4].tolist()}")
        mode = self.autoreset_mode
        next_step = mode == AutoresetMode.NEXT_STEP
        n_actions = self.single_action_space.n
        out_of_range = ((acts < 0) | (acts >= n_actions)) & ~(self._autoreset if next_step else False)
        if out_of_range.any():  # before any environment steps (an ending one's action is ignored)
            bad = acts[np.flatnonzero(out_of_range)[0]].item()
            raise ValueError(f"action {bad!r} is outside Discrete({n_actions})")
        acts = acts.astype(np.int64, copy=False).tolist()
        if mode == AutoresetMode.DISABLED and self._autoreset.any():
            raise ValueError(f"environments {np.flatnonzero(self._autoreset).tolist()} ended: reset them "
                             "(options={'reset_mask': ...}) before stepping with autoreset_mode=Disabled")
        t0 = time.perf_counter()
        self._sim_seconds = self._reset_seconds = 0.0
        info_of: dict[int, dict[str, Any] | tuple[bool, str]] = {}
        ending = np.flatnonzero(self._autoreset).tolist() if next_step else []
        native = self._native & ~self._autoreset if next_step else self._native.copy()
        stepping = self._requests(acts, skip=(self._autoreset | native) if next_step else native)
        core, stepped = self._core, None
        ahead = self._pool is not None and self._pool.ahead < self._ahead_limit  # the pool has room to draw ahead
        beside = bool(ending or stepping or ahead)
        if self._pool is not None and self._pool.worker is not None:
            # A reset worker draws ahead and an autoreset here is a load: a side thread's hand-offs cost
            # more than they overlap (256 environments on 2 cores: 22,200-24,300 env-steps/s against
            # 25,200-30,000 stepping on the engine's threads here). Python-stepped environments still pay.
            beside = bool(stepping)
        if native.any() and self.engine_threads > 1 and beside:
            # the core's step (no GIL) beside the autoresets' and the other environments' Python
            t1 = time.perf_counter()
            stepped = self._side().submit(engine.env_step, core, np.asarray(acts, dtype=np.int64), native,
                                          threads=self.engine_threads - 1)
            self._native_seconds = time.perf_counter() - t1
        try:
            if ending:  # their starting plans join the step's batch
                info_of.update(self._resets(ending, seeds=None, options=None, batched=True, with_batch=stepping))
            else:
                self._simulate(stepping)
        except BaseException:
            if stepped is not None:
                stepped.exception()  # the core is not left stepping behind the error
            raise
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=bool)
        truncs = np.zeros(n, dtype=bool)
        obs = self._obs
        plain = self._plain_step
        skip = set(ending)
        same_step = mode == AutoresetMode.SAME_STEP
        finals: list[tuple[int, dict[str, np.ndarray], dict[str, Any]]] = []
        if native.any():
            t1 = time.perf_counter()
            if stepped is None:
                engine.env_step(core, np.asarray(acts, dtype=np.int64), native)
            else:
                if self._pool is not None:  # the next scenarios, drawn while the core steps
                    switch = sys.getswitchinterval()
                    if switch > _SWITCH_S:  # (another vector env's step may have lowered it: left to that one)
                        sys.setswitchinterval(_SWITCH_S)
                    try:
                        self._pool.prefetch(lambda: not stepped.done(), limit=self._ahead_limit,
                                            prepare=self._prepare)
                    finally:
                        if switch > _SWITCH_S:
                            sys.setswitchinterval(switch)
                stepped.result()
            self.batched_calls += 1
            rewards[native] = core.rewards[native]
            terms[native] = core.terminated[native]
            truncs[native] = core.truncated[native]
            kept, edits = core.kept.tolist(), _EDIT_NAMES[core.edits + 2].tolist()
            for i in np.flatnonzero(native).tolist():
                info = (kept[i], edits[i])
                if same_step and (terms[i] or truncs[i]):
                    info = self._info_of(i, info)  # before the reset changes its state
                    finals.append((i, {k: v.copy() for k, v in zip(_PARTS, obs[i])}, info))
                info_of[i] = info
            skip.update(np.flatnonzero(native).tolist())
            tm_native = time.perf_counter() - t1 + (self._native_seconds if stepped is not None else 0.0)
        else:
            tm_native = 0.0
        for i, env in enumerate(self.envs):
            if i in skip:
                continue
            if plain[i]:
                rewards[i], terms[i], truncs[i], kept, edit = env.step_core(acts[i])
                obs[i] = env.observation_parts()
                info = (kept, edit)  # the info is read from the environment's state once every one stepped
            else:
                o, rewards[i], terms[i], truncs[i], info = env.step(acts[i])
                obs[i] = tuple(o[k] for k in _PARTS)
            if same_step and (terms[i] or truncs[i]):
                info = self._info_of(i, info)  # before the reset changes its state
                finals.append((i, {k: v.copy() for k, v in zip(_PARTS, obs[i])}, info))
            info_of[i] = info
        if finals:
            info_of.update(self._resets([i for i, _, _ in finals], seeds=None, options=None, batched=True))
        self._autoreset = terms | truncs
        out = self._infos([(i, info_of[i]) for i in range(n)])
        if finals:
            final_obs = np.full(n, None, dtype=object)
            for i, o, _ in finals:
                final_obs[i] = o
            out["final_obs"] = final_obs
            out["_final_obs"] = np.isin(np.arange(n), [i for i, _, _ in finals])
            out["final_info"] = self._batch_infos([(i, info) for i, _, info in finals])
            out["_final_info"] = out["_final_obs"].copy()
        batch = self._batch_obs()
        tm = self.timings
        tm["step"] += time.perf_counter() - t0
        tm["prefetch"] += self._sim_seconds
        tm["resets"] += self._reset_seconds
        tm["native"] += tm_native
        return batch, rewards, terms, truncs, out

    def action_masks(self) -> np.ndarray:
        """Allowed actions of every environment, ``(num_envs, 344)`` bool (MaskablePPO's masks)."""
        envs = self.envs
        if self._core is not None and self._native.any():
            masks = self._core.masks.copy()
            for i in np.flatnonzero(~self._native).tolist():
                masks[i] = envs[i].action_masks(copy=False)
            return masks
        if self._plain_masks:  # PipelineEnv.action_masks copies the editor's mask: one copy, the stack
            return np.stack([env.action_masks(copy=False) for env in envs])
        return np.stack([env.action_masks() for env in envs])

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        if self._pool is not None:
            self._pool.close()
        if self._side_thread is not None:
            self._side_thread.shutdown(wait=True)
            self._side_thread = None

    @property
    def scenario_pool(self) -> ScenarioPool | None:
        """The pool the resets take their scenarios from (None: a fresh draw at every reset)."""
        return self._pool

    def _make_pool(self, size: int, reuse: int, workers: int) -> ScenarioPool | None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"scenario_pool must be a whole number >= 0 (0: no pool), got {size!r}")
        if isinstance(reuse, bool) or not isinstance(reuse, (int, np.integer)) or reuse < 1:
            raise ValueError(f"pool_reuse must be a whole number >= 1, got {reuse!r}")
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or not 0 <= workers <= _WORKERS:
            raise ValueError(f"pool_workers must be a whole number in [0, {_WORKERS}] (0: resets in this process), "
                             f"got {workers!r}")
        if workers and not size:
            raise ValueError("pool_workers prepare the scenario pool's draws: pass scenario_pool > 0 too")
        spec = self._worker_spec() if workers else None
        return ScenarioPool(int(size), reuse=reuse, config=self.envs[0].scenario, worker=spec, workers=max(1, workers),
                            worker_ahead=min(self.num_envs, _AHEAD)) if size else None

    def _worker_spec(self) -> StartSpec:
        """The episode settings the reset worker prepares (every environment's: they must agree)."""
        if self._core is None:
            raise ValueError("pool_workers prepare starts for the compiled core: build it ('make engine') or "
                             "pass pool_workers=0")
        if any(type(e) is not PipelineEnv for e in self.envs):
            raise ValueError("pool_workers need plain PipelineEnv environments (a subclass may reset its own "
                             "way): pass pool_workers=0")
        e = self.envs[0]
        settings = [(x.max_steps, x.step_cost, x.max_calls, x.allow_stop, x.share_results, x.single_start_share,
                     x.scenario) for x in self.envs]
        if any(s != settings[0] for s in settings):
            raise ValueError("pool_workers need environments of one setting (max_steps, step_cost, max_calls, "
                             "allow_stop, share_results, single_start_share, scenario): pass pool_workers=0")
        share = e.single_start_share
        singles = tuple(s for s, on in ((False, share < 1.0), (True, share > 0.0)) if on)
        return StartSpec(e.max_steps, e.step_cost, e.max_calls, e.allow_stop, e.share_results, singles)

    def _prepare(self, entry: PoolEntry) -> None:
        """Build what the resets of a pool entry drawn ahead will need: the compiled core's table, the
        portfolio (its starting plans are simulated with the step's resets, beside the core's step)."""
        prep = entry.prep
        if self._core is not None:
            native_core.scenario_table(prep)
        if prep.portfolio is None:
            prep.portfolio = portfolio(entry.scenario, lambda placement: native_core.balanced_of(prep, placement))

    def _pooled(self, i: int, seed: int | None, options: dict[str, Any] | None) -> PoolEntry | None:
        """Environment ``i``'s pool entry for this reset (held for the environment's ``repeat_scenario``
        resets, anew on a seed, as its own draw is), or None: no pool, or ``options`` name a scenario."""
        if not self._pool_ok[i] or (options and any(options.get(k) is not None for k in _NAMES_SCENARIO)):
            return None
        held = self._held[i]
        if seed is not None or held is None or held[1] >= self.envs[i].repeat_scenario:
            held = self._held[i] = [self._pool.take(started=seed is None), 0]
        held[1] += 1
        return held[0]

    def _start_key(self, i: int, seed: int | None, options: dict[str, Any] | None) -> tuple | None:
        """What the compiled core's start of environment ``i`` depends on beside its scenario, or None
        where a kept start cannot serve it (options; a seeded reset's random start). The draw of the
        start's kind is :meth:`PipelineEnv.draw_single_start`, drawn here instead of in the reset."""
        env = self.envs[i]
        if options or self._core is None or not self._can_native[i]:
            return None
        single = False
        if env.single_start_share:
            if seed is not None:  # (the reset reseeds the generator the kind is drawn from)
                return None
            single = env.draw_single_start()
        return env.max_steps, env.step_cost, env.max_calls, env.allow_stop, single

    def _load_kept(self, i: int, entry: PoolEntry, key: tuple | None, loads: list[tuple[int, Any]]) -> bool:
        """Start environment ``i``'s episode in the compiled core from ``entry``'s kept start (no Python
        reset: ``envs[i]`` keeps an earlier episode's state but for its ``reference``), appended to
        ``loads`` for one ``EnvCore.load_starts`` of the step's autoresets; False where there is none."""
        kept = entry.starts.get(key) if key is not None else None
        if kept is None:
            return False
        start, reference = kept
        if type(start) is tuple:  # load's arguments, kept by a first reset here: parsed once, for every reuse
            start = engine.env_start(start)
            entry.starts[key] = (start, reference)
        loads.append((i, start))
        self.envs[i].reference = reference
        self._native[i] = True
        self._obs[i] = (self._core.stages[i], self._core.devices[i], self._core.plan[i])
        return True

    def _compiled_start(self, i: int, entry: PoolEntry, key: tuple) -> None:
        """Keep on ``entry`` the portfolio start of environment ``i``'s settings ``key`` made in the compiled
        engine (:func:`env.reset_worker.portfolio_start`, the Python reset's bit for bit), so that the
        reset is one ``EnvCore.load_start``; nothing where it does not port (the Python reset runs)."""
        env = self.envs[i]
        if type(env) is not PipelineEnv:  # (a subclass may reset its own way)
            return
        start = portfolio_start(entry.prep, max_calls=env.max_calls, max_steps=env.max_steps,
                                step_cost=env.step_cost, allow_stop=env.allow_stop)
        if start is not None:
            entry.starts[key] = start

    def _side(self) -> ThreadPoolExecutor:
        """The thread the compiled core steps on while the step's Python runs (``engine_threads`` > 1)."""
        if self._side_thread is None:
            self._side_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-core")
        return self._side_thread

    # ------------------------------------------------------------------ batching

    def _resets(self, which: list[int], *, seeds: list[int | None] | None, options: dict[str, Any] | None,
                batched: bool, with_batch: list[tuple[Evaluator, Candidate]] | None = None
                ) -> list[tuple[int, dict[str, Any] | tuple[bool, str]]]:
        """Reset the environments ``which`` (their observations into ``self._obs``) and return their
        infos (or ``(kept, edit)``, read by :meth:`_infos`); with ``batched``, the starting plans of
        all of them are simulated in native batches (:meth:`env.pipeline_env.PipelineEnv.reset_rounds`),
        the first one together with ``with_batch`` (a step's edited plans)."""
        t0, sims = time.perf_counter(), self._sim_seconds
        infos: dict[int, dict[str, Any] | tuple[bool, str]] = {}
        runs: list[tuple[int, Iterator[list[Candidate]]]] = []
        keep: dict[int, tuple[PoolEntry, tuple]] = {}  # pooled resets whose start the entry is to keep
        loads: list[tuple[int, Any]] = []  # kept starts, loaded together (on the engine's threads)
        for i in which:
            env, seed = self.envs[i], None if seeds is None else seeds[i]
            opts = options
            entry = None if self._pool is None else self._pooled(i, seed, options)
            if entry is not None:
                key = self._start_key(i, seed, options)
                if seed is None and key is not None and not key[-1] and key not in entry.starts:
                    self._compiled_start(i, entry, key)
                if seed is None and self._load_kept(i, entry, key, loads):  # (a seeded reset seeds envs[i] too)
                    infos[i] = (False, "start")
                    continue
                opts = {**(options or {}), "scenario": entry.scenario}
                if key is not None:
                    keep[i] = (entry, key)
                    if env.single_start_share and seed is None:  # the kind _start_key drew
                        opts["start"] = "single" if key[-1] else "portfolio"
            if batched and self._plain_reset[i]:
                runs.append((i, env.reset_rounds(seed=seed, options=opts)))
            else:
                o, infos[i] = env.reset(seed=seed, options=opts)
                self._obs[i] = tuple(o[k] for k in _PARTS)
                self._unload(i)
        if loads:
            self._core.load_starts([i for i, _ in loads], [s for _, s in loads], threads=self.engine_threads)
        first = list(with_batch or ())
        while runs or first:
            requests, natives = self._advance(runs)
            if natives:  # the compiled core's scenarios: their starting plans on the engine, no Python costs
                t1 = time.perf_counter()
                self.batched_calls += 1
                requests += native_core.evaluate(natives, threads=self.engine_threads)
                self._sim_seconds += time.perf_counter() - t1
            self._simulate(first + requests)
            first = []
        core = self._core
        for i in which:
            if i not in infos:
                args = native_core.load(core, i, self.envs[i]) if core is not None and self._can_native[i] else None
                if args is not None:
                    if i in keep:
                        entry, key = keep[i]
                        entry.starts[key] = (args, float(self.envs[i].reference))
                    self._native[i] = True
                    self._obs[i] = (core.stages[i], core.devices[i], core.plan[i])
                else:
                    self._unload(i)
                    self._obs[i] = self.envs[i].observation_parts()
                infos[i] = (False, "start")
        self._reset_seconds += time.perf_counter() - t0 - (self._sim_seconds - sims)
        return [(i, infos[i]) for i in which]

    def _unload(self, i: int) -> None:
        """Environment ``i`` steps in Python (its episode is not the compiled core's)."""
        if self._native[i]:
            self._native[i] = False
            self._core.deactivate(i)

    def _advance(self, runs: list[tuple[int, Iterator[list[Candidate]]]]
                 ) -> tuple[list[tuple[Evaluator, Candidate]], list[tuple[Evaluator, Candidate, Any]]]:
        """Run each reset to its next round of simulations (dropping those that finished) and
        return what that round will simulate (:func:`env.pipeline_env.round_to_simulate`); those of
        environments the compiled core may step apart, with their scenario's preparation."""
        requests: list[tuple[Evaluator, Candidate]] = []
        natives: list[tuple[Evaluator, Candidate, Any]] = []
        done = []
        for k, (i, run) in enumerate(runs):
            try:
                hint = next(run)
            except StopIteration:
                done.append(k)
                continue
            env = self.envs[i]
            ev = env.editor.ev
            prep = env.episode_state()["prep"] if self._core is not None and self._can_native[i] else None
            for t in round_to_simulate(ev, hint):
                if prep is not None:
                    natives.append((ev, t, prep))
                else:
                    requests.append((ev, t))
        for k in reversed(done):
            del runs[k]
        return requests, natives

    def _requests(self, acts: list[int], *, skip: np.ndarray | None) -> list[tuple[Evaluator, Candidate]]:
        """The new plan each environment's step will simulate (:meth:`PipelineEnv.would_simulate`:
        the target of an allowed edit, neither known nor remembered by its evaluator). Simulating
        it beforehand (:meth:`_simulate`), on the environment's own evaluator, counts and caches the
        call the step would make, so the step finds it ready and nothing else changes."""
        requests: list[tuple[Evaluator, Candidate]] = []
        for i, env in enumerate(self.envs):
            if skip is not None and skip[i]:
                continue
            hit = env.would_simulate(acts[i])
            if hit is not None:
                requests.append(hit)
        return requests

    def _simulate(self, requests: list[tuple[Evaluator, Candidate]]) -> None:
        """Simulate ``requests`` in one native batch, each on its evaluator, which counts, caches
        and remembers it as its ``result`` would (:func:`pipeline.evaluator.results_across`)."""
        if not requests:
            return
        t0 = time.perf_counter()
        self.batched_calls += 1
        results_across(requests, threads=self.engine_threads)
        self._sim_seconds += time.perf_counter() - t0

    def _batch_obs(self) -> dict[str, np.ndarray]:
        obs = self._obs
        core = self._core
        if core is None or not self._native.any():
            return {k: np.stack([o[_PARTS.index(k)] for o in obs]) for k in self._keys}
        out = {k: getattr(core, k).copy() for k in self._keys}  # the core's rows, the Python ones over them
        for i in np.flatnonzero(~self._native).tolist():
            for k in self._keys:
                out[k][i] = obs[i][_PARTS.index(k)]
        return out

    def _info_of(self, i: int, info: dict[str, Any] | tuple[bool, str]) -> dict[str, Any]:
        """Environment ``i``'s info dict (``info`` itself, or built from its ``(kept, edit)``)."""
        if isinstance(info, dict):
            return info
        if not self._native[i]:
            return self.envs[i].info(kept=info[0], edit=info[1])
        core = self._core
        return {"action_mask": core.masks[i].astype(np.int8), "iteration_time": float(core.iteration_time[i]),
                "best_iteration_time": float(core.best_iteration_time[i]), "feasible": bool(core.feasible[i]),
                "sim_calls": int(core.sim_calls[i]), "reference_time": float(self.envs[i].reference),
                "kept": bool(info[0]), "edit": info[1], "candidate": self._candidate(i, best=False),
                "best_candidate": self._candidate(i, best=True)}

    def _candidate(self, i: int, *, best: bool) -> Candidate:
        """Environment ``i``'s current (or best) candidate in the compiled core, built once per change."""
        core = self._core
        col, seen = self._cands[best]
        version = (core.best_version if best else core.version)[i]
        if seen[i] != version:
            col[i] = native_core.candidate_of(core.candidate(i, best))
            seen[i] = version
        return col[i]

    def _candidates(self, *, best: bool) -> np.ndarray:
        """Every environment's current (or best) candidate, an object array: the core's rebuilt where
        they changed, the others' read from their editors."""
        core, nat = self._core, self._native
        col, seen = self._cands[best]
        versions = core.best_version if best else core.version
        for i in np.flatnonzero(nat & (versions != seen)).tolist():
            col[i] = native_core.candidate_of(core.candidate(i, best))
            seen[i] = versions[i]
        out = col.copy()
        for i in np.flatnonzero(~nat).tolist():
            ed = self.envs[i].editor
            out[i] = ed.best if best else ed.current
        return out

    def _infos(self, items: list[tuple[int, dict[str, Any] | tuple[bool, str]]]) -> dict[str, Any]:
        """The vector infos of ``items``: built column by column when every environment gave
        ``(kept, edit)``, as :meth:`_batch_infos` builds them from ``PipelineEnv.info`` dicts."""
        n = self.num_envs
        if [i for i, _ in items] != list(range(n)) or not all(type(info) is tuple for _, info in items):
            return self._batch_infos([(i, self._info_of(i, info)) for i, info in items])
        eds = [env.editor for env in self.envs]

        def objects(values: list[Any]) -> np.ndarray:
            col = np.empty(n, dtype=object)
            col[:] = values
            return col

        if self._core is not None and self._native.any():
            cols = self._native_infos(items, objects)
        else:
            cols = self._python_infos(items, eds, objects)
        out: dict[str, Any] = {}
        for key, col in cols.items():
            out[key] = col
            out[f"_{key}"] = np.ones(n, dtype=bool)
        return out

    def _native_infos(self, items: list[tuple[int, tuple[bool, str]]], objects: Callable) -> dict[str, np.ndarray]:
        """The info columns of every environment, the compiled core's from its arrays."""
        core, nat = self._core, self._native
        cols = {"action_mask": self.action_masks().astype(np.int8),
                "iteration_time": core.iteration_time.copy(), "best_iteration_time": core.best_iteration_time.copy(),
                "feasible": core.feasible.copy(), "sim_calls": core.sim_calls.astype(int)}
        for i in np.flatnonzero(~nat).tolist():
            ed = self.envs[i].editor
            cols["iteration_time"][i] = float(ed.result.iteration_time)
            cols["best_iteration_time"][i] = float(ed.best_result.iteration_time)
            cols["feasible"][i] = bool(ed.result.feasible)
            cols["sim_calls"][i] = int(ed.ev.calls)
        cols["reference_time"] = np.array([float(env.reference) for env in self.envs], dtype=float)
        cols["kept"] = np.array([bool(info[0]) for _, info in items], dtype=bool)
        cols["edit"] = objects([info[1] for _, info in items])
        cols["candidate"] = self._candidates(best=False)
        cols["best_candidate"] = self._candidates(best=True)
        return cols

    def _python_infos(self, items: list[tuple[int, tuple[bool, str]]], eds: list[Any],
                      objects: Callable) -> dict[str, np.ndarray]:
        """The info columns of every environment, read from their editors."""
        return {
            "action_mask": np.stack([ed.mask() for ed in eds]).astype(np.int8),
            "iteration_time": np.array([float(ed.result.iteration_time) for ed in eds], dtype=float),
            "best_iteration_time": np.array([float(ed.best_result.iteration_time) for ed in eds], dtype=float),
            "feasible": np.array([bool(ed.result.feasible) for ed in eds], dtype=bool),
            "sim_calls": np.array([int(ed.ev.calls) for ed in eds], dtype=int),
            "reference_time": np.array([float(env.reference) for env in self.envs], dtype=float),
            "kept": np.array([bool(info[0]) for _, info in items], dtype=bool),
            "edit": objects([info[1] for _, info in items]),
            "candidate": objects([ed.current for ed in eds]),
            "best_candidate": objects([ed.best for ed in eds]),
        }

    def _batch_infos(self, items: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """Gymnasium's vector info layout (what ``VectorEnv._add_info`` builds, faster): each key an
        array over the environments and ``_key`` a bool array of those that have it."""
        n = self.num_envs
        out: dict[str, Any] = {}
        if not items:
            return out
        keys = items[0][1].keys()
        if any(info.keys() != keys for _, info in items):  # infos of different shapes: the general path
            for i, info in items:
                out = self._add_info(out, info, i)
            return out
        idx = [i for i, _ in items]
        full = len(items) == n
        for key, first in items[0][1].items():
            values = [info[key] for _, info in items]
            if key == "final_obs" or isinstance(first, dict):
                for i, v in zip(idx, values):
                    out = self._add_info(out, {key: v}, i)
                continue
            kind = type(first)
            if kind in (int, float, bool) or isinstance(first, np.number):
                col = np.array(values, dtype=kind)
            elif isinstance(first, np.ndarray):
                col = np.stack(values).astype(first.dtype, copy=False)
            else:
                col = np.empty(len(values), dtype=object)
                for j, v in enumerate(values):
                    col[j] = v
            if full:
                arr, present = col, np.ones(n, dtype=bool)
            else:
                shape = (n, *col.shape[1:])
                arr = np.full(n, None, dtype=object) if col.dtype == object else np.zeros(shape, col.dtype)
                arr[idx] = col
                present = np.zeros(n, dtype=bool)
                present[idx] = True
            out[key] = arr
            out[f"_{key}"] = present
        return out
