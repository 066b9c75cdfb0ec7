"""Our replay vs torch.distributed.pipelining's own schedule classes, same model, same partition.

For Schedule1F1B (2 stages), ScheduleInterleaved1F1B and ScheduleZBVZeroBubble (4 stages), the
PyTorch schedule runs on plain ``PipelineStage``s; our executor replays the very same per-rank
order (taken from the schedule object) as a plan. Steps alternate (torch then ours, then ours then torch, ...)
in one process group so that both see the same machine; prints the medians and their ratio
(ours / torch; <= 1 means our replay is no slower).

  python -m experiments.benchmarks.executor_vs_torch [--steps 9] [--microbatches 8] [--json]

It starts ``torchrun`` with 2 processes itself; under torchrun it is the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main"]

SCHEDULES = ("Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-hybrid")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as ts

    from executor.model import build_stage, make_batch, resolve_architecture
    from executor.pipeline_executor import PipelineExecutor, passthrough_loss
    from pipeline.orders import one_f_one_b_order
    from pipeline.plan import Plan, even_partition, parse_action

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    arch = resolve_architecture(args.model)
    M = args.microbatches
    tokens, labels = make_batch(arch, batch=M, seq_len=args.seq_len)
    rows = []
    for name in SCHEDULES:
        cls = getattr(ts, name)
        n_stages = world if name == "Schedule1F1B" else 2 * world
        partition = even_partition(len(arch.layers), n_stages)
        if name == "ScheduleZBVZeroBubble":
            placement = tuple(list(range(world)) + list(reversed(range(world))))
        else:
            placement = tuple(s % world for s in range(n_stages))
        mine = [s for s in range(n_stages) if placement[s] == rank]
        stages = [PipelineStage(build_stage(arch, *partition[s]), s, n_stages, torch.device("cpu")) for s in mine]
        sched = cls(stages[0] if name == "Schedule1F1B" else stages, M, loss_fn=passthrough_loss)
        if name == "Schedule1F1B":  # its _get_pipeline_order is a drawing (F and B share steps)
            schedule = [list(acts) for acts in one_f_one_b_order(world, M)]
        else:
            schedule = [[parse_action(str(a)) for a in sched.pipeline_order[r] if a is not None and a.is_compute_op]
                        for r in range(world)]
        plan = Plan(world, M, partition, placement, schedule, {"method": f"replay-of-{name}"})
        ours = PipelineExecutor(plan, arch, rank=rank, device=torch.device("cpu"))
        t_torch: list[float] = []
        t_ours: list[float] = []
        for k in range(args.warmup + args.steps):
            # Alternate which goes first, so neither always runs right after the other.
            if k % 2 == 0:
                a, b = _time_torch(sched, stages, tokens, labels), _time_ours(ours, tokens, labels)
            else:
                b, a = _time_ours(ours, tokens, labels), _time_torch(sched, stages, tokens, labels)
            if k >= args.warmup:
                t_torch.append(a)
                t_ours.append(b)
        tm, om = statistics.median(t_torch), statistics.median(t_ours)
        rows.append({"schedule": name, "stages": n_stages, "torch_ms": tm, "ours_ms": om, "ratio": om / tm})
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(rows) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _time_torch(sched: Any, stages: Sequence[Any], tokens: Any, labels: Any) -> float:
    """One step of PyTorch's schedule; the slowest rank's milliseconds."""
    import torch
    import torch.distributed as dist

    for stage in stages:
        for p in stage.submod.parameters():
            p.grad = None
    dist.barrier()
    t0 = time.perf_counter()
    sched.step(tokens, labels=labels, target=labels, return_outputs=False)
    dt = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt) * 1e3


def _time_ours(ours: Any, tokens: Any, labels: Any) -> float:
    """One step of our replay (it aligns the ranks with a barrier itself); slowest rank's ms."""
    import torch
    import torch.distributed as dist

    ours.zero_grad()
    do = torch.tensor([ours.step(tokens, labels).seconds])
    dist.all_reduce(do, op=dist.ReduceOp.MAX)
    return float(do) * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if "RANK" in os.environ:
        _worker(args)
        return 0
    import tempfile

    from executor.replay import run_torchrun  # noqa: F401 - same environment handling
    from experiments.common import print_table

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd_args = [*(argv if argv is not None else sys.argv[1:]), "--out", str(out)]
        rows = _launch_self(cmd_args, timeout=900)
        if rows is None:
            rows = json.loads(out.read_text()) if out.exists() else None
        if rows is None:
            print("the benchmark job failed", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{args.model}, 2 gloo ranks, {args.microbatches} micro-batches, median of {args.steps} steps each, "
          "alternating torch / ours")
    print_table(rows, ["schedule", "stages", "torch_ms", "ours_ms", "ratio"])
    return 0


def _launch_self(cmd_args: list[str], *, timeout: float) -> Any:
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--monitor-interval=0.1", str(Path(__file__).resolve()), *cmd_args]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return None
    out = Path(cmd_args[cmd_args.index("--out") + 1])
    return json.loads(out.read_text()) if out.exists() else None


if __name__ == "__main__":
    raise SystemExit(main())
