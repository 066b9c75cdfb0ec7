"""The job search's command line: ``search --gpus N --global-batch B`` (and ``python -m
experiments.commands.job_search``, the same options standalone).

:func:`add_job_arguments` adds the whole-job options to ``search``; :func:`run_job` runs
:func:`agents.job_search.search_job` from parsed arguments and prints the best configurations (or
JSON rows); :func:`write_job_exports` writes the output folder. Not a command of its own (no
``NAME``): ``search`` switches to it when ``--gpus``/``--global-batch`` are given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from agents.job_search import (
    DEFAULT_CALLS_PER_CONFIG,
    DEFAULT_TUNE_TOP,
    JobConfig,
    JobRow,
    JobSearchResult,
    job_setup,
    no_fit_advice,
    plan_summary,
    search_job,
)
from pipeline.arch import Architecture
from pipeline.errors import AdaptisError, ConfigError
from pipeline.hardware import get_gpu
from pipeline.job_targets import megatron_job_args, torchtitan_job_fragment
from pipeline.parallelism import ZERO_STAGES

__all__ = ["add_job_arguments", "config_from_args", "run_job", "write_job_exports", "main"]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers >= 1 separated by commas, e.g. 1,2,4")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The whole-job options (``--gpus N --global-batch B`` switch ``search`` to the job search).
    Shares ``--model/--hf-config``, ``--seq-len``, ``--gpu``, ``--gpus-per-node``, ``--memory-gb``,
    ``--runtime``, ``--seed``, ``--out`` and ``--json`` with the pipeline search."""
    group = parser.add_argument_group("whole job (tp x pp x dp x cp x ep; instead of --devices)")
    group.add_argument("--gpus", type=_positive, default=None, help="GPUs of the whole job")
    group.add_argument("--global-batch", type=_positive, default=None, help="sequences per iteration (whole job)")
    group.add_argument("--microbatch-sizes", type=_sizes, default=(1, 2, 4),
                       help="micro-batch sizes to try, comma-separated (default 1,2,4)")
    group.add_argument("--zero", choices=tuple(ZERO_STAGES), default="dist-opt",
                       help="data-parallel sharding: none, dist-opt/zero1 (Megatron's distributed optimizer, the "
                            "default), zero2, fsdp/zero3")
    group.add_argument("--max-cp", type=_positive, default=8, help="largest context-parallel degree to try")
    group.add_argument("--pp", type=_sizes, default=None, help="pipeline degrees to try, comma-separated (default all)")
    group.add_argument("--tp", type=_sizes, default=None,
                       help="tensor-parallel degrees to try, comma-separated (default all up to a node)")
    group.add_argument("--calls-per-config", type=_positive, default=DEFAULT_CALLS_PER_CONFIG,
                       help=f"tuner simulator calls per configuration (default {DEFAULT_CALLS_PER_CONFIG})")
    group.add_argument("--tune-top", type=_positive, default=DEFAULT_TUNE_TOP,
                       help=f"configurations the tuner runs on (default {DEFAULT_TUNE_TOP})")
    group.add_argument("--workers", type=_positive, default=1, help="local processes for the configurations")
    group.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run the configurations as Ray tasks on the cluster at ADDRESS (auto: the running one; "
                            "local: start one here); needs the optional ray package and this checkout on the workers")
    group.add_argument("--top", type=_positive, default=5, help="configurations to print")


def _architecture(args: argparse.Namespace) -> Architecture:
    if getattr(args, "profile", None):
        raise ConfigError("the job search needs the model's architecture to price tp/cp/ep; give --model or "
                          "--hf-config instead of --profile", field="profile")
    hf = getattr(args, "hf_config", None)
    if hf:
        from pipeline.hf import load_hf_config
        return load_hf_config(hf)
    from pipeline.zoo import load_zoo_architecture
    return load_zoo_architecture(getattr(args, "model", None) or "gemma-medium")


def config_from_args(args: argparse.Namespace) -> JobConfig:
    """The :class:`JobConfig` of parsed arguments (``--microbatch-size``, ``--devices``, ``--method``
    and ``--budget`` of the pipeline search do not apply: the job search chooses them)."""
    if args.gpus is None or args.global_batch is None:
        raise ConfigError("the job search needs both --gpus and --global-batch", field="gpus")
    if getattr(args, "cluster", None):
        raise ConfigError("the job search builds its GPUs from --gpu and --gpus-per-node; drop --cluster",
                          field="cluster")
    arch = _architecture(args)
    seq_len = getattr(args, "seq_len", None) or arch.seq_len or 4096
    gpu = get_gpu(getattr(args, "gpu", None) or "h100").name
    return JobConfig(arch=arch, gpus=args.gpus, global_batch=args.global_batch, seq_len=seq_len, gpu=gpu,
                     gpus_per_node=getattr(args, "gpus_per_node", None) or 8,
                     memory_gb=getattr(args, "memory_gb", None), runtime=getattr(args, "runtime", None) or "megatron",
                     zero_stage=ZERO_STAGES[args.zero], microbatch_sizes=tuple(args.microbatch_sizes),
                     max_cp=args.max_cp, pp_choices=args.pp, tp_choices=args.tp,
                     calls_per_config=args.calls_per_config, tune_top=args.tune_top,
                     seed=getattr(args, "seed", 0) or 0)


