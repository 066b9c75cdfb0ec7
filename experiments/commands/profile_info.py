"""Print a model's per-layer costs and where its heterogeneity is, or write its profile JSON.

Layer times come from the analytic cost model (pipeline.costs) on the chosen GPU preset, or from a
profile file. The summary compares each layer kind with the most common one, e.g. "head = 4.6
sliding_attention+mlp layers". ``--json`` prints the profile itself and ``--out P.json`` writes it,
for any command that takes ``--profile``.

examples:
  python -m experiments profile-info --model gemma-small
  python -m experiments profile-info --model deepseek-medium --gpu h800 --seq-len 2048
  python -m experiments profile-info --hf-config path/to/config.json --json > profile.json
  python -m experiments profile-info --model nemotronh-small --out nemotronh-small.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter

from experiments.common import DEFAULT_MODEL, add_model_args, positive_int, print_table, resolve_profile
from pipeline.errors import ConfigError
from pipeline.spec import GIB, LayerCost, ModelProfile

__all__ = ["NAME", "HELP", "add_arguments", "run", "heterogeneity"]

NAME = "profile-info"
HELP = "per-layer costs of a model and where its heterogeneity is (--json/--out: the profile JSON)"

MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--gpu", default="h100",
                        help="GPU preset for the analytic costs (a100, h100, h200, h800, b200)")
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree inside each stage")
    parser.add_argument("--json", action="store_true", help="print the profile JSON instead of the table")
    parser.add_argument("--out", metavar="P.json", help="also write the profile JSON to this file")


def _profile(args: argparse.Namespace) -> ModelProfile:
    if args.tp == 1:
        return resolve_profile(args)
    if args.profile:
        raise ConfigError("applies to analytic profiles only; a profile file has its times already", field="--tp")
    if args.hf_config:
        from pipeline.costs import profile_from_architecture
        from pipeline.hf import load_hf_config

        return profile_from_architecture(load_hf_config(args.hf_config), gpu=args.gpu, seq_len=args.seq_len or 4096,
                                         microbatch_size=args.microbatch_size, tp=args.tp)
    from pipeline.zoo import zoo_profile

    return zoo_profile(args.model or DEFAULT_MODEL, gpu=args.gpu, seq_len=args.seq_len,
                       microbatch_size=args.microbatch_size, tp=args.tp)


def _total(layer: LayerCost) -> float:
    return layer.f + layer.b + layer.w


def heterogeneity(profile: ModelProfile) -> list[dict]:
    """One row per layer kind: count, mean times, and time/activation/parameter ratios to the most common kind."""
    counts = Counter(layer.kind for layer in profile.layers)
    reference = counts.most_common(1)[0][0]
    by_kind: dict[str, list[LayerCost]] = {}
    for layer in profile.layers:
        by_kind.setdefault(layer.kind, []).append(layer)

    def mean(kind: str, key) -> float:
        return statistics.fmean(key(layer) for layer in by_kind[kind])

    ref_time = mean(reference, _total) or 1.0
    ref_act = mean(reference, lambda x: x.act_bytes) or 1.0
    ref_params = mean(reference, lambda x: x.params) or 1.0
    total_time = sum(_total(layer) for layer in profile.layers) or 1.0
    rows = []
    for kind, layers in by_kind.items():
        rows.append({
            "kind": kind, "count": len(layers), "reference": reference,
            "f": mean(kind, lambda x: x.f), "b": mean(kind, lambda x: x.b), "w": mean(kind, lambda x: x.w),
            "time_x": mean(kind, _total) / ref_time, "act_x": mean(kind, lambda x: x.act_bytes) / ref_act,
            "params_x": mean(kind, lambda x: x.params) / ref_params,
            "time_share_%": 100.0 * sum(_total(x) for x in layers) / total_time,
        })
    return rows


def _print_report(profile: ModelProfile) -> None:
    unit = profile.time_unit
    rows = [{"#": i, "name": layer.name, "kind": layer.kind, f"f_{unit}": layer.f, f"b_{unit}": layer.b,
             f"w_{unit}": layer.w, "params_M": layer.params / 1e6, "act_MiB": layer.act_bytes / MIB,
             "out_MiB": layer.out_bytes / MIB} for i, layer in enumerate(profile.layers)]
    extra = profile.extra
    title = (f"{profile.name}: {profile.num_layers} layers, seq_len {profile.seq_len}, micro-batch "
             f"{profile.microbatch_size}" + (f", {extra['gpu']}" if "gpu" in extra else "")
             + (f", tp {extra['tp']}" if extra.get("tp", 1) != 1 else ""))
    print_table(rows, list(rows[0]), title=title)
    kinds = heterogeneity(profile)
    print()
    print_table(kinds, ["kind", "count", "f", "b", "w", "time_x", "act_x", "params_x", "time_share_%"],
                title=f"layer kinds (x = relative to one {kinds[0]['reference']} layer)")
    print()
    totals = [_total(layer) for layer in profile.layers]
    params = sum(layer.params for layer in profile.layers)
    print(f"per micro-batch: F+B+W {sum(totals):.3f} {unit}, params {params / 1e9:.3f}B "
          f"(~{params * 18 / GIB:.1f} GiB with Adam), activations {sum(x.act_bytes for x in profile.layers) / GIB:.2f} "
          f"GiB")
    print(f"heaviest/lightest layer: {max(totals) / max(min(totals), 1e-12):.1f}x; coefficient of variation "
          f"{statistics.pstdev(totals) / statistics.fmean(totals):.2f}")
    for row in sorted(kinds, key=lambda r: -abs(r["time_x"] - 1.0)):
        if row["kind"] != row["reference"]:
            print(f"  {row['kind']} = {row['time_x']:.2f} {row['reference']} layers in time, "
                  f"{row['act_x']:.2f} in activation memory, {row['params_x']:.2f} in parameters")


def run(args: argparse.Namespace) -> int:
    profile = _profile(args)
    if args.out:
        profile.save(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
    else:
        _print_report(profile)
    return 0
