"""Model profiles, clusters and training settings, with JSON I/O and validation.

Units: times are in the profile's ``time_unit`` (``ms`` by default), bytes are
bytes, bandwidths are gigabytes per second (``p2p_gbps = 450`` is H100 NVLink's
450 GB/s one way), latencies are microseconds, memories are GiB (2**30 bytes): every ``*_gb`` memory field
(``memory_gb``, ``memory_reserve_gb``) counts 2**30 bytes, the unit ``nvidia-smi`` and
``torch.cuda`` report in (an "80 GB" H100 shows 81559 MiB = 79.6 GiB). Data-sheet gigabytes
(10**9 bytes) appear only as :attr:`pipeline.hardware.GPUSpec.memory_gb`.
"""

from __future__ import annotations

import difflib
import json
import math
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.errors import ClusterError, ConfigError, ProfileError

__all__ = [
    "W_RETAINED_FRACTION",
    "LayerCost",
    "ModelProfile",
    "Device",
    "Cluster",
    "TrainingConfig",
    "GIB",
    "TIME_UNITS",
    "DEFAULT_MEMORY_RESERVE_GB",
    "KNOWN_LAYER_EXTRAS",
    "ProfileWarning",
]

GIB = 2**30
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
PROFILE_VERSION = 1
#: 2: ``memory_reserve_gb`` (absent in a version-1 file: the default below applies).
CLUSTER_VERSION = 2
#: GiB per GPU that a plan may not use: the CUDA context with cuBLAS/cuDNN workspaces (about
#: 0.5-1 GiB with lazy module loading), NCCL's buffers and streams for the point-to-point
#: transfers of a pipeline (about 0.5-1 GiB), and the caching allocator's fragmentation
#: (reserved over allocated at peak, commonly a few percent of the peak). 4 GiB is 5% of an
#: 80 GiB H100 and 3% of an H200; ``python -m experiments gpu-check`` measures the
#: context and fragmentation on a real GPU so it can be corrected.
DEFAULT_MEMORY_RESERVE_GB = 4.0
#: Share of a layer's activations that its W (weight-gradient) pass still needs
#: after I has run, when a profile gives no ``w_act_bytes``: the inputs of the
#: weight matmuls. For a Megatron transformer layer these are about 8 of the
#: 34 s*b*h bytes of Korthikanti et al. (2022), hence a quarter.
W_RETAINED_FRACTION = 0.25
#: Optional per-layer fields the toolkit writes or reads (``pipeline.costs``, ``executor.profiler``):
#: any other extra field is kept too, with a :class:`ProfileWarning` naming it (a typo such as ``b_ful``).
KNOWN_LAYER_EXTRAS = frozenset({"b_full", "shared_group", "grad_sync_bytes", "unique_params", "flops_f", "flops_b",
                                "flops_w", "bytes_f", "bytes_b", "bytes_w", "block", "part", "shard", "shards",
                                "mem_retained_bytes", "mem_peak_bytes", "b_first",
                                "workspace_bytes", "w_workspace_bytes"})


