"""Measure the memory a plan really uses, stage by stage, on one process.

Two meters:

* :class:`SavedTensorMeter` counts the bytes of the tensors autograd saves
  (``torch.autograd.graph.saved_tensors_hooks``), per stage, over time: a tensor counts from the
  moment a stage's forward saves it until autograd releases it (the graph node that holds it is
  freed after the backward that used it, or never while a later pass still needs it). Storages
  are counted once however many nodes save them; parameters are left out. This is what the
  performance model's ``act_bytes`` stands for, on the CPU as on a GPU. Besides, the meter counts
  what a stage *keeps* (:meth:`SavedTensorMeter.hold`): the saved tensors plus the gradients
  PyTorch's ``stage_backward_input`` keeps from I until W (``param_groups[...]["grads"]``, the
  gradient at every weight operation's output), each storage once; this is what the model's
  ``w_graph_bytes`` stands for (``TrainingConfig.input_backward_keeps_graph``).
* On CUDA, the caching allocator's ``memory_allocated`` around every action, attributed to the
  stage that runs it (:func:`run_plan_here`): parameters, gradients, activations, transfer
  buffers and the transient workspace of each pass.

:func:`run_runtime_here` steps PyTorch's own ``_PipelineScheduleRuntime`` (the executor's
runtime) with every stage of a plan on this one rank, the devices' orders merged in the
simulator's timeline order (each stage's own actions keep their order, so each stage's memory
curve is the one it has on its own device). :func:`run_plan_here` follows the same order with
the stage modules directly, as the runtime does (first stage: ``I`` is a no-op and ``W`` runs the
whole backward), and hands activations and gradients between stages as copies, as a transfer
to another device would: that makes each device's allocator figures its own.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

from pipeline.plan import Action, Plan

__all__ = ["SavedTensorMeter", "MemoryReport", "merged_order", "run_runtime_here", "run_plan_here", "input_grads_for_w"]


class _Held:
    """What autograd stores instead of a saved tensor while the meter runs."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Tally:
    """Live bytes of reference-counted storages per stage and per device, with their peaks."""

    def __init__(self, placement: tuple[int, ...]) -> None:
        self.placement = placement
        self._live: dict[int, dict[int, list[int]]] = defaultdict(dict)
        self.level: dict[int, int] = defaultdict(int)
        self.stage_peak: dict[int, int] = defaultdict(int)
        self.device_level: dict[int, int] = defaultdict(int)
        self.device_peak: dict[int, int] = defaultdict(int)

    def add(self, stage: int, key: int, nbytes: int) -> None:
        entry = self._live[stage].get(key)
        if entry is None:
            self._live[stage][key] = [nbytes, 1]
            self._change(stage, nbytes)
        else:
            entry[1] += 1

    def remove(self, stage: int, key: int) -> None:
        entry = self._live[stage].get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[stage][key]
            self._change(stage, -entry[0])

    def _change(self, stage: int, delta: int) -> None:
        self.level[stage] += delta
        self.stage_peak[stage] = max(self.stage_peak[stage], self.level[stage])
        d = self.placement[stage]
        self.device_level[d] += delta
        self.device_peak[d] = max(self.device_peak[d], self.device_level[d])


