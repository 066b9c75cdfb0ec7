"""torchtitan's published runs (tokens/s per GPU) beside the torchtitan runtime model (docs/torchtitan.md).

A row is rebuilt from what it states: the Llama model's dimensions, the degrees, the local batch,
the AC mode, torch.compile / Float8 / async TP (from ``training_flags``, or its ``techniques``
text), the GPU. What the row leaves out and torchtitan's defaults fix is assumed and said so:

* ``seq_len`` null: 8192, the ``training.seq_len`` of torchtitan's llama3 8B/70B/405B TOMLs,
  which those tables ran;
* ``vocab`` null: 128,256, the Llama 3 tokenizer's entries;
* ``ffn_hidden`` null: ``ffn_hidden_derived`` (torchtitan's ModelArgs formula);
* ``dp_kind`` FSDP: ``dp`` is ``data_parallel_shard_degree`` (no replication).

Predicted: tokens/s per GPU and peak memory GiB (:func:`pipeline.torchtitan_model.titan_step`,
pipelined rows :func:`pipeline.torchtitan_pp.titan_pp_step`). ``--fit`` grid-searches the H100
fit (:class:`pipeline.torchtitan_model.TitanFit`) across all rows: pairs ranked first, then the
median and the maximum |error|.

  python -m experiments.benchmarks.published_titan ../shared/data/published/torchtitan_llama3_h100_no_pp.json
  python -m experiments.benchmarks.published_titan FILE --fit
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.errors import AdaptisError
from pipeline.hardware import get_gpu
from pipeline.torchtitan_model import TitanFit, TitanJob, TitanModel, titan_fit_for, titan_step

__all__ = ["TitanPrediction", "predict_torchtitan_row", "is_titan_row", "pairs_ranked", "fit_titan", "main",
           "DEFAULT_SEQ_LEN", "LLAMA3_VOCAB"]

#: torchtitan's llama3 TOMLs' ``training.seq_len`` (the tables' runs where the row gives none).
DEFAULT_SEQ_LEN = 8192
#: The Llama 3 tokenizer's entries (``vocab`` null in the rows).
LLAMA3_VOCAB = 128_256
TOKENS_UNIT = "tokens/s/gpu"
#: torchtitan at the tables' commit (9dec370) splits a pipelined rank's local batch into
#: ``experimental.pipeline_parallel_microbatches`` micro-batches, ``None`` meaning the pipeline degree
#: (``n_microbatches = pipeline_parallel_microbatches or pipeline_parallel_degree``); rows that state
#: neither a micro-batch size nor a count take that default, and say so.
#: Without split points, its ``generate_split_points`` gives a looped (multi-stage) schedule two
#: stages per rank.
DEFAULT_STAGES_PER_RANK_LOOPED = 2


@dataclass(frozen=True)
class TitanPrediction:
    """Predicted tokens/s per GPU and peak GiB of one row, or why not (``refused``), with the assumptions made."""

    tokens_per_s_per_gpu: float | None
    peak_memory_gib: float | None
    refused: str | None = None
    assumptions: tuple[str, ...] = ()


def is_titan_row(row: dict[str, Any]) -> bool:
    """A row in tokens/s per GPU (the unit torchtitan reports)."""
    unit = str((row.get("measured") or {}).get("throughput_unit") or "").lower().replace(" ", "")
    return unit in (TOKENS_UNIT, "tokens/s/gpu", "tps/gpu", "tokens/s/device")


def _flag(row: dict[str, Any], name: str, *words: str) -> bool:
    flags = row.get("training_flags") or {}
    if name in flags:
        return bool(flags[name])
    text = str(flags.get("techniques") or "").lower().replace(" ", "")
    return any(w in text for w in words)


def _gpu_of(row: dict[str, Any]) -> str:
    text = str(row.get("gpu_type") or "").lower()
    for name in ("h100", "h200", "h800", "a100"):
        if name in text:
            return name
    raise ValueError(f"gpu_type: unknown GPU {row.get('gpu_type')!r}; name one of h100, h200, h800, a100")


def _int(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}.{key}: needs a whole number >= 1, got {v!r}")
    return v


def _model(row: dict[str, Any], notes: list[str]) -> TitanModel:
    m = row.get("model") or {}
    ffn = m.get("ffn_hidden")
    if ffn is None:
        ffn = m.get("ffn_hidden_derived")
        if ffn is None:
            raise ValueError("model.ffn_hidden: not given (nor ffn_hidden_derived)")
        notes.append(f"ffn_hidden={ffn} (derived)")
    vocab = m.get("vocab")
    if vocab is None:
        vocab = LLAMA3_VOCAB
        notes.append(f"vocab={vocab} (Llama 3 tokenizer)")
    return TitanModel(str(m.get("name") or "llama"), _int(m, "layers", "model"), _int(m, "hidden", "model"),
                      int(ffn), _int(m, "heads", "model"), int(m.get("kv_heads") or m["heads"]), int(vocab))


def _job(row: dict[str, Any], notes: list[str]) -> TitanJob:
    par, batch, flags = row.get("parallel") or {}, row.get("batch") or {}, row.get("training_flags") or {}
    gpus = _int(row, "gpus", "row")
    tp, pp, cp = (_int({**{"tp": 1, "pp": 1, "cp": 1}, **{k: v for k, v in par.items() if v is not None}}, k,
                       "parallel") for k in ("tp", "pp", "cp"))
    kind = str(par.get("dp_kind") or "FSDP")
    if kind.upper() != "FSDP":
        raise ValueError(f"parallel.dp_kind: {kind!r} is not priced (replicas' gradient all-reduce is not modelled); "
                         "only FSDP, dp = data_parallel_shard_degree")
    dp = par.get("dp")
    if dp is None:
        dp = gpus // (tp * pp * cp)
        notes.append(f"dp={dp} (gpus / tp*pp*cp)")
    if tp * pp * cp * int(dp) != gpus:
        raise ValueError(f"parallel: tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * cp * int(dp)}, not gpus={gpus}")
    seq = (row.get("model") or {}).get("seq_len")
    if seq is None:
        seq = DEFAULT_SEQ_LEN
        notes.append(f"seq_len={seq} (torchtitan's llama3 TOML default)")
    local = batch.get("local_batch") or batch.get("micro_batch_size")
    if local is None:
        raise ValueError("batch.local_batch: not given (nor micro_batch_size)")
    ac = str(flags.get("activation_checkpoint") or "selective").lower()
    ac = "none" if ac in ("no", "off", "false") else ac
    schedule = str(row.get("schedule") or "no pipeline")
    chunks = int(par.get("vpp") or 1)
    mbs = int(batch.get("micro_batch_size") or 1)
    m = int(batch.get("num_microbatches") or max(1, int(local) // mbs))
    if pp > 1:
        sched = schedule.replace(" ", "").lower()
        schedule = "Interleaved1F1B" if "interleaved" in sched else "1F1B" if sched == "1f1b" else schedule
        if not batch.get("num_microbatches") and not batch.get("micro_batch_size"):
            m = min(pp, int(local))
            notes.append(f"num_microbatches={m} (torchtitan's default: pipeline_parallel_microbatches = pp)")
        if schedule == "Interleaved1F1B" and chunks < 2:
            # a looped schedule with one stage per rank is 1F1B; vpp null or 1 beside it means "not stated"
            chunks = DEFAULT_STAGES_PER_RANK_LOOPED
            notes.append(f"vpp={chunks} (torchtitan's default stages per rank for a looped schedule; the row "
                         f"gives {par.get('vpp')!r})")
    return TitanJob(gpus=gpus, dp_shard=int(dp), tp=tp, cp=cp, pp=pp, seq_len=int(seq), local_batch=int(local),
                    microbatches=m, compile=_flag(row, "compile", "compile"), float8=_flag(row, "float8", "float8"),
                    ac=ac, async_tp=_flag(row, "async_tp", "asynctp"), schedule=schedule, chunks=chunks)


def predict_torchtitan_row(row: dict[str, Any], meta: dict[str, Any] | None = None, *,
                           fit: TitanFit | None = None) -> TitanPrediction:
    """Predicted tokens/s per GPU and peak memory GiB of a torchtitan row, or a refusal naming the
    field (never an exception for bad input). ``meta``: the file's top level (unused today: the
    hardware is read from the row's ``gpu_type``)."""
    notes: list[str] = []
    if not is_titan_row(row):
        unit = (row.get("measured") or {}).get("throughput_unit")
        return TitanPrediction(None, None, f"measured.throughput_unit: {unit!r} is not tokens/s/GPU")
    try:
        gpu = _gpu_of(row)
        model, job = _model(row, notes), _job(row, notes)
        use = fit or titan_fit_for(get_gpu(gpu))
        if job.pp > 1:
            from pipeline.torchtitan_pp import titan_pp_step
            step = titan_pp_step(model, job, gpu=gpu, fit=use)
        else:
            step = titan_step(model, job, gpu=gpu, fit=use)
    except (ValueError, KeyError, TypeError) as exc:
        return TitanPrediction(None, None, str(exc).strip("'"), tuple(notes))
    except AdaptisError as exc:
        return TitanPrediction(None, None, str(exc), tuple(notes))
    return TitanPrediction(step.tokens_per_s_per_gpu, step.peak_memory_gib, None, tuple(notes))


