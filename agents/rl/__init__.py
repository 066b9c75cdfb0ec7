"""Reinforcement learning: the ``rl`` and ``rl+tuner`` searchers and what they are trained with.

* :mod:`agents.rl.searchers` — the searchers (a trained policy edits plans, alone or seeding the tuner).
* :mod:`agents.rl.net` — the size-independent entity network (``EntityPolicy``).
* :mod:`agents.rl.policy` — policy files: saving, checked metadata, loading.
* :mod:`agents.rl.starts` — the start ranker (which starting plans to simulate first).
* :mod:`agents.rl.imitation` — imitation of the one-step look-ahead oracle before PPO.
* :mod:`agents.rl.train` — PPO training, checkpoints and resume (the ``train`` command).

Importing the package imports none of them (torch and SB3 load only with the modules that need them).
"""
