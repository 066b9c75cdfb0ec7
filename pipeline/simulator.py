"""The pipeline performance model: an event simulation of a plan.

Rules (the contract every other part relies on):

* Each device runs its actions in list order, one at a time. An action starts when its device
  is free and its inputs have arrived; nothing else delays it (no link contention).
* ``F(s, m)`` needs ``F(s-1, m)`` plus the transfer of stage ``s-1``'s ``out_bytes`` when the
  two stages sit on different devices. ``I(s, m)`` or ``B(s, m)`` needs ``F(s, m)`` and the
  gradient of stage ``s+1`` (``I`` or ``B`` of ``(s+1, m)`` plus the same transfer back).
  ``W(s, m)`` needs ``I(s, m)``. Transfers cost ``latency + bytes / bandwidth`` of the link
  and overlap computation.
* Durations: the stage's summed layer costs divided by the device's speed factor. ``B`` costs
  ``b + w``.
* Memory of a device = static (parameters of every stage it holds x ``TrainingConfig.param_bytes``,
  plus the largest ``workspace_bytes`` of its layers: a pass's short-lived buffers, such as the
  head's logits, counted as if always present; a weight pass's ``w_workspace_bytes``, such as the
  embedding's dense gradient, counts only beyond the ``min(act, keep)`` its stage's backward has
  freed by then) + activations. ``F`` adds the stage's
  ``act_bytes``; ``I`` leaves what ``W`` needs and ``W`` frees it; ``B`` frees all. What ``I``
  leaves follows the runtime: PyTorch's (``TrainingConfig.input_backward_keeps_graph``, on by default)
  keeps the autograd graph and the
  gradients ``W`` needs, ``w_graph_bytes`` (``LayerCost.w_graph``, which may exceed what ``F``
  added: ``I`` can raise the level, and the peak counts it); a runtime that frees at ``I`` keeps
  ``w_retained`` (the inputs of the weight matmuls). On the first stage, as PyTorch's runtime does
  (``I`` is a no-op there and ``W`` runs the whole backward), ``I`` frees nothing and ``W`` frees
  all (``TrainingConfig.first_stage_defers_backward``, on by default). Since a device's actions
  run in list order, its activation curve follows that order exactly. The limit is each device's
  capacity less ``Cluster.memory_reserve_gb``. Transfer buffers and the optimizer step's memory
  are not modelled (its time is the runtime's ``step_s``, below).
* Finer units (see :func:`stage_costs`): units of a ``shared_group`` (a head cut into shards)
  hold one copy of their weights per device, and the all-reduce of their gradients across the
  devices that hold them runs after the step (``StageCosts.post_step``, added to the makespan).
  A recomputing stage keeps only its input from F; its I (or B) first re-runs F and then
  computes the weight gradients too (its W is empty).
* Bounded: the loop makes at most ``actions + 1`` passes over the devices; a plan whose
  devices all wait on each other is reported as a deadlock naming the waiting actions.
* The runtime (``TrainingConfig.runtime``, :mod:`pipeline.runtime`) adds what a real runtime does
  to these ideal rules: a compute scale and a per-action overhead on every action, the profile's
  ``transfer_overhead`` on both ends of each transfer between devices, blocking transfers (moved
  from the link onto the sending action), a step time after the last action, and, where
  iterations overlap, the steady-state period (:func:`steady_period`) instead of the makespan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline import engine
from pipeline.errors import PlanError
from pipeline.event_sim import StageCosts, TimelineEntry, iteration_time
from pipeline.hardware import memory_bandwidth
from pipeline.plan import Action, Plan, raise_schedule_defect, validate_layout
from pipeline.runtime import Runtime, runtime_named
from pipeline.spec import GIB, Cluster, LayerCost, ModelProfile, TrainingConfig

#: Bytes per gradient element Megatron-LM all-reduces (its fp32 ``main_grad``).
FP32_BYTES = 4

_DUMMY_LAYER = LayerCost("stage", "stage", 0.0, 0.0, 0.0, 0, 0, 0)

__all__ = ["TimelineEntry", "StageCosts", "Result", "stage_costs", "simulate", "simulate_checked", "simulate_order",
           "steady_period"]



@dataclass(frozen=True)
class _Columns:
    """A profile's per-layer fields as lists, read once per profile (slices sum in C)."""

    f: list[float]
    b: list[float]
    w: list[float]
    b_full: list[float] | None
    act: list[int]
    keep: list[int]
    graph: list[int]
    params: list[int]
    out: list[int]
    groups: list[tuple[str, float] | None] | None = None
    """Per layer ``(shared_group, grad_sync_bytes)`` or None; ``None`` when no layer shares weights."""
    b_first: list[float] | None = None
    """Per layer the first stage's whole backward (``LayerCost.extra["b_first"]``, a calibrated
    profile's), or ``None`` where a layer lacks it."""
    workspace: list[float] | None = None
    """Per layer the bytes a pass allocates above what it holds (``LayerCost.extra["workspace_bytes"]``,
    the analytic head's logits), or ``None`` where no layer gives any."""
    w_workspace: list[float] | None = None
    """Per layer the bytes its weight pass allocates once the stage's backward has freed what it frees
    (``LayerCost.extra["w_workspace_bytes"]``, the embedding's dense gradient), or ``None``."""
    spans: dict[tuple[int, int], tuple] = field(default_factory=dict, compare=False)
    """``(a, b)`` -> the sums of the columns over layers ``[a, b)`` (:meth:`span`), one stage's."""
    stages: dict[tuple[int, int], tuple] = field(default_factory=dict, compare=False)
    """``(id(cluster), id(training))`` -> ``(cluster, training, runtime, memo)``: :func:`stage_costs`'
    per-stage figures on that cluster and training (the objects held, so the ids stay theirs)."""

    def stage_memo(self, cluster: Cluster, training: TrainingConfig, runtime: Runtime) -> dict[tuple, tuple]:
        """The per-stage memo of :func:`stage_costs` for these objects (a new one for others)."""
        key = (id(cluster), id(training))
        hit = self.stages.get(key)
        if hit is None or hit[0] is not cluster or hit[1] is not training or hit[2] is not runtime:
            if len(self.stages) >= 8:
                self.stages.clear()
            hit = self.stages[key] = (cluster, training, runtime, {})
        memo = hit[3]
        if len(memo) >= 65536:
            memo.clear()
        return memo

    def span(self, a: int, b: int) -> tuple:
        """``(f, b, w, b_full, act, graph, keep, params)`` summed over layers ``[a, b)`` (``b_full``
        0 without it), each ``sum`` of its slice as a stage sums it, computed once per range:
        the candidates of a search share most of their stages."""
        hit = self.spans.get((a, b))
        if hit is None:
            if len(self.spans) >= 65536:
                self.spans.clear()
            hit = self.spans[(a, b)] = (
                sum(self.f[a:b]), sum(self.b[a:b]), sum(self.w[a:b]),
                sum(self.b_full[a:b]) if self.b_full is not None else 0.0, sum(self.act[a:b]),
                sum(self.graph[a:b]), sum(self.keep[a:b]), sum(self.params[a:b]))
        return hit