def _group(row: dict[str, Any]) -> str:
    return str(row.get("table") or "")


def pairs_ranked(rows: Sequence[dict[str, Any]], preds: Sequence[float | None], *,
                 tie: float = 0.01) -> tuple[int, int]:
    """(pairs ordered as measured, pairs) within each group (``table``); a pair within ``tie`` of each
    other as measured counts as right whichever way it is predicted."""
    good = total = 0
    for i, j in itertools.combinations(range(len(rows)), 2):
        if _group(rows[i]) != _group(rows[j]) or preds[i] is None or preds[j] is None:
            continue
        a, b = rows[i]["measured"]["throughput"], rows[j]["measured"]["throughput"]
        total += 1
        if abs(a / b - 1) <= tie or (a > b) == (preds[i] > preds[j]):
            good += 1
    return good, total


def _score(rows: Sequence[dict[str, Any]], fit: TitanFit | None) -> dict[str, Any]:
    preds = [predict_torchtitan_row(r, fit=fit) for r in rows]
    tp = [p.tokens_per_s_per_gpu for p in preds]
    errs = [abs(p / r["measured"]["throughput"] - 1) for p, r in zip(tp, rows, strict=True) if p is not None]
    mem = [abs(p.peak_memory_gib / r["measured"]["peak_memory_gb"] - 1) for p, r in zip(preds, rows, strict=True)
           if p.peak_memory_gib is not None and (r.get("measured") or {}).get("peak_memory_gb")]
    good, total = pairs_ranked(rows, tp)
    return {"predictions": preds, "predicted": len(errs), "rows": len(rows),
            "median_abs_error": statistics.median(errs) if errs else None, "max_abs_error": max(errs, default=None),
            "memory_median_abs_error": statistics.median(mem) if mem else None,
            "memory_max_abs_error": max(mem, default=None),
            "pairs_ranked": good / total if total else None, "pairs": total}


