"""Where a multi-chunk plan's time goes: per-device load, memory and idle (issue 15's gemma case).

For each placement with several stages per device it prints the heaviest device's load per
micro-batch under the stage-balanced and the device-balanced split (``pipeline/balance.py``), the
iteration time of each under budgets that fill every device's memory and without a memory limit,
and the best of the device-balanced split with its first stage lightened. Then the tuner's plan at
the default budget, device by device: busy time, idle before its first action, after its last and
in between, and peak memory. With ``--curve``, first what memory the list scheduler would need:
the device-balanced split of a few placements under the same budget on every device (8 to 40
micro-batches, no device limit), its iteration time against its peak. One JSON line per row.

  python -m experiments.benchmarks.device_balance                       # gemma-large, 16 devices, 4k
  python -m experiments.benchmarks.device_balance --model deepseek-large --seq-len 2048
  python -m experiments.benchmarks.device_balance --frees-at-i   # a runtime whose I frees all but W's inputs
  python -m experiments.benchmarks.device_balance --weight-store # ... that keeps W's inputs and output gradients
  python -m experiments.benchmarks.device_balance --gpu h200     # the same case with 141 GB per device
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agents.base import Budget  # noqa: E402
from agents.registry import make_searcher  # noqa: E402
from agents.tuner import AdaptisTuner, lighten_first_stage  # noqa: E402
from pipeline.balance import device_loads  # noqa: E402
from pipeline.candidates import Candidate, Scenario, make_placement  # noqa: E402
from pipeline.errors import ConfigError  # noqa: E402
from pipeline.evaluator import Evaluator  # noqa: E402
from pipeline.hardware import build_cluster  # noqa: E402
from pipeline.simulator import simulate  # noqa: E402
from pipeline.spec import GIB, Cluster, TrainingConfig  # noqa: E402
from pipeline.start_recipes import PLACEMENT_CHOICES, with_filled_budgets  # noqa: E402
from pipeline.zoo import auto_head_shards, zoo_profile  # noqa: E402

__all__ = ["rows", "main"]


def rows(model: str, cluster: Cluster, microbatches: int, *, gpu: str = "h100", seq_len: int = 4096,
         budget: str = "3000", runtime: str = "pytorch", curve: bool = False) -> Iterator[dict]:
    """The rows :func:`main` prints, unrounded, in its order: one per multi-chunk placement, the
    curve's with ``curve``, the tuner's plan against Megatron's (``tuner_ms``, ``megatron_ms``,
    ``speedup``) and one per device. ``runtime``: ``pytorch``, ``frees-at-i`` or ``weight-store``
    (see ``--help``)."""
    P, M = cluster.devices, microbatches
    training = TrainingConfig(input_backward_keeps_graph=runtime == "pytorch")
    even = Scenario(zoo_profile(model, gpu=gpu, seq_len=seq_len), cluster, M, training)
    mega = make_searcher("megatron").search(even)
    k = auto_head_shards(zoo_profile(model, gpu=gpu, seq_len=seq_len, granularity="sublayer"))
    profile = zoo_profile(model, gpu=gpu, seq_len=seq_len, granularity="sublayer", head_shards=k)
    if runtime == "weight-store":  # what I keeps for W: the matmuls' inputs plus their output gradients
        profile = replace(profile, layers=tuple(
            replace(x, w_act_bytes=x.w_retained + max(0, x.w_graph - x.act_bytes)) for x in profile.layers))
    scenario = Scenario(profile, cluster, M, training)
    ev = Evaluator(scenario)
    costs = [x.f + x.b + x.w for x in profile.layers]
    mean = sum(costs) / P
    for kind, chunks in PLACEMENT_CHOICES:
        if chunks == 1 or P * chunks > profile.num_layers:
            continue
        placement = make_placement(kind, P, chunks)
        row = {"placement": f"{kind}-{chunks}", "mean_load": mean}
        for name, sizes in (("stage", ev.balanced_sizes(placement)), ("device", ev.device_balanced_sizes(placement))):
            filled = with_filled_budgets(Candidate(sizes, placement), ev)
            row[f"{name}_max_load"] = float(device_loads(costs, sizes, placement, devices=P).max())
            row[f"{name}_filled_ms"] = ev.result(filled).iteration_time
            row[f"{name}_no_memory_limit_ms"] = ev.result(replace(filled, budgets=None)).iteration_time
        lighter = [ev.result(with_filled_budgets(c, ev)) for c in
                   lighten_first_stage(Candidate(ev.device_balanced_sizes(placement), placement), 0, scenario)]
        row["device_lightened_best_ms"] = min((r.iteration_time for r in lighter if r.feasible), default=float("nan"))
        yield row
    if curve:
        for kind, chunks in (("interleaved", 4), ("v", 2), ("interleaved", 2)):
            placement = make_placement(kind, P, chunks)
            if len(placement) > profile.num_layers:
                continue
            sizes = ev.device_balanced_sizes(placement)
            for mb in (8, 12, 16, 20, 24, 28, 32, 40):
                r = ev.result(Candidate(sizes, placement, "list", (float(mb),) * P, cap_counts_w=True))
                yield {"curve": f"{kind}-{chunks}", "budget_microbatches": mb, "ms": r.iteration_time,
                       "peak_gib": max(r.peak_memory) / GIB}
    found = AdaptisTuner().search(scenario, budget=Budget.parse(budget), seed=0)
    res = simulate(found.plan, profile, cluster, training=training, record_timeline=True)
    T = res.iteration_time
    yield {"tuner_ms": T, "speedup": mega.iteration_time / T, "megatron_ms": mega.iteration_time, "plan": found.note}
    for d in range(P):
        acts = sorted((e for e in res.timeline if e.device == d), key=lambda e: e.start)
        inside = sum(max(0.0, b.start - a.end) for a, b in zip(acts, acts[1:]))
        yield {"device": d, "busy_ms": res.busy[d], "idle_first_ms": acts[0].start, "idle_last_ms": T - acts[-1].end,
               "idle_inside_ms": inside, "peak_gib": res.peak_memory[d] / GIB, "limit_gib": res.memory_limit[d] / GIB}


def _printed(row: dict) -> dict:
    """A row as printed: loads to 3 digits, the speedup to 4, milliseconds and GiB to 1."""
    def digits(key: str) -> int | None:
        if key.endswith("load"):
            return 3
        if key == "speedup":
            return 4
        return 1 if key == "ms" or key.endswith(("_ms", "_gib")) else None

    return {k: v if digits(k) is None else round(v, digits(k)) for k, v in row.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma-large")
    p.add_argument("--gpu", default="h100", help="device kind of every pipeline device, with its memory "
                   "(e.g. h200: 141 GB), for the Megatron baseline and the plans alike")
    p.add_argument("--devices", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--microbatches", type=int, default=64)
    p.add_argument("--budget", default="3000", help="the tuner's budget (simulator calls, or seconds with 's')")
    p.add_argument("--frees-at-i", action="store_true",
                   help="model a runtime whose I keeps only W's inputs (TrainingConfig(input_backward_keeps_graph="
                        "False)); default: PyTorch's, which keeps the graph and W's gradients until W")
    p.add_argument("--weight-store", action="store_true",
                   help="model a runtime whose I frees the graph and keeps, per weight matmul, its input and "
                        "output gradient until W (a WeightGradStore, as zero-bubble's Megatron fork): each "
                        "layer keeps w_act_bytes + (w_graph_bytes - act_bytes) from I until W")
    p.add_argument("--curve", action="store_true", help="also print iteration time against peak memory "
                   "for uniform budgets on the device-balanced split (what memory a time would need)")
    args = p.parse_args(argv)
    if args.frees_at_i and args.weight_store:
        p.error("--frees-at-i and --weight-store model two different runtimes: pick one")
    try:
        cluster = build_cluster(args.gpu, devices=args.devices, gpus_per_node=8)
    except ConfigError as exc:
        p.error(f"--gpu: {exc}")
    runtime = "frees-at-i" if args.frees_at_i else "weight-store" if args.weight_store else "pytorch"
    for row in rows(args.model, cluster, args.microbatches, gpu=args.gpu, seq_len=args.seq_len, budget=args.budget,
                    runtime=runtime, curve=args.curve):
        print(json.dumps(_printed(row)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
