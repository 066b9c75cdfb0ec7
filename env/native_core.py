"""The bridge between :class:`env.pipeline_env.PipelineEnv` and the compiled environment core.

The core (``EnvCore`` in ``pipeline/_native/env_core.hpp``, reached through
:func:`pipeline.engine.env_core`) steps many environments in C++: each environment's current plan,
its edit table and mask, the plans its episode evaluated and its counters live there, and a step
writes observations, rewards, flags, masks and info columns into numpy arrays the core owns. A
reset stays Python's (:meth:`PipelineEnv.reset_rounds`): :func:`load` hands the state it leaves
(:meth:`PipelineEnv.episode_state`) to the core, or says the episode is not one the core ports,
and the vector env then steps that environment in Python. With a scenario pool
(:mod:`env.scenario_pool`) the vector env keeps what :func:`load` handed over (:func:`load_args`)
and starts the next episodes of the same scenario and start with it, without a Python reset.

What the core ports: candidates of the list order without recomputation, an evaluator the episode
owns (no ``options["evaluator"]``), placements whose DP-balanced split the scenario table holds
(the seven families; an episode started elsewhere steps in Python), and scenarios whose stage costs are
:func:`pipeline.simulator.stage_costs` without its runtime extras (a step cost, an optimizer step,
tied-gradient sums, blocking or held transfers, overlapped iterations), shared weight groups,
measured or calibrated backward columns, W depth, transfer overhead or compute contention: every
scenario :func:`env.scenarios.sample_scenario` draws (:func:`unsupported` names what is not).
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

import numpy as np

from env.editor import ACTIONS, MAX_DEVICES, MAX_STAGES, PLACEMENT_FAMILIES, presets_of
from pipeline import engine
from pipeline.candidates import Candidate, Scenario, make_placement
from pipeline.runtime import runtime_named
from pipeline.simulator import Result

__all__ = ["unsupported", "scenario_table", "table_fields", "balanced_of", "candidate_tuple", "candidate_of",
           "load_args", "load", "evaluate", "EDIT_NAMES", "edit_name"]

#: Edit names by code: an action index, -1 for stop, -2 for a masked action (``EnvCore.edits``).
EDIT_NAMES: tuple[str, ...] = tuple(str(a) for a in ACTIONS)
_EXACT = float(2**53)


def edit_name(code: int) -> str:
    """The ``info["edit"]`` of an ``EnvCore.edits`` code."""
    return "stop" if code == -1 else "masked" if code == -2 else EDIT_NAMES[code]


def unsupported(scenario: Scenario) -> str | None:
    """Why the core cannot step episodes of ``scenario`` (None: it can)."""
    p, training = scenario.profile, scenario.training
    runtime = runtime_named(training.runtime)
    if scenario.devices > MAX_DEVICES or scenario.devices < 1:
        return f"{scenario.devices} devices"
    checks = {
        "runtime step cost": runtime.step_s, "optimizer step": runtime.optimizer_bytes_per_param,
        "tied-gradient sums": runtime.sums_tied_gradients, "blocking transfers": runtime.blocking_p2p,
        "held transfers": runtime.p2p_hold_share, "overlapped iterations": runtime.overlap_iterations,
        "W depth": p.w_depth, "transfer overhead": p.transfer_overhead, "compute contention": p.compute_contention,
    }
    for what, value in checks.items():
        if value:
            return what
    extras = [x.extra for x in p.layers]
    if any(e.get("shared_group") is not None for e in extras if e):
        return "shared weight groups"
    if all("b_full" in e for e in extras) or all("b_first" in e for e in extras):
        return "measured backward columns"
    return None


def _exact(columns: list[list[float]]) -> bool:
    """Whether sums of these integer-valued byte and parameter columns are exact in float64, as
    Python's integer sums are (every partial sum below 2**53)."""
    return all(sum(map(abs, col)) < _EXACT for col in columns)


