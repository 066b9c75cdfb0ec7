"""One prepared check of the performance model on a real GPU (runs on the CPU too, tiny).

Two parts, one table, one JSON file:

(a) **Layer kinds.** Every layer kind of the zoo at the real widths of a zoo model that has it
    (deepseek-small: MLA + MLP / MoE; gemma-small: sliding and global attention, a 256k
    vocabulary; nemotronh-small: Mamba, attention, MLP; llama-control: attention + MLP at hidden
    4096; and attention + MoE, gated linear attention + MLP at llama-control's widths), one layer
    of each with its model's embedding and head, sequence 4096, bf16. Each is profiled with
    ``executor.profiler`` (CUDA events after warm-up, ``max_memory_allocated``) and compared with
    the analytic costs of ``pipeline.costs`` for the GPU's preset: measured / predicted for the
    forward time, the backward time (I + W) and the activation bytes.
(b) **Per-device peak memory of a plan.** A 4-stage ZB-H1 plan (deferred W) of a mid-size model
    (gemma-small, about 2.9 B parameters, 8 micro-batches) runs one step in this one process
    (:func:`executor.memory.run_plan_here`: PyTorch's runtime semantics, transfers as copies,
    ``memory_allocated`` attributed to the device of each action). Its peak per device is compared
    with the model's prediction (:func:`pipeline.simulator.simulate`, 4 bytes per parameter: bf16
    weights and gradients, no optimizer in this check), from the analytic profile and from the
    layer kinds measured in (a); and the bytes each device keeps for its backward (the tensors
    autograd saves plus the gradients PyTorch's I keeps until W, ``kept act``) with the
    prediction without parameters.

On a GPU it also reports what the per-device reserve (``Cluster.memory_reserve_gb``) stands for:
the CUDA context (device memory in use that the caching allocator does not hold) and the
allocator's fragmentation (reserved over allocated at peak).

Without CUDA (or with ``--tiny``) every width shrinks 32-fold, sequences are 64 tokens, fp32,
one repeat: a few seconds, as the test suite runs it. The CPU's ratios say nothing about a GPU.

  python -m experiments gpu-check [--tiny] [--out runs/gpu_check.json] [--json]

Sized for under 8 minutes on one H200 (141 GB); not yet run on one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from executor.memory import merged_order, run_plan_here
from executor.model import build_stage, make_batch, resolve_architecture, scale_architecture
from executor.profiler import ProfileConfig, profile_architecture
from experiments.common import check_file_path, print_table
from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import profile_from_architecture
from pipeline.errors import ConfigError
from pipeline.hardware import build_cluster, get_gpu
from pipeline.schedules import build_plan
from pipeline.simulator import simulate
from pipeline.spec import GIB, LayerCost, ModelProfile, TrainingConfig

__all__ = ["main", "run", "kind_architectures", "check_kinds", "check_plan", "KIND_SOURCES", "HYBRID"]

#: Zoo models whose real widths the layer kinds are profiled at.
KIND_SOURCES = ("deepseek-small", "gemma-small", "nemotronh-small", "llama-control")
#: The source name of attention + MoE and gated linear attention + MLP at llama-control's widths.
HYBRID = "hybrid"
#: Width factor and sequence length of the tiny (CPU) run.
TINY_SCALE, TINY_SEQ = 1 / 32, 64
#: Longest ``--seq-len`` the tiny check profiles (seconds on a CPU core), and the real one (one layer
#: of each kind at the real widths must fit an H200 with its activations).
MAX_TINY_SEQ, MAX_SEQ = 1024, 32768
#: Most warm-up or timed runs per layer, and most micro-batches of part (b)'s plan.
MAX_RUNS, MAX_MICROBATCHES = 100, 64
#: Bytes per parameter the one-process plan holds: bf16 weights and bf16 gradients, no optimizer.
CHECK_BYTES_PER_PARAM = 4.0


def _distinct_blocks(arch: Architecture) -> list[LayerSpec]:
    seen: dict[str, LayerSpec] = {}
    for spec in arch.layers:
        if spec.kind == "block":
            seen.setdefault(spec.label, spec)
    return list(seen.values())


def kind_architectures(*, scale: float = 1.0, sources: Sequence[str] = (*KIND_SOURCES, HYBRID)) -> list[Architecture]:
    """One small architecture per source model: embedding, one layer of each block kind, head.
    ``hybrid`` stands for the kinds only ``tiny-hybrid`` has, at llama-control's widths."""
    out = []
    for name in sources:
        if name == HYBRID:
            continue
        arch = resolve_architecture(name)
        out.append(arch.with_layers((LayerSpec(kind="embedding"), *_distinct_blocks(arch), LayerSpec(kind="head"))))
    llama = resolve_architecture("llama-control")
    if HYBRID in sources:
        out.append(replace(llama, name="hybrid@llama-control", num_experts=16, num_experts_per_tok=2,
                           moe_intermediate_size=llama.intermediate_size // 4, layers=(
                               LayerSpec(kind="embedding"), LayerSpec(mixer="attention", ffn="moe"),
                               LayerSpec(mixer="linear_attention", ffn="mlp"), LayerSpec(kind="head"))))
    return [scale_architecture(a, scale) for a in out]