class ProfileWarning(UserWarning):
    """A profile that reads, with fields nothing uses (perhaps misspelt).

    ``source`` is the file; ``fields`` maps each unknown per-layer field to the closest known
    field, or None (``experiments --strict`` turns it into an error naming them)."""

    def __init__(self, message: str, *, source: str | None = None,
                 fields: dict[str, str | None] | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.fields = dict(fields or {})


def _warn_unknown_layer_fields(layers: list[dict[str, Any]], source: str) -> None:
    """One :class:`ProfileWarning` naming each per-layer field that is neither a cost nor a known extra."""
    known = {f.name for f in fields(LayerCost)} - {"extra"} | KNOWN_LAYER_EXTRAS
    unknown: dict[str, list[str]] = {}
    for raw in layers:
        for key in raw:
            if key not in known:
                unknown.setdefault(key, []).append(str(raw.get("name")))
    parts = []
    closest: dict[str, str | None] = {}
    for key, names in unknown.items():
        close = difflib.get_close_matches(key, sorted(known), n=1)
        closest[key] = close[0] if close else None
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        parts.append(f"{key!r} (layer {names[0]!r}{more}" + (f"; did you mean {close[0]!r}?)" if close else ")"))
    if parts:
        warnings.warn(ProfileWarning(f"{source}: unknown layer field{'s' if len(parts) > 1 else ''} "
                                     f"{', '.join(parts)}: kept, but not used", source=source, fields=closest),
                      stacklevel=3)


def _number(raw: dict[str, Any], key: str, *, error: type, source: str, minimum: float = 0.0,
            default: float | None = None, integer: bool = False) -> float:
    bound = "a positive number" if 0 < minimum < 1e-6 else f"a number >= {minimum:g}"
    if key not in raw:
        if default is not None:
            return default
        raise error(f"missing; add {bound}", source=source, field=key)
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"expected a number, got {value!r}", source=source, field=key)
    if not math.isfinite(value) or value < minimum:
        raise error(f"must be {bound} (finite), got {value!r}", source=source, field=key)
    if integer:
        if int(value) != value:
            raise error(f"must be a whole number, got {value!r}", source=source, field=key)
        return int(value)
    return float(value)


def _read_json(path: str | Path, error: type) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read file ({exc.strerror}); check the path", source=str(path)) from None
    except UnicodeDecodeError:
        raise error("not a text file (JSON is UTF-8 text); check the path", source=str(path)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                    source=str(path)) from None
    if not isinstance(raw, dict):
        raise error("the top level must be a JSON object", source=str(path))
    return raw


@dataclass(frozen=True)
class LayerCost:
    """Costs of one layer for one micro-batch."""

    name: str
    """Human-readable layer name, e.g. ``embed`` or ``layer3.moe``."""
    kind: str
    """Layer kind, e.g. ``embedding``, ``attention``, ``moe``, ``mamba``, ``head``."""
    f: float
    """Forward time."""
    b: float
    """Backward-for-inputs (I) time."""
    w: float
    """Backward-for-weights (W) time; a fused backward B costs ``b + w``."""
    params: int
    """Parameter count."""
    act_bytes: int
    """Activation bytes held from F until the backward frees them."""
    out_bytes: int
    """Bytes of the output sent to the next stage (the gradient coming back has the same size)."""
    w_act_bytes: int | None = None
    """Bytes of ``act_bytes`` still held after I, until W, on a runtime whose I frees what W does not
    need (default: W_RETAINED_FRACTION of them); see :attr:`TrainingConfig.input_backward_keeps_graph`."""
    w_graph_bytes: int | None = None
    """Bytes held from I until W by PyTorch's split backward (``stage_backward_input`` keeps the
    autograd graph): the saved tensors below the weight-gradient nodes plus the gradients at those
    nodes that W turns into weight gradients; may exceed ``act_bytes`` (default: ``act_bytes``,
    the graph without the gradients). Used under ``TrainingConfig.input_backward_keeps_graph``."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Optional fields carried through JSON unchanged."""

    @property
    def w_retained(self) -> int:
        """Activation bytes I leaves for W to free."""
        if self.w_act_bytes is not None:
            return self.w_act_bytes
        return int(self.act_bytes * W_RETAINED_FRACTION)

    @property
    def w_graph(self) -> int:
        """Bytes PyTorch's ``I`` leaves for ``W`` to free (:attr:`w_graph_bytes`, else ``act_bytes``)."""
        return self.w_graph_bytes if self.w_graph_bytes is not None else self.act_bytes

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "profile") -> LayerCost:
        if not isinstance(raw, dict):
            raise ProfileError(f"each layer must be a JSON object, got {type(raw).__name__}", source=source)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ProfileError("missing or empty; give each layer a name", source=source, field="name")
        src = f"{source} layer '{name}'"
        kind = raw.get("kind", "layer")
        if not isinstance(kind, str):
            raise ProfileError("must be a string such as 'attention'", source=src, field="kind")
        known = {"name", "kind", "f", "b", "w", "params", "act_bytes", "out_bytes", "w_act_bytes", "w_graph_bytes"}
        act = _number(raw, "act_bytes", error=ProfileError, source=src, integer=True)
        w_act = None
        if raw.get("w_act_bytes") is not None:
            w_act = _number(raw, "w_act_bytes", error=ProfileError, source=src, integer=True)
            if w_act > act:
                raise ProfileError(f"{w_act} exceeds act_bytes {act}; W can only keep part of F's activations",
                                   source=src, field="w_act_bytes")
        w_graph = None
        if raw.get("w_graph_bytes") is not None:
            w_graph = _number(raw, "w_graph_bytes", error=ProfileError, source=src, integer=True)
        return cls(
            name=name,
            kind=kind,
            f=_number(raw, "f", error=ProfileError, source=src),
            b=_number(raw, "b", error=ProfileError, source=src),
            w=_number(raw, "w", error=ProfileError, source=src),
            params=_number(raw, "params", error=ProfileError, source=src, integer=True),
            act_bytes=act,
            out_bytes=_number(raw, "out_bytes", error=ProfileError, source=src, integer=True),
            w_act_bytes=w_act,
            w_graph_bytes=w_graph,
            extra={k: v for k, v in raw.items() if k not in known},
        )


