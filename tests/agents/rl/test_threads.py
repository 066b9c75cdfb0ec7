"""The learner's thread count follows the measured update times (agents/rl/threads.py)."""

from __future__ import annotations

import pytest

from agents.rl.threads import ThreadChooser, learner_threads_callback
from agents.rl.train import silent_sb3_logger


def run(chooser: ThreadChooser, seconds_of: dict[int, float], updates: int) -> list[int]:
    picks = []
    for _ in range(updates):
        n = chooser.pick()
        picks.append(n)
        chooser.record(n, seconds_of[n])
    return picks


def test_tries_each_count_then_keeps_the_faster_and_retries_the_other_rarely():
    chooser = ThreadChooser([1, 2], explore_every=8)
    picks = run(chooser, {1: 0.30, 2: 0.23}, 64)
    assert picks[:2] == [1, 2]
    assert chooser.best == 2
    assert picks.count(1) <= 2 + 64 // 8
    assert picks.count(2) >= 64 - 2 - 64 // 8


def test_switches_when_the_load_makes_two_threads_slower():
    chooser = ThreadChooser([1, 2], explore_every=8)
    run(chooser, {1: 0.30, 2: 0.23}, 32)
    assert chooser.best == 2
    picks = run(chooser, {1: 0.32, 2: 0.60}, 32)  # a busy process arrives: two threads wait on each other
    assert chooser.best == 1
    assert picks[-8:].count(1) >= 7


def test_one_choice_never_explores():
    chooser = ThreadChooser([1], explore_every=2)
    assert run(chooser, {1: 0.1}, 10) == [1] * 10


@pytest.mark.parametrize("kwargs", [{"choices": []}, {"choices": [0, 1]}, {"choices": [1, 2], "explore_every": 1}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        ThreadChooser(**kwargs)


def test_the_callback_runs_updates_on_the_chosen_count_and_rollouts_on_one():
    import torch as th
    from sb3_contrib import MaskablePPO

    from agents.vec_adapter import make_vec_env
    from env.scenarios import TRAIN_SCENARIO

    seen = []
    cb = learner_threads_callback(most=2)
    vec = make_vec_env(4, max_steps=4, max_calls=8, scenario=TRAIN_SCENARIO)
    model = MaskablePPO("MultiInputPolicy", vec, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(silent_sb3_logger())
    original_train = model.train

    def train_spy():
        seen.append(th.get_num_threads())
        original_train()

    model.train = train_spy
    try:
        model.learn(total_timesteps=4 * 8 * 5, callback=cb)
    finally:
        vec.close()
    assert seen[:2] == [1, 2]  # each count tried once, in order
    assert sum(cb.chooser.counts.values()) == len(seen) - 1  # every update timed but the last
    assert th.get_num_threads() == 1