class SavedTensorMeter:
    """Live bytes of the tensors autograd saves, per stage and per device, with their peaks; and
    of what each stage keeps: those plus the tensors passed to :meth:`hold` (gradients kept for W).

    Set :attr:`stage` (or use :meth:`attribute`) to the stage whose work runs; install the hooks
    with :meth:`hooks` around the work."""

    def __init__(self, placement: Sequence[int], *, exclude: Sequence[torch.Tensor] = ()) -> None:
        self.placement = tuple(placement)
        self.stage: int | None = None
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._saved = _Tally(self.placement)
        self._kept = _Tally(self.placement)
        # Saved tensors: live bytes per stage now, peaks per stage and device.
        self.level, self.stage_peak = self._saved.level, self._saved.stage_peak
        self.device_level, self.device_peak = self._saved.device_level, self._saved.device_peak
        # What each stage keeps (saved tensors and held gradients, each storage once).
        self.kept_level, self.kept_stage_peak = self._kept.level, self._kept.stage_peak
        self.kept_device_level, self.kept_device_peak = self._kept.device_level, self._kept.device_peak

    @contextmanager
    def attribute(self, stage: int) -> Iterator[None]:
        prev, self.stage = self.stage, stage
        try:
            yield
        finally:
            self.stage = prev

    @contextmanager
    def hooks(self) -> Iterator[SavedTensorMeter]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self

    def pack(self, t: torch.Tensor) -> Any:
        """The pack hook of :meth:`hooks`: counts ``t`` for :attr:`stage` (to wrap in another hook)."""
        stage = self.stage
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if stage is None or key in self._exclude:
            return t
        self._saved.add(stage, key, storage.nbytes())
        self._kept.add(stage, key, storage.nbytes())
        held = _Held(t.detach())  # no grad_fn: holding a node's own output must not make a cycle
        weakref.finalize(held, self._saved.remove, stage, key)
        weakref.finalize(held, self._kept.remove, stage, key)
        return held

    def hold(self, stage: int, tensors: Sequence[torch.Tensor | None]) -> int:
        """Count ``tensors`` as kept by ``stage`` until they are freed (storages counted once, with
        the saved ones); returns the bytes this added."""
        before = self.kept_level[stage]
        for t in tensors:
            if t is None or t.untyped_storage().data_ptr() in self._exclude:
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            self._kept.add(stage, key, storage.nbytes())
            weakref.finalize(t, self._kept.remove, stage, key)
        return self.kept_level[stage] - before

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        """The unpack hook of :meth:`hooks`: the tensor :meth:`pack` kept."""
        return held.tensor if isinstance(held, _Held) else held


def input_grads_for_w(param_groups: Sequence[dict[str, Any]] | None) -> list[torch.Tensor]:
    """The gradients ``stage_backward_input`` keeps in its ``param_groups`` until
    ``stage_backward_weight`` (one per output of each weight-gradient node; ``None`` skipped)."""
    out: list[torch.Tensor] = []
    for group in param_groups or ():
        for grads in group.get("grads") or ():
            out.extend(g for g in grads if isinstance(g, torch.Tensor))
    return out


def merged_order(plan: Plan, timeline: Sequence[Any]) -> tuple[Action, ...]:
    """Every device's actions in one list, in the order a simulated ``timeline`` starts them
    (ties: the earlier end first). Each device's own order is kept, and every action comes after
    what it needs, so one process can run the plan."""
    order = [e.action for e in sorted(timeline, key=lambda e: (e.start, e.end, e.device))]
    position = {a: i for i, a in enumerate(order)}
    for acts in plan.schedule:
        if [position[a] for a in acts] != sorted(position[a] for a in acts):
            raise ValueError("the timeline reorders a device's actions; pass the simulator's timeline of this plan")
    return tuple(order)


@dataclass
class MemoryReport:
    """Per-stage and per-device memory over one step of a plan, bytes."""

    saved_peak_stage: dict[int, int]
    """Peak live bytes of autograd-saved tensors, per stage."""
    saved_peak_device: dict[int, int]
    """The same summed over each device's stages (peak of the sum), per device."""
    kept_peak_stage: dict[int, int] = field(default_factory=dict)
    """Peak live bytes each stage keeps: saved tensors plus the gradients PyTorch's I keeps for W."""
    kept_peak_device: dict[int, int] = field(default_factory=dict)
    """The same summed over each device's stages (peak of the sum), per device."""
    allocated_peak_device: dict[int, int] = field(default_factory=dict)
    """CUDA only: peak ``memory_allocated`` per device (its parameters and gradients included)."""
    static_device: dict[int, int] = field(default_factory=dict)
    """CUDA only: bytes each device held before the step (its parameters)."""
    loss: float | None = None
    process_allocated_peak: int = 0
    """CUDA only: peak ``memory_allocated`` of the whole process (all devices' work on one GPU)."""
    process_reserved_peak: int = 0
    """CUDA only: peak ``memory_reserved``; less the allocated peak: the allocator's fragmentation."""

    def to_dict(self) -> dict[str, Any]:
        return {"saved_peak_stage": self.saved_peak_stage, "saved_peak_device": self.saved_peak_device,
                "kept_peak_stage": self.kept_peak_stage, "kept_peak_device": self.kept_peak_device,
                "allocated_peak_device": self.allocated_peak_device, "static_device": self.static_device,
                "loss": self.loss, "process_allocated_peak": self.process_allocated_peak,
                "process_reserved_peak": self.process_reserved_peak}


