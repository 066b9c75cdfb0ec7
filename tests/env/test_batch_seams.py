"""The public seams the vector env steps through: PipelineEnv's parts and would_simulate, and the
evaluator's remembers / remember (with results_across remembering what it simulates)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from env.editor import SharedEvaluator, portfolio
from env.pipeline_env import PipelineEnv
from env.scenarios import ScenarioConfig, sample_scenario
from pipeline.evaluator import Evaluator, results_across

SMALL = ScenarioConfig(max_devices=4, max_blocks=12, microbatch_factors=(1, 2))


def _allowed_edits(env: PipelineEnv) -> list[int]:
    return (np.flatnonzero(env.action_masks()[1:]) + 1).tolist()


def _same(a, b) -> None:
    """Observations (dicts or parts tuples) or infos that hold the same values."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    else:
        assert a == b


def test_the_parts_make_reset_and_step():
    """reset_rounds, step_core, observation_parts and info give what reset and step give."""
    whole, parts = PipelineEnv(scenario=SMALL), PipelineEnv(scenario=SMALL)
    obs, info = whole.reset(seed=3)
    rounds = list(parts.reset_rounds(seed=3))
    assert rounds and all(isinstance(r, list) for r in rounds)
    _same(obs, dict(zip(("stages", "devices", "plan"), parts.observation_parts())))
    _same(info, parts.info(kept=False, edit="start"))
    rng = np.random.default_rng(0)
    for _ in range(8):
        a = int(rng.choice(_allowed_edits(whole) or [0]))
        obs, reward, term, trunc, info = whole.step(a)
        r, te, tr, kept, edit = parts.step_core(a)
        assert (reward, term, trunc) == (r, te, tr) and (info["kept"], info["edit"]) == (kept, edit)
        _same(obs, dict(zip(("stages", "devices", "plan"), parts.observation_parts())))
        _same(info, parts.info(kept=kept, edit=edit))
        if term or trunc:
            break
    assert parts.action_masks(copy=False) is parts.editor.mask()
    assert parts.action_masks() is not parts.editor.mask() and np.array_equal(parts.action_masks(), parts.editor.mask())


def test_would_simulate_names_the_call_a_step_makes():
    env = PipelineEnv(scenario=SMALL)
    assert env.would_simulate(1) is None  # no reset yet
    env.reset(seed=5)
    ev = env.editor.ev
    assert env.would_simulate(0) is None  # stop
    masked = np.flatnonzero(~env.action_masks()[1:]) + 1
    assert env.would_simulate(int(masked[0])) is None
    for a in _allowed_edits(env):
        hit = env.would_simulate(a)
        assert hit is not None and hit[0] is ev and hit[1] == env.editor.targets()[a]
        assert not ev.known(hit[1]) and not ev.remembers(hit[1])
    a = _allowed_edits(env)[0]
    target = env.would_simulate(a)[1]
    results_across([(ev, target)])  # simulated beforehand: the step finds it ready
    calls = ev.calls
    assert env.would_simulate(a) is None  # known now
    env.step(a)
    assert ev.calls == calls and ev.known(target)


def test_would_simulate_leaves_a_remembered_plan_to_the_step():
    """A plan the scenario's memo holds (an earlier episode found it) is adopted, not simulated."""
    scenario = sample_scenario(np.random.default_rng(2), SMALL)
    first, second = PipelineEnv(), PipelineEnv()
    first.reset(seed=0, options={"scenario": scenario})
    second.reset(seed=0, options={"scenario": scenario})
    a = _allowed_edits(first)[0]
    target = first.would_simulate(a)[1]
    first.step(a)
    ev = second.editor.ev
    assert ev.remembers(target) and not ev.known(target) and second.would_simulate(a) is None
    calls = ev.calls
    second.step(a)
    assert ev.calls == calls + 1 and ev.cached(target) is first.editor.ev.cached(target)  # adopted: one call


class _FixedReset(PipelineEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)


class _OwnInfo(PipelineEnv):
    def info(self, *, kept, edit):
        return {**super().info(kept=kept, edit=edit), "extra": 1}


class _OwnMasks(PipelineEnv):
    def action_masks(self, *, copy=True):
        return super().action_masks(copy=copy)


@pytest.mark.parametrize(("cls", "steps", "resets"), [
    (PipelineEnv, True, True), (_FixedReset, True, False), (_OwnInfo, False, False), (_OwnMasks, False, True)])
def test_what_runs_in_parts(cls, steps, resets):
    env = cls(scenario=SMALL)
    assert (env.steps_in_parts, env.resets_in_rounds) == (steps, resets)
    if not steps and not resets:  # a part of its own: the vector env steps it by its step and reset
        from env.vector_env import PipelineVectorEnv

        vec = PipelineVectorEnv(2, env_factory=lambda: cls(scenario=SMALL))
        _, infos = vec.reset(seed=0)
        assert infos["extra"].tolist() == [1, 1]
        _, _, _, _, infos = vec.step(np.array([_allowed_edits(e)[0] for e in vec.envs]))
        assert infos["extra"].tolist() == [1, 1]


def test_evaluators_remember_what_they_share():
    scenario = sample_scenario(np.random.default_rng(1), SMALL)
    c, d = portfolio(scenario)[:2]
    plain = Evaluator(scenario)
    plain.remember(c, plain.result(c))
    assert not plain.remembers(c)  # nothing shared: nothing remembered
    first = SharedEvaluator(scenario)
    later = SharedEvaluator(scenario, share=first)
    results_across([(first, c), (later, d)])  # remembers each, as result would
    assert first.remembers(d) and later.remembers(c) and not later.known(c)
    assert later.result(c) is first.cached(c) and later.calls == 2  # d simulated, c adopted
    assert not SharedEvaluator(scenario, share=first, results=False).remembers(c)


def test_known_test_is_known():
    scenario = sample_scenario(np.random.default_rng(1), SMALL)
    c, d = portfolio(scenario)[:2]
    for ev in (Evaluator(scenario), SharedEvaluator(scenario)):
        ev.result(c)
        assert [ev.known_test(x) for x in (c, d)] == [True, False]

    class Picky(Evaluator):
        def known(self, c):
            return False

    assert Picky(scenario).known_test.__func__ is Picky.known  # a redefined known is used


def test_reset_needed_before_masks():
    with pytest.raises(gym.error.ResetNeeded):
        PipelineEnv().action_masks(copy=False)
