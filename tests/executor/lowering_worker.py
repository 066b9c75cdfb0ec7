"""Torchrun worker: with ``lowering="torch"`` our executor lowers PyTorch's own ZBV and interleaved
orders exactly as PyTorch does (same actions with sends and receives, same stage-to-rank map); the
default ``early`` lowering holds the same actions with every receive first, in PyTorch's order.
Prints LOWERING-OK per schedule."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.pipelining.schedules as ts  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402

from executor.model import build_stage, resolve_architecture  # noqa: E402
from executor.pipeline_executor import PipelineExecutor, passthrough_loss  # noqa: E402
from pipeline.plan import Plan, even_partition, parse_action  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    arch = resolve_architecture("tiny-hybrid")
    microbatches = 4
    for name, placement in (("ScheduleZBVZeroBubble", (0, 1, 1, 0)), ("ScheduleInterleaved1F1B", (0, 1, 0, 1))):
        n = len(placement)
        partition = even_partition(len(arch.layers), n)
        mine = [s for s in range(n) if placement[s] == rank]
        stages = [PipelineStage(build_stage(arch, *partition[s]), s, n, torch.device("cpu")) for s in mine]
        theirs = getattr(ts, name)(stages, microbatches, loss_fn=passthrough_loss)
        order = [[parse_action(str(a)) for a in theirs.pipeline_order[r] if a is not None and a.is_compute_op]
                 for r in range(world)]
        plan = Plan(world, microbatches, partition, placement, order, {"method": name})
        ours = PipelineExecutor(plan, arch, rank=rank, device=torch.device("cpu"), lowering="torch")
        mine_torch = [str(a) for a in ours.schedule.pipeline_order_with_comms[rank]]
        same = ([str(a) for a in theirs.pipeline_order_with_comms[rank]] == mine_torch
                and theirs.stage_index_to_group_rank == ours.schedule.stage_index_to_group_rank)
        # early: the same actions, every RECV first and in PyTorch's order, the rest in PyTorch's order
        early = [str(a) for a in PipelineExecutor(plan, arch, rank=rank, device=torch.device("cpu"))
                 .schedule.pipeline_order_with_comms[rank]]
        recvs = [a for a in mine_torch if "RECV" in a]
        same = same and early == recvs + [a for a in mine_torch if "RECV" not in a] and len(recvs) > 0
        if not same:
            print(f"LOWERING-DIFFERS {name} rank {rank}", flush=True)
            return 1
        if rank == 0:
            print(f"LOWERING-OK {name}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