def _columns(profile: ModelProfile) -> _Columns:
    cached = profile.__dict__.get("_columns")
    if cached is None:
        layers = profile.layers
        measured_b = all("b_full" in x.extra for x in layers)
        cached = _Columns([x.f for x in layers], [x.b for x in layers], [x.w for x in layers],
                          [float(x.extra["b_full"]) for x in layers] if measured_b else None,
                          [x.act_bytes for x in layers], [x.w_retained for x in layers],
                          [x.w_graph for x in layers], [x.params for x in layers], [x.out_bytes for x in layers],
                          _shared_groups(layers),
                          [float(x.extra["b_first"]) for x in layers] if all("b_first" in x.extra for x in layers)
                          else None,
                          [float(x.extra.get("workspace_bytes", 0)) for x in layers]
                          if any("workspace_bytes" in x.extra for x in layers) else None,
                          [float(x.extra.get("w_workspace_bytes", 0)) for x in layers]
                          if any("w_workspace_bytes" in x.extra for x in layers) else None)
        object.__setattr__(profile, "_columns", cached)  # a cache, not a field: replace() drops it
    return cached


def _shared_groups(layers: Sequence[LayerCost]) -> list[tuple[str, float] | None] | None:
    groups = [(str(x.extra["shared_group"]), float(x.extra.get("grad_sync_bytes", 0)))
              if x.extra.get("shared_group") is not None else None for x in layers]
    return groups if any(g is not None for g in groups) else None


