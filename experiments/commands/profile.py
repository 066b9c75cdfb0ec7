"""Measure a model's per-layer costs on this machine and write the profile JSON the search reads.

Every layer's forward (F), backward-for-inputs (I) and backward-for-weights (W) time is the
median of --repeats runs after --warmup runs, timed with the functions PyTorch's pipeline runtime
calls; activation bytes are the tensors autograd saves, output bytes what a stage sends. With
--cluster-out it also measures point-to-point latency and bandwidth between two local
processes (gloo on CPU, NCCL on GPU) and writes a cluster JSON, so that

  python -m experiments profile --model tiny-hybrid --out prof.json --cluster-out cluster.json
  python -m experiments search --profile prof.json --cluster cluster.json --out DIR

searches with measured instead of analytic costs. With --calibrate N it then replays N random plans
on --devices local ranks and fits what the per-layer profile misses (each operation's time inside a
pipelined step, the per-action and per-transfer overheads; pipeline.calibration.fidelity.calibrate) into the
profile it writes, as `run` does before its search:

  python -m experiments profile --model tiny-hybrid --calibrate 6 --out prof.json --cluster-out cluster.json
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from experiments.common import add_granularity_args, non_negative_int, positive_float, positive_int
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.arch import Architecture

__all__ = ["NAME", "HELP", "add_arguments", "run"]

NAME = "profile"
HELP = "measure every layer's F/I/W time and memory on this device (and the p2p link) into a profile JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-hybrid", help="zoo model (default tiny-hybrid)")
    parser.add_argument("--scale", type=positive_float, default=1.0,
                        help="shrink the model's widths by this factor (0, 1]")
    add_granularity_args(parser)
    parser.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence (default: model's)")
    parser.add_argument("--microbatch-size", type=positive_int, default=1, help="sequences per micro-batch")
    parser.add_argument("--repeats", type=positive_int, default=7, help="timed runs per layer (median kept)")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed runs first")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="parameters and activations (default: bfloat16 on CUDA, timed with CUDA events; "
                             "float32 on the CPU)")
    parser.add_argument("--out", metavar="P.json", help="write the profile here")
    parser.add_argument("--cluster-out", metavar="C.json", help="also measure the p2p link and write a cluster JSON")
    parser.add_argument("--devices", type=positive_int, default=2, help="devices of the written cluster")
    parser.add_argument("--calibrate", type=non_negative_int, default=0, metavar="N",
                        help="then replay N random plans on --devices local ranks and fit the runtime's terms "
                             "(per-operation factors and per-layer times, per-action and per-transfer overheads) "
                             "into the written profile, as run does (0: the per-layer profile alone)")
    parser.add_argument("--calibration-microbatches", type=positive_int, default=8,
                        help="micro-batches of the calibration plans")
    parser.add_argument("--no-contention", dest="contention", action="store_false",
                        help="with --calibrate: leave out the compute contention between the local ranks "
                             "(the profile's compute_contention, fitted by default; docs/fidelity.md)")
    parser.add_argument("--layer-factors", action="store_true",
                        help="with --calibrate: fit each layer's own factor too, from two more replayed plans with "
                             "every layer a stage of its own (off by default; docs/fidelity.md)")
    parser.add_argument("--json", action="store_true", help="print the profile JSON")


def run(args: argparse.Namespace) -> int:
    import torch

    from executor.model import default_seq_len, resolve_architecture
    from executor.profiler import ProfileConfig, profile_architecture
    from executor.replay import p2p_bench
    from pipeline.calibration.fidelity import measured_cluster

    if args.calibrate and args.devices < 2:
        raise ConfigError("calibration replays plans across ranks and needs --devices 2 or more", field="--calibrate")
    torch.set_num_threads(args.threads)
    arch = resolve_architecture(args.model, scale=args.scale, granularity=args.granularity,
                                head_shards=args.head_shards)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    config = ProfileConfig(seq_len=args.seq_len or default_seq_len(arch), microbatch_size=args.microbatch_size,
                           warmup=args.warmup, repeats=args.repeats, dtype=args.dtype)
    if torch.device(device).type == "cpu":
        check_memory(args, arch, seq_len=config.seq_len, microbatch_size=config.microbatch_size)
    log = None if args.json else print
    if log:
        print(f"profiling {arch.name} ({len(arch.layers)} layers) on {device}, seq_len {config.seq_len}, "
              f"micro-batch {config.microbatch_size}, {config.torch_dtype(torch.device(device))}, "
              f"{args.threads} thread(s)")
    profile = profile_architecture(arch, device=device, config=config, name=args.model, log=log)
    bench = None
    if args.cluster_out or args.calibrate:
        bench = p2p_bench(backend="nccl" if device.startswith("cuda") else "gloo")
    if args.calibrate:
        profile = _calibrated(args, profile, measured_cluster(args.devices, bench), bench, device, log)
    if args.out:
        profile.save(args.out)
        if log:
            print(f"profile written to {args.out}")
    if args.cluster_out:
        cluster = measured_cluster(args.devices, bench, name=f"{device}-{bench.get('backend') or 'p2p'}")
        cluster.save(args.cluster_out)
        if log:
            print(f"p2p latency {bench['latency_us']:.1f} us, bandwidth {bench['p2p_gbps']:.3g} GB/s; "
                  f"cluster written to {args.cluster_out}")
    if args.json:
        print(json.dumps(profile.to_dict()))
    return 0


def check_device(device: str) -> None:
    """Refuse in one line (``--device``) a device name torch does not know, or one this machine lacks."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise ConfigError(f"unknown device {device!r}; use cpu or cuda (or cuda:N)", field="--device") from None
    if kind == "cuda" and not torch.cuda.is_available():
        build = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"cuda asked for, but {build}; use --device cpu (or install a CUDA build of torch)",
                          field="--device")
    if kind == "cuda" and torch.device(device).index is not None and torch.device(device).index >= \
            torch.cuda.device_count():
        raise ConfigError(f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)", field="--device")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"{device!r}: the profiler runs on cpu or cuda", field="--device")