GRID = dict(matmul_efficiency=(0.4, 0.45, 0.5), attention_efficiency=(0.2, 0.25, 0.3),
            float8_speedup=(1.3, 1.4, 1.5, 1.6), compile_vector_factor=(0.0, 0.1, 0.2, 0.4),
            comm_efficiency=(0.6, 0.8), overlap_interference=(0.0, 0.5, 1.0),
            async_tp_exposed=(0.0, 0.3, 0.6), cp_attention_overhead=(0.25, 0.5, 0.75))


def fit_titan(rows: Sequence[dict[str, Any]], *, base: TitanFit | None = None) -> tuple[TitanFit, dict[str, Any]]:
    """The grid point (:data:`GRID`) with the most pairs ranked, then the least maximum |error| (to
    1%), then the least median; then the reserved-memory factor (1.0-1.4) of the least median
    memory |error|."""
    base = base or titan_fit_for("h100")
    usable = [r for r in rows if is_titan_row(r) and (r.get("measured") or {}).get("throughput")]
    best: tuple[tuple[float, float, float], TitanFit, dict[str, Any]] | None = None
    keys = list(GRID)
    for values in itertools.product(*(GRID[k] for k in keys)):
        trial = replace(base, **dict(zip(keys, values, strict=True)))
        s = _score(usable, trial)
        if s["median_abs_error"] is None:
            continue
        key = (-(s["pairs_ranked"] or 0.0), round(s["max_abs_error"], 2), s["median_abs_error"])
        if best is None or key < best[0]:
            best = (key, trial, s)
    if best is None:
        raise SystemExit("no torchtitan rows to fit")
    fit = best[1]
    if any((r.get("measured") or {}).get("peak_memory_gb") for r in usable):  # memory does not move throughput
        factors = [1.0 + k / 50 for k in range(21)]
        fit = min((replace(fit, memory_reserved_factor=f) for f in factors),
                  key=lambda t: _score(usable, t)["memory_median_abs_error"] or 0.0)
    return fit, _score(usable, fit)


def _table(rows: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    out = [f"{'row':48s} {'meas':>7s} {'pred':>7s} {'err':>7s} {'GiB':>6s} {'pred':>6s} {'err':>7s}"]
    for r, p in zip(rows, s["predictions"], strict=True):
        m = r.get("measured") or {}
        if p.refused:
            out.append(f"{r.get('id', '?'):48s} refused: {p.refused}")
            continue
        mem_m = m.get("peak_memory_gb")
        mem_e = f"{p.peak_memory_gib / mem_m - 1:+7.1%}" if mem_m else "      -"
        out.append(f"{r.get('id', '?'):48s} {m['throughput']:7.0f} {p.tokens_per_s_per_gpu:7.0f} "
                   f"{p.tokens_per_s_per_gpu / m['throughput'] - 1:+7.1%} {mem_m or 0:6.1f} "
                   f"{p.peak_memory_gib:6.1f} {mem_e}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks.published_titan",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a published JSON file whose rows are torchtitan tokens/s/GPU rows")
    ap.add_argument("--fit", action="store_true", help="grid-search the H100 fit across the rows and print it")
    args = ap.parse_args(argv)
    try:
        with open(args.file) as fh:
            data = json.load(fh)
        rows = [r for r in data["rows"] if isinstance(r, dict)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{args.file}: cannot read rows ({exc})", file=sys.stderr)
        return 2
    fit = None
    if args.fit:
        fit, _ = fit_titan(rows)
        print("fit:", json.dumps({k: v for k, v in fit.__dict__.items() if k != "fitted_on"}))
    s = _score(rows, fit)
    print("\n".join(_table(rows, s)))
    summary = {k: v for k, v in s.items() if k != "predictions"}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