def balanced_of(prep: Any, placement: tuple[int, ...]) -> tuple[int, ...]:
    """The scenario's DP-balanced split of ``placement`` (``Evaluator.balanced_sizes``'s answer),
    from the compiled engine where it runs, kept on the preparation by the stages' speeds."""
    memo = prep.native_balanced
    hit = memo.get(placement)  # by placement, then by its stages' speeds (all the split depends on)
    if hit is not None:
        return hit
    z = prep.scenario
    speeds = z.cluster.speeds
    if not 0 < len(placement) <= z.profile.num_layers or min(placement) < 0 or max(placement) >= len(speeds):
        return prep.evaluator.balanced_sizes(placement)  # its error, or its answer
    key = ("speeds", tuple([speeds[d] for d in placement]))
    hit = memo.get(key)
    if hit is None:
        hit = engine.balanced_split(prep.prefix_list, key[1])
        if hit is None:
            hit = prep.evaluator.balanced_sizes(placement)
        memo[key] = hit
    memo[placement] = hit
    return hit


def scenario_table(prep: Any) -> Any | None:
    """The core's table of the scenario of a ``PipelineEnv`` preparation (``env.pipeline_env._Prep``),
    built once and kept on it; None where :func:`unsupported`."""
    hit = prep.native_table
    if hit is None:
        fields = table_fields(prep) if unsupported(prep.scenario) is None else None
        hit = prep.native_table = (engine.env_scenario(fields) if fields is not None else None) or False
    return hit or None


#: What :func:`table_fields` takes from the cluster's links alone, by ``(devices, gpus_per_node,
#: latency_us, inter_node_latency_us, p2p_gbps, inter_node_gbps)``: the latency and bandwidth
#: matrices, row-major (a few link settings recur across draws; emptied past 256 entries).
_LINKS: dict[tuple, tuple[tuple[float, ...], tuple[float, ...]]] = {}
#: By device count: each placement family's placement and whether its kind fits the devices.
_FAMILIES: dict[int, tuple[tuple[tuple[int, ...], int, bool], ...]] = {}
#: By device count: :func:`presets_of` as the table takes them (floats; None: unlimited).
_PRESET_FLOATS: dict[int, tuple[tuple[float, ...] | None, ...]] = {}


