"""A plan: partition (layers per stage), placement (stage -> device) and schedule.

Actions follow ``torch.distributed.pipelining``'s notation ``{stage}{F|I|W|B}{microbatch}``:
``F`` forward, ``I`` backward for inputs, ``W`` backward for weights, ``B`` fused I+W.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.errors import PlanError

__all__ = [
    "Action",
    "Plan",
    "Schedule",
    "parse_action",
    "parse_torch_cell",
    "even_partition",
    "partition_from_sizes",
    "sequential_placement",
    "interleaved_placement",
    "v_placement",
    "wave_placement",
    "validate_plan",
    "validate_layout",
    "schedule_defect",
    "raise_schedule_defect",
    "PLAN_VERSION",
]

#: Version 2 adds the optional per-stage ``recompute``; a plan without it is written as version 1.
PLAN_VERSION = 2
OPS = ("F", "I", "W", "B")
_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FIWB])\s*(\d+)\s*$")


class Action(NamedTuple):
    """One unit of work: ``op`` of ``stage`` for micro-batch ``mb``."""

    stage: int
    op: str
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.mb}"


def parse_action(text: Any, *, source: str = "plan") -> Action:
    """Parse ``"3F0"`` into ``Action(3, "F", 0)``; a clear PlanError otherwise."""
    if isinstance(text, Action):
        return text
    match = _ACTION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise PlanError(f"bad action {text!r}; write {{stage}}{{F|I|W|B}}{{microbatch}}, e.g. '3F0'",
                        source=source, field="schedule")
    return Action(int(match.group(1)), match.group(2), int(match.group(3)))


_OVERLAP_RE = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_COMPUTE_RE = re.compile(r"^\s*\d+\s*[FIWB]\s*\d+\s*$")


def parse_torch_cell(text: str) -> list[Action]:
    """The compute actions of one cell of a PyTorch pipelining order.

    Handles plain cells (``3F0``), DualPipeV's overlapped pairs (``(0F3;3B1)OVERLAP_F_B``, run
    one after the other here) and skips communication and bookkeeping cells (``0REDUCE_GRAD``,
    ``1SEND_F0``, ``UNSHARD``...), which the simulator models implicitly.
    """
    text = text.strip()
    match = _OVERLAP_RE.match(text)
    parts = match.group(1).split(";") if match else [text]
    return [parse_action(p) for p in parts if _COMPUTE_RE.match(p)]


# ---------------------------------------------------------------- partitions and placements

def partition_from_sizes(sizes: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Contiguous ``[start, end)`` ranges from the number of layers in each stage."""
    out, start = [], 0
    for size in sizes:
        out.append((start, start + int(size)))
        start += int(size)
    return tuple(out)


