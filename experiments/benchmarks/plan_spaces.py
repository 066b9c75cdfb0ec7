"""What each addition to the plan space buys: the tuner and the ceiling per space, case by case.

Spaces: whole layers without and with the recompute move, sub-block units, head shards (``auto``:
no heavier than the heaviest other unit), both, and both without the recompute move. Speedups are
over the best-chunk Megatron baseline on whole layers; ceilings are Megatron / the space's lower
bound (for a finer space, the lower of its bound and the whole-layer one). One JSON line per case.

  python -m experiments.benchmarks.plan_spaces --cases gemma-large:16:4096,nemotronh-large:16:4096:40 --budget 200
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agents.base import Budget  # noqa: E402
from agents.registry import make_searcher  # noqa: E402
from agents.tuner import AdaptisTuner  # noqa: E402
from pipeline.bounds import lower_bound  # noqa: E402
from pipeline.candidates import Candidate, Scenario  # noqa: E402
from pipeline.hardware import build_cluster  # noqa: E402
from pipeline.zoo import auto_head_shards, zoo_profile  # noqa: E402

__all__ = ["NoRecomputeTuner", "main"]


class NoRecomputeTuner(AdaptisTuner):
    """The tuner without its recompute move."""

    @staticmethod
    def _schedule_moves(c: Candidate, result, scenario: Scenario, rng, ev) -> Iterator[Candidate]:  # type: ignore[override]
        return (n for n in AdaptisTuner._schedule_moves(c, result, scenario, rng, ev) if n.recompute is None)


def _case(text: str) -> tuple[str, int, int, float | None]:
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"expected MODEL:DEVICES:SEQ[:MEMORY_GB], got {text!r}")
    return parts[0], int(parts[1]), int(parts[2]), float(parts[3]) if len(parts) == 4 else None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="gemma-large:16:4096", help="MODEL:DEVICES:SEQ[:MEMORY_GB], comma-separated")
    p.add_argument("--budget", default="200", help="tuner budget per space")
    p.add_argument("--microbatches", type=int, default=64)
    args = p.parse_args(argv)
    budget = Budget.parse(args.budget)
    M = args.microbatches
    for model, devices, seq, memory in (_case(x) for x in args.cases.split(",") if x):
        cluster = build_cluster("h100", devices=devices, gpus_per_node=8)
        if memory:
            cluster = cluster.with_memory(memory)
        whole = zoo_profile(model, seq_len=seq)
        mega = make_searcher("megatron").search(Scenario(whole, cluster, M)).iteration_time
        bound = lower_bound(whole, cluster, M).value
        shards = {"layer": auto_head_shards(whole),
                  "sublayer": auto_head_shards(zoo_profile(model, seq_len=seq, granularity="sublayer"))}
        out = {"model": model, "devices": devices, "seq": seq, "memory_gb": memory or cluster.device(0).memory_gb}
        for name, gran, k, tuner in (("layer-norecompute", "layer", 1, NoRecomputeTuner),
                                     ("layer", "layer", 1, AdaptisTuner),
                                     ("sublayer", "sublayer", 1, AdaptisTuner),
                                     ("head", "layer", shards["layer"], AdaptisTuner),
                                     ("both", "sublayer", shards["sublayer"], AdaptisTuner),
                                     ("both-norecompute", "sublayer", shards["sublayer"], NoRecomputeTuner)):
            prof = zoo_profile(model, seq_len=seq, granularity=gran, head_shards=k)
            r = tuner().search(Scenario(prof, cluster, M), budget=budget, seed=0)
            ok = r.ok and r.result.feasible
            out[name] = round(mega / r.iteration_time, 3) if ok else None
            out[f"{name}_recompute"] = bool(ok and r.plan.recompute)
            out[f"{name}_ceiling"] = round(mega / min(bound, lower_bound(prof, cluster, M).value), 3)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
