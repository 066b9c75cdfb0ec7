"""Search agents: named-schedule baselines, the AdaPtis tuner, random search and RL policies.

Every agent is a :class:`agents.base.Searcher`; :func:`agents.registry.make_searcher` builds one
from a method name.
"""