def _fmt(row: JobRow) -> str:
    p = row.par
    if row.estimate is None:
        return f"{row.method:9} tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep} mbs={p.microbatch_size}: {row.note}"
    e = row.estimate
    return (f"{row.method:9} tp={p.tp} pp={p.pp:<2} dp={p.dp:<2} cp={p.cp} ep={p.ep} mbs={p.microbatch_size} "
            f"m={p.microbatches:<4} {1e3 * e.iteration_s:9.1f} ms {e.tokens_per_s_per_gpu:8.0f} tok/s/GPU "
            f"MFU {100 * e.mfu:4.1f}% {e.peak_memory_gb:5.1f} GiB{'' if e.fits else ' (over memory)'}  "
            f"{plan_summary(e.plan)}")


def run_job(args: argparse.Namespace) -> int:
    """Run the job search from parsed arguments; print the best configurations; 0 on success, 3 (with
    one line of advice, also the JSON summary's ``why``) when no configuration fits in memory."""
    try:
        cfg = config_from_args(args)
        found = search_job(cfg, workers=args.workers, ray_address=getattr(args, "ray", None))
    except AdaptisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = getattr(args, "out", None)
    m_by_par = {r.par: r for r in found.rows if r.method == "megatron"}
    why = None if found.best is not None else (
        f"no configuration of {cfg.arch.name} on {cfg.gpus} x {cfg.gpu} fits in memory: {no_fit_advice(cfg)}")
    if getattr(args, "json", False):
        for r in found.rows:
            print(json.dumps(r.as_dict()))
        print(json.dumps({"summary": True, "configurations": found.configurations, "why": why,
                          "pruned_memory": found.pruned_memory, "pruned_bound": found.pruned_bound,
                          "seconds": found.seconds, "speedup_over_megatron": found.speedup,
                          "best": found.best.as_dict() if found.best else None,
                          "megatron_best": found.megatron_best.as_dict() if found.megatron_best else None}))
    else:
        print(f"{cfg.arch.name}: {cfg.gpus} x {cfg.gpu}, global batch {cfg.global_batch} x {cfg.seq_len} tokens; "
              f"{found.configurations} configurations, {found.pruned_memory} cannot fit, {found.pruned_bound} "
              f"pruned by the bound; {found.seconds:.0f} s")
        shown = [r for r in found.rows if r.method == "adaptis"][:args.top]
        for r in shown:
            print(_fmt(r))
            same = m_by_par.get(r.par)
            if same is not None:
                print("  same degrees, " + _fmt(same))
        if found.megatron_best is not None:
            print("Megatron's best even-split configuration:\n  " + _fmt(found.megatron_best))
        if found.speedup is not None:
            print(f"best: {found.best.par.describe()} {found.best.method}, {found.speedup:.2f}x Megatron's best "
                  "configuration on the same GPUs")
    if out and found.best is not None:
        files = write_job_exports(Path(out), cfg, found)
        if not getattr(args, "json", False):
            print(f"-> {', '.join(str(Path(out) / f) for f in files)}")
    if why is not None:  # exit 3, as the pipeline search's "no plan fits"
        print(why, file=sys.stderr)
        return 3
    return 0


def write_job_exports(out: Path, cfg: JobConfig, found: JobSearchResult) -> list[str]:
    """``job_rows.jsonl`` (every row), ``job.json`` (the best, with its plan), ``plan.json`` and
    ``plan.csv`` of the best plan, ``megatron_args.txt`` (the best plan if Megatron-LM can run it,
    else Megatron's best configuration) and ``torchtitan.toml`` (the best plan, where torchtitan
    can run it). Returns the names written."""
    out.mkdir(parents=True, exist_ok=True)
    best = found.best
    assert best is not None and best.estimate is not None
    (out / "job_rows.jsonl").write_text("".join(json.dumps(r.as_dict()) + "\n" for r in found.rows))
    plan = best.estimate.plan
    plan.save(out / "plan.json")
    plan.save_csv(out / "plan.csv")
    files = ["job_rows.jsonl", "job.json", "plan.json", "plan.csv"]
    exports: dict[str, str] = {}
    for row in (best, found.megatron_best):
        if row is None or row.estimate is None:
            continue
        profile = job_setup(cfg, row.par)[0]
        try:
            (out / "megatron_args.txt").write_text(megatron_job_args(row.estimate.plan, profile, row.estimate.par,
                                                                     seq_len=cfg.seq_len))
        except ConfigError as exc:
            exports.setdefault("megatron_args_note", f"the best plan: {exc}")
            continue
        exports["megatron_args.txt"] = "the best plan" if row is best else "Megatron's best configuration"
        files.append("megatron_args.txt")
        break
    try:
        (out / "torchtitan.toml").write_text(torchtitan_job_fragment(plan, job_setup(cfg, best.par)[0], best.par,
                                                                     csv_path=str(out / "plan.csv"),
                                                                     seq_len=cfg.seq_len))
        exports["torchtitan.toml"] = "the best plan"
        files.append("torchtitan.toml")
    except ConfigError as exc:
        exports["torchtitan_note"] = str(exc)
    (out / "job.json").write_text(json.dumps({**best.as_dict(with_plan=True), "exports": exports,
                                              "speedup_over_megatron": found.speedup}, indent=1))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-medium")
    parser.add_argument("--hf-config", default=None)
    parser.add_argument("--seq-len", type=_positive, default=None)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--gpus-per-node", type=_positive, default=8)
    parser.add_argument("--memory-gb", type=float, default=None)
    parser.add_argument("--runtime", default="megatron")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true")
    add_job_arguments(parser)
    return run_job(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
