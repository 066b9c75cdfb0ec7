"""Env-steps/s of the batched environment beside the single one and SubprocVecEnv, and PPO training
steps/s on it beside today's training path, measured side by side in one run (issue 27).

Environment rows (random allowed actions from the masks, stop only where nothing else is left, as
:func:`experiments.benchmarks.env_speed.measure` does): for each case of :mod:`env_speed`
(``default``: ``make("adaptis/Pipeline-v0")``'s defaults, a new scenario at every reset;
``small-fresh``: one small scenario, every new plan simulated), the single environment and 2
SubprocVecEnv workers (``env_speed.measure``), then :class:`env.vector_env.PipelineVectorEnv`
with each of ``--sizes`` environments (and ``--two-threads`` sizes again with the native batch on
two threads); a vector row also gives its steps per second of the process's CPU time, which other
work on a shared machine disturbs less than the wall clock. Each figure is the median of ``--repeats`` runs, the runs
interleaved (every configuration once, then again) so a change of the machine's load hits all
alike. A vector row also says where its step's time went: the batched simulations (edited
candidates, stage costs, the one native call) and the autoresets (the scenario draw and its cost
model, the starting plans), and what the engine took (:func:`pipeline.engine.clocked`: its share,
microseconds and jobs per env-step, and the env-steps/s the engine alone would allow, the ceiling
of every speed-up outside it).

PPO rows: today's path, :func:`agents.rl.train.train` with its defaults (MaskablePPO, the entity
network, 8 SubprocVecEnv workers, 128 steps per environment per update), against the same
MaskablePPO on the vector env through :mod:`agents.vec_adapter` with ``--ppo-envs`` environments
in one process and ``n_steps`` cut so that every update has as many samples (1,024) as today's:
the same number of gradient steps per sample. Steps/s is ``timesteps / seconds of learn()``.
The vector row's learner share (PPO's updates, no environment) bounds what any environment
speed can give. The ``today`` row runs this checkout's code (its faster network included);
``--today-checkout DIR`` runs it with another checkout's code instead (a worktree of the commit
to compare with, its engine built there), alternating with this checkout's rows.

  python -m experiments.benchmarks.vector_env_speed [--seconds 5] [--repeats 3] [--sizes 1,16,64,256]
      [--two-threads 16,256] [--python-sizes ''] [--cases default,small-fresh] [--ppo-timesteps 40960]
      [--ppo-envs 256] [--no-ppo] [--pool] [--pool-size 0] [--pool-reuse 4] [--pool-workers 0]
      [--today-checkout DIR] [--json]

The vector rows step on the compiled environment core where it is built (``env.native_core``);
``--python-sizes`` adds rows of the same vector env stepped in Python (``native=False``).
``--pool`` adds, beside every vector row, the same vector env with a scenario pool
(:mod:`env.scenario_pool`: ``scenario_pool=--pool-size``, the row's environment count by default,
``pool_reuse=--pool-reuse``): its resets take a prepared scenario from the pool, so a scenario is
drawn, priced and its starting plans simulated once per ``--pool-reuse`` resets instead of at every
one; each reset's scenario keeps today's distribution, but up to ``--pool-reuse`` episodes share one
(the ``default`` case is then no longer "a fresh scenario at every reset"). Cases whose
environments fix their scenario (``small``, ``small-fresh``) do not use the pool. With
``--pool-reuse 1`` every reset still gets a fresh scenario (the ``default`` case as it is);
``--pool-workers N`` has N processes draw and prepare the pooled rows' scenarios and starting plans
ahead (:mod:`env.reset_worker`; the same episodes, step for step); a row's steps per CPU second
then counts the workers' CPU time too, and the row splits the CPU of an env-step between the
stepping process and the workers (theirs with their warm-up: the first draws, a cold cost cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.benchmarks.env_speed import env_factory
from experiments.benchmarks.env_speed import measure as measure_single

__all__ = ["measure_vector", "ppo_today", "ppo_vector", "main"]


def _random_allowed(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random allowed edit per row (stop only where no edit is allowed)."""
    r = rng.random(masks.shape)
    r[~masks] = -1.0
    r[masks[:, 1:].any(axis=1), 0] = -1.0
    return r.argmax(axis=1)


