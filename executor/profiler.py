"""Measure every layer's costs on the current device and write a profile the search reads.

For each layer, on one micro-batch: ``f`` the forward time, ``b`` the backward-for-inputs time
(I) and ``w`` the backward-for-weights time (W), each the median of ``repeats`` runs after
``warmup`` runs (at least one: the first run meters bytes through saved-tensor hooks and is never
timed; the timed runs run without hooks, as the runtime does). I and W are timed with the very
functions the pipeline runtime calls
(``torch.distributed.pipelining._backward.stage_backward_input`` / ``stage_backward_weight``):
I computes gradients with respect to the layer's input only and keeps the intermediate gradients
that W then turns into parameter gradients. The first layer (token embedding: integer input)
has no input gradient; as in the runtime, its I is empty and W runs its whole backward.

``act_bytes`` counts the distinct tensors autograd saves during the forward (via
``torch.autograd.graph.saved_tensors_hooks``; parameters excluded, the layer's input included)
and ``out_bytes`` the bytes of the layer's output, i.e. what crosses a stage boundary.
``w_act_bytes`` is the share of ``act_bytes`` that is still saved after I, until W
(:class:`executor.memory.SavedTensorMeter`): PyTorch's ``stage_backward_input`` keeps the graph
for W (``retain_graph=True``), so inside a block it frees almost nothing; the first layer keeps
everything (its I is a no-op). ``w_graph_bytes`` is what PyTorch's I keeps in all until W:
``w_act_bytes`` plus the gradients ``stage_backward_input`` keeps for ``stage_backward_weight``
(its ``param_groups``' grads: the gradient at each weight operation's output).

On CUDA the same measurements run in bf16 (``ProfileConfig.dtype``): times come from CUDA events
recorded around each pass after the warm-up runs (GPU time, not host time), and the caching
allocator's counters add two fields per layer: ``mem_retained_bytes`` (``memory_allocated``
after the forward less before it: what the forward keeps alive, its output included) and
``mem_peak_bytes`` (``max_memory_allocated`` above the level before each pass, the largest over
F, I, W and fused B: the transient workspace). The profile's format is unchanged; on the CPU
these two fields are absent and times come from ``perf_counter``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

from executor.memory import SavedTensorMeter, input_grads_for_w
from executor.model import StageModule, build_layers, make_batch
from pipeline.arch import Architecture
from pipeline.spec import LayerCost, ModelProfile

__all__ = ["ProfileConfig", "profile_architecture", "measure_layers"]


@dataclass(frozen=True)
class ProfileConfig:
    """How to measure."""

    seq_len: int = 128
    """Tokens per sequence."""
    microbatch_size: int = 1
    """Sequences per micro-batch."""
    warmup: int = 2
    """Untimed runs before measuring."""
    repeats: int = 7
    """Timed runs; the median is kept."""
    seed: int = 0
    """Weights and data seed."""
    dtype: str | None = None
    """Parameter and activation dtype, ``bfloat16`` or ``float32``; None: bf16 on CUDA, fp32 on CPU."""

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        name = self.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        if name not in _DTYPES:
            raise ValueError(f"dtype {name!r} is not one of {sorted(_DTYPES)}")
        return _DTYPES[name]


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tic(device: torch.device) -> Any:
    """Start a timing: a recorded CUDA event on a GPU, ``perf_counter`` on the CPU."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start
    return time.perf_counter()


def _toc(device: torch.device, start: Any) -> float:
    """Seconds since :func:`_tic` (GPU time between the two CUDA events on a GPU)."""
    if device.type == "cuda":
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return time.perf_counter() - start


class _CudaMemory:
    """Allocator counters around one pass (CUDA only; a no-op elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on = device.type == "cuda"
        self.base = 0

    def begin(self) -> None:
        if self.on:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)

    def retained(self) -> int:
        """Bytes allocated now over the level at :meth:`begin`."""
        return torch.cuda.memory_allocated(self.device) - self.base if self.on else 0

    def peak(self) -> int:
        """Peak bytes allocated since :meth:`begin` over the level then."""
        return torch.cuda.max_memory_allocated(self.device) - self.base if self.on else 0


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(x: Any) -> list[torch.Tensor]:
    """A layer's output or input as a list (a head shard passes ``(hidden rows, carried loss)``)."""
    return list(x) if isinstance(x, tuple) else [x]


def _full_backward(out: Any, grad: list[torch.Tensor] | None, inp: list[torch.Tensor]) -> Any:
    if grad is None:  # the loss
        return stage_backward(out, None, inp)
    return stage_backward(tuple(_tensors(out)), tuple(grad), inp)