def _preset_for(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for key in ("h200", "h100", "h800", "b200", "a100"):
        if key in name:
            return key
    return "h200"


def _ratio(measured: float, predicted: float) -> float | None:
    return measured / predicted if predicted > 0 else None


def check_kinds(archs: Sequence[Architecture], *, device: torch.device, config: ProfileConfig, gpu: str,
                log: Any = None) -> tuple[list[dict[str, Any]], dict[str, ModelProfile]]:
    """Part (a): per (model, layer kind) measured and predicted figures; and the measured profile
    of each source architecture (for part b)."""
    rows: list[dict[str, Any]] = []
    measured_profiles: dict[str, ModelProfile] = {}
    for arch in archs:
        t0 = time.perf_counter()
        try:
            measured = profile_architecture(arch, device=device, config=config)
        except Exception as exc:  # noqa: BLE001 - a prepared run reports a failing kind and goes on
            rows.append({"model": arch.name, "kind": "*", "error": f"{type(exc).__name__}: {exc}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        measured_profiles[arch.name] = measured
        predicted = profile_from_architecture(arch, gpu=gpu, seq_len=config.seq_len,
                                              microbatch_size=config.microbatch_size)
        for m, p in zip(measured.layers, predicted.layers):
            row: dict[str, Any] = {
                "model": arch.name, "kind": m.kind, "f_ms": m.f, "f_pred_ms": p.f, "bwd_ms": m.b + m.w,
                "bwd_pred_ms": p.b + p.w, "act_mib": m.act_bytes / 2**20, "act_pred_mib": p.act_bytes / 2**20,
                "f_ratio": _ratio(m.f, p.f), "bwd_ratio": _ratio(m.b + m.w, p.b + p.w),
                "act_ratio": _ratio(m.act_bytes, p.act_bytes),
            }
            if "mem_peak_bytes" in m.extra:
                row["peak_mib"] = m.extra["mem_peak_bytes"] / 2**20
            rows.append(row)
        if log:
            log(f"  {arch.name}: {len(arch.layers)} layers profiled in {time.perf_counter() - t0:.1f} s")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, measured_profiles


def _kind_profile(arch: Architecture, source: ModelProfile, seq_len: int) -> ModelProfile | None:
    """``arch``'s profile from the per-kind measurements of ``source`` (same widths)."""
    by_kind = {x.kind: x for x in source.layers}
    layers: list[LayerCost] = []
    for i, spec in enumerate(arch.layers):
        x = by_kind.get(spec.label)
        if x is None:
            return None
        layers.append(replace(x, name=f"layer{i}.{spec.label}" if spec.kind == "block" else spec.kind))
    return ModelProfile(name=f"{arch.name} (measured kinds)", layers=tuple(layers), seq_len=seq_len)


def check_plan(arch: Architecture, *, device: torch.device, seq_len: int, microbatches: int, stages: int,
               gpu: str, dtype: torch.dtype, measured_kinds: ModelProfile | None) -> dict[str, Any]:
    """Part (b): one step of a ZB-H1 plan of ``arch`` here; per-device peaks, measured and predicted."""
    analytic = profile_from_architecture(arch, gpu=gpu, seq_len=seq_len)
    cluster = build_cluster(gpu, devices=stages, memory_reserve_gb=0.0)
    plan = build_plan("zb-h1", analytic, cluster, microbatches=microbatches)
    training = TrainingConfig(bytes_per_param=CHECK_BYTES_PER_PARAM)
    pred = simulate(plan, analytic, cluster, training=training)
    pred_act = simulate(plan, analytic, cluster, training=replace(training, bytes_per_param=0)).peak_memory
    kinds = _kind_profile(arch, measured_kinds, seq_len) if measured_kinds is not None else None
    pred_kinds = simulate(plan, kinds, cluster, training=training).peak_memory if kinds else None
    pred_kinds_act = simulate(plan, kinds, cluster, training=replace(training, bytes_per_param=0)).peak_memory \
        if kinds else None
    tokens, labels = make_batch(arch, batch=microbatches, seq_len=seq_len, device=device)

    def build(s: int) -> torch.nn.Module:
        a, b = plan.partition[s]
        return build_stage(arch, a, b).to(dtype=dtype).to(device)

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    report = run_plan_here(plan, merged_order(plan, pred.timeline), (), tokens=tokens, labels=labels, device=device,
                           build=build)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"model": arch.name, "method": "zb-h1", "stages": stages, "microbatches": microbatches,
                           "partition": [list(p) for p in plan.partition], "seconds": seconds, "loss": report.loss,
                           "bytes_per_param": CHECK_BYTES_PER_PARAM, "devices": []}
    for d in range(stages):
        row: dict[str, Any] = {"device": d, "saved_act_gib": report.saved_peak_device.get(d, 0) / GIB,
                               "kept_act_gib": report.kept_peak_device.get(d, 0) / GIB,
                               "pred_act_gib": pred_act[d] / GIB, "pred_peak_gib": pred.peak_memory[d] / GIB}
        if pred_kinds is not None:
            row["pred_kinds_act_gib"] = pred_kinds_act[d] / GIB
            row["pred_kinds_peak_gib"] = pred_kinds[d] / GIB
        if report.allocated_peak_device:
            row["allocated_peak_gib"] = report.allocated_peak_device[d] / GIB
            row["static_gib"] = report.static_device[d] / GIB
        out["devices"].append(row)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out["reserve"] = {
            "context_gib": (total - free - torch.cuda.memory_reserved(device)) / GIB,
            "fragmentation_gib": (report.process_reserved_peak - report.process_allocated_peak) / GIB,
            "process_allocated_peak_gib": report.process_allocated_peak / GIB,
            "total_gib": total / GIB,
        }
    return out


def _table_rows(kinds: Sequence[dict[str, Any]], plan: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for r in kinds:
        item = f"{r['model']} {r['kind']}"
        if "error" in r:
            rows.append({"check": "kind", "item": item, "measured": r["error"][:60]})
            continue
        rows.append({"check": "F ms", "item": item, "measured": r["f_ms"], "predicted": r["f_pred_ms"],
                     "ratio": r["f_ratio"]})
        rows.append({"check": "I+W ms", "item": item, "measured": r["bwd_ms"], "predicted": r["bwd_pred_ms"],
                     "ratio": r["bwd_ratio"]})
        rows.append({"check": "act MiB", "item": item, "measured": r["act_mib"], "predicted": r["act_pred_mib"],
                     "ratio": r["act_ratio"]})
    # (check, measured key, predicted key) per device; a row only where both figures exist.
    checks = (("peak GiB", "allocated_peak_gib", "pred_peak_gib"),
              ("peak GiB (kinds)", "allocated_peak_gib", "pred_kinds_peak_gib"),
              ("kept act GiB", "kept_act_gib", "pred_act_gib"),
              ("kept act GiB (kinds)", "kept_act_gib", "pred_kinds_act_gib"))
    for d in (plan or {}).get("devices", []):
        item = f"{plan['model']} zb-h1 device {d['device']}"
        for check, measured, predicted in checks:
            if measured in d and predicted in d:
                rows.append({"check": check, "item": item, "measured": d[measured], "predicted": d[predicted],
                             "ratio": _ratio(d[measured], d[predicted])})
    return rows


def run(args: argparse.Namespace) -> int:
    """Run the check with parsed ``args``; the process's torch thread count is restored after it."""
    threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m experiments gpu-check ARGV`` (its flags: :mod:`experiments.commands.gpu_check`)."""
    from experiments.cli import main as cli_main

    return cli_main(["gpu-check", *(sys.argv[1:] if argv is None else argv)])


def _run(args: argparse.Namespace) -> int:
    from experiments.commands.profile import check_device

    start = time.perf_counter()
    if args.device is not None:
        check_device(args.device)  # one line naming --device: an unknown name, or CUDA on a CPU build
    if args.warmup is not None and args.warmup < 0:
        raise ConfigError(f"must be >= 0, got {args.warmup}", field="--warmup")
    if args.gpu is not None:
        get_gpu(args.gpu)  # an unknown or empty preset is one line naming --gpu, before any work
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tiny = args.tiny or device.type != "cuda"
    for name, value, most in (("--warmup", args.warmup, MAX_RUNS), ("--repeats", args.repeats, MAX_RUNS),
                              ("--microbatches", args.microbatches, MAX_MICROBATCHES)):
        if value is not None and value > most:
            raise ConfigError(f"at most {most}, got {value}: the check is sized for minutes", field=name)
    check_file_path(args.out, "--out")
    longest = MAX_TINY_SEQ if tiny else MAX_SEQ
    if args.seq_len is not None and args.seq_len > longest:
        raise ConfigError(f"at most {longest} tokens {'in the tiny check (a CPU, or --tiny)' if tiny else 'per layer'}"
                          f", got {args.seq_len}; profile longer sequences on a GPU", field="--seq-len")
    scale = TINY_SCALE if tiny else 1.0
    seq = args.seq_len or (TINY_SEQ if tiny else 4096)
    dtype = torch.float32 if tiny else torch.bfloat16
    config = ProfileConfig(seq_len=seq, warmup=args.warmup if args.warmup is not None else (0 if tiny else 3),
                           repeats=args.repeats or (1 if tiny else 10), dtype=str(dtype).removeprefix("torch."))
    gpu = args.gpu or _preset_for(device)
    log = None if args.json else print
    if log:
        log(f"gpu_check on {_device_name(device)} ({'tiny' if tiny else 'real widths'}, seq {seq}, "
            f"{config.dtype}), analytic preset {gpu}")
    if tiny:
        torch.set_num_threads(1)
    sources = [m.strip() for m in (args.models or ",".join((*KIND_SOURCES, HYBRID))).split(",") if m.strip()]
    unknown = sorted(set(sources) - {*KIND_SOURCES, HYBRID})
    if unknown:
        print(f"--models: unknown {unknown}; use some of {', '.join((*KIND_SOURCES, HYBRID))}", file=sys.stderr)
        return 2
    archs = kind_architectures(scale=scale, sources=sources)
    kinds, measured = check_kinds(archs, device=device, config=config, gpu=gpu, log=log)
    plan = None
    if not args.skip_plan:
        arch = scale_architecture(resolve_architecture(args.plan_model), scale)
        source = measured.get(arch.name)  # its kinds at the same widths, when (a) profiled that model
        plan = check_plan(arch, device=device, seq_len=seq, microbatches=args.microbatches, stages=args.stages,
                          gpu=gpu, dtype=dtype, measured_kinds=source)
    result = {"device": _device_name(device), "tiny": tiny, "dtype": config.dtype, "seq_len": seq, "preset": gpu,
              "torch": torch.__version__, "kinds": kinds, "plan": plan, "seconds": time.perf_counter() - start}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print_table(_table_rows(kinds, plan), ("check", "item", "measured", "predicted", "ratio"),
                    title="measured vs predicted (ratio = measured / predicted)")
        if plan and plan.get("reserve"):
            r = plan["reserve"]
            print(f"reserve: CUDA context {r['context_gib']:.2f} GiB, fragmentation {r['fragmentation_gib']:.2f} GiB "
                  f"(of {r['total_gib']:.1f} GiB)")
        print(f"{time.perf_counter() - start:.1f} s; JSON in {args.out}" if args.out else "")
    failed = [r for r in kinds if "error" in r]
    return 1 if failed or any(not math.isfinite(r.get("f_ratio") or 1.0) for r in kinds) else 0


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    sys.exit(main())