def stage_costs(profile: ModelProfile, cluster: Cluster, partition: Sequence[tuple[int, int]], *,
                placement: Sequence[int], training: TrainingConfig = TrainingConfig(),
                recompute: Sequence[bool] | None = None) -> StageCosts:
    """Sum layer costs per stage, scale by device speed, add the profile's per-action overhead, and
    price the links between stages. A fused B costs ``i + w``, unless every layer carries a
    measured fused-backward time (``b_full``, measured profiles): then B costs their sum (one
    autograd pass is cheaper than I then W) plus two overheads, like I + W.

    With ``training.first_stage_defers_backward`` stage 0 keeps all its activations until ``W``
    (``w_keep[0] == act[0]``), as PyTorch's runtime does; its times are left as the profile gives
    them, unless every layer carries the first stage's whole-backward time (``b_first``: a profile
    calibrated on replays, ``pipeline.calibration.fidelity.calibrated_profile``): then stage 0's ``I`` costs
    its overhead alone and its ``W`` their ``b_first``, as ``pipeline.calibration.fidelity.runtime_profile``
    prices a replayed plan, so a search prices stage 0 as the replay does.
    Every other stage keeps from ``I`` until ``W`` its layers' ``w_graph`` under
    ``training.input_backward_keeps_graph`` (PyTorch), else their ``w_retained``.

    Units that name a ``shared_group`` (head shards) count their parameters once per device and
    add a ring all-reduce of ``grad_sync_bytes`` over the devices holding the group to
    ``post_step``. ``recompute[s]`` (activation checkpointing of the whole stage): F keeps only
    the stage's input; I re-runs F, then runs the whole backward, weight gradients included, so
    W is empty and nothing waits for it (a separate weight pass over checkpointed activations
    would re-run the forward per parameter group); B costs ``f + b + w``; the device's static
    memory reserves one micro-batch of the stage's full activations for the recomputation.

    ``training.runtime`` (:mod:`pipeline.runtime`) scales every time by its ``compute_scale``, adds
    its ``action_overhead_s`` to the profile's, its ``step_s`` and its optimizer step
    (:func:`optimizer_step_seconds`) to ``post_step``, and with
    ``blocking_p2p`` moves each transfer onto the action that sends it (``comm`` becomes 0); its
    ``p2p_hold_share`` adds that share of each transfer between devices to the actions at both its
    ends (the transfer stays on the link). The
    profile's ``transfer_overhead`` is added to both actions at the ends of each transfer between
    devices (F of the sender and of the receiver, I/B of both on the way back)."""
    if recompute is not None and len(recompute) != len(partition):
        raise PlanError(f"has {len(recompute)} entries for {len(partition)} stages; give one per stage",
                        field="recompute")
    col = _columns(profile)
    runtime = runtime_named(training.runtime)
    unit = profile.seconds_per_unit
    over = profile.action_overhead + runtime.action_overhead_s / unit
    measured_b = col.b_full is not None
    fused: list[float] = []
    compute = runtime.compute_scale_for(profile)
    speeds = [sp / compute for sp in cluster.speeds]  # a slower runtime is a slower device
    f, i, w, act, keep, comm = [], [], [], [], [], []
    static = [0.0] * cluster.devices
    scale = training.activation_scale
    transient = [0.0] * cluster.devices
    holders: dict[str, tuple[float, set[int]]] = {}
    tokens = profile.tokens_per_microbatch
    defers, keeps_graph, param_bytes = training.first_stage_defers_backward, training.input_backward_keeps_graph, \
        training.param_bytes
    depth = profile.w_depth

    def one(a: int, b: int, sp: float, redo: bool, first: bool) -> tuple:
        """(f, i, w, fused, act, keep, static bytes, full activations) of one stage."""
        sum_f, sum_b, sum_w, sum_fused, sum_act, sum_graph, sum_keep, sum_params = col.span(a, b)
        fwd, bwd_w = sum_f / sp, sum_w / sp
        if depth and not redo and not (first and defers):  # PyTorch's W walks the stage's graph per group
            bwd_w *= 1.0 + depth * (b - a - 1)
        if redo:  # I re-runs F, then the whole backward (weights too); W is left empty
            i_s, w_s = fwd + sum_b / sp + bwd_w + over, over
        elif first and defers and col.b_first is not None:  # I a no-op, W the whole backward (calibrated)
            i_s, w_s = over, sum(col.b_first[a:b]) / sp + over  # stage 0 only: once per stage memo
        else:
            i_s, w_s = sum_b / sp + over, bwd_w + over
        fused_s = sum_fused / sp + 2 * over + (fwd if redo else 0.0) if measured_b else None
        full = scale * sum_act
        if redo:
            act_s, keep_s = float(col.out[a - 1] if a else 8 * tokens), 0.0
        elif first and defers:
            act_s = keep_s = full
        else:
            act_s, keep_s = full, scale * sum_graph if keeps_graph else scale * sum_keep
        return fwd + over, i_s, w_s, fused_s, act_s, keep_s, param_bytes * sum_params, full

    memo = col.stage_memo(cluster, training, runtime)  # each figure a pure function of its key here
    last = len(partition) - 1
    for s, (a, b) in enumerate(partition):
        d = placement[s]
        redo = recompute is not None and bool(recompute[s])
        key = (a, b, d, redo, s == 0)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = one(a, b, speeds[d], redo, s == 0)
        f_s, i_s, w_s, fused_s, act_s, keep_s, static_s, full = hit
        f.append(f_s)
        i.append(i_s)
        w.append(w_s)
        if measured_b:
            fused.append(fused_s)
        act.append(act_s)
        keep.append(keep_s)
        if redo:
            transient[d] = max(transient[d], full)
        if col.workspace is not None:  # a pass's short-lived buffers, on top of whatever is held then
            transient[d] = max(transient[d], max(col.workspace[a:b], default=0.0))
        if col.w_workspace is not None:  # at the end of a backward that freed at least min(act, keep) of it
            transient[d] = max(transient[d], max(col.w_workspace[a:b], default=0.0) - min(act_s, keep_s))
        if col.groups is None:
            static[d] += static_s
        else:
            for k in range(a, b):
                group = col.groups[k]
                if group is None:
                    static[d] += training.param_bytes * col.params[k]
                    continue
                devices = holders.setdefault(group[0], (group[1], set()))[1]
                if d not in devices:
                    devices.add(d)
                    static[d] += training.param_bytes * col.params[k]
        if s < last:
            nxt = placement[s + 1]
            ckey = (d, nxt, b)
            c = memo.get(ckey)
            if c is None:
                c = memo[ckey] = cluster.transfer_seconds(d, nxt, col.out[b - 1]) / unit
            comm.append(c)
        else:
            comm.append(0.0)
    post = sum(_ring_all_reduce(cluster, sorted(devs), nbytes) for nbytes, devs in holders.values()) / unit
    post += runtime.step_s / unit
    if runtime.optimizer_bytes_per_param and training.param_bytes > 0:  # the parameters each device holds
        post += optimizer_step_seconds([x / training.param_bytes for x in static], cluster, runtime=runtime,
                                       training=training) / unit
    post += tied_gradient_seconds(profile, cluster, partition, placement=placement, runtime=runtime) / unit
    ends = profile.transfer_overhead  # each end of a transfer between devices pays it
    share = 0.0 if runtime.blocking_p2p else runtime.p2p_hold_share  # and is held for this share of it
    if ends or share:
        for s in range(len(partition) - 1):
            if placement[s] != placement[s + 1]:
                held = ends + share * comm[s]
                f[s] += held  # sends the activation
                f[s + 1] += held  # receives it
                i[s + 1] += held  # sends the gradient
                i[s] += held  # receives it
                if measured_b:
                    fused[s] += held
                    fused[s + 1] += held
    if runtime.blocking_p2p:  # the sender waits for its transfer: it moves from the link onto the action
        for s, t in enumerate(comm):
            if t:
                f[s] += t
                i[s + 1] += t
                if measured_b:
                    fused[s + 1] += t
        comm = [0.0] * len(comm)
    static = [x + y for x, y in zip(static, transient)]
    return StageCosts(tuple(f), tuple(i), tuple(w), tuple(act), tuple(keep), tuple(comm), tuple(static),
                      cluster.memory_limits_bytes, tuple(fused) if measured_b else None, post,
                      profile.compute_contention)