@dataclass(frozen=True)
class ModelProfile:
    """One model's per-micro-batch, per-layer costs, in layer order."""

    name: str
    layers: tuple[LayerCost, ...]
    time_unit: str = "ms"
    seq_len: int = 4096
    microbatch_size: int = 1
    action_overhead: float = 0.0
    """Time every action (F, I, W) costs on top of its layers' time: the runtime's dispatch,
    bookkeeping and transfer posting (a fused B counts as I + W). 0 for analytic profiles;
    fitted from replays by ``pipeline.calibration.fidelity.calibrate``."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    transfer_overhead: float = 0.0
    """Time a transfer between devices costs each of its two ends on top of the link's time: the
    runtime posting the send and the receive, and the transport's copies competing with compute
    (gloo's threads on a CPU). Added to the action that sends and to the action that receives.
    0 for analytic profiles; fitted from replays by ``pipeline.calibration.fidelity.calibrate``."""
    compute_contention: float = 0.0
    """How much slower a device computes while another device of the same host computes too
    (dimensionless): CPU ranks sharing a machine's cores, caches and memory bandwidth. The
    simulator adds ``compute_contention x`` the time devices compute at once (the busy time beyond
    the makespan, over ``devices - 1``) to the iteration time. 0 for GPUs, whose compute does not
    share SMs across devices; fitted from replays by ``pipeline.calibration.fidelity.calibrate``."""
    w_depth: float = 0.0
    """How much a split backward's ``W`` of a stage grows, as a share of its layers' ``w``, for
    every layer of the stage past the first (dimensionless): PyTorch's ``stage_backward_weight``
    runs one ``autograd.grad`` per parameter group, each walking the stage's graph below it, so a
    stage of n layers costs about ``(1 + w_depth x (n - 1))`` the sum of its layers' ``W`` (measured
    on CPU: 1.21-1.24x for two layers, 1.65-1.68x for four, 1.95x for six). Not the first stage's
    W, which runs its whole backward at once. 0 for analytic profiles; fitted from replays by
    ``pipeline.calibration.fidelity.calibrate``."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise ProfileError("a profile needs at least one layer", source=self.name, field="layers")
        for name in ("action_overhead", "transfer_overhead", "compute_contention", "w_depth"):
            o = getattr(self, name)
            if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) or o < 0:
                raise ProfileError(f"must be a number >= 0, got {o!r}", source=self.name, field=name)
        if self.time_unit not in TIME_UNITS:
            raise ProfileError(f"unknown unit {self.time_unit!r}; use one of {sorted(TIME_UNITS)}",
                               source=self.name, field="time_unit")
        object.__setattr__(self, "layers", tuple(self.layers))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tokens_per_microbatch(self) -> int:
        return self.seq_len * self.microbatch_size

    @property
    def seconds_per_unit(self) -> float:
        return TIME_UNITS[self.time_unit]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": PROFILE_VERSION,
            "name": self.name,
            "time_unit": self.time_unit,
            "seq_len": self.seq_len,
            "microbatch_size": self.microbatch_size,
        }
        if self.action_overhead:
            out["action_overhead"] = self.action_overhead
        if self.transfer_overhead:
            out["transfer_overhead"] = self.transfer_overhead
        if self.compute_contention:
            out["compute_contention"] = self.compute_contention
        if self.w_depth:
            out["w_depth"] = self.w_depth
        out.update(self.extra)
        out["layers"] = [layer.to_dict() for layer in self.layers]
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "profile") -> ModelProfile:
        if not isinstance(raw, dict):
            raise ProfileError("the top level must be a JSON object", source=source)
        layers = raw.get("layers")
        if not isinstance(layers, list) or not layers:
            raise ProfileError("missing or empty; give a list of layer objects with f, b, w, params, "
                               "act_bytes, out_bytes", source=source, field="layers")
        unit = raw.get("time_unit", "ms")
        if not isinstance(unit, str) or unit not in TIME_UNITS:
            raise ProfileError(f"unknown unit {unit!r}; use one of {sorted(TIME_UNITS)}", source=source,
                               field="time_unit")
        name = raw.get("name", Path(source).stem)
        if not isinstance(name, str):
            raise ProfileError("must be a string", source=source, field="name")
        known = {"version", "name", "time_unit", "seq_len", "microbatch_size", "action_overhead", "transfer_overhead",
                 "compute_contention", "w_depth", "layers"}
        costs = tuple(LayerCost.from_dict(layer, source=source) for layer in layers)
        if not any(c.f > 0 or c.b > 0 or c.w > 0 for c in costs) and not raw.get("action_overhead"):
            raise ProfileError("every layer's f, b and w is 0, so every plan takes no time and none can be ranked; "
                               "give the measured times (python -m experiments profile writes them)",
                               source=source, field="layers")
        _warn_unknown_layer_fields(layers, source)
        return cls(
            name=name,
            layers=costs,
            time_unit=unit,
            seq_len=_number(raw, "seq_len", error=ProfileError, source=source, minimum=1, default=4096,
                            integer=True),
            microbatch_size=_number(raw, "microbatch_size", error=ProfileError, source=source, minimum=1,
                                    default=1, integer=True),
            action_overhead=_number(raw, "action_overhead", error=ProfileError, source=source, minimum=0,
                                    default=0.0),
            transfer_overhead=_number(raw, "transfer_overhead", error=ProfileError, source=source, minimum=0,
                                      default=0.0),
            compute_contention=_number(raw, "compute_contention", error=ProfileError, source=source, minimum=0,
                                       default=0.0),
            w_depth=_number(raw, "w_depth", error=ProfileError, source=source, minimum=0, default=0.0),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    @classmethod
    def load(cls, path: str | Path) -> ModelProfile:
        return cls.from_dict(_read_json(path, ProfileError), source=str(path))

    def scaled(self, factor: float) -> ModelProfile:
        """The same profile with every time multiplied by ``factor``."""
        return replace(self, layers=tuple(replace(layer, f=layer.f * factor, b=layer.b * factor,
                                                  w=layer.w * factor) for layer in self.layers),
                       action_overhead=self.action_overhead * factor,
                       transfer_overhead=self.transfer_overhead * factor)


#: Pipeline devices a cluster may hold (a guard: larger counts are a whole job's GPUs, not a pipeline).
MAX_CLUSTER_DEVICES = 65_536


@dataclass(frozen=True)
class Device:
    """One accelerator of a cluster."""

    speed: float = 1.0
    """Compute speed factor: a layer's time on this device is its profile time / speed."""
    memory_gb: float = 80.0
    """Memory capacity in GiB (2**30 bytes), as ``torch.cuda`` reports it."""


@dataclass(frozen=True)
class Cluster:
    """Devices and the links between them.

    Devices ``0..gpus_per_node-1`` share a node and talk over ``p2p_gbps``;
    across nodes the link is ``inter_node_gbps`` with ``inter_node_latency_us``.
    A plan may use ``memory_gb - memory_reserve_gb`` GiB per device
    (:attr:`memory_limits_bytes`).
    """

    devices: int
    memory_gb: float = 80.0
    """Capacity per device, GiB (2**30 bytes)."""
    p2p_gbps: float = 450.0
    latency_us: float = 5.0
    gpus_per_node: int | None = None
    inter_node_gbps: float = 50.0
    inter_node_latency_us: float = 10.0
    device_list: tuple[Device, ...] | None = None
    name: str = "cluster"
    memory_reserve_gb: float = 0.0
    """GiB per device kept off-limits for the CUDA context, NCCL buffers and allocator
    fragmentation. 0 here (an ideal device); GPU presets, the command line and cluster files
    default to :data:`DEFAULT_MEMORY_RESERVE_GB`."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise ClusterError(f"must be a whole number >= 1, got {self.devices!r}", source=self.name,
                               field="devices")
        if self.devices > MAX_CLUSTER_DEVICES:
            raise ClusterError(f"{self.devices} pipeline devices: plans hold at most {MAX_CLUSTER_DEVICES}; "
                               "give the pipeline's size, not the whole job's GPU count", source=self.name,
                               field="devices")
        for key in ("memory_gb", "p2p_gbps", "inter_node_gbps"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ClusterError(f"must be a positive number, got {value!r}", source=self.name, field=key)
        reserve = self.memory_reserve_gb
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not math.isfinite(reserve) \
                or reserve < 0:
            raise ClusterError(f"must be a number >= 0 (GiB), got {reserve!r}", source=self.name,
                               field="memory_reserve_gb")
        if self.device_list is not None:
            object.__setattr__(self, "device_list", tuple(self.device_list))
            if len(self.device_list) != self.devices:
                raise ClusterError(f"lists {len(self.device_list)} devices but 'devices' is {self.devices}; "
                                   "make them agree", source=self.name, field="device_list")
        smallest = (min(d.memory_gb for d in self.device_list) if self.device_list is not None
                    else self.memory_gb)
        if reserve >= smallest:
            raise ClusterError(f"{reserve:g} GiB leaves nothing of a {smallest:g} GiB device; lower "
                               "memory_reserve_gb (--memory-reserve-gb) or raise memory_gb (--memory-gb)",
                               source=self.name, field="memory_reserve_gb")

    def device(self, index: int) -> Device:
        if self.device_list is not None:
            return self.device_list[index]
        return Device(speed=1.0, memory_gb=self.memory_gb)

    @cached_property
    def speeds(self) -> tuple[float, ...]:
        return tuple(self.device(d).speed for d in range(self.devices))

    @cached_property
    def memory_limits_bytes(self) -> tuple[float, ...]:
        """Bytes a plan may use per device: capacity less the reserve."""
        return tuple((self.device(d).memory_gb - self.memory_reserve_gb) * GIB for d in range(self.devices))

    def same_node(self, a: int, b: int) -> bool:
        if self.gpus_per_node is None:
            return True
        return a // self.gpus_per_node == b // self.gpus_per_node

    def transfer_seconds(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to send ``nbytes`` from device ``a`` to ``b`` (0 on the same device)."""
        if a == b:
            return 0.0
        if self.same_node(a, b):
            return self.latency_us * 1e-6 + nbytes / (self.p2p_gbps * 1e9)
        return self.inter_node_latency_us * 1e-6 + nbytes / (self.inter_node_gbps * 1e9)

    def with_memory(self, memory_gb: float) -> Cluster:
        """The same cluster with every device's memory set to ``memory_gb``."""
        devs = None
        if self.device_list is not None:
            devs = tuple(replace(d, memory_gb=memory_gb) for d in self.device_list)
        return replace(self, memory_gb=memory_gb, device_list=devs)

    def with_reserve(self, memory_reserve_gb: float) -> Cluster:
        """The same cluster with ``memory_reserve_gb`` GiB per device kept off-limits."""
        return replace(self, memory_reserve_gb=memory_reserve_gb)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": CLUSTER_VERSION,
            "name": self.name,
            "devices": self.devices,
            "memory_gb": self.memory_gb,
            "memory_reserve_gb": self.memory_reserve_gb,
            "p2p_gbps": self.p2p_gbps,
            "latency_us": self.latency_us,
            "inter_node_gbps": self.inter_node_gbps,
            "inter_node_latency_us": self.inter_node_latency_us,
        }
        if self.gpus_per_node is not None:
            out["gpus_per_node"] = self.gpus_per_node
        if self.device_list is not None:
            out["device_list"] = [asdict(d) for d in self.device_list]
        out.update(self.extra)
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "cluster") -> Cluster:
        if not isinstance(raw, dict):
            raise ClusterError("the top level must be a JSON object", source=source)
        num = dict(error=ClusterError, source=source)
        devices = _number(raw, "devices", minimum=1, integer=True, **num)
        memory_gb = _number(raw, "memory_gb", minimum=1e-9, **num)
        device_list = None
        if raw.get("device_list") is not None:
            entries = raw["device_list"]
            if not isinstance(entries, list):
                raise ClusterError("must be a list of {speed, memory_gb} objects", source=source,
                                   field="device_list")
            device_list = []
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise ClusterError(f"entry {i} must be an object with speed and memory_gb",
                                       source=source, field="device_list")
                device_list.append(Device(
                    speed=_number(entry, "speed", minimum=1e-9, default=1.0, error=ClusterError,
                                  source=f"{source} device_list[{i}]"),
                    memory_gb=_number(entry, "memory_gb", minimum=1e-9, default=memory_gb,
                                      error=ClusterError, source=f"{source} device_list[{i}]"),
                ))
        gpn = raw.get("gpus_per_node")
        if gpn is not None:
            gpn = _number(raw, "gpus_per_node", minimum=1, integer=True, **num)
        version = _number(raw, "version", minimum=1, default=1, integer=True, **num)
        if version > CLUSTER_VERSION:
            raise ClusterError(f"version {version} is newer than this toolkit reads ({CLUSTER_VERSION}); "
                               "update the toolkit or write the file at an older version", source=source,
                               field="version")
        known = {"version", "name", "devices", "memory_gb", "memory_reserve_gb", "p2p_gbps", "latency_us",
                 "gpus_per_node", "inter_node_gbps", "inter_node_latency_us", "device_list"}
        p2p = _number(raw, "p2p_gbps", minimum=1e-12, **num)
        return cls(
            devices=devices,
            memory_gb=memory_gb,
            p2p_gbps=p2p,
            latency_us=_number(raw, "latency_us", **num),
            gpus_per_node=gpn,
            inter_node_gbps=_number(raw, "inter_node_gbps", minimum=1e-12, default=p2p, **num),
            inter_node_latency_us=_number(raw, "inter_node_latency_us", default=_number(raw, "latency_us", **num),
                                          **num),
            device_list=tuple(device_list) if device_list is not None else None,
            name=str(raw.get("name", Path(source).stem)),
            memory_reserve_gb=_number(raw, "memory_reserve_gb", default=DEFAULT_MEMORY_RESERVE_GB, **num),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    @classmethod
    def load(cls, path: str | Path) -> Cluster:
        return cls.from_dict(_read_json(path, ClusterError), source=str(path))


@dataclass(frozen=True)
class TrainingConfig:
    """Training settings that the performance model needs besides the plan."""

    bytes_per_param: float = 18.0
    """Weights + gradients + Adam states per parameter: 18 in mixed precision with fp32 master
    weights and no sharded optimizer (Korthikanti et al. 2022 quote 16-18): 2 of bf16 weights, 4 of
    fp32 gradients and the rest (12) of fp32 master weights and Adam's two moments."""
    data_parallel: int = 1
    """Data-parallel replicas over which :attr:`zero_stage` shards the per-parameter state."""
    zero_stage: int = 0
    """Sharding of the per-parameter state over :attr:`data_parallel` ranks: 0 none (every rank
    holds all :attr:`bytes_per_param`); 1 the optimizer states (Megatron-LM's distributed optimizer,
    ZeRO-1: ``6 + 12/d`` bytes); 2 the gradients too (ZeRO-2: ``2 + 16/d``); 3 the weights too
    (FSDP / ZeRO-3: ``18/d``). See :attr:`param_bytes`."""
    activation_scale: float = 1.0
    """Multiplier on every layer's activation bytes (e.g. < 1 with selective recomputation)."""
    first_stage_defers_backward: bool = True
    """Memory as PyTorch's ``_PipelineScheduleRuntime`` (torch 2.13, the executor's runtime) spends
    it: on the first stage, ``I`` does nothing (there is no input gradient to send) and ``W`` runs
    the whole backward, so stage 0 keeps all its activations from ``F`` until ``W``
    (``PipelineStage.backward_one_chunk`` skips ``is_first``; ``backward_weight_one_chunk`` runs
    the "full" backward for stage 0). ``False``: a runtime that splits stage 0's backward like
    every other stage's (see :attr:`input_backward_keeps_graph`). Fused ``B`` is unaffected."""
    input_backward_keeps_graph: bool = True
    """Memory of ``I`` on the stages after the first. ``True`` matches PyTorch's
    ``torch.distributed.pipelining`` (torch 2.13), the runtime of the executor and of torchtitan:
    ``stage_backward_input`` runs ``autograd.grad(..., retain_graph=True)`` and keeps, until
    ``stage_backward_weight``, every saved tensor below the weight-gradient nodes and the gradients
    at those nodes (``param_groups[...]["grads"]``), so a stage's ``I`` leaves its layers'
    ``w_graph_bytes`` for ``W`` to free, which can be more than ``F`` added (a deferred-W plan of
    ``tiny-hybrid`` through the executor's runtime: a middle stage keeps 1.40x the bytes autograd
    saved, the head's stage 2.54x, its logits' gradient; ``tests/executor/test_memory.py``).
    ``False``: the model before, for a runtime whose ``I`` frees what ``W`` does not need: ``I``
    leaves only ``w_act_bytes`` (the inputs of the weight matmuls). It omits the output gradients
    that ``W`` needs too (Megatron-LM's ``WeightGradStore`` keeps ``(total_input, grad_output)``
    per linear until ``W``), so it is a lower bound even for such a runtime."""
    runtime: Any = "ideal"
    """The runtime that executes the plan (:data:`pipeline.runtime.RUNTIMES`): ``ideal`` is the
    performance model alone; ``megatron``, ``zb``, ``zb-sync`` and ``pytorch`` add what that runtime
    does (per-action overhead, blocking transfers, the optimizer step, overlapped iterations). A
    :class:`pipeline.runtime.Runtime` may stand here too (calibration tries its own values)."""

    def __post_init__(self) -> None:
        if isinstance(self.data_parallel, bool) or not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise ConfigError(f"must be a whole number >= 1, got {self.data_parallel!r}", field="data_parallel")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"must be 0 (none), 1 (optimizer states), 2 (+ gradients) or 3 (FSDP), got "
                              f"{self.zero_stage!r}", field="zero_stage")

    @property
    def param_bytes(self) -> float:
        """Static bytes one device holds per parameter of its stages, after :attr:`zero_stage`
        sharding over :attr:`data_parallel` ranks (:attr:`bytes_per_param` when either is off)."""
        d, z = self.data_parallel, self.zero_stage
        if d <= 1 or z <= 0:
            return self.bytes_per_param
        weights, grads = 2.0, 4.0
        state = max(0.0, self.bytes_per_param - weights - grads)
        if z == 1:
            return weights + grads + state / d
        if z == 2:
            return weights + (grads + state) / d
        return self.bytes_per_param / d
