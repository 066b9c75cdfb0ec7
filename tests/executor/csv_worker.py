"""Run a plan's exported CSV under PyTorch's own ``_PipelineScheduleRuntime`` (no code of the
executor's runtime): plain ``PipelineStage``s, ``_load_csv(path, format="compute_only")``.

Usage (under torchrun, 2 processes): ``python tests/executor/csv_worker.py PLAN.json PLAN.csv``.
Rank 0 prints ``CSV-OK <max relative gradient error>`` when the gradients match one process.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime  # noqa: E402

from executor.model import build_model, build_stage, make_batch, named_grads, resolve_architecture  # noqa: E402
from pipeline.plan import Plan  # noqa: E402


def main() -> None:
    plan = Plan.load(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    arch = resolve_architecture("tiny-hybrid")
    modules = [build_stage(arch, *plan.partition[s]) for s in plan.stages_of(rank)]
    stages = [PipelineStage(m, s, plan.num_stages, torch.device("cpu"))
              for m, s in zip(modules, plan.stages_of(rank))]
    schedule = _PipelineScheduleRuntime(stages, plan.microbatches, loss_fn=lambda out, _target: out)
    schedule._load_csv(sys.argv[2], format="compute_only")
    tokens, labels = make_batch(arch, batch=plan.microbatches, seq_len=32)
    schedule.step(tokens, labels=labels, target=labels, return_outputs=False)  # outputs are scalar losses
    ref = build_model(arch)
    for t, lab in zip(tokens.chunk(plan.microbatches), labels.chunk(plan.microbatches)):
        (ref(t, lab) / plan.microbatches).backward()
    want = named_grads([ref])
    err = max(float((g - want[n]).abs().max() / (want[n].abs().max() + 1e-12))
              for n, g in named_grads(modules).items())
    errs = torch.tensor([err])
    dist.all_reduce(errs, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"CSV-OK {float(errs[0]):.3e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