def run_runtime_here(plan: Plan, order: Sequence[Action], arch: Any, *, tokens: torch.Tensor, labels: torch.Tensor,
                     device: torch.device | str = "cpu", seed: int = 0) -> MemoryReport:
    """One step of ``plan`` through PyTorch's ``_PipelineScheduleRuntime`` with every stage on
    this rank (a one-rank gloo group is started and ended here), saved tensors metered per stage.

    ``order`` is :func:`merged_order`; ``tokens``/``labels`` hold ``plan.microbatches``
    micro-batches."""
    import torch.distributed as dist

    from executor.pipeline_executor import PipelineExecutor

    device = torch.device(device)
    one = Plan(1, plan.microbatches, plan.partition, tuple(0 for _ in plan.partition), (tuple(order),))
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ex = PipelineExecutor(one, arch, rank=0, device=device, seed=seed)
        meter = SavedTensorMeter(plan.placement, exclude=list(ex.parameters()))
        for stage in ex.stages:
            _attribute_stage(stage, meter)
        with meter.hooks():
            result = ex.step(tokens, labels, align=False)
    finally:
        if started:
            dist.destroy_process_group()
    return MemoryReport(dict(meter.stage_peak), dict(meter.device_peak), dict(meter.kept_stage_peak),
                        dict(meter.kept_device_peak), loss=result.loss)


def _attribute_stage(stage: Any, meter: SavedTensorMeter) -> None:
    """Make every computation of ``stage`` count as its own in ``meter`` (wraps the instance's
    methods), and hold the gradients its I keeps for W (``backward_state``) until W frees them."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        method = getattr(stage, name)

        def wrapped(*args: Any, _method: Callable[..., Any] = method, _name: str = name, **kwargs: Any) -> Any:
            with meter.attribute(stage.stage_index):
                out = _method(*args, **kwargs)
            if _name == "backward_one_chunk":
                chunk = args[0] if args else kwargs["bwd_chunk_id"]
                state = stage.backward_state.get(chunk)
                if state is not None:  # an I: (inputs, param_groups, outputs, output grads) wait for W
                    meter.hold(stage.stage_index, input_grads_for_w(state[1]))
            return out

        setattr(stage, name, wrapped)


class _Allocated:
    """``memory_allocated`` attributed to devices (CUDA; a no-op on the CPU)."""

    def __init__(self, device: torch.device, devices: int) -> None:
        self.on = device.type == "cuda"
        self.device = device
        self.level = [0] * devices
        self.peak = [0] * devices
        self.max_allocated = 0
        """Peak of the whole process's ``memory_allocated`` over every window."""
        self.max_reserved = 0
        """Peak of the caching allocator's ``memory_reserved`` over every window."""

    @contextmanager
    def on_device(self, d: int) -> Iterator[None]:
        if not self.on:
            yield
            return
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        after = torch.cuda.memory_allocated(self.device)
        high = torch.cuda.max_memory_allocated(self.device)
        self.peak[d] = max(self.peak[d], self.level[d] + high - before)
        self.max_allocated = max(self.max_allocated, high)
        self.max_reserved = max(self.max_reserved, torch.cuda.max_memory_reserved(self.device))
        self.level[d] += after - before


