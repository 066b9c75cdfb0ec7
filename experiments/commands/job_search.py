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
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from agents.job_search import (
    DEFAULT_CALLS_PER_CONFIG,
    DEFAULT_TUNE_TOP,
    JobConfig,
    JobRow,
    JobSearchResult,
    check_runtime,
    job_setup,
    no_fit_advice,
    parse_reference,
    plan_summary,
    search_job,
)
from experiments.common import interrupted, non_negative_int, share
from pipeline.arch import Architecture
from pipeline.errors import AdaptisError, ConfigError
from pipeline.hardware import get_gpu
from pipeline.job_targets import job_ac_mode, megatron_job_args, torchtitan_job_fragment
from pipeline.parallelism import AC_MODES, DEFAULT_MOE_IMBALANCE, ZERO_STAGES, Parallelism
from pipeline.plan import Plan
from pipeline.spec import ModelProfile
from pipeline.torchtitan_job import DEFAULT_TITAN_FEATURES, TITAN_FEATURES

__all__ = ["add_job_arguments", "config_from_args", "run_job", "write_job_exports", "main"]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers >= 1 separated by commas, e.g. 1,2,4")
    return values


def _ac_modes(text: str) -> tuple[str, ...]:
    modes = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [m for m in modes if m not in AC_MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: give modes among {', '.join(AC_MODES)} separated by commas, "
                                         "e.g. none,selective,full")
    return tuple(m for m in AC_MODES if m in modes)  # lightest recomputation first


def _imbalance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give e.g. 1.25") from None
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1 (1: perfectly balanced experts), e.g. 1.25")
    return value


def _titan_features(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in TITAN_FEATURES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: give features among {', '.join(TITAN_FEATURES)} separated by "
                                         "commas, or none")
    return tuple(n for n in TITAN_FEATURES if n in names)


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
    group.add_argument("--ac", type=_ac_modes, default=AC_MODES,
                       help="activation-checkpointing modes to try, comma-separated (default none,selective,full): "
                            "each configuration takes the lightest in which it fits")
    group.add_argument("--moe-imbalance", type=_imbalance, default=DEFAULT_MOE_IMBALANCE,
                       help="MoE load imbalance: the busiest expert's tokens over the mean (default "
                            f"{DEFAULT_MOE_IMBALANCE}, Switch Transformer's capacity factor; 1: balanced)")
    group.add_argument("--fp8", action="store_true",
                       help="FP8 linear-layer GEMMs, saved inputs and EP dispatch (DeepSeek-V3's recipe; Hopper and "
                            "later)")
    group.add_argument("--ep-overlap", type=share, default=0.0,
                       help="share 0-1 of the EP all-to-all overlapped with another micro-batch's compute (DualPipe, "
                            "Megatron's --overlap-moe-expert-parallel-comm: 1; default 0)")
    group.add_argument("--moe-max-nodes", type=non_negative_int, default=0,
                       help="node-limited routing: nodes a token's experts may span (DeepSeek-V3: 4; default 0, "
                            "unlimited)")
    group.add_argument("--titan-features", type=_titan_features, default=DEFAULT_TITAN_FEATURES,
                       help="with --runtime torchtitan: torchtitan's training flags, comma-separated among "
                            f"{', '.join(TITAN_FEATURES)} or none (default {','.join(DEFAULT_TITAN_FEATURES)}: its "
                            "published 405B runs); the job is FSDP2 over dp*cp (--zero does not apply)")
    group.add_argument("--reference", metavar="CONFIG", default=None,
                       help="a configuration to price beside the search's, e.g. tp8,pp8,dp8,interleaved: degrees "
                            "tpN,ppN,dpN,cpN,epN (dp may be left out), optional mbs=N, ac=MODE, zero=NAME, and "
                            "1f1b or interleaved[:v] (default the runtime's fastest that fits; without mbs=, "
                            "Megatron's 1 or torchtitan's pp micro-batches per local batch)")


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
    cfg = JobConfig(arch=arch, gpus=args.gpus, global_batch=args.global_batch, seq_len=seq_len, gpu=gpu,
                    gpus_per_node=getattr(args, "gpus_per_node", None) or 8,
                    memory_gb=getattr(args, "memory_gb", None), runtime=getattr(args, "runtime", None) or "megatron",
                    zero_stage=ZERO_STAGES[args.zero], microbatch_sizes=tuple(args.microbatch_sizes),
                    max_cp=args.max_cp, pp_choices=args.pp, tp_choices=args.tp,
                    calls_per_config=args.calls_per_config, tune_top=args.tune_top,
                    seed=getattr(args, "seed", 0) or 0, ac_modes=getattr(args, "ac", AC_MODES),
                    moe_imbalance=getattr(args, "moe_imbalance", DEFAULT_MOE_IMBALANCE),
                    fp8=bool(getattr(args, "fp8", False)), ep_overlap=getattr(args, "ep_overlap", 0.0),
                    moe_max_nodes=getattr(args, "moe_max_nodes", 0),
                    titan_features=getattr(args, "titan_features", DEFAULT_TITAN_FEATURES))
    check_runtime(cfg)
    text = getattr(args, "reference", None)
    if text:
        cfg = replace(cfg, reference=parse_reference(text, cfg))
    return cfg


