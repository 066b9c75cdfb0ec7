"""Run a plan's per-rank actions on real stages with ``torch.distributed.pipelining``.

What comes from PyTorch and what is ours:

* PyTorch: :class:`~torch.distributed.pipelining.PipelineStage` (point-to-point transfers of
  activations and gradients, shape inference, the F / I / W / B computations) and
  ``_PipelineScheduleRuntime`` (lowers the plan's compute-only order to one with sends and
  receives, runs it). The plan reaches it exactly as an exported CSV: ``Plan.save_csv`` then
  ``_load_csv(path, format="compute_only")``, which also infers the stage-to-rank placement, so
  any placement (sequential, interleaved, V, or arbitrary) runs.
* Ours: :class:`TimedStage`, a ``PipelineStage`` that records when each F, I, W and B starts and
  ends (compute only: waits for incoming transfers happen before the call), the stage modules
  built from an architecture, barrier-aligned clocks, and the step/timeline bookkeeping.

Loss convention: the head returns the mean cross-entropy over a micro-batch's tokens; the
step's loss is the mean over micro-batches, and gradients are those of that mean
(``scale_grads=True`` divides the summed micro-batch gradients by their number).

Finer units: a head cut into shards holds one copy of its weights per shard; after the step the
copies' gradients are summed over every stage and rank (an all-reduce over the process group,
as Megatron does for tied embeddings), so every copy holds the whole head's gradient and the
copies stay equal under the optimizer. A stage marked in ``plan.recompute`` runs under
``torch.utils.checkpoint`` and computes its weight gradients in its I (its W does nothing), as
the performance model prices it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from executor.lowering import lower
from executor.model import build_stage
from pipeline.arch import Architecture
from pipeline.plan import Plan

__all__ = ["ActionRecord", "TimedStage", "StepResult", "PipelineExecutor", "passthrough_loss"]


class ActionRecord(tuple):
    """``(stage, op, microbatch, start, end)`` with ``perf_counter`` seconds."""

    __slots__ = ()

    def __new__(cls, stage: int, op: str, mb: int, start: float, end: float) -> ActionRecord:
        return super().__new__(cls, (stage, op, mb, start, end))


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that appends an :class:`ActionRecord` for every computation it runs."""

    def __init__(self, *args: Any, records: list[ActionRecord], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records = records
        self._sync = torch.device(self.device).type == "cuda"

    def _now(self) -> float:
        if self._sync:  # GPU work is asynchronous: wait for it so the record holds its real end
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def forward_one_chunk(self, fwd_chunk_id: int, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                          save_forward_output: bool = True) -> Any:
        t0 = self._now()
        out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.records.append(ActionRecord(self.stage_index, "F", fwd_chunk_id, t0, self._now()))
        return out

    @property
    def _recomputes(self) -> bool:
        return bool(getattr(self.submod, "recompute", False))

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> None:
        t0 = self._now()
        # A recomputing stage runs its whole backward in I: PyTorch's separate weight pass over
        # checkpointed activations re-runs the forward once per parameter group (about 150x W).
        super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward or self._recomputes,
                                   last_backward=last_backward)
        op = "B" if full_backward else "I"
        self.records.append(ActionRecord(self.stage_index, op, bwd_chunk_id, t0, self._now()))

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        t0 = self._now()
        if not self._recomputes:  # else its I computed the weight gradients already
            super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self.records.append(ActionRecord(self.stage_index, "W", bwd_chunk_id, t0, self._now()))


def passthrough_loss(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The last stage's output already is the loss (the head computes it); pass it through."""
    return output


@dataclass
class StepResult:
    """One training step on this rank."""

    loss: float | None
    """Mean loss over micro-batches (on the rank holding the last stage; else None)."""
    start: float
    """``perf_counter`` after the aligning barrier."""
    end: float
    """``perf_counter`` when this rank's part of the step returned."""
    records: list[ActionRecord] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.end - self.start


class PipelineExecutor:
    """This rank's stages of ``plan`` over ``arch`` and the schedule that runs them.

    ``step(tokens, labels)`` runs one training step (forward, backward, gradient scaling; no
    optimizer) of ``plan.microbatches`` micro-batches; ``tokens`` and ``labels`` are the whole
    batch, ``(microbatches * microbatch_size, seq_len)``, the same on every rank. ``lowering``
    (:mod:`executor.lowering`): ``early`` posts every receive at the start of the step, ``torch``
    keeps PyTorch's lock-step placement of receives.
    """

    def __init__(self, plan: Plan, arch: Architecture, *, rank: int, device: torch.device,
                 seed: int = 0, group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32,
                 lowering: str = "early") -> None:
        self.plan, self.arch, self.rank, self.device = plan, arch, rank, device
        self.records: list[ActionRecord] = []
        self.modules: list[nn.Module] = []
        stages: list[PipelineStage] = []
        for s in plan.stages_of(rank):  # ascending: the order shape inference needs
            start, end = plan.partition[s]
            recompute = bool(plan.recompute[s]) if plan.recompute is not None else False
            module = build_stage(arch, start, end, seed=seed, recompute=recompute).to(dtype=dtype).to(device)
            self.modules.append(module)
            stages.append(TimedStage(module, s, plan.num_stages, device, group=group, records=self.records))
        if not stages:
            raise ValueError(f"rank {rank} holds no stage of the plan")
        self.stages = stages
        self.schedule = _PipelineScheduleRuntime(stages, plan.microbatches, loss_fn=passthrough_loss,
                                                 scale_grads=True)
        fd, path = tempfile.mkstemp(prefix=f"adaptis-plan-r{rank}-", suffix=".csv")
        os.close(fd)
        try:
            plan.save_csv(path)
            self.schedule._load_csv(path, format="compute_only")
        finally:
            os.unlink(path)
        lower(self.schedule, lowering)

    def parameters(self) -> Iterator[nn.Parameter]:
        for module in self.modules:
            yield from module.parameters()

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def _sum_shared_grads(self) -> None:
        """Sum the gradients of the head shards' weight copies over stages and ranks (every rank
        takes part in the all-reduce, with zeros where it holds no shard)."""
        from executor.layers import HeadShard

        first = next((spec for spec in self.arch.layers if spec.kind == "head" and spec.shards > 1), None)
        if first is None:
            return
        with torch.device("meta"):
            shapes = [(n, p.shape) for n, p in
                      HeadShard(self.arch.vocab_size, self.arch.hidden_size, shard=0, shards=first.shards)
                      .named_parameters()]
        copies = [m for module in self.modules for m in module.modules() if isinstance(m, HeadShard)]
        for name, shape in shapes:
            params = [m.get_parameter(name) for m in copies]
            total = torch.zeros(shape, device=self.device)
            for p in params:
                if p.grad is not None:
                    total += p.grad
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(total)
            for p in params:
                p.grad = total.clone()

    def step(self, tokens: torch.Tensor, labels: torch.Tensor, *, align: bool = True) -> StepResult:
        """One step; with ``align``, a barrier first so that every rank's clock starts together."""
        self.records.clear()
        if align and dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        losses: list[torch.Tensor] = []
        self.schedule.step(tokens, labels=labels, target=labels, losses=losses, return_outputs=False)
        self._sum_shared_grads()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        loss = float(torch.stack([x.detach() for x in losses]).mean()) if losses else None
        return StepResult(loss, start, end, list(self.records))
