"""Time of the lower bound on measured-style profiles, its validity on fused-backward profiles, and
its values on the paper grid.

* timing: ``lower_bound`` (packing included) on profiles whose layer costs all differ, as
  ``profile`` measures them for a real model: a zoo model's blocks repeated to N layers, every
  f / b / w jittered by up to 3%, a measured fused backward ``b_full`` and a per-action overhead
  (and the same without ``b_full``); median wall and CPU milliseconds over ``--repeats``.
* validity: the smallest iteration time / bound over the named schedules on the issue's case (4
  layers f=b=w=1, ``b_full`` 1, 2 devices, 64 micro-batches); must be >= 1.
* ``--grid``: the bound of each case of ``python -m experiments reproduce``'s grid; with
  ``--against FILE`` (another version of ``pipeline/bounds.py``, e.g. ``git show
  main:pipeline/bounds.py > /tmp/old_bounds.py``) also that version's value and the relative change.

  python -m experiments.benchmarks.bounds_speed [--layers 48,64,256] [--repeats 7] [--grid] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bounds import lower_bound
from pipeline.hardware import build_cluster
from pipeline.schedules import NAMED_METHODS, build_plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, LayerCost, ModelProfile
from pipeline.zoo import zoo_profile


def measured_style(layers: int, *, seed: int = 0, fused: bool = True, model: str = "gemma-large") -> ModelProfile:
    """``model``'s embedding, blocks (repeated) and head as ``layers`` layers whose costs all differ."""
    base = zoo_profile(model, seq_len=2048).layers
    blocks = base[1:-1]
    chosen = [base[0], *(blocks[i % len(blocks)] for i in range(layers - 2)), base[-1]]
    rng = np.random.default_rng(seed)
    out: list[LayerCost] = []
    for i, x in enumerate(chosen):
        j = rng.uniform(0.97, 1.03, size=4)
        extra = {"b_full": 0.8 * (x.b + x.w) * j[3]} if fused else {}
        out.append(replace(x, name=f"l{i}", f=x.f * j[0], b=x.b * j[1], w=x.w * j[2], extra=extra))
    mean = sum(x.f for x in out) / len(out)
    return ModelProfile(f"measured-style-{layers}", tuple(out), action_overhead=0.01 * mean)


def _median_ms(profile: ModelProfile, cluster: Cluster, microbatches: int, repeats: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of one ``lower_bound`` (CPU time is what a busy machine's
    other processes do not inflate)."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        lower_bound(profile, cluster, microbatches)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def _fused_case_ratio() -> dict[str, Any]:
    base = ModelProfile("fused4", tuple(LayerCost(f"l{i}", "attention+mlp", 1.0, 1.0, 1.0, 1000, 1000, 0,
                                                  extra={"b_full": 1.0}) for i in range(4)))
    cluster = Cluster(devices=2, memory_gb=1e9, p2p_gbps=1e12, latency_us=0.0)
    bound = lower_bound(base, cluster, 64).value
    ratios = {}
    for method in ("megatron", *NAMED_METHODS):
        try:
            plan = build_plan(method, base, cluster, microbatches=64)
        except Exception:  # a method that needs more layers or devices than the case has
            continue
        ratios[method] = simulate(plan, base, cluster).iteration_time / bound
    worst = min(ratios, key=ratios.get)
    return {"check": "fused_backward_case", "bound": bound, "min_vs_lower_bound": round(ratios[worst], 4),
            "method": worst}


def _grid(against: Path | None) -> list[dict[str, Any]]:
    from pipeline.zoo import PAPER_MODELS
    from pipeline.zoo import PAPER_SIZES as SIZES

    other = None
    if against is not None:
        spec = importlib.util.spec_from_file_location("other_bounds", against)
        other = importlib.util.module_from_spec(spec)
        sys.modules["other_bounds"] = other
        spec.loader.exec_module(other)  # type: ignore[union-attr]
    rows = []
    for family in PAPER_MODELS:
        for size, devices in SIZES.items():
            for seq in (2048, 4096):
                profile = zoo_profile(f"{family}-{size}", gpu="h100", seq_len=seq)
                cluster = build_cluster("h100", devices=devices, gpus_per_node=8)
                lb = lower_bound(profile, cluster, 64)
                row: dict[str, Any] = {"check": "grid", "case": f"{family}-{size}-{seq}", "bound": lb.value,
                                       "binding": lb.binding}
                if other is not None:
                    ref = other.lower_bound(profile, cluster, 64).value
                    row.update({"other": ref, "relative_change": (lb.value - ref) / ref})
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="48,64,256", help="comma-separated layer counts to time")
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--grid", action="store_true", help="also print the bound on the paper grid")
    parser.add_argument("--against", type=Path, help="another bounds.py to compare the grid with")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    cluster = build_cluster("h100", devices=args.devices, gpus_per_node=8)
    for n in (int(x) for x in args.layers.split(",")):
        for fused in (True, False):
            profile = measured_style(n, fused=fused)
            wall, cpu = _median_ms(profile, cluster, args.microbatches, args.repeats)
            rows.append({"check": "timing", "layers": n, "b_full": fused, "devices": args.devices,
                         "median_ms": round(wall, 3), "median_cpu_ms": round(cpu, 3),
                         "binding": lower_bound(profile, cluster, args.microbatches).binding})
    rows.append(_fused_case_ratio())
    if args.grid or args.against:
        grid = _grid(args.against)
        rows += grid
        if args.against:
            worst = min(grid, key=lambda r: r["relative_change"])
            rows.append({"check": "grid_summary", "largest_drop": worst["relative_change"], "case": worst["case"],
                         "largest_change": max(abs(r["relative_change"]) for r in grid)})
    for r in rows:
        print(json.dumps(r) if args.json else "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