def optimizer_step_seconds(params_held: Sequence[float], cluster: Cluster, *, runtime: Runtime,
                           training: TrainingConfig) -> float:
    """Seconds of the optimizer step after the iteration's last action: every device updates the
    ``params_held[d]`` parameters it holds at once (a shared group counted once per device, as its
    static memory counts them), streaming ``runtime.optimizer_bytes_per_param`` bytes of weights,
    gradients and optimizer state per parameter through its memory; the slowest device sets the
    time. Parameters whose optimizer state is sharded over data-parallel ranks
    (``training.zero_stage`` >= 1) count ``1 / dp``. 0 where the runtime does not price the step or
    the cluster's GPU (and so its memory bandwidth) is unknown (:func:`pipeline.hardware.memory_bandwidth`)."""
    if not runtime.optimizer_bytes_per_param or not params_held:
        return 0.0
    bandwidth = memory_bandwidth(cluster)
    if bandwidth is None:
        return 0.0
    held = max(params_held)
    if training.zero_stage >= 1:
        held /= training.data_parallel
    return runtime.optimizer_bytes_per_param * held / bandwidth


def tied_gradient_seconds(profile: ModelProfile, cluster: Cluster, partition: Sequence[tuple[int, int]], *,
                          placement: Sequence[int], runtime: Runtime) -> float:
    """Seconds of summing tied weights' gradients after the last action, on a runtime that does it
    (``runtime.sums_tied_gradients``: Megatron-LM's embedding-group all-reduce): a layer holding a
    copy of weights another owns (a tied LM head, MTP's copies: ``extra["unique_params"]`` below
    its ``params``) all-reduces that copy's fp32 gradient with the embedding's device, free when both
    are on one device (a V placement puts them there). Head shards' own copies are priced by their
    ``shared_group`` instead."""
    if not runtime.sums_tied_gradients:
        return 0.0
    layers = profile.layers
    embedding = next((k for k, x in enumerate(layers) if x.kind == "embedding"), None)
    if embedding is None:
        return 0.0
    device_of = [0] * len(layers)
    for s, (a, b) in enumerate(partition):
        for k in range(a, b):
            device_of[k] = placement[s]
    total = 0.0
    for k, x in enumerate(layers):
        copies = x.params - int(x.extra.get("unique_params", x.params))
        if copies > 0 and x.extra.get("shared_group") is None and device_of[k] != device_of[embedding]:
            total += _ring_all_reduce(cluster, sorted({device_of[embedding], device_of[k]}), FP32_BYTES * copies)
    return total