def _children_cpu() -> float:
    """CPU seconds of this process's ended child processes (the reset workers once closed)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_vector(case: str, *, n_envs: int, seconds: float = 5.0, seed: int = 0,
                   engine_threads: int = 1, native: bool | None = None, pool: int = 0,
                   pool_reuse: int = 4, pool_workers: int = 0) -> dict[str, float]:
    """Env-steps/s of ``n_envs`` environments of ``case`` in one PipelineVectorEnv, the shares of
    its step time in batched simulations and in autoresets, and the engine's: its share of the wall
    time, its microseconds per env-step and the env-steps/s it alone would allow (the ceiling of
    any speed-up outside the engine, on the engine's threads). ``native``: PipelineVectorEnv's
    (None: the compiled environment core where it is built; False: the Python path). ``pool``,
    ``pool_reuse``, ``pool_workers``: its ``scenario_pool``, ``pool_reuse`` (0: a fresh scenario at every
    reset) and reset workers (their CPU time counts in ``cpu_steps_per_s``; ``stepping_cpu_us_per_step`` and
    ``worker_cpu_us_per_step`` split it: this process's threads, the workers' with their warm-up)."""
    from env.vector_env import PipelineVectorEnv
    from pipeline import engine

    vec = PipelineVectorEnv(n_envs, env_factory=env_factory(case), engine_threads=engine_threads, native=native,
                            scenario_pool=pool, pool_reuse=pool_reuse, pool_workers=pool_workers)
    vec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    n, t0, c0, k0 = 0, time.perf_counter(), time.process_time(), _children_cpu()
    with engine.clocked() as clock:
        while time.perf_counter() - t0 < seconds or n == 0:
            vec.step(_random_allowed(vec.action_masks(), rng))
            n += n_envs
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tm = vec.timings
    vec.close()
    workers = _children_cpu() - k0  # the reset workers', joined by close (their warm-up included)
    return {"steps_per_s": n / wall, "cpu_steps_per_s": n / max(cpu + workers, 1e-9),
            "stepping_cpu_us_per_step": 1e6 * cpu / n, "worker_cpu_us_per_step": 1e6 * workers / n,
            "prefetch_share": tm["prefetch"] / wall,
            "reset_share": tm["resets"] / wall, "engine_share": clock.seconds / wall,
            "engine_us_per_step": 1e6 * clock.seconds / n, "engine_jobs_per_step": clock.jobs / n,
            "engine_bound_steps_per_s": n / max(clock.seconds, 1e-9)}


class _Clock:
    """SB3 callback: seconds spent collecting rollouts (the rest of learn() is PPO's update)."""

    def __new__(cls):
        from stable_baselines3.common.callbacks import BaseCallback

        class Clock(BaseCallback):
            def __init__(self) -> None:
                super().__init__()
                self.collect = 0.0
                self._t = 0.0

            def _on_rollout_start(self) -> None:
                self._t = time.perf_counter()

            def _on_rollout_end(self) -> None:
                self.collect += time.perf_counter() - self._t

            def _on_step(self) -> bool:
                return True

        return Clock()


def ppo_today(*, timesteps: int, seed: int = 0) -> dict[str, float]:
    """Steps/s of :func:`agents.rl.train.train` with its default configuration but 8 subprocess
    environments (``vec="subproc"``, the default until 6 Dec 2026), no evaluation."""
    from agents.rl.train import PPOConfig, train

    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(timesteps=timesteps, seed=seed, eval_every=0, checkpoint_every=10 * timesteps,
                           progress_bar=False, out=out, vec="subproc")
        res = train(config)
    return {"steps_per_s": res["timesteps"] / res["seconds"], "seconds": res["seconds"]}


def ppo_today_at(checkout: str, *, timesteps: int, seed: int = 0, timeout_s: float = 1800.0) -> dict[str, float]:
    """:func:`ppo_today` as another checkout's code runs it (say a worktree of an older commit, its
    engine built there): a subprocess with that checkout first on the path, so that this run's
    PPO rows are compared with the code that trained before them, not with today's code on 8
    processes."""
    code = ("import json; from experiments.benchmarks.vector_env_speed import ppo_today; "
            f"print(json.dumps(ppo_today(timesteps={int(timesteps)}, seed={int(seed)})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, env={**os.environ, "PYTHONPATH": checkout},
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"ppo_today in {checkout} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ppo_vector(*, n_envs: int, timesteps: int, seed: int = 0) -> dict[str, float]:
    """Steps/s of MaskablePPO (today's hyperparameters and network) on ``n_envs`` batched
    environments as :func:`agents.rl.train.train` runs it (with its batched bootstrap of
    truncated episodes), with the time split between collecting rollouts and PPO's
    updates."""
    import torch as th
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import VecMonitor

    from agents.rl.bootstrap import batched_bootstrap
    from agents.rl.net import EntityPolicy
    from agents.rl.threads import learner_threads_callback
    from agents.rl.train import PPOConfig, minibatch_size, silent_sb3_logger
    from agents.vec_adapter import make_vec_env
    from env.scenarios import TRAIN_SCENARIO

    c = PPOConfig()
    th.set_num_threads(max(1, c.torch_threads or 1))
    vec = VecMonitor(make_vec_env(n_envs, max_steps=c.max_steps, max_calls=c.max_calls, scenario=TRAIN_SCENARIO,
                                  repeat_scenario=c.repeat_scenario, single_start_share=c.single_start_share,
                                  allow_stop=c.allow_stop, engine_threads=c.engine_threads))
    vec.seed(seed)
    n_steps = max(1, c.n_steps * c.n_envs // n_envs)
    model = MaskablePPO(EntityPolicy, vec, seed=seed, device="cpu", n_steps=n_steps,
                        batch_size=min(minibatch_size(c), n_steps * n_envs), n_epochs=c.n_epochs,
                        learning_rate=c.learning_rate, gamma=c.gamma, ent_coef=c.ent_coef, verbose=0,
                        policy_kwargs={"hidden": c.hidden})
    model.set_logger(silent_sb3_logger())
    clock = _Clock()
    t0 = time.perf_counter()
    threads = [learner_threads_callback()] if c.torch_threads is None else []
    model.learn(total_timesteps=timesteps, callback=[*threads, clock, batched_bootstrap()])
    seconds = time.perf_counter() - t0
    vec.close()
    learner = max(seconds - clock.collect, 1e-9)
    return {"steps_per_s": model.num_timesteps / seconds, "seconds": seconds, "n_steps": n_steps,
            "collect_share": clock.collect / seconds, "learner_bound_steps_per_s": model.num_timesteps / learner}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per environment measurement")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every configuration (medians)")
    parser.add_argument("--sizes", default="1,16,64,256", help="environments of the vector env rows")
    parser.add_argument("--cases", default="default,small-fresh", help="env_speed cases, comma-separated")
    parser.add_argument("--ppo-timesteps", type=int, default=40960,
                        help="timesteps of each PPO run (40 updates of 1,024 samples: start-up and the "
                             "learner threads' first tries are a small share)")
    parser.add_argument("--ppo-envs", default="256", help="environments of the vector env PPO rows")
    parser.add_argument("--two-threads", default="16,256",
                        help="sizes also run with the native batch on 2 threads (engine_threads=2; '' for none)")
    parser.add_argument("--python-sizes", default="",
                        help="sizes also run on the vector env's Python path (native=False; '' for none)")
    parser.add_argument("--no-ppo", action="store_true", help="environment rows only")
    parser.add_argument("--pool", action="store_true",
                        help="also run every vector row with a scenario pool (env.scenario_pool): a reset takes a "
                             "prepared scenario instead of drawing and pricing a new one, so scenarios are drawn "
                             "--pool-reuse times less often; each reset's scenario keeps today's distribution, but "
                             "up to --pool-reuse episodes share one")
    parser.add_argument("--pool-size", type=int, default=0, help="scenarios in the pool (0: the row's environments)")
    parser.add_argument("--pool-reuse", type=int, default=4, help="resets each pooled scenario serves")
    parser.add_argument("--pool-workers", type=int, default=0,
                        help="reset worker processes of the pooled rows (env.reset_worker: the draws, their cost "
                             "model and starting plans prepared in other processes; 0: in the stepping process)")
    parser.add_argument("--today-checkout", default=None, metavar="DIR",
                        help="run the PPO 'today' row with another checkout's code (e.g. a git worktree of an "
                             "older commit with its engine built: make engine there), alternating with this "
                             "checkout's rows; default: this checkout's code on 8 SubprocVecEnv")
    parser.add_argument("--json", action="store_true", help="one JSON row per figure")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.seconds <= 0:
        parser.error("--repeats must be >= 1 and --seconds > 0")
    if args.pool_size < 0 or args.pool_reuse < 1 or not 0 <= args.pool_workers <= 8:
        parser.error("--pool-size must be >= 0, --pool-reuse >= 1 and --pool-workers in [0, 8]")
    if args.today_checkout and not (Path(args.today_checkout) / "experiments/benchmarks/vector_env_speed.py").is_file():
        parser.error(f"--today-checkout {args.today_checkout}: not a checkout of this toolkit (no "
                     "experiments/benchmarks/vector_env_speed.py there); make one with git worktree add DIR COMMIT")
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    args.two_threads = [int(x) for x in args.two_threads.split(",") if x.strip()]
    python_sizes = [int(x) for x in args.python_sizes.split(",") if x.strip()]
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    configs: list[tuple[str, str, int]] = []
    for case in cases:
        configs += [(case, "single", 1), (case, "subproc", 2)] + [(case, "vector", n) for n in sizes]
        configs += [(case, "vector-2t", n) for n in args.two_threads]
        configs += [(case, "vector-py", n) for n in python_sizes]
        if args.pool:  # each pooled row right after its fresh one
            configs = [x for c, kind, n in configs
                       for x in ([(c, kind, n)] + ([(c, f"{kind}-pool", n)] if c == case and "vector" in kind
                                                   else []))]
    if not args.no_ppo:
        configs += [("ppo", "today", 8)] + [("ppo", "vector", int(n)) for n in args.ppo_envs.split(",") if n.strip()]
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {k: [] for k in configs}
    for rep in range(args.repeats):
        for case, kind, n in configs:
            if case == "ppo":
                if kind == "today" and args.today_checkout:
                    res = ppo_today_at(args.today_checkout, timesteps=args.ppo_timesteps, seed=rep)
                elif kind == "today":
                    res = ppo_today(timesteps=args.ppo_timesteps, seed=rep)
                else:
                    res = ppo_vector(n_envs=n, timesteps=args.ppo_timesteps, seed=rep)
            elif kind.startswith("vector"):
                res = measure_vector(case, n_envs=n, seconds=args.seconds, seed=rep,
                                     engine_threads=2 if "-2t" in kind else 1,
                                     native=False if "-py" in kind else None,
                                     pool=(args.pool_size or n) if kind.endswith("-pool") else 0,
                                     pool_reuse=args.pool_reuse,
                                     pool_workers=0 if "-py" in kind or not kind.endswith("-pool")
                                     else args.pool_workers)
            else:
                res = {"steps_per_s": measure_single(case, n_envs=n, seconds=args.seconds, seed=rep)}
            runs[(case, kind, n)].append(res)
    rows: list[dict[str, Any]] = []
    for (case, kind, n), results in runs.items():
        med = _median(results)
        base = _median(runs[(case, "single" if case != "ppo" else "today", 1 if case != "ppo" else 8)])
        rows.append({"case": case, "kind": kind, "n_envs": n, **{k: round(v, 3) for k, v in med.items()},
                     "runs": [round(r["steps_per_s"], 1) for r in results],
                     "ratio": round(med["steps_per_s"] / base["steps_per_s"], 2)})
    workers = f", {args.pool_workers} reset worker{'s' * (args.pool_workers > 1)}" if args.pool_workers else ""
    for row in rows:
        if args.json:
            print(json.dumps(row))
            continue
        what = {"single": "single env", "subproc": "SubprocVecEnv", "vector": "vector env",
                "vector-2t": "vector env, 2 engine threads", "vector-py": "vector env, Python path",
                "vector-pool": f"vector env, pooled{workers}",
                "vector-2t-pool": f"vector env, 2 threads, pooled{workers}",
                "vector-py-pool": "vector env, Python path, pooled",
                "today": "rl.train.train (8 SubprocVecEnv)" + (" at --today-checkout" if args.today_checkout
                                                                 else "")}[row["kind"]]
        extra = ""
        if row["case"] != "ppo" and row["kind"].startswith("vector"):
            extra = (f"  (batched sims {row['prefetch_share']:.0%}, resets {row['reset_share']:.0%} of the time; "
                     f"{row['cpu_steps_per_s']:.0f} steps per CPU second"
                     + (f" (CPU a step: stepping {row['stepping_cpu_us_per_step']:.1f} us, workers "
                        f"{row['worker_cpu_us_per_step']:.1f} us)" if row['worker_cpu_us_per_step'] else "")
                     + f"; engine {row['engine_share']:.0%}, "
                     f"{row['engine_us_per_step']:.1f} us and {row['engine_jobs_per_step']:.2f} jobs a step: "
                     f"alone {row['engine_bound_steps_per_s']:.0f} steps/s)")
        if row["kind"] == "vector" and row["case"] == "ppo":
            extra = (f"  (n_steps {int(row['n_steps'])}; collecting {row['collect_share']:.0%}; "
                     f"learner alone {row['learner_bound_steps_per_s']:.0f} steps/s)")
        base = "today" if row["case"] == "ppo" else "single"
        print(f"{row['case']:11s} {what:34s} n={row['n_envs']:<4d} {row['steps_per_s']:9.0f} steps/s "
              f"{row['ratio']:6.2f}x {base}{extra}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # (the rows measured so far are not printed: medians need every run)
        print("vector_env_speed: interrupted (Ctrl-C); nothing printed", file=sys.stderr)
        raise SystemExit(130) from None
