"""Published multi-dimensional Megatron-LM runs (TP x PP x DP) beside the whole-job model's predictions.

Used by :mod:`experiments.benchmarks.published` for rows whose throughput is in TFLOP/s per GPU
(Narayanan et al. 2021 Table 1 on A100; Megatron-Core's H100 weak-scaling table). A row is
rebuilt analytically (docs/whole-job.md): a GPT of the row's dimensions (4h MLP, multi-head
attention unless ``kv_heads`` is given), the GPU preset as it is, the row's degrees, micro-batch
size and schedule, priced by :mod:`pipeline.parallelism` (TP/DP/CP pieces) around a simulation
of one pipeline replica under the ``megatron`` runtime model, and its throughput given in the
row's own FLOP convention (Megatron's formula: ``(72 or 96 with full recomputation) * B*s*L*h^2 *
(1 + s/6h) + 6*B*s*h*V`` for a 4h-MLP MHA GPT).

What each source's codebase did is a fact of that codebase (:data:`SOURCES`); two numbers per
source are fitted once across all of the source's rows (``--fit``): the runtime's compute scale
(kernels in a real step against the preset's roofline) and a fixed per-iteration time (data
loading, logging, the gradient-norm and the optimizer's synchronisation). Nothing is per row.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import runtime_cost_options
from pipeline.errors import AdaptisError
from pipeline.hardware import get_gpu
from pipeline.megatron import MAX_MEGATRON_CHUNKS, megatron_partition
from pipeline.parallelism import Parallelism, estimate_job, job_cluster, job_profile, megatron_job_plan
from pipeline.runtime import RUNTIMES
from pipeline.spec import TrainingConfig
from pipeline.v_greedy import v_greedy_plan

__all__ = ["JobSource", "SOURCES", "TFLOPS_UNITS", "is_tflops_unit", "source_of", "predict_job_row",
           "infer_job_degrees", "fit_job_source", "megatron_flops", "gated_mlp", "JobRowPrediction", "predict_job",
           "row_cost_facts", "mfu_fraction", "unstated_interleaving", "interleaving_range"]

#: Schedules of the Zero Bubble fork a whole-job row may name besides Megatron's: its V orders
#: (:mod:`pipeline.v_greedy`), on the ``zb`` runtime at the row's source's compute scale.
V_FORK_SCHEDULES = ("v-half", "v-min")

#: Throughput units the whole-job model predicts (any unit naming TFLOP/s per GPU is taken as one).
TFLOPS_UNITS = ("achieved TFLOP/s per GPU", "TFLOP/s per GPU")


def is_tflops_unit(unit: object) -> bool:
    text = str(unit or "").lower().replace(" ", "")
    return "tflop" in text and "gpu" in text


@dataclass(frozen=True)
class JobSource:
    """What one published codebase ran (facts) and the two values fitted across its rows."""

    name: str
    gpu: str
    """The preset, as it is."""
    flash_attention: bool
    """FlashAttention (Transformer Engine) or materialised softmax scores (Megatron-LM 2021)."""
    sequence_parallel: bool
    tp_comm_overlap: bool
    zero_stage: int
    """0: plain DDP; 1: the distributed optimizer."""
    tied_embeddings: bool
    """Megatron-LM 2021's GPT ties the output layer to the embedding; the Megatron-Core table's
    parameter counts (1.7B = 12*L*h^2 + 2*V*h) say untied."""
    default_microbatch_size: int
    """Where the row does not say (Megatron-Core's table)."""
    bytes_per_param: float
    """Static bytes per parameter before ZeRO sharding (:attr:`pipeline.spec.TrainingConfig.bytes_per_param`):
    16 with fp16 mixed precision (Megatron-LM keeps fp16 gradients unless bf16), 18 with bf16 (an fp32
    ``main_grad``); each with fp32 master weights and Adam's two moments."""
    main_grad_bytes: int
    """Bytes per element of the gradient buffer the embedding's dense gradient is added into each micro-batch
    (:attr:`pipeline.costs.CostOptions.main_grad_bytes`): 2 with fp16, 4 with bf16 (fp32 ``main_grad``)."""
    dropout: bool
    """Megatron-LM's default ``--hidden-dropout 0.1``: the two dropout masks per layer are kept for backward
    (a row's ``training_flags`` override it)."""
    memory_unit_bytes: float
    """What a row's "GB" of peak memory is where the row names no unit: Megatron-LM reports memory as
    ``torch.cuda.max_memory_allocated() / 2**20`` "MB", so a Megatron-based paper's "GB" is GiB."""
    compute_scale: float
    """Fitted across the source's rows (``--fit``): F/I/W times over the preset's roofline."""
    step_s: float
    """Fitted likewise: seconds per iteration outside the pipeline and the DP tail."""
    fitted_on: str


SOURCES = {
    "a100": JobSource("megatron-lm-2021-a100", "a100", flash_attention=False, sequence_parallel=False,
                      tp_comm_overlap=False, zero_stage=0, tied_embeddings=True, default_microbatch_size=1,
                      bytes_per_param=16.0, main_grad_bytes=2, dropout=True, memory_unit_bytes=2.0**30,
                      compute_scale=1.10, step_s=0.0,
                      fitted_on="megatron_narayanan2021.json Table 1, 10 rows (published --fit; refitted with "
                                "the A100 preset by benchmarks.stage_times --fit, 6 Dec 2026: were 1.08, 0.1 s)"),
    "h100": JobSource("megatron-core-r0.8-h100", "h100", flash_attention=True, sequence_parallel=True,
                      tp_comm_overlap=True, zero_stage=1, tied_embeddings=False, default_microbatch_size=1,
                      bytes_per_param=18.0, main_grad_bytes=4, dropout=True, memory_unit_bytes=2.0**30,
                      compute_scale=1.15, step_s=0.0,
                      fitted_on="megatron_core_h100_readme.json weak-scaling table, 9 rows (published --fit)"),
}


def source_of(row: dict[str, Any]) -> JobSource | None:
    """The source whose codebase and GPU ran ``row`` (by its ``gpu_type``), or None. H200, H800 and B200
    rows take the Megatron-Core H100 source's facts and fitted values on their own preset."""
    gpu = str(row.get("gpu_type") or "").lower()
    for key, source in SOURCES.items():
        if key in gpu:
            return source
    for other in ("h200", "h800", "b200"):
        if other in gpu:
            return replace(SOURCES["h100"], gpu=other)
    return None


def gated_mlp(model: dict[str, Any]) -> bool:
    """A gated MLP (SwiGLU / GeGLU: three matrices) where the row says so."""
    act = str(model.get("activation") or model.get("mlp") or "").lower()
    return bool(model.get("gated_mlp")) or any(k in act for k in ("swiglu", "geglu", "silu", "gated"))


def _gpt(model: dict[str, Any], *, tied: bool) -> Architecture:
    h, L = int(model["hidden"]), int(model["layers"])
    heads = int(model["heads"])
    layers = (LayerSpec("embedding"),) + (LayerSpec(),) * L + (LayerSpec("head"),)
    tie = model.get("tied_embeddings")
    return Architecture(model.get("name", "gpt"), "gpt", h, int(model["vocab"]), layers, num_attention_heads=heads,
                        num_key_value_heads=int(model.get("kv_heads") or heads),
                        intermediate_size=int(model.get("ffn_hidden") or 4 * h), gated_mlp=gated_mlp(model),
                        tie_word_embeddings=tied if tie is None else bool(tie), seq_len=int(model["seq_len"]))


def megatron_flops(model: dict[str, Any], *, batch: int, recompute: bool) -> float:
    """FLOPs of one iteration by Megatron-LM's formula (Narayanan et al. 2021 eq. 3 with full
    recomputation; Megatron-Core's ``num_floating_point_operations`` without), generalised to
    GQA, any MLP width and gated MLPs (``x`` = 3 matrices, else 2): per layer and pass
    ``2*B*s*(h*(a*d + 2*g*d) + a*d*h + x*h*f) + 4*B*s^2*a*d``."""
    h, L, s, V = int(model["hidden"]), int(model["layers"]), int(model["seq_len"]), int(model["vocab"])
    a = int(model["heads"])
    g = int(model.get("kv_heads") or a)
    f = int(model.get("ffn_hidden") or 4 * h)
    d = h // a
    x = 3 if gated_mlp(model) else 2
    fwd = 2 * batch * s * (h * (a * d + 2 * g * d) + a * d * h + x * h * f) + 4 * batch * s * s * a * d
    return (4 if recompute else 3) * L * fwd + 6 * batch * s * h * V


def _degrees(row: dict[str, Any], source: JobSource) -> tuple[Parallelism, int] | str:
    """The row's degrees and chunk count, or why they cannot be read."""
    par, batch = dict(row.get("parallel") or {}), row.get("batch", {})
    if par.get("dp") is None and row.get("gpus") and par.get("tp") and par.get("pp"):
        par["dp"] = int(row["gpus"]) // (int(par["tp"]) * int(par["pp"]) * int(par.get("cp") or 1))
    if any(par.get(k) is None for k in ("tp", "pp", "dp")) or not row.get("model", {}).get("layers"):
        return "degrees or model dimensions not published (only tp*pp)"
    schedule = str(row.get("schedule") or "")
    flags = row.get("training_flags") or {}
    recompute = "full" in str(flags.get("activation_recompute") or "")
    # a row's own flags override its source's facts where it states them
    text = " ".join(f"{k}={v}" for k, v in flags.items()).lower()
    zero = 3 if "fsdp" in text or "zero3" in text or "zero-3" in text else (
        1 if flags.get("distributed_optimizer") or "distributed optimizer" in text else source.zero_stage)
    sp = bool(flags["sequence_parallel"]) if "sequence_parallel" in flags else source.sequence_parallel
    tp_overlap = bool(flags["tp_comm_overlap"]) if "tp_comm_overlap" in flags else source.tp_comm_overlap
    pp = int(par["pp"])
    if schedule == "no pipeline" or pp == 1:
        chunks = 1
    elif schedule == "interleaved 1F1B":
        per_chunk = flags.get("num_layers_per_virtual_pipeline_stage")
        chunks = int(par.get("vpp") or (int(row["model"]["layers"]) // pp // int(per_chunk) if per_chunk else 0))
        if chunks < 1:
            return "interleaved 1F1B without its chunk count (vpp or num_layers_per_virtual_pipeline_stage)"
    elif schedule == "1F1B" or schedule.startswith("1F1B family"):
        chunks = 1  # Megatron's default without --num-layers-per-virtual-pipeline-stage
    elif schedule.lower() in V_FORK_SCHEDULES:
        chunks = 2  # the Zero Bubble fork's V: two chunks per device
    else:
        return f"unknown schedule {schedule!r}"
    mbs = int(batch.get("micro_batch_size") or source.default_microbatch_size)
    global_batch = batch.get("global_batch")
    if global_batch is None and batch.get("num_microbatches"):
        global_batch = int(batch["num_microbatches"]) * mbs * int(par["dp"])
    if global_batch is None:
        return "neither the global batch nor the micro-batch count is published"
    ddp = str(flags.get("ddp_impl") or "")
    # torch DDP overlaps its bucketed all-reduce with the backward; Megatron-LM 2021's "local" DDP
    # all-reduces after the backward; Megatron-Core overlaps (--overlap-grad-reduce, README)
    overlap = ddp != "local"
    return Parallelism(tp=int(par["tp"]), pp=pp, dp=int(par["dp"]), cp=int(par.get("cp") or 1),
                       ep=int(par.get("ep") or 1), microbatch_size=mbs,
                       global_batch=int(global_batch), sequence_parallel=sp,
                       zero_stage=zero, overlap_grad_reduce=overlap, overlap_param_gather=True,
                       tp_comm_overlap=tp_overlap, recompute=recompute), chunks


def infer_job_degrees(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """``row`` with the degrees a stated rule infers where it gives only ``tp * pp``
    (``model_parallel_size_in_table``, Narayanan et al. Table 2), else None: TP fills one 8-GPU
    node (as every Table 1 row from 8 model-parallel GPUs up), ``pp = M / tp``, Megatron's default
    1F1B where no schedule is given, and the recomputation, DDP and precision flags of the file's
    pipelined rows where the row has none and they all agree."""
    par = row.get("parallel") or {}
    M = par.get("model_parallel_size_in_table")
    if par.get("tp") is not None or par.get("pp") is not None or not M:
        return None
    tp = min(8, int(M))
    if int(M) % tp:
        return None
    out = {**row, "parallel": {**par, "tp": tp, "pp": int(M) // tp, "cp": par.get("cp") or 1},
           "schedule": row.get("schedule") or "1F1B"}
    if not row.get("training_flags"):
        keys = ("activation_recompute", "ddp_impl", "precision")
        flags = {json.dumps({k: r["training_flags"].get(k) for k in keys}, sort_keys=True) for r in rows
                 if r.get("training_flags") and (r.get("parallel") or {}).get("pp", 1) not in (None, 1)}
        if len(flags) == 1:
            out["training_flags"] = json.loads(flags.pop())
    return out


#: ``training_flags`` keys that say whether a row ran FlashAttention (a row's word beats its source's fact).
FLASH_FLAGS = ("flash_attention", "use_flash_attn", "use-flash-attn", "attention_kernel", "attention")
#: ``training_flags`` keys that give a dropout probability (masks kept in the activations when > 0).
DROPOUT_FLAGS = ("dropout", "hidden_dropout", "attention_dropout")


def _flag_bool(value: object) -> bool | None:
    """True / False for a flag's value (``"flash"``, ``"yes"``, ``0.1``...), None where it says neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value > 0
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "flash", "flash-attn", "flashattention", "fused"):
        return True
    if text in ("false", "no", "off", "none", "unfused", "materialised", "materialized", "eager"):
        return False
    return "flash" in text or None


def row_cost_facts(row: dict[str, Any], source: JobSource, *,
                   default_flash: bool | None = None) -> tuple[bool, bool, list[str]]:
    """(FlashAttention, dropout masks kept, assumptions) of ``row``: what its ``training_flags`` state,
    else ``default_flash`` (None: its source's codebase fact) and the codebase's dropout, each default said
    in the list."""
    flags = row.get("training_flags") or {}
    notes: list[str] = []
    flash = next((v for k in FLASH_FLAGS if k in flags for v in [_flag_bool(flags[k])] if v is not None), None)
    if flash is None and default_flash is not None:
        flash = default_flash
        notes.append(f"flash_attention={flash} (the row does not say; the cost model's default)")
    elif flash is None:
        flash = source.flash_attention
        notes.append(f"flash_attention={flash} ({source.name}'s codebase)")
    dropout = next((v for k in DROPOUT_FLAGS if k in flags for v in [_flag_bool(flags[k])] if v is not None), None)
    if dropout is None:
        dropout = source.dropout
        notes.append(f"dropout masks {'kept' if dropout else 'not kept'} ({source.name}'s default; the row "
                     "states no dropout)")
    return flash, dropout, notes


@dataclass(frozen=True)
class JobRowPrediction:
    """A whole-job row's predicted step in the row's FLOP convention, or why not (``reason``)."""

    tflops_per_gpu: float | None = None
    mfu: float | None = None
    """Megatron-formula FLOPs over the GPU's bf16 peak (what Megatron-based papers call MFU)."""
    peak_memory_gib: float | None = None
    reason: str | None = None
    assumptions: tuple[str, ...] = ()


def predict_job(row: dict[str, Any], *, source: JobSource | None = None,
                default_flash: bool | None = None) -> JobRowPrediction:
    """The whole-job model's step of ``row`` (docstring of this module): TFLOP/s per GPU and MFU in
    Megatron's FLOP formula, and the fullest device's peak memory (GiB). ``default_flash``: FlashAttention
    where the row does not say (None: its source's codebase fact, :func:`row_cost_facts`)."""
    source = source or source_of(row)
    if source is None:
        return JobRowPrediction(reason=f"no whole-job source for GPU {row.get('gpu_type')!r}")
    got = _degrees(row, source)
    if isinstance(got, str):
        return JobRowPrediction(reason=got)
    par, chunks = got
    model = row["model"]
    if model.get("seq_len") is None or model.get("vocab") is None:
        missing = "seq_len" if model.get("seq_len") is None else "vocab"
        return JobRowPrediction(reason=f"row field 'model.{missing}' is not published; the whole-job model needs it")
    s = int(model["seq_len"])
    flash, dropout, notes = row_cost_facts(row, source, default_flash=default_flash)
    try:
        arch = _gpt(model, tied=source.tied_embeddings)
        profile = job_profile(arch, par, gpu=source.gpu, seq_len=s,
                              options=runtime_cost_options("megatron", flash_attention=flash, dropout=dropout,
                                                           main_grad_bytes=source.main_grad_bytes))
        cluster = job_cluster(par, gpu=source.gpu)
        v_shape = str(row.get("schedule") or "").lower() in V_FORK_SCHEDULES  # run by the fork's runtime
        runtime = replace(RUNTIMES["zb" if v_shape else "megatron"], name=source.name,
                          compute_scale=source.compute_scale, step_s=source.step_s, fitted_on=source.fitted_on,
                          analytic_compute_scales=())
        training = TrainingConfig(runtime=runtime, bytes_per_param=source.bytes_per_param)
        if v_shape:  # blocks evenly over the 2p chunks, the embedding on the first, the head on the last
            plan = v_greedy_plan(str(row["schedule"]).lower(), par.pp, par.microbatches,
                                 partition=megatron_partition(profile, 2 * par.pp))
        else:
            plan = megatron_job_plan(profile, cluster, par, training=training, chunks=[chunks])
        est = estimate_job(profile, cluster, plan, par=par, training=training, gpu=source.gpu, seq_len=s)
    except AdaptisError as exc:
        return JobRowPrediction(reason=str(exc), assumptions=tuple(notes))
    if not est.result.valid:
        return JobRowPrediction(reason=est.result.error, assumptions=tuple(notes))
    tflops = megatron_flops(model, batch=par.batch, recompute=par.recompute) / est.iteration_s / par.gpus / 1e12
    peak_tflops = get_gpu(source.gpu).peak_bf16_tflops
    return JobRowPrediction(tflops, tflops / peak_tflops, est.peak_memory_gb, None, tuple(notes))


def predict_job_row(row: dict[str, Any], *, source: JobSource | None = None) -> tuple[float | None, str | None]:
    """(predicted TFLOP/s per GPU, None) for a whole-job row, or (None, reason)."""
    got = predict_job(row, source=source)
    return got.tflops_per_gpu, got.reason


def unstated_interleaving(row: dict[str, Any]) -> bool:
    """Whether ``row`` ran Megatron's 1F1B family on a pipeline without saying how it interleaved
    (schedule "1F1B family ...", pp > 1, neither ``vpp`` nor ``num_layers_per_virtual_pipeline_stage``)."""
    par = row.get("parallel") or {}
    per_chunk = (row.get("training_flags") or {}).get("num_layers_per_virtual_pipeline_stage")
    return (str(row.get("schedule") or "").startswith("1F1B family") and int(par.get("pp") or 1) > 1
            and not par.get("vpp") and not per_chunk)


def interleaving_range(row: dict[str, Any], *, source: JobSource | None = None) -> list[tuple[int, float]]:
    """``(vpp, predicted TFLOP/s per GPU)`` for each chunk count Megatron-Core could have run ``row`` with
    where the row leaves its interleaving unstated (:func:`unstated_interleaving`): 1 (its default,
    1F1B) and every ``vpp`` that splits each pipeline stage's layers evenly (Megatron-Core's
    ``num_layers_per_virtual_pipeline_stage`` must divide them) and that Megatron's interleaved
    schedule accepts (:func:`pipeline.megatron.megatron_chunk_counts`). Empty where the row states it."""
    if not unstated_interleaving(row):
        return []
    layers, pp = int(row["model"]["layers"]), int(row["parallel"]["pp"])
    out = []
    for vpp in range(1, min(layers // pp, MAX_MEGATRON_CHUNKS) + 1):  # (Megatron interleaves at most 8 ways)
        if vpp > 1 and (layers % pp or (layers // pp) % vpp):
            continue
        trial = row if vpp == 1 else {**row, "schedule": "interleaved 1F1B",
                                      "parallel": {**row["parallel"], "vpp": vpp}}
        got = predict_job(trial, source=source)
        if got.tflops_per_gpu is not None:
            out.append((vpp, got.tflops_per_gpu))
    return out


def mfu_fraction(value: float) -> float:
    """A published MFU as a fraction (rows give 0.17 or 17 for 17%)."""
    return value / 100.0 if value > 1.0 else value


def fit_job_source(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Grid search of (compute_scale, step_s) shared by every row of one source: the least median
    absolute error, then the least maximum. Returns the values and {median, max}. A row that leaves
    its interleaving open is read at Megatron's default (1F1B), as when the values were fitted
    (docs/whole-job.md says what its range would choose instead)."""
    usable = [r for r in rows if source_of(r) is not None and (r.get("measured") or {}).get("throughput")
              and is_tflops_unit(r["measured"].get("throughput_unit"))]
    if not usable:
        raise SystemExit("no whole-job rows to fit")
    source = source_of(usable[0])
    assert source is not None
    best: tuple[tuple[float, float], dict[str, float], dict[str, float]] | None = None
    for scale, step in itertools.product([1.0 + k / 100 for k in range(31)], (0.0, 0.025, 0.05, 0.1, 0.15, 0.2)):
        trial = replace(source, compute_scale=scale, step_s=step)
        errors = []
        for r in usable:
            pred, _ = predict_job_row(r, source=trial)
            if pred is not None:
                errors.append(abs(pred / r["measured"]["throughput"] - 1))
        if not errors:
            continue
        key = (statistics.median(errors), max(errors))
        if best is None or key < best[0]:
            best = (key, {"compute_scale": scale, "step_s": step}, {"median_abs_error": key[0],
                                                                     "max_abs_error": key[1]})
    assert best is not None
    return best[1], best[2]