def _ring_all_reduce(cluster: Cluster, devices: Sequence[int], nbytes: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``devices``: ``2(n-1)`` steps of ``nbytes/n``
    over the ring's slowest link (0 for one device)."""
    n = len(devices)
    if n < 2:
        return 0.0
    step = max(cluster.transfer_seconds(devices[k], devices[(k + 1) % n], nbytes / n) for k in range(n))
    return 2 * (n - 1) * step



@dataclass
class Result:
    """What the performance model predicts for one plan."""

    valid: bool
    error: str | None
    iteration_time: float
    """Makespan of the iteration, in the profile's time unit (``inf`` when invalid)."""
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]
    """Bytes per device: static + peak activations."""
    memory_limit: tuple[float, ...]
    tokens: int
    seconds_per_unit: float
    time_unit: str
    timeline: list[TimelineEntry] = field(default_factory=list)
    devices: int = 0

    @property
    def feasible(self) -> bool:
        """Valid and within every device's memory limit."""
        return self.valid and all(p <= lim for p, lim in zip(self.peak_memory, self.memory_limit))

    @property
    def bubble(self) -> tuple[float, ...]:
        """Idle share of the iteration, per device."""
        t = self.iteration_time
        if not self.valid or t <= 0:
            return tuple(0.0 for _ in self.busy)
        return tuple(max(0.0, 1.0 - b / t) for b in self.busy)

    @property
    def mean_bubble(self) -> float:
        bub = self.bubble
        return sum(bub) / len(bub) if bub else 0.0

    @property
    def throughput(self) -> float:
        """Tokens per second of the whole pipeline."""
        if not self.valid or self.iteration_time <= 0:
            return 0.0
        return self.tokens / (self.iteration_time * self.seconds_per_unit)

    @property
    def peak_memory_gb(self) -> tuple[float, ...]:
        return tuple(p / GIB for p in self.peak_memory)

    def summary(self) -> dict[str, Any]:
        """The JSON-able figures of this result (no timeline)."""
        return {
            "valid": self.valid,
            "error": self.error,
            "iteration_time": self.iteration_time if self.valid else None,
            "time_unit": self.time_unit,
            "throughput": self.throughput,
            "bubble": round(self.mean_bubble, 6),
            "bubble_per_device": [round(b, 6) for b in self.bubble],
            "peak_memory_gb": [round(p, 4) for p in self.peak_memory_gb],
            "memory_limit_gb": [round(m / GIB, 4) for m in self.memory_limit],
            "feasible": self.feasible,
        }

    def timeline_dict(self) -> dict[str, Any]:
        """The timeline in the shared format that the executor also writes, with the priced
        ``iteration_time`` (the schedule's makespan plus the terms the events do not show: the
        step after it, compute contention; or the steady period of overlapping iterations), so a
        chart drawn from it ends at the printed time (:func:`pipeline.render.chart_span`)."""
        return {
            "time_unit": self.time_unit,
            "devices": self.devices,
            "iteration_time": self.iteration_time if self.valid else None,
            "events": [{"device": e.device, "action": str(e.action), "start": e.start, "end": e.end}
                       for e in self.timeline],
        }


