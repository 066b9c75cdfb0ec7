"""Worker entry point: ``python -m executor.launch ...`` under ``torchrun`` (one process per rank).

It runs one or more plans on real layers in one process group and, on rank 0, writes a JSON
result (``--out``): per plan the measured iteration times, the measured timeline (the
simulator's timeline format, milliseconds; ranks of one host on their shared monotonic clock,
across hosts aligned by a barrier before each step), the
losses and, with ``--check``, the largest relative gradient, loss and weight errors against
the unpipelined model run on one process. ``--p2p-bench`` instead measures point-to-point
latency and bandwidth between ranks 0 and 1.

Runs on several nodes under a user's own launcher, e.g.
``torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500
-m executor.launch --plan plan.json --model NAME --out result.json``.

Every plan is checked against the model and the world size before the process group starts;
a rank that fails prints its traceback and exits at once (``os._exit``) so that the launcher
stops the others; every collective and transfer has ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m executor.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", action="append", default=[], help="plan JSON (repeat to run several in one job)")
    p.add_argument("--model", default="tiny-hybrid", help="zoo model name")
    p.add_argument("--scale", type=float, default=1.0, help="width scale of the model (see scale_architecture)")
    p.add_argument("--granularity", choices=("layer", "sublayer"), default="layer", help="plan units")
    p.add_argument("--head-shards", type=int, default=1, help="head cut into this many units over the tokens")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--check", action="store_true", help="compare loss, gradients and weights with one process")
    p.add_argument("--opt-steps", type=int, default=3, help="optimizer steps compared with --check")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for set-up and every transfer")
    p.add_argument("--backend", default=None, help="gloo or nccl (default: nccl with CUDA, else gloo)")
    p.add_argument("--gc", choices=("freeze", "auto"), default="freeze",
                   help="freeze: after the warm-up steps, move the job's long-lived objects out of the garbage "
                        "collector's scans (gc.freeze; collection stays on and timed); auto: Python's default")
    p.add_argument("--lowering", choices=("early", "torch"), default="early",
                   help="early: post every receive at the start of the step (default); torch: PyTorch's lock-step "
                        "placement (executor/lowering.py)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="stages' and profile's dtype (bfloat16 on GPUs; --check compares with an fp32 model)")
    p.add_argument("--out", default=None, help="result JSON written by rank 0")
    p.add_argument("--p2p-bench", action="store_true", help="measure p2p latency/bandwidth (ranks 0 and 1)")
    p.add_argument("--measure", action="store_true",
                   help="first measure the link and profile the model (all ranks at once; times averaged)")
    p.add_argument("--profile-repeats", type=int, default=7, help="timed repeats per layer with --measure")
    p.add_argument("--inject-failure", type=int, default=None, metavar="RANK",
                   help="testing: make RANK raise during its first forward")
    return p


def _rel_err(a: Any, b: Any) -> float:

    return float((a - b).abs().max() / (b.abs().max() + 1e-12)) if a.numel() else 0.0


def _reference(arch: Any, tokens: Any, labels: Any, *, microbatches: int, seed: int, device: Any,
               opt_steps: int) -> dict[str, Any]:
    """Loss, gradients (first step) and weights after ``opt_steps`` SGD steps of the whole model."""
    import torch

    from executor.model import build_model, named_grads

    model = build_model(arch, seed=seed, device=device)
    mb_tok, mb_lab = tokens.chunk(microbatches), labels.chunk(microbatches)

    def one_step() -> float:
        losses = []
        for t, lab in zip(mb_tok, mb_lab):
            loss = model(t, labels=lab)
            (loss / microbatches).backward()
            losses.append(float(loss.detach()))
        return sum(losses) / len(losses)

    loss = one_step()
    grads = named_grads([model])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.step()
    for _ in range(opt_steps - 1):
        opt.zero_grad(set_to_none=True)
        one_step()
        opt.step()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"loss": loss, "grads": grads, "weights": weights}


def _check(ex: Any, arch: Any, tokens: Any, labels: Any, *, seed: int, device: Any,
           opt_steps: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from executor.model import named_grads

    ref = _reference(arch, tokens, labels, microbatches=ex.plan.microbatches, seed=seed, device=device,
                     opt_steps=opt_steps)
    ex.zero_grad()
    res = ex.step(tokens, labels)
    from executor.model import canonical_name

    grads = named_grads(ex.modules)
    grad_err = max((_rel_err(g, ref["grads"][canonical_name(arch, n)]) for n, g in grads.items()), default=0.0)
    loss_err = abs(res.loss - ref["loss"]) / abs(ref["loss"]) if res.loss is not None else 0.0
    opt = torch.optim.SGD(list(ex.parameters()), lr=0.1, momentum=0.9)
    opt.step()
    for _ in range(opt_steps - 1):
        ex.zero_grad()
        ex.step(tokens, labels)
        opt.step()
    weight_err = max((_rel_err(p.detach(), ref["weights"][canonical_name(arch, n)])
                      for m in ex.modules for n, p in m.named_parameters()), default=0.0)
    errs = torch.tensor([grad_err, loss_err, weight_err], dtype=torch.float64)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX)
    ex.zero_grad()
    return {"max_grad_error": float(errs[0]), "loss_error": float(errs[1]), "max_weight_error": float(errs[2]),
            "reference_loss": ref["loss"]}


def _prepare(plan: Any, arch: Any, args: argparse.Namespace, rank: int, device: Any) -> dict[str, Any]:
    import torch

    from executor.model import make_batch
    from executor.pipeline_executor import PipelineExecutor

    ex = PipelineExecutor(plan, arch, rank=rank, device=device, seed=args.seed, dtype=getattr(torch, args.dtype),
                          lowering=args.lowering)
    if args.inject_failure == rank:
        def boom(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError(f"injected failure on rank {rank}")
        ex.stages[0].forward_one_chunk = boom  # type: ignore[method-assign]
    tokens, labels = make_batch(arch, batch=plan.microbatches * args.microbatch_size, seq_len=args.seq_len,
                                seed=args.seed, device=device)
    out: dict[str, Any] = {"plan": plan.to_dict()}
    if args.check:
        out.update(_check(ex, arch, tokens, labels, seed=args.seed, device=device, opt_steps=args.opt_steps))
    return {"ex": ex, "tokens": tokens, "labels": labels, "out": out, "steps": []}


def rank_offsets(starts: Sequence[float], hosts: Sequence[str]) -> list[float]:
    """Seconds to add to each rank's step-relative times to put them on one clock. Ranks of one host
    read the same monotonic clock (``perf_counter``), so their step starts place them exactly:
    each rank's start after the earliest (the barrier releases ranks up to a few ms apart, and a
    timeline aligned on each rank's own start then shows a consumer starting before its producer
    ended). Across hosts the clocks differ and the barrier is the alignment: 0 for every rank."""
    if len(set(hosts)) != 1:
        return [0.0] * len(starts)
    first = min(starts)
    return [t - first for t in starts]


def freeze_collector() -> None:
    """Collect, then move every object alive now (modules, stages, buffers, torch's own) out of the
    cyclic garbage collector's reach (``gc.freeze``). The collector stays on and its time stays in
    every timed step, but it no longer scans the job's long-lived objects: measured on tiny-hybrid,
    2 gloo ranks, the spread of one plan's step times fell from up to 30-35% of its median (a full
    collection landing in some steps) to 3-5%."""
    import gc

    gc.collect()
    gc.freeze()


def _run_plans(plans: Sequence[Any], arch: Any, args: argparse.Namespace, rank: int,
               device: Any) -> list[dict[str, Any]] | None:
    """Check each plan, then time them round-robin (step k of every plan, then step k+1), so that
    a machine whose speed drifts slows every plan alike."""
    import torch.distributed as dist

    jobs = [_prepare(plan, arch, args, rank, device) for plan in plans]
    for k in range(args.warmup + args.steps):
        if k == args.warmup and args.gc == "freeze":
            freeze_collector()
        for job in jobs:
            job["ex"].zero_grad()
            res = job["ex"].step(job["tokens"], job["labels"])
            if k >= args.warmup:
                job["steps"].append(res)
    results = []
    for job in jobs:
        steps = job["steps"]
        local = {"host": socket.gethostname(),
                 "steps": [{"seconds": r.seconds, "loss": r.loss, "start": r.start,
                            "records": [(s, op, mb, a - r.start, b - r.start) for s, op, mb, a, b in r.records]}
                           for r in steps]}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, local)
        if rank != 0:
            continue
        out = job["out"]
        gathered = [g["steps"] for g in everyone]
        times = [max(g[k]["seconds"] for g in gathered) for k in range(len(steps))]
        med = statistics.median(times)
        pick = min(range(len(times)), key=lambda k: abs(times[k] - med))  # the step closest to the median
        offsets = rank_offsets([g[pick]["start"] for g in gathered], [g["host"] for g in everyone])
        events = [{"device": d, "action": f"{s}{op}{mb}", "start": (a + offsets[d]) * 1e3,
                   "end": (b + offsets[d]) * 1e3}
                  for d, g in enumerate(gathered) for s, op, mb, a, b in g[pick]["records"]]
        events.sort(key=lambda e: (e["device"], e["start"]))
        losses = [x["loss"] for g in gathered for x in g if x["loss"] is not None]
        out.update({
            "measured_iteration_time": med * 1e3,
            "measured_iteration_times": [t * 1e3 for t in times],
            "time_unit": "ms",
            "loss": losses[-1] if losses else None,
            "timeline": {"time_unit": "ms", "devices": job["ex"].plan.devices, "events": events},
        })
        results.append(out)
    return results if rank == 0 else None


def _profile_in_job(arch: Any, args: argparse.Namespace, rank: int, device: Any) -> dict[str, Any] | None:
    """Every rank profiles the model at once (as busy as in a pipeline); layer times are averaged."""
    import torch.distributed as dist

    from executor.profiler import ProfileConfig, profile_architecture

    config = ProfileConfig(seq_len=args.seq_len, microbatch_size=args.microbatch_size, seed=args.seed,
                           repeats=args.profile_repeats, dtype=args.dtype)  # the stages' dtype
    prof = profile_architecture(arch, device=device, config=config, name=args.model)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, prof.to_dict())
    if rank != 0:
        return None
    raw = gathered[0]
    for i, layer in enumerate(raw["layers"]):
        for key in ("f", "b", "w", "b_full"):
            layer[key] = statistics.fmean(g["layers"][i][key] for g in gathered)
    raw["profiled_ranks"] = len(gathered)
    return raw


def _p2p_bench(rank: int, device: Any) -> dict[str, Any] | None:
    """One-way time of a p2p transfer (half a ping-pong) for a small and a large message."""
    import torch
    import torch.distributed as dist

    def one_way(nbytes: int, reps: int) -> float:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        times = []
        for k in range(reps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, 1)])[0].wait()
                dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 1)])[0].wait()
            elif rank == 1:
                dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 0)])[0].wait()
                dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, 0)])[0].wait()
            if k >= 3:
                times.append((time.perf_counter() - t0) / 2)
        return statistics.median(times)

    small, large = 4, 4 << 20
    t_small, t_large = one_way(small, 30), one_way(large, 10)
    if rank != 0:
        return None
    bw = (large - small) / max(t_large - t_small, 1e-9)
    return {"latency_us": t_small * 1e6, "p2p_gbps": bw / 1e9, "small_bytes": small, "large_bytes": large,
            "t_small_us": t_small * 1e6, "t_large_us": t_large * 1e6}


def _check_memory(plans: Sequence[Any], args: argparse.Namespace, *, rank: int, world: int) -> None:
    """Local rank 0 refuses (one error line, exit 2; the launcher then stops the others) a CPU job whose
    ranks on this machine would not fit in its available memory (:func:`executor.preflight.check_job`),
    unless the launcher checked it before starting (``run_job`` does)."""
    from executor.preflight import check_job, checked_before_start

    if checked_before_start():
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    check_job(plans, model=args.model, scale=args.scale, seq_len=args.seq_len, microbatch_size=args.microbatch_size,
              measure=args.measure, check=args.check, nproc=world, granularity=args.granularity,
              head_shards=args.head_shards, backend="gloo", ranks=range(rank, min(rank + local, world)))


def _worker(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    import torch
    import torch.distributed as dist

    from executor.model import resolve_architecture
    from executor.replay import check_plan
    from pipeline.plan import Plan

    torch.set_num_threads(args.threads)
    if not torch.cuda.is_available() or args.backend == "gloo":
        from executor.host_memory import pin_malloc_thresholds

        pin_malloc_thresholds()  # layers cost the same here as in the profile (see executor.host_memory)
    plans = []
    arch = None
    if not args.p2p_bench:
        arch = resolve_architecture(args.model, scale=args.scale, granularity=args.granularity,
                                    head_shards=args.head_shards)
        for path in args.plan:
            plan = Plan.load(path)
            check_plan(plan, arch, world_size=world, source=path)
            plans.append(plan)
        if not plans and not args.measure:
            print("error: give at least one --plan (or --measure)", file=sys.stderr)
            return 2
    cuda = torch.cuda.is_available() and args.backend != "gloo"
    if not cuda and not args.p2p_bench and local_rank == 0:
        _check_memory(plans, args, rank=rank, world=world)  # before this job allocates any layer
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout),
                            device_id=device if cuda else None)
    try:
        result: dict[str, Any] | None = {}
        if args.p2p_bench or args.measure:
            bench = _p2p_bench(rank, device) if world > 1 else None
            if result is not None:
                result["p2p"] = bench
        if args.measure:
            if args.gc == "freeze":
                freeze_collector()  # the profile measures under the collector the timed steps run under
            prof = _profile_in_job(arch, args, rank, device)
            if result is not None:
                result["profile"] = prof
        if plans:
            runs = _run_plans(plans, arch, args, rank, device)
            if result is not None:
                result["runs"] = runs
        if rank != 0:
            result = None
        if rank == 0 and result is not None:
            result.update({"world_size": world, "backend": backend, "device": str(device),
                           "threads": torch.get_num_threads(), "model": args.model, "scale": args.scale,
                           "seq_len": args.seq_len, "microbatch_size": args.microbatch_size})
            text = json.dumps(result)
            if args.out:
                Path(args.out).write_text(text + "\n")
            else:
                print(text)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun's: it ends when its launcher does
        import signal

        from executor.orphan_guard import die_with_parent

        launcher = os.getppid()
        if die_with_parent(signal.SIGKILL) and os.getppid() != launcher:
            os._exit(1)  # the launcher died before the setting took
    args = build_parser().parse_args(argv)
    try:
        code = _worker(args)
        # Leave without the interpreter's teardown: on a loaded machine a native thread still
        # joinable when its static owner is destroyed aborted a finished job ("terminate called
        # without an active exception", SIGABRT after the result was written).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except Exception as exc:  # noqa: BLE001 - report and leave at once so the launcher stops the others
        from pipeline.errors import AdaptisError

        if isinstance(exc, AdaptisError):
            print(f"error: {exc}", file=sys.stderr, flush=True)
            code = 2
        else:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