class _SavedBytes:
    """Counts the distinct non-parameter tensors autograd saves (a ``saved_tensors_hooks`` pair)."""

    def __init__(self, param_ptrs: set[int]) -> None:
        self.param_ptrs = param_ptrs
        self.sizes: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.data_ptr()
        if ptr not in self.param_ptrs:
            self.sizes[ptr] = max(self.sizes.get(ptr, 0), _tensor_bytes(t))
        return t

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


@contextlib.contextmanager
def _metering(counter: _SavedBytes, meter: SavedTensorMeter, layer: int) -> Iterator[None]:
    """Count the bytes a forward saves (``counter``) and what stays saved after I (``meter``)."""
    pack = lambda t: meter.pack(counter.pack(t))  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, meter.unpack), meter.attribute(layer):
        yield


def measure_layers(layers: Sequence[StageModule], tokens: torch.Tensor, labels: torch.Tensor, *,
                   config: ProfileConfig) -> list[dict[str, float]]:
    """Per layer: ``f``, ``b``, ``w``, ``b_full`` (seconds, medians), ``act_bytes``, ``out_bytes``,
    ``w_act_bytes``, ``w_graph_bytes``; on CUDA also ``mem_retained_bytes`` and ``mem_peak_bytes`` (see the
    module docstring).

    Layers are timed one after another inside a whole forward / backward pass, as a stage runs
    them (so caches are as cold as in a pipeline, not warmed by repeating one layer): a forward
    pass, an I pass in reverse, a W pass in reverse, then a forward and a fused-B pass.
    """
    device = tokens.device
    n = len(layers)
    params = [list(layer.parameters()) for layer in layers]
    times: dict[str, list[list[float]]] = {k: [[] for _ in range(n)] for k in ("f", "b", "w", "b_full")}
    act = [0] * n
    out_b = [0] * n
    retained = [0] * n
    peak = [0] * n
    w_share = [1.0] * n  # of the saved bytes, the share still saved after I
    w_grads = [0] * n  # bytes of the gradients I keeps for W
    meter = SavedTensorMeter([0] * n, exclude=[p for ps in params for p in ps])
    saved_after_f = [0] * n
    mem = _CudaMemory(device)

    def note_peak(i: int, rep: int) -> None:
        if rep == 0:
            peak[i] = max(peak[i], mem.peak())

    # Rep 0 meters bytes through saved-tensor hooks, whose Python calls (pack in F, unpack in I/W) the
    # runtime does not make: it is never timed, and the timed reps run without hooks.
    untimed = max(1, config.warmup)
    for rep in range(untimed + config.repeats):
        keep = rep >= untimed
        # forward
        ins, outs = [], []
        x = tokens
        for i, layer in enumerate(layers):
            inp = [x] if i == 0 else [t.detach().requires_grad_(True) for t in _tensors(x)]
            counter = _SavedBytes({p.data_ptr() for p in params[i]})
            mem.begin()
            with _metering(counter, meter, i) if rep == 0 else contextlib.nullcontext():
                t0 = _tic(device)
                out = layer(*inp, labels=labels)
                dt = _toc(device, t0)
            if rep == 0:
                saved_after_f[i] = meter.level[i]
                act[i] = counter.total + (0 if i == 0 else sum(_tensor_bytes(t) for t in inp))
                out_b[i] = sum(_tensor_bytes(t) for t in _tensors(out))
                retained[i] = mem.retained()
            note_peak(i, rep)
            if keep:
                times["f"][i].append(dt)
            ins.append(inp)
            outs.append(out)
            x = out
        # I in reverse (the first layer has no input gradient: its whole backward runs as W)
        groups: list[Any] = [None] * n
        grad: list[torch.Tensor] | None = None
        grads_out: list[list[torch.Tensor] | None] = [None] * n
        for i in reversed(range(n)):
            grads_out[i] = grad
            dt = 0.0
            if i:
                mem.begin()
                t0 = _tic(device)
                gin, groups[i] = stage_backward_input(_tensors(outs[i]), grad, ins[i], iter(params[i]))
                dt = _toc(device, t0)
                note_peak(i, rep)
                grad = list(gin)
                if rep == 0 and saved_after_f[i]:
                    w_share[i] = meter.level[i] / saved_after_f[i]
                if rep == 0:
                    w_grads[i] = meter.hold(i, input_grads_for_w(groups[i]))
            if keep:
                times["b"][i].append(dt)
        for i in reversed(range(n)):
            mem.begin()
            t0 = _tic(device)
            if i:
                stage_backward_weight(iter(params[i]), groups[i])
            else:
                _full_backward(outs[0], grads_out[0], ins[0])
            dt = _toc(device, t0)
            note_peak(i, rep)
            if keep:
                times["w"][i].append(dt)
        # fused B, for reference (the simulator prices B as b + w)
        ins, outs = [], []
        x = tokens
        for i, layer in enumerate(layers):
            inp = [x] if i == 0 else [t.detach().requires_grad_(True) for t in _tensors(x)]
            out = layer(*inp, labels=labels)
            ins.append(inp)
            outs.append(out)
            x = out
        grad = None
        for i in reversed(range(n)):
            mem.begin()
            t0 = _tic(device)
            gin = _full_backward(outs[i], grad, ins[i])
            dt = _toc(device, t0)
            note_peak(i, rep)
            grad = list(gin) if i else None
            if keep:
                times["b_full"][i].append(dt)
        for ps in params:
            for p in ps:
                p.grad = None
    med = statistics.median
    rows: list[dict[str, float]] = [
        {"f": med(times["f"][i]), "b": med(times["b"][i]), "w": med(times["w"][i]), "b_full": med(times["b_full"][i]),
         "act_bytes": act[i], "out_bytes": out_b[i], "w_act_bytes": int(act[i] * min(1.0, w_share[i])),
         "w_graph_bytes": int(act[i] * min(1.0, w_share[i])) + w_grads[i]}
        for i in range(n)]
    if mem.on:
        for i, row in enumerate(rows):
            row["mem_retained_bytes"] = retained[i]
            row["mem_peak_bytes"] = peak[i]
    return rows