def _calibrated(args: argparse.Namespace, profile: Any, cluster: Any, bench: dict[str, Any], device: str,
                log: Any) -> Any:
    """``profile`` with what replays of ``--calibrate`` random plans teach it (unchanged, with a line
    saying so, if the replays could not run)."""
    from experiments.workflow.phases import Costs, calibrate_here
    from pipeline.calibration.fidelity import calibrated_profile

    costs = Costs(profile, cluster, "measured", True, bench, bench.get("backend"), device)
    costs = calibrate_here(costs, model=args.model, scale=args.scale, microbatches=args.calibration_microbatches,
                           count=args.calibrate, seed=0, steps=5, warmup=2, threads=args.threads, timeout=900.0,
                           granularity=args.granularity, head_shards=args.head_shards, contention=args.contention,
                           layer_factors=args.layer_factors,
                           log=log or (lambda _line: None))
    return calibrated_profile(profile, costs.scales) if costs.scales else profile


def check_memory(args: argparse.Namespace, arch: Architecture, *, seq_len: int, microbatch_size: int) -> None:
    """Refuse, before any tensor is allocated, a CPU profile that would not fit in the available memory."""
    from executor.model import resolve_architecture
    from executor.preflight import HEADROOM, available_bytes, check_fits, fitting_scale, profile_estimate
    from pipeline.spec import GIB

    available = available_bytes()
    if available is None:
        return

    def estimate(scale: float):
        narrowed = arch if scale == args.scale else resolve_architecture(
            args.model, scale=scale, granularity=args.granularity, head_shards=args.head_shards)
        return profile_estimate(narrowed, seq_len=seq_len, microbatch_size=microbatch_size)

    found = estimate(args.scale)
    if found.total <= HEADROOM * available:
        return
    fit = fitting_scale(estimate, args.scale, available)
    fixes = [f"--scale {fit[0]:g} (about {fit[1] / GIB:.1f} GiB)"] if fit is not None else []
    fixes.append("or a smaller model (--model tiny-hybrid)")
    check_fits(found, what=f"profiling {args.model} on the CPU", fixes=fixes, available=available)