def _fmt(row: JobRow) -> str:
    p = row.par
    if row.estimate is None:
        return f"{row.method:9} tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep} mbs={p.microbatch_size}: {row.note}"
    e = row.estimate
    return (f"{row.method:9} tp={p.tp} pp={p.pp:<2} dp={p.dp:<2} cp={p.cp} ep={p.ep} mbs={p.microbatch_size} "
            f"m={p.microbatches:<4} ac={e.par.ac:<9} {1e3 * e.iteration_s:9.1f} ms "
            f"{e.tokens_per_s_per_gpu:8.0f} tok/s/GPU "
            f"MFU {100 * e.mfu:4.1f}% {e.peak_memory_gb:5.1f} GiB{'' if e.fits else ' (over memory)'}  "
            f"{plan_summary(e.plan)}")


@contextmanager
def _progress_bars():
    """One tqdm bar per phase of the job search on stderr (only on a terminal)."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    names = {"megatron": "Megatron's choice", "tuner": "AdaPtis tuner"}

    def progress(phase: str, done: int, total: int) -> None:
        bar = bars.get(phase)
        if bar is None:
            bar = bars[phase] = tqdm(total=total, desc=names.get(phase, phase), unit="config", file=sys.stderr,
                                     disable=not sys.stderr.isatty(), leave=False)
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def run_job(args: argparse.Namespace) -> int:
    """Run the job search from parsed arguments; print the best configurations; 0 on success, 3 (with
    one line of advice, also the JSON summary's ``why``) when no configuration fits in memory."""
    try:
        cfg = config_from_args(args)
        with _progress_bars() as progress:
            found = search_job(cfg, workers=args.workers, ray_address=getattr(args, "ray", None), progress=progress)
    except AdaptisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        return interrupted(stop, "nothing written (the job search writes its files when it ends)")
    out = getattr(args, "out", None)
    m_by_par = {r.par: r for r in found.rows if r.method in ("megatron", "torchtitan")}
    base = "torchtitan's" if cfg.runtime == "torchtitan" else "Megatron's"
    why = None if found.best is not None else (
        f"no configuration of {cfg.arch.name} on {cfg.gpus} x {cfg.gpu} fits in memory: {no_fit_advice(cfg)}")
    if getattr(args, "json", False):
        for r in found.rows:
            print(json.dumps(r.as_dict()))
        print(json.dumps({"summary": True, "configurations": found.configurations, "why": why,
                          "pruned_memory": found.pruned_memory, "pruned_bound": found.pruned_bound,
                          "seconds": found.seconds, "speedup_over_megatron": found.speedup,
                          "best": found.best.as_dict() if found.best else None,
                          "megatron_best": found.megatron_best.as_dict() if found.megatron_best else None,
                          "reference": found.reference.as_dict() if found.reference else None,
                          "speedup_over_reference": found.speedup_over(found.reference)}))
    else:
        print(f"{cfg.arch.name}: {cfg.gpus} x {cfg.gpu}, global batch {cfg.global_batch} x {cfg.seq_len} tokens; "
              f"{found.configurations} configurations, {found.pruned_memory} cannot fit, {found.pruned_bound} "
              f"pruned by the bound; {found.seconds:.0f} s; every row priced on the {cfg.runtime} runtime"
              + (f" (FSDP2, {'+'.join(cfg.titan_features) or 'bf16 eager'})" if cfg.runtime == "torchtitan" else ""))
        shown = [r for r in found.rows if r.method == "adaptis"][:args.top]
        for r in shown:
            print(_fmt(r))
            same = m_by_par.get(r.par)
            if same is not None:
                print("  same degrees, " + _fmt(same))
        if found.megatron_best is not None:
            print(f"{base} best even-split configuration:\n  " + _fmt(found.megatron_best))
        if found.reference is not None:
            print(f"the reference configuration ({cfg.reference.describe() if cfg.reference else ''}):\n  "
                  + _fmt(found.reference))
        if found.speedup is not None:
            best = found.best.estimate.par.describe() if found.best.estimate else found.best.par.describe()
            print(f"best: {best} {found.best.method}, {found.speedup:.2f}x {base} best configuration on the "
                  "same GPUs")
        ref_speedup = found.speedup_over(found.reference)
        if ref_speedup is not None:
            print(f"best vs the reference: {ref_speedup:.2f}x")
    if out and found.best is not None:
        files = write_job_exports(Path(out), cfg, found)
        if not getattr(args, "json", False):
            print(f"-> {', '.join(str(Path(out) / f) for f in files)}")
    if why is not None:  # exit 3, as the pipeline search's "no plan fits"
        print(why, file=sys.stderr)
        return 3
    return 0


def _megatron_text(cfg: JobConfig, plan: Plan, profile: ModelProfile, *, par: Parallelism) -> tuple[str, str | None]:
    """``megatron_args.txt`` with the model's flags, or without them and why where Megatron-LM's flags
    cannot describe the model (the parallel flags still hold)."""
    try:
        return megatron_job_args(plan, profile, par, seq_len=cfg.seq_len, arch=cfg.arch), None
    except ConfigError as exc:
        if exc.field != "model_flags":
            raise
        return megatron_job_args(plan, profile, par, seq_len=cfg.seq_len), f"model flags not written: {exc}"


def write_job_exports(out: Path, cfg: JobConfig, found: JobSearchResult) -> list[str]:
    """``job_rows.jsonl`` (every row), ``job.json`` (the best, with its plan), ``plan.json`` and
    ``plan.csv`` of the best plan, ``megatron_args.txt`` (the best plan if Megatron-LM can run it,
    else Megatron's best configuration; with the model's own flags) and ``torchtitan.toml`` (the best
    plan where torchtitan can run it, else Megatron's best configuration with its CSV in
    ``megatron_plan.csv``; the degrees, batch, activation checkpointing and module names).
    ``job.json``'s ``exports`` says which row each file holds, or why it is missing. Returns the
    names written."""
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
        # the estimate's degrees carry its AC mode; row.par is the key. The layers' names and module
        # map are the architecture's, whichever runtime priced the row
        profile = job_setup(replace(cfg, runtime="megatron"), row.estimate.par)[0]
        try:
            text, flags_note = _megatron_text(cfg, row.estimate.plan, profile, par=row.estimate.par)
            (out / "megatron_args.txt").write_text(text)
            if flags_note:
                exports["megatron_model_flags_note"] = flags_note
        except ConfigError as exc:
            which = "the best plan" if row is best else "Megatron's best configuration"
            exports.setdefault("megatron_args_note", f"{which}: {exc}")
            continue
        exports["megatron_args.txt"] = "the best plan" if row is best else "Megatron's best configuration"
        files.append("megatron_args.txt")
        break
    for row in (best, found.megatron_best):  # Megatron's even split is loop-style: torchtitan runs it too
        if row is None or row.estimate is None:
            continue
        which = "the best plan" if row is best else "Megatron's best configuration"
        csv = out / ("plan.csv" if row is best else "megatron_plan.csv")
        par = row.estimate.par
        try:
            text = torchtitan_job_fragment(row.estimate.plan, job_setup(replace(cfg, runtime="megatron"), par)[0], par,
                                           csv_path=str(csv),
                                           seq_len=cfg.seq_len, arch=cfg.arch)
        except ConfigError as exc:
            exports.setdefault("torchtitan_note", f"{which}: {exc}")
            continue
        if row is not best:
            row.estimate.plan.save_csv(csv)
            files.append(csv.name)
        (out / "torchtitan.toml").write_text(text)
        exports["torchtitan.toml"] = which
        files.append("torchtitan.toml")
        break
    ac_note = job_ac_mode(plan, best.estimate.par)[1]
    if ac_note:
        exports["activation_checkpoint_note"] = ac_note
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