def profile_architecture(arch: Architecture, *, device: torch.device | str = "cpu",
                         config: ProfileConfig = ProfileConfig(), name: str | None = None,
                         log: Callable[[str], None] | None = None) -> ModelProfile:
    """Measure every layer of ``arch`` on ``device``; times in milliseconds."""
    device = torch.device(device)
    if device.type == "cpu":
        from executor.host_memory import pin_malloc_thresholds

        pin_malloc_thresholds()  # as the executor's workers do: no page-fault costs in the profile
    dtype = config.torch_dtype(device)
    tokens, labels = make_batch(arch, batch=config.microbatch_size, seq_len=config.seq_len, seed=config.seed,
                                device=device)
    built = build_layers(arch, range(len(arch.layers)), seed=config.seed)
    layers = [StageModule({i: built[i]}, start=i, end=i + 1).to(device=device, dtype=dtype)
              for i in range(len(arch.layers))]
    measured = measure_layers(layers, tokens, labels, config=config)
    costs: list[LayerCost] = []
    for i, (spec, m) in enumerate(zip(arch.layers, measured)):
        label = spec.label
        unit = ({"block": f"layer{spec.block}", "part": spec.part} if spec.part is not None else
                {"block": "head", "shard": spec.shard, "shards": spec.shards, "shared_group": "head",
                 "grad_sync_bytes": 4 * sum(p.numel() for p in layers[i].parameters())}
                if spec.kind == "head" and spec.shards > 1 else {})
        costs.append(LayerCost(
            name=(f"layer{i}.{label}" if spec.kind == "block" else spec.kind if spec.shards == 1
                  else f"head.{spec.shard}"), kind=label,
            f=m["f"] * 1e3, b=m["b"] * 1e3, w=m["w"] * 1e3, params=sum(p.numel() for p in layers[i].parameters()),
            act_bytes=int(m["act_bytes"]), out_bytes=int(m["out_bytes"]), w_act_bytes=int(m["w_act_bytes"]),
            w_graph_bytes=int(m["w_graph_bytes"]),
            extra={"b_full": m["b_full"] * 1e3, **unit,
                   **{k: int(m[k]) for k in ("mem_retained_bytes", "mem_peak_bytes") if k in m}},
        ))
        if log is not None:
            c = costs[-1]
            log(f"  {c.name:<28} f {c.f:8.3f}  i {c.b:8.3f}  w {c.w:8.3f}  B {m['b_full'] * 1e3:8.3f} ms  "
                f"act {c.act_bytes / 2**20:7.2f} MiB")
    extra = {"measured": True, "device": _device_name(device), "threads": torch.get_num_threads(),
             "torch": torch.__version__, "hidden_size": arch.hidden_size, "repeats": config.repeats,
             "dtype": str(dtype).removeprefix("torch."),
             "timer": "cuda_events" if device.type == "cuda" else "perf_counter"}
    return ModelProfile(name=name or arch.name, layers=tuple(costs), time_unit="ms", seq_len=config.seq_len,
                        microbatch_size=config.microbatch_size, extra=extra)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
