"""Steps per second of adaptis/Pipeline-v0 with random masked actions, single and vectorised.

Cases: ``default`` (``gymnasium.make("adaptis/Pipeline-v0")`` with its default arguments: a
new scenario of 2-8 devices at every reset), ``small`` (a fixed synthetic model of 16 layers on 4
devices, 8 micro-batches: resets re-use the scenario, and its episodes share the scenario's
simulated results, so a plan an earlier episode tried costs no new simulation), ``small-fresh``
(the same without that sharing: every new plan of an episode is scheduled and simulated) and
``train`` (fresh scenarios of 2-32 devices drawn as in training, resets included, each scenario
serving 4 episodes).

  python -m experiments.benchmarks.env_speed [--seconds 5] [--n-envs 2] [--cases small,train] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

__all__ = ["CASES", "env_factory", "measure", "main"]

#: The cases :func:`env_factory` knows.
CASES = ("default", "small", "small-fresh", "train")


def _small_scenario():
    from env.scenarios import sample_architecture
    from pipeline.candidates import Scenario
    from pipeline.costs import profile_from_architecture
    from pipeline.hardware import build_cluster

    arch = sample_architecture(np.random.default_rng(3), blocks=14)
    return Scenario(profile_from_architecture(arch, seq_len=2048), build_cluster("h100", devices=4), 8)


def env_factory(case: str):
    """A function that builds one new environment of ``case`` (one of :data:`CASES`)."""
    from env.pipeline_env import PipelineEnv

    if case in ("small", "small-fresh"):
        scenario = _small_scenario()

        class Fixed(PipelineEnv):
            def reset(self, *, seed=None, options=None):
                return super().reset(seed=seed, options={"scenario": scenario, **(options or {})})

        return lambda: Fixed(share_results=case == "small")
    if case == "default":
        return PipelineEnv
    if case != "train":
        raise ValueError(f"unknown case {case!r}; use default, small, small-fresh or train")
    from env.scenarios import TRAIN_SCENARIO

    return lambda: PipelineEnv(scenario=TRAIN_SCENARIO, max_calls=40, repeat_scenario=4)


def measure(case: str = "small", *, n_envs: int = 1, seconds: float = 5.0, seed: int = 0) -> float:
    """Environment steps per second (all environments together) with random allowed actions."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    factory = env_factory(case)
    rng = np.random.default_rng(seed)
    if n_envs == 1:
        env = factory()
        env.reset(seed=seed)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            allowed = np.flatnonzero(env.action_masks()[1:])
            a = int(allowed[rng.integers(len(allowed))]) + 1 if len(allowed) else 0
            _, _, term, trunc, _ = env.step(a)
            n += 1
            if term or trunc:
                env.reset()
        return n / (time.perf_counter() - t0)
    vec = (SubprocVecEnv if n_envs > 1 else DummyVecEnv)([factory for _ in range(n_envs)])
    vec.seed(seed)
    vec.reset()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        masks = np.stack(vec.env_method("action_masks"))
        acts = [int(rng.choice(np.flatnonzero(m[1:]) + 1)) if m[1:].any() else 0 for m in masks]
        vec.step(np.array(acts))
        n += n_envs
    rate = n / (time.perf_counter() - t0)
    vec.close()
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--n-envs", type=int, default=2, help="environments of the vectorised run (SubprocVecEnv)")
    parser.add_argument("--cases", default="small,small-fresh,train", help="comma-separated cases")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        for n in (1, args.n_envs):
            rate = measure(case, n_envs=n, seconds=args.seconds)
            rows.append({"case": case, "n_envs": n, "steps_per_s": round(rate, 1)})
    for row in rows:
        text = f"{row['case']:11s} n_envs={row['n_envs']}: {row['steps_per_s']:.0f} steps/s"
        print(json.dumps(row) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