def _invalid(message: str, costs: StageCosts, tokens: int, profile: ModelProfile, devices: int) -> Result:
    return Result(False, message, float("inf"), tuple(0.0 for _ in range(devices)),
                  tuple(costs.static_bytes), costs.memory_limit, tokens, profile.seconds_per_unit,
                  profile.time_unit, devices=devices)


def simulate(plan: Plan, profile: ModelProfile, cluster: Cluster, *, training: TrainingConfig = TrainingConfig(),
             costs: StageCosts | None = None, validate: bool = True, record_timeline: bool = True) -> Result:
    """Simulate ``plan``; never raises for a bad plan: an invalid one gives ``Result.valid == False``.

    ``costs`` may be passed to reuse per-stage sums across schedules; ``validate=False`` skips the
    structural checks (use only for plans from our own generators); ``record_timeline=False``
    keeps only the figures (faster, for search). Runs on the engine :mod:`pipeline.engine` selects.
    """
    tokens = plan.microbatches * profile.tokens_per_microbatch
    P, M = plan.devices, plan.microbatches
    if validate:
        try:
            validate_layout(plan, num_layers=profile.num_layers, devices=cluster.devices)
            scenario = engine.check_schedule(plan)
            if scenario is not None:
                raise_schedule_defect(plan, scenario)
        except PlanError as exc:
            dummy = StageCosts((), (), (), (), (), (), tuple(0.0 for _ in range(P)),
                               tuple(cluster.memory_limits_bytes[:P]) if cluster.devices >= P else
                               tuple(float("inf") for _ in range(P)))
            return _invalid(str(exc), dummy, tokens, profile, P)
    if costs is None:
        costs = stage_costs(profile, cluster, plan.partition, placement=plan.placement, training=training,
                            recompute=plan.recompute)
    ok, makespan, busy, peak, ran, timeline = engine.simulate_schedule(
        costs, plan.schedule, devices=P, microbatches=M, record_timeline=record_timeline)
    if not ok:
        S = plan.num_stages
        waiting = [f"device {d} waits at {plan.schedule[d][ran[d]]} ({_needs(plan.schedule[d][ran[d]], S)})"
                   for d in range(P) if ran[d] < len(plan.schedule[d])]
        return _invalid("deadlock: no device can run its next action: " + "; ".join(waiting) +
                        ". Reorder so each action comes after what it needs.", costs, tokens, profile, P)
    static = costs.static_bytes
    if runtime_named(training.runtime).overlap_iterations:
        makespan = steady_period(costs, plan.schedule, devices=P, microbatches=M, makespan=makespan)
    makespan = iteration_time(costs, makespan, busy)  # + the gradient all-reduce, the step, contention
    return Result(True, None, makespan, tuple(busy), tuple(static[d] + peak[d] for d in range(P)),
                  costs.memory_limit, tokens, profile.seconds_per_unit, profile.time_unit, timeline, devices=P)