def even_partition(num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Split layers as evenly as possible; earlier stages take the remainder."""
    if num_stages < 1 or num_stages > num_layers:
        raise PlanError(f"cannot split {num_layers} layers into {num_stages} non-empty stages",
                        field="partition")
    base, extra = divmod(num_layers, num_stages)
    return partition_from_sizes([base + (1 if s < extra else 0) for s in range(num_stages)])


def sequential_placement(devices: int) -> tuple[int, ...]:
    """Stage ``s`` on device ``s``."""
    return tuple(range(devices))


def interleaved_placement(devices: int, chunks: int) -> tuple[int, ...]:
    """Looped placement: stage ``s`` on device ``s % devices`` (Megatron's virtual stages)."""
    return tuple(s % devices for s in range(devices * chunks))


def v_placement(devices: int) -> tuple[int, ...]:
    """V-shape: device ``d`` holds stages ``d`` and ``2*devices - 1 - d``."""
    return tuple(list(range(devices)) + list(reversed(range(devices))))


def wave_placement(devices: int, chunks: int) -> tuple[int, ...]:
    """Wave: chunks go down and up the devices alternately (V-shape is 2 chunks)."""
    out: list[int] = []
    for c in range(chunks):
        out.extend(range(devices) if c % 2 == 0 else reversed(range(devices)))
    return tuple(out)


# ---------------------------------------------------------------- the plan

class Schedule(tuple):
    """Per-device tuples of actions that also carry the flat arrays the compiled engine reads
    (``arrays``: rows and offsets, see :mod:`pipeline.engine`), so a schedule the engine made is
    never converted back. Equal to, and usable as, the plain tuple of tuples."""

    arrays: Any = None



@dataclass(frozen=True)
class Plan:
    """Partition + placement + schedule for ``devices`` devices and ``microbatches`` micro-batches."""

    devices: int
    microbatches: int
    partition: tuple[tuple[int, int], ...]
    placement: tuple[int, ...]
    schedule: tuple[tuple[Action, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    recompute: tuple[bool, ...] | None = None
    """Per stage: re-run its forward in the backward instead of keeping its activations
    (activation checkpointing); ``None``: no stage recomputes."""

    def __post_init__(self) -> None:
        if self.recompute is not None:
            if not any(self.recompute):
                object.__setattr__(self, "recompute", None)
            else:
                object.__setattr__(self, "recompute", tuple(bool(x) for x in self.recompute))
        object.__setattr__(self, "partition", tuple((int(a), int(b)) for a, b in self.partition))
        object.__setattr__(self, "placement", tuple(int(d) for d in self.placement))
        if type(self.schedule) is not Schedule:
            object.__setattr__(self, "schedule", tuple(tuple(acts) for acts in self.schedule))

    @property
    def num_stages(self) -> int:
        return len(self.partition)

    @property
    def num_layers(self) -> int:
        return self.partition[-1][1] if self.partition else 0

    @property
    def stage_sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.partition)

    def stages_of(self, device: int) -> tuple[int, ...]:
        return tuple(s for s, d in enumerate(self.placement) if d == device)

    @property
    def method(self) -> str:
        return str(self.meta.get("method", "custom"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": PLAN_VERSION if self.recompute is not None else 1,
            "devices": self.devices,
            "microbatches": self.microbatches,
            "partition": [list(r) for r in self.partition],
            "placement": list(self.placement),
            "schedule": [[str(a) for a in acts] for acts in self.schedule],
            "meta": self.meta,
        }
        if self.recompute is not None:
            out["recompute"] = list(self.recompute)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=None) + "\n")

    def save_csv(self, path: str | Path) -> None:
        """Write one row per device of action cells, the ``compute_only`` CSV that
        ``_PipelineScheduleRuntime._load_csv`` and torchtitan's ``pipeline_parallel_schedule_csv`` read."""
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            for acts in self.schedule:
                writer.writerow([str(a) for a in acts])

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "plan") -> Plan:
        if not isinstance(raw, dict):
            raise PlanError("the top level must be a JSON object", source=source)
        for key in ("devices", "microbatches", "partition", "placement", "schedule"):
            if key not in raw:
                raise PlanError("missing; a plan needs devices, microbatches, partition, placement, schedule",
                                source=source, field=key)
        for key in ("devices", "microbatches"):
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"must be a whole number >= 1, got {v!r}", source=source, field=key)
        part = raw["partition"]
        if not isinstance(part, list) or not all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in r) for r in part):
            raise PlanError("must be a list of [start, end) pairs of layer indices, e.g. [[0, 4], [4, 8]]",
                            source=source, field="partition")
        place = raw["placement"]
        if not isinstance(place, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in place):
            raise PlanError("must be a list with the device of each stage, e.g. [0, 1, 1, 0]",
                            source=source, field="placement")
        sched = raw["schedule"]
        if not isinstance(sched, list) or not all(isinstance(row, list) for row in sched):
            raise PlanError("must be a list (one per device) of lists of actions like '0F0'",
                            source=source, field="schedule")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise PlanError("must be a JSON object", source=source, field="meta")
        version = raw.get("version", 1)
        if version not in (1, 2):
            raise PlanError(f"version {version!r} is newer than this reader (1 or 2); update the toolkit",
                            source=source, field="version")
        recompute = raw.get("recompute")
        if recompute is not None and (not isinstance(recompute, list) or len(recompute) != len(part)
                                      or not all(isinstance(x, bool) for x in recompute)):
            raise PlanError(f"must be a list of true/false, one per stage ({len(part)}), e.g. "
                            f"{[False] * min(len(part), 3)}", source=source, field="recompute")
        return cls(
            devices=raw["devices"],
            microbatches=raw["microbatches"],
            partition=tuple(tuple(r) for r in part),
            placement=tuple(place),
            schedule=tuple(tuple(parse_action(a, source=source) for a in row) for row in sched),
            meta=meta,
            recompute=tuple(recompute) if recompute is not None else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except OSError as exc:
            raise PlanError(f"cannot read file ({exc.strerror}); check the path", source=str(path)) from None
        except json.JSONDecodeError as exc:
            raise PlanError(f"not valid JSON (line {exc.lineno}: {exc.msg})", source=str(path)) from None
        except UnicodeDecodeError:
            raise PlanError("not a text file (a plan is UTF-8 JSON); check the path", source=str(path)) from None
        return cls.from_dict(raw, source=str(path))


def validate_plan(plan: Plan, *, num_layers: int | None = None, devices: int | None = None,
                  source: str = "plan") -> None:
    """Check the plan's structure; raise PlanError naming the field, the actions and the fix.

    Checks: the partition covers the layers contiguously without empty stages; every stage sits
    on an existing device; every (stage, micro-batch) has exactly one F and either one B or one
    I and one W, each on the device that holds the stage. Ordering (deadlocks, a backward before
    its forward) is checked by the simulator, which names the actions it could not run.
    """
    validate_layout(plan, num_layers=num_layers, devices=devices, source=source)
    scenario = schedule_defect(plan)
    if scenario is not None:
        raise_schedule_defect(plan, scenario, source=source)


def validate_layout(plan: Plan, *, num_layers: int | None = None, devices: int | None = None,
                    source: str = "plan") -> None:
    """The checks of :func:`validate_plan` before the actions: devices, partition, placement, and
    one schedule row per device."""
    if devices is not None and plan.devices != devices:
        raise PlanError(f"the plan is for {plan.devices} devices but the cluster has {devices}; "
                        "search again for this cluster", source=source, field="devices")
    if not plan.partition:
        raise PlanError("is empty; give at least one stage", source=source, field="partition")
    expect = 0
    for s, (a, b) in enumerate(plan.partition):
        if a != expect:
            raise PlanError(f"stage {s} starts at layer {a} but the previous stage ended at {expect}; "
                            "stages must be contiguous from layer 0", source=source, field="partition")
        if b <= a:
            raise PlanError(f"stage {s} is empty ([{a}, {b})); every stage needs at least one layer",
                            source=source, field="partition")
        expect = b
    if num_layers is not None and expect != num_layers:
        raise PlanError(f"covers {expect} layers but the model has {num_layers}; the last stage must end "
                        f"at {num_layers}", source=source, field="partition")
    if len(plan.placement) != plan.num_stages:
        raise PlanError(f"has {len(plan.placement)} entries for {plan.num_stages} stages; give one device "
                        "per stage", source=source, field="placement")
    if plan.recompute is not None and len(plan.recompute) != plan.num_stages:
        raise PlanError(f"has {len(plan.recompute)} entries for {plan.num_stages} stages; give one true/false "
                        "per stage", source=source, field="recompute")
    for s, d in enumerate(plan.placement):
        if not 0 <= d < plan.devices:
            raise PlanError(f"stage {s} is on device {d}, outside 0..{plan.devices - 1}", source=source,
                            field="placement")
    if len(plan.schedule) != plan.devices:
        raise PlanError(f"has {len(plan.schedule)} device rows for {plan.devices} devices; give one list "
                        "of actions per device", source=source, field="schedule")


#: A structural defect of a schedule: (kind, data). Kinds and data: ``stage``, ``mb``, ``device``:
#: (device, flat action index); ``twice``: (device, flat index, first device); ``both``: (stage,
#: micro-batch, op code of the split half); ``missing``: flat (stage, op code, micro-batch) triples,
#: at most 9 of them. Op codes: F=0, I=1, W=2, B=3. The compiled engine reports the same.
ScheduleDefect = tuple[str, tuple[int, ...]]


def schedule_defect(plan: Plan) -> ScheduleDefect | None:
    """The first structural defect of ``plan.schedule`` (the readable reference of the check the
    compiled engine runs): every action names an existing stage and micro-batch on the device that
    holds the stage, no action twice, and every (stage, micro-batch) has F and either B or I and W."""
    seen: dict[tuple[int, str, int], int] = {}
    k = 0
    for d, acts in enumerate(plan.schedule):
        for a in acts:
            if not 0 <= a.stage < plan.num_stages:
                return "stage", (d, k)
            if not 0 <= a.mb < plan.microbatches:
                return "mb", (d, k)
            if plan.placement[a.stage] != d:
                return "device", (d, k)
            key = (a.stage, a.op, a.mb)
            if key in seen:
                return "twice", (d, k, seen[key])
            seen[key] = d
            k += 1
    missing: list[int] = []
    # Stop after a few: a typo like "microbatches": 1e9 must give an answer, not a billion-step loop.
    for s in range(plan.num_stages):
        for m in range(plan.microbatches):
            if len(missing) // 3 > 8:
                break
            if (s, "F", m) not in seen:
                missing += (s, 0, m)
            has_b = (s, "B", m) in seen
            has_i, has_w = (s, "I", m) in seen, (s, "W", m) in seen
            if has_b and (has_i or has_w):
                return "both", (s, m, 1 if has_i else 2)
            if not has_b:
                if not has_i:
                    missing += (s, 1 if has_w else 3, m)
                if has_i and not has_w:
                    missing += (s, 2, m)
        if len(missing) // 3 > 8:
            break
    return ("missing", tuple(missing)) if missing else None


def raise_schedule_defect(plan: Plan, defect: ScheduleDefect, *, source: str = "plan") -> None:
    """Raise the PlanError that names a :data:`ScheduleDefect`, the actions and the fix."""
    kind, data = defect

    def action_at(device: int, flat: int) -> Action:
        before = sum(len(acts) for acts in plan.schedule[:device])
        return plan.schedule[device][flat - before]

    if kind in ("stage", "mb", "device", "twice"):
        d = data[0]
        a = action_at(d, data[1])
        if kind == "stage":
            message = f"action {a} on device {d} names stage {a.stage}, outside 0..{plan.num_stages - 1}"
        elif kind == "mb":
            message = f"action {a} on device {d} names micro-batch {a.mb}, outside 0..{plan.microbatches - 1}"
        elif kind == "device":
            message = (f"action {a} is on device {d} but stage {a.stage} is placed on device "
                       f"{plan.placement[a.stage]}; move it to that device's list")
        else:
            message = f"action {a} appears twice (devices {data[2]} and {d}); keep one"
    elif kind == "both":
        s, m, op = data
        message = f"stage {s} micro-batch {m} has both a fused {s}B{m} and a split {OPS[op]}; use B, or I and W"
    elif kind == "missing":
        names = [f"{data[i]}{OPS[data[i + 1]]}{data[i + 2]}" for i in range(0, len(data), 3)]
        shown = ", ".join(names[:8]) + (" and more" if len(names) > 8 else "")
        message = (f"missing actions {shown}; every stage needs F and B (or I and W) for every "
                   "micro-batch")
    else:
        raise ValueError(f"unknown schedule defect {kind!r}")
    raise PlanError(message, source=source, field="schedule")