def run_plan_here(plan: Plan, order: Sequence[Action], stages: Sequence[torch.nn.Module], *, tokens: torch.Tensor,
                  labels: torch.Tensor, device: torch.device | str = "cpu",
                  build: Callable[[int], torch.nn.Module] | None = None) -> MemoryReport:
    """One step of ``plan`` in ``order`` (:func:`merged_order`) over its stage modules on this
    process, with PyTorch's runtime semantics, metering saved tensors per stage and (CUDA) the
    allocator per device.

    ``stages[s]`` is stage ``s``'s module (``forward(x, labels)``, the last returns the loss); or
    pass ``build(s)`` and ``stages=()`` to build each stage inside its device's accounting (so its
    parameters count as that device's static memory). Gradients accumulate in ``.grad``.
    """
    device = torch.device(device)
    P, M, S = plan.devices, plan.microbatches, plan.num_stages
    alloc = _Allocated(device, P)
    mods: list[torch.nn.Module] = list(stages)
    if not mods:
        if build is None:
            raise ValueError("pass the stage modules or build")
        for s in range(S):
            with alloc.on_device(plan.placement[s]):
                mods.append(build(s))
    static = list(alloc.level)
    params = [list(m.parameters()) for m in mods]
    meter = SavedTensorMeter(plan.placement, exclude=[p for ps in params for p in ps])
    tok = tokens.chunk(M)
    lab = labels.chunk(M)
    ins: dict[tuple[int, int], torch.Tensor] = {}
    outs: dict[tuple[int, int], torch.Tensor] = {}
    grad_in: dict[tuple[int, int], torch.Tensor] = {}  # input gradient of (stage, mb), not yet sent
    grad_out: dict[tuple[int, int], torch.Tensor | None] = {}  # received output gradient of (stage, mb)
    groups: dict[tuple[int, int], Any] = {}
    losses: list[float] = []
    with meter.hooks():
        for s, op, m in order:
            d = plan.placement[s]
            key = (s, m)
            if op == "F":
                with alloc.on_device(d), meter.attribute(s):
                    # a later stage's input is its receive buffer: a copy on this device
                    x = tok[m] if s == 0 else outs[(s - 1, m)].detach().clone().requires_grad_(True)
                    out = mods[s](x, lab[m])
                ins[key], outs[key] = x, out
                if s == S - 1:
                    losses.append(float(out.detach()) / M)
                continue
            if op in ("I", "B"):
                if s < S - 1:
                    with alloc.on_device(d):
                        grad_out[key] = grad_in[(s + 1, m)].clone()  # the receive buffer
                    with alloc.on_device(plan.placement[s + 1]):
                        del grad_in[(s + 1, m)]  # the sender frees it once sent
                else:
                    grad_out[key] = None
            with alloc.on_device(d), meter.attribute(s):
                if op == "I" and s == 0:
                    pass  # PyTorch's runtime: the first stage's I does nothing; its W runs the whole backward
                elif op == "B" or (op == "W" and s == 0):
                    g = grad_out.pop(key)
                    out, x = outs.pop(key), ins.pop(key)
                    gins = stage_backward(out, None, [x]) if g is None else stage_backward((out,), (g,), [x])
                    if s:
                        grad_in[key] = gins[0]
                elif op == "I":
                    g = grad_out.pop(key)
                    gins, groups[key] = stage_backward_input([outs.pop(key)], None if g is None else [g], [ins[key]],
                                                             iter(params[s]))
                    meter.hold(s, input_grads_for_w(groups[key]))
                    grad_in[key] = gins[0]
                else:  # W of a later stage
                    stage_backward_weight(iter(params[s]), groups.pop(key))
                    ins.pop(key)
    return MemoryReport(dict(meter.stage_peak), dict(meter.device_peak), dict(meter.kept_stage_peak),
                        dict(meter.kept_device_peak), {d: alloc.peak[d] for d in range(P)} if alloc.on else {},
                        {d: static[d] for d in range(P)} if alloc.on else {},
                        loss=sum(losses) if losses else None, process_allocated_peak=alloc.max_allocated,
                        process_reserved_peak=alloc.max_reserved)