def steady_period(costs: StageCosts, schedule: Sequence[Sequence[Action]], *, devices: int, microbatches: int,
                  makespan: float) -> float:
    """Time per iteration when iterations overlap (each device starts the next one as soon as it has
    finished its own actions): the second of two back-to-back iterations, each device running its
    list twice (the second time on micro-batches ``M..2M-1``). ``makespan``: one iteration's."""
    M = microbatches
    twice = tuple(tuple(acts) + tuple(Action(a[0], a[1], a[2] + M) for a in acts) for acts in schedule)
    run = engine.simulate_schedule(costs, twice, devices=devices, microbatches=2 * M)
    return run.makespan - makespan if run.ok else makespan


def simulate_order(schedule: Sequence[Sequence[Action]], costs: StageCosts, devices: int, *,
                   microbatches: int) -> tuple[float, tuple[float, ...]]:
    """Iteration time and peak activation bytes per device of an order from our own generators
    (valid by construction), without building a Plan or a Result."""
    S = len(costs.f)
    placement = [0] * S
    for d, acts in enumerate(schedule):
        for a in acts:
            placement[a[0]] = d
    partition = tuple((s, s + 1) for s in range(S))
    plan = Plan(devices, microbatches, partition, tuple(placement), tuple(tuple(a) for a in schedule))
    dummy = ModelProfile("order", tuple(_DUMMY_LAYER for _ in range(S)))
    zero = StageCosts(costs.f, costs.i, costs.w, costs.act, costs.w_keep, costs.comm,
                      tuple(0.0 for _ in range(devices)), tuple(float("inf") for _ in range(devices)), costs.fused)
    result = simulate(plan, dummy, Cluster(devices=devices), costs=zero, validate=False, record_timeline=False)
    return result.iteration_time, result.peak_memory


def _needs(a: Action, num_stages: int) -> str:
    s, op, m = a
    if op == "F":
        return f"needs {s - 1}F{m}" if s else "needs nothing"
    if op == "W":
        return f"needs {s}I{m}"
    if s == num_stages - 1:
        return f"needs {s}F{m}"
    return f"needs {s}F{m} and the gradient of {s + 1}I{m} or {s + 1}B{m}"


def simulate_checked(plan: Plan, profile: ModelProfile, cluster: Cluster, *,
                     training: TrainingConfig = TrainingConfig(), **kw: Any) -> Result:
    """Like :func:`simulate` but raise PlanError for an invalid plan."""
    result = simulate(plan, profile, cluster, training=training, **kw)
    if not result.valid:
        raise PlanError(result.error or "invalid plan", field="schedule")
    return result