def _links(cl: Any, P: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The latency (s) and bandwidth (B/s) of each pair of ``cl``'s first ``P`` devices, row-major
    (0 and 1 on the diagonal), cached in :data:`_LINKS`."""
    key = (P, cl.gpus_per_node, cl.latency_us, cl.inter_node_latency_us, cl.p2p_gbps, cl.inter_node_gbps)
    hit = _LINKS.get(key)
    if hit is None:
        node = np.arange(P) // cl.gpus_per_node if cl.gpus_per_node is not None else np.zeros(P, dtype=np.int64)
        same = node[:, None] == node[None, :]  # (Cluster.same_node of every pair)
        lat = np.where(same, cl.latency_us * 1e-6, cl.inter_node_latency_us * 1e-6)
        bw = np.where(same, cl.p2p_gbps * 1e9, cl.inter_node_gbps * 1e9)
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, 1.0)
        if len(_LINKS) >= 256:
            _LINKS.clear()
        hit = _LINKS[key] = (tuple(lat.ravel().tolist()), tuple(bw.ravel().tolist()))
    return hit


def _families(P: int) -> tuple[tuple[tuple[int, ...], int, bool], ...]:
    """``(placement, chunks, kind fits P devices)`` of each of :data:`PLACEMENT_FAMILIES` on ``P`` devices."""
    hit = _FAMILIES.get(P)
    if hit is None:
        hit = tuple((make_placement(kind, P, chunks), chunks, chunks == 1 or P >= 2)
                    for kind, chunks in PLACEMENT_FAMILIES)
        if len(_FAMILIES) >= 256:
            _FAMILIES.clear()
        _FAMILIES[P] = hit
    return hit


def _preset_floats(P: int) -> tuple[tuple[float, ...] | None, ...]:
    hit = _PRESET_FLOATS.get(P)
    if hit is None:
        hit = tuple(None if b is None else tuple([float(x) for x in b]) for b in presets_of(P))
        if len(_PRESET_FLOATS) >= 256:
            _PRESET_FLOATS.clear()
        _PRESET_FLOATS[P] = hit
    return hit


def _extra_column(extras: list[dict[str, Any]], key: str) -> list[float] | None:
    """``float(extra.get(key, 0))`` of each layer's extras, or None where no layer has ``key``."""
    if not any(map(operator.contains, extras, repeat(key))):
        return None
    return [float(e.get(key, 0)) for e in extras]


def table_fields(prep: Any) -> dict[str, Any] | None:
    """What the core's table of a preparation's scenario is built from (plain numbers and lists: it
    pickles, so another process may build it, :mod:`env.reset_worker`), or None where the scenario's
    costs are not exact in floats. The scenario must be one the core ports (:func:`unsupported`).
    Every list is the caller's own (what depends on the devices or links alone is cached as tuples)."""
    z = prep.scenario
    P, L = z.devices, z.profile.num_layers
    families, balanced = [], {}
    stages = min(L, MAX_STAGES)
    for placement, chunks, kind_ok in _families(P):
        applies = kind_ok and P * chunks <= stages
        families.append((list(placement), applies, kind_ok))
        if applies:
            balanced[placement] = balanced_of(prep, placement)
    columns = _columns(z)
    if columns is None:
        return None
    return {
        **columns, "post": 0.0,
        "prefix": list(prep.prefix_list), "cost": prep.cost.tolist(), "act_prefix": prep.act_prefix.tolist(),
        "node": prep.node.tolist(), "bound": float(prep.bound), "consts": [float(c) for c in prep.consts],
        "devices": prep.devices.ravel().tolist(), "families": families,
        "balanced": [(list(k), list(v)) for k, v in balanced.items()],
        "presets": [None if b is None else list(b) for b in _preset_floats(P)],
    }


def _columns(z: Scenario) -> dict[str, Any] | None:
    """What the core's table of scenario ``z`` takes as it is (per-layer and per-device columns, the
    runtime's constants: plain floats, every list the caller's own), for :func:`table_fields` and
    :func:`direct_table`; None where the byte and parameter columns' sums are not exact in floats."""
    p, cl, training = z.profile, z.cluster, z.training
    runtime = runtime_named(training.runtime)
    compute = runtime.compute_scale_for(p)
    unit = p.seconds_per_unit
    layers = p.layers
    lat, bw = _links(cl, z.devices)
    extras = [x.extra for x in layers]
    keep = ([float(x.w_graph) for x in layers] if training.input_backward_keeps_graph
            else [float(x.w_retained) for x in layers])
    exact = [[float(x.act_bytes) for x in layers], keep, [float(x.params) for x in layers],
             [float(x.out_bytes) for x in layers]]
    if not _exact(exact):
        return None
    f, b, w = [x.f for x in layers], [x.b for x in layers], [x.w for x in layers]
    if not all(issubclass(t, float) for t in {*map(type, f), *map(type, b), *map(type, w)}):
        f, b, w = [float(x) for x in f], [float(x) for x in b], [float(x) for x in w]
    speeds = cl.speeds
    return {
        "P": z.devices, "M": z.microbatches, "f": f, "b": b,
        "w": w, "act": exact[0], "keep": exact[1], "params": exact[2], "out": exact[3],
        "workspace": _extra_column(extras, "workspace_bytes"),
        "w_workspace": _extra_column(extras, "w_workspace_bytes"), "defers": bool(training.first_stage_defers_backward),
        "over": p.action_overhead + runtime.action_overhead_s / unit, "scale": training.activation_scale,
        "param_bytes": training.param_bytes, "unit": unit,
        "speeds": [sp / compute for sp in speeds],
        "cluster_speeds": [float(s) for s in speeds],
        "latency": list(lat), "bandwidth": list(bw), "limits": list(cl.memory_limits_bytes),
    }


def direct_table(scenario: Scenario) -> Any | None:
    """The core's table of ``scenario`` without a ``PipelineEnv`` preparation: its raw columns
    (:func:`_columns`) here, what :func:`table_fields` reads off the preparation (prefix sums, lower
    bound, observation constants and device rows, balanced splits) derived in the engine
    (:func:`pipeline.engine.env_scenario_derived`). The same table as ``scenario_table(prep_of(scenario))``,
    its ``bound`` the preparation's ``reference("bound")`` (``tests/env/test_env_table.py``). The scenario
    must be one the core ports (:func:`unsupported`); None where the Python reference gives no table or
    the engine leaves it to the reference (then build it from the preparation)."""
    columns = _columns(scenario)
    if columns is None:
        return None
    p, cl, training = scenario.profile, scenario.cluster, scenario.training
    ideal = runtime_named("ideal")
    bound_compute = ideal.compute_scale_for(p)
    P = scenario.devices
    out = [x.out_bytes for x in p.layers]
    send = {n: cl.transfer_seconds(0, min(1, P - 1), n) for n in set(out)}  # (as _Prep's constants)
    return engine.env_scenario_derived({
        **columns, "cost": [float(x.f + x.b + x.w) for x in p.layers], "gpus_per_node": cl.gpus_per_node or P,
        "comm": sum([send[n] for n in out]), "bytes_per_param": training.bytes_per_param,
        "bound_speeds": [sp / bound_compute for sp in cl.speeds],
        "bound_over": p.action_overhead + ideal.action_overhead_s / p.seconds_per_unit,
        "families": _families(P), "presets": _preset_floats(P),
    })


def candidate_tuple(c: Candidate) -> tuple | None:
    """``c`` as the core takes it, or None where the core does not port it (another order, recomputation)."""
    if c.order != "list" or c.recompute is not None:
        return None
    mpw = c.max_pending_w
    if mpw is not None and (isinstance(mpw, bool) or not isinstance(mpw, int)):
        return None
    return (c.sizes, c.placement, c.budgets, bool(c.split_backward), bool(c.eager_w), bool(c.depth_first), mpw,
            bool(c.cap_counts_w))


#: :class:`Candidate`'s fields, in order: :func:`candidate_of` fills them without the frozen dataclass's
#: ``__init__`` (a third of the cost; the vector env's info columns build one per changed plan).
_CANDIDATE_FIELDS = ("sizes", "placement", "order", "budgets", "split_backward", "eager_w", "depth_first",
                     "max_pending_w", "cap_counts_w", "recompute")
if tuple(Candidate.__dataclass_fields__) != _CANDIDATE_FIELDS:
    raise ImportError("env.native_core.candidate_of fills Candidate's fields by name: update _CANDIDATE_FIELDS "
                      f"to {tuple(Candidate.__dataclass_fields__)}")


def candidate_of(t: tuple) -> Candidate:
    """The :class:`Candidate` of the core's 8-tuple (:meth:`EnvCore.candidate`): equal, field for field, to
    ``Candidate(sizes, placement, "list", budgets, ...)``."""
    sizes, placement, budgets, split, eager, depth, mpw, counts_w = t
    c = object.__new__(Candidate)
    c.__dict__.update(sizes=sizes, placement=placement, order="list", budgets=budgets, split_backward=split,
                      eager_w=eager, depth_first=depth, max_pending_w=mpw, cap_counts_w=counts_w, recompute=None)
    return c


def evaluate(requests: list[tuple[Any, Candidate, Any]], *, threads: int = 1) -> list[tuple[Any, Candidate]]:
    """Simulate ``(evaluator, candidate, preparation)`` requests on the compiled engine where it ports
    them, each evaluator counting, caching and remembering its result as
    :func:`pipeline.evaluator.results_across` has it do (``adopt`` counts the call, ``remember``
    shares the result); returns the ``(evaluator, candidate)`` requests left to Python."""
    rest: list[tuple[Any, Candidate]] = []
    todo: list[tuple[Any, Candidate, Scenario]] = []
    pairs: list[tuple[Any, tuple]] = []
    seen: set[tuple[int, Candidate]] = set()
    last = None
    for ev, c, prep in requests:
        key = (id(ev), c)
        if key in seen or ev.known(c):
            continue
        z = prep.scenario
        if z is not last:  # (the scenario's sizes, once per run of its requests)
            last, layers, devices = z, z.profile.num_layers, z.devices
        table = scenario_table(prep) if ev.scenario is z else None
        t = candidate_tuple(c) if table is not None else None
        if t is None or not _well_formed(c, layers, devices):  # the reference's error result
            rest.append((ev, c))
            continue
        seen.add(key)
        todo.append((ev, c, z))
        pairs.append((table, t))
    if pairs:
        last = None
        for (ev, c, z), (it, busy, peak) in zip(todo, engine.env_evaluate(pairs, threads=threads)):
            if z is not last:  # (the Result fields of the scenario, once per run of its requests)
                last, p = z, z.profile
                limits, devices = z.cluster.memory_limits_bytes, z.devices
                tokens, unit, time_unit = z.microbatches * p.tokens_per_microbatch, p.seconds_per_unit, p.time_unit
            res = Result(True, None, it, busy, peak, limits, tokens, unit, time_unit, [], devices=devices)
            ev.remember(c, ev.adopt(c, res))
    return rest


def _well_formed(c: Candidate, layers: int, devices: int) -> bool:
    """Whether ``c`` is a plan of a scenario of ``layers`` layers on ``devices`` devices the core can hold."""
    sizes, placement = c.sizes, c.placement
    return (0 < len(sizes) == len(placement) <= MAX_STAGES and sum(sizes) == layers
            and min(sizes) >= 1 and min(placement) >= 0 and max(placement) < devices
            and (c.budgets is None or len(c.budgets) == devices))


def _result_tuple(r: Result) -> tuple:
    return (bool(r.valid), float(r.iteration_time), list(r.busy), list(r.peak_memory), list(r.memory_limit))


def load_args(env: Any) -> tuple | None:
    """The arguments after the slot of ``EnvCore.load`` that start environment ``env``'s episode, just
    reset, in the core; None where the core does not port it. They hold no reference to ``env``: a
    scenario pool keeps them to start later episodes of the same start (:mod:`env.scenario_pool`)."""
    state = env.episode_state()
    ed = env.editor
    table = scenario_table(state["prep"]) if state["own_evaluator"] else None
    if table is None or not hasattr(ed.ev, "evaluated"):
        return None
    cur, best = candidate_tuple(ed.current), candidate_tuple(ed.best)
    known = [candidate_tuple(c) for c in ed.ev.evaluated()]
    if cur is None or best is None or any(k is None for k in known):
        return None
    if not table.has_balanced(list(ed.current.placement)):  # a start off the families (the table is shared)
        return None
    params = {"calls": ed.ev.calls, "max_calls": ed.max_calls, "calls_cap": state["calls_cap"],
              "calls_at_start": state["calls_at_start"], "allow_stop": ed.allow_stop, "max_steps": env.max_steps,
              "step_cost": env.step_cost, "reference": float(env.reference), "start_time": float(state["start_time"])}
    return table, cur, _result_tuple(ed.result), best, _result_tuple(ed.best_result), known, params


def load(core: Any, i: int, env: Any) -> tuple | None:
    """Hand environment ``env``'s episode, just reset, to slot ``i`` of ``core``: the arguments it
    loaded (:func:`load_args`), or None (and the slot left inactive) where the core does not port it."""
    args = load_args(env)
    if args is None:
        core.deactivate(i)
        return None
    core.load(i, *args)
    return args
