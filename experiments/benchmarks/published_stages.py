"""Per-stage F/B/W and transfer times of a published pipeline row: its own, or another row's scaled.

The Zero Bubble paper publishes profiled per-stage times (its Table 9) for one pipeline size and
micro-batch size per model; its other tables run the same models on other pipelines and
micro-batches. A row without its own times takes them from rows of the same model and GPU in the
same source (``donors``), and when the donors ran another setup the times are scaled, never
borrowed as they are:

* **layers per stage.** Where the source places one fewer transformer layer on the first and last
  stage (the embedding and the head stand in for it: the row's ``layer_placement`` says so),
  a stage holds ``(L + 2) / p`` layer-equivalents, else ``L / p``; F/B/W scale with that count.
* **micro-batch size.** F/B/W scale by the analytic cost model's ratio of one transformer layer's
  time at the two micro-batch sizes (:func:`pipeline.costs.layer_work` on the row's GPU, its
  dimensions; an FFN of ``4h`` where the row gives none, which it says), so shape efficiency
  enters as the cost model states it; the transfer ``T_comm`` scales with the activation's bytes
  (linear in the micro-batch size).

A row whose model has no donor in its source is refused with that reason.

:func:`analytic_stage_times` prices the same stage from the row's dimensions alone, by the cost
model on the row's GPU preset: one transformer layer's F/B/W times the stage's layer-equivalents
(the source's placement makes the end stages as heavy as the middle ones, so the vocabulary, which
the Zero Bubble paper does not publish, is not needed), the transfer as the activation's bf16
bytes over the preset's NVLink.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.benchmarks.published_job import gated_mlp
from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import CostOptions, layer_cost, layer_work
from pipeline.hardware import get_gpu, gpu_names

__all__ = ["StageTimes", "stage_times", "analytic_stage_times", "layer_units", "gpu_preset_of", "layer_arch",
           "ZB_PAPER_OPTIONS"]

KEYS = ("T_F", "T_B", "T_W", "T_comm")
#: How the Zero Bubble paper's runs computed attention: without FlashAttention, the scores stored. Its
#: measured memory says so (Tables 4 and 12: a 1F1B stage grows 3.5-3.7 GB per micro-batch in flight,
#: the activations of three layers with the 5as^2b scores term; 1.44 GB without it), and so do its
#: profiled T_B (Table 9: 15% above this cost model's with FlashAttention, 4% below without). The
#: fork's launch script has passed ``--use-flash-attn`` since; the paper's rows predate that.
ZB_PAPER_OPTIONS = CostOptions(flash_attention=False)


@dataclass(frozen=True)
class StageTimes:
    """One stage's profiled times (ms) and where they come from."""

    T_F: float
    T_B: float
    T_W: float
    T_comm: float
    source: str
    """``own``, ``same setup`` (another row of the same model, pipeline and micro-batch size) or
    ``scaled from pp=8 mbs=3`` and what was assumed."""


def gpu_preset_of(row: dict[str, Any]) -> str | None:
    """The GPU preset a row's ``gpu_type`` names (``"A100 SXM 80GB"`` -> ``a100``), or None."""
    text = str(row.get("gpu_type") or "").lower()
    hits = [name for name in gpu_names() if name in text]
    return max(hits, key=len) if hits else None


def layer_units(layers: int, pp: int, *, ends_lighter: bool) -> float:
    """Transformer layer-equivalents per stage of ``layers`` on ``pp`` stages (module docstring)."""
    return (layers + 2 * ends_lighter) / pp


def layer_arch(model: dict[str, Any]) -> Architecture:
    """One transformer layer of the row's dimensions (the vocabulary does not enter a layer's cost): a
    GPT's two-matrix GELU MLP unless the row names a gated one (SwiGLU / GeGLU), as the whole-job
    rows are read (:func:`experiments.benchmarks.published_job.gated_mlp`)."""
    h = int(model["hidden"])
    return Architecture(str(model.get("name") or "row"), "gpt", h, 1, (LayerSpec(),),
                        num_attention_heads=int(model["heads"]),
                        num_key_value_heads=int(model.get("kv_heads") or model["heads"]),
                        intermediate_size=int(model.get("ffn_hidden") or 4 * h), gated_mlp=gated_mlp(model),
                        seq_len=int(model["seq_len"]))


def _mbs_ratios(model: dict[str, Any], gpu: str, mbs_from: int, mbs_to: int) -> tuple[float, float, float]:
    """(F, B, W) time at ``mbs_to`` over the time at ``mbs_from`` of one layer, by the cost model."""
    arch = layer_arch(model)
    s = int(model["seq_len"])
    a, b = (layer_cost(layer_work(arch, 0, seq_len=s, microbatch_size=m, options=ZB_PAPER_OPTIONS), gpu)
            for m in (mbs_from, mbs_to))
    return b.f / a.f, b.b / a.b, b.w / a.w


def _mean(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.fmean(float(r["profiled_inputs"][k]) for r in rows) for k in KEYS}


def stage_times(row: dict[str, Any], donors: Sequence[dict[str, Any]]) -> StageTimes | str:
    """The per-stage times of ``row`` (its own, or its donors' scaled), or why there are none."""
    own = row.get("profiled_inputs")
    if own:
        missing = [k for k in KEYS if not isinstance(own.get(k), (int, float))]
        if missing:
            return f"profiled_inputs lacks {', '.join(missing)}"
        return StageTimes(*(float(own[k]) for k in KEYS), source="own")
    model, gpu = row["model"], gpu_preset_of(row)
    pp, mbs = int(row["parallel"]["pp"]), int(row["batch"]["micro_batch_size"])
    same = [d for d in donors if d.get("profiled_inputs") and d["model"].get("name") == model.get("name")
            and gpu_preset_of(d) == gpu]
    if not same:
        return (f"no profiled stage times for {model.get('name')!r} on {row.get('gpu_type')!r} in this source "
                "(give the row profiled_inputs)")

    def setup(d: dict[str, Any]) -> tuple[int, int]:
        return int(d["parallel"]["pp"]), int(d["batch"]["micro_batch_size"])

    # the nearest setup: the same one, else the same micro-batch size, else the same pipeline
    nearest = min({setup(d) for d in same}, key=lambda s: (s != (pp, mbs), s[1] != mbs, s[0] != pp,
                                                           abs(s[1] - mbs), abs(s[0] - pp)))
    chosen = [d for d in same if setup(d) == nearest]
    base = _mean(chosen)
    if nearest == (pp, mbs):
        return StageTimes(*(base[k] for k in KEYS), source="same setup")
    d_pp, d_mbs = nearest
    # the source's placement rule (its codebase's), read from the rows that state it
    ends_lighter = "one fewer" in str(chosen[0].get("layer_placement") or "")
    layers = int(model["layers"])
    units = layer_units(layers, pp, ends_lighter=ends_lighter) / layer_units(layers, d_pp, ends_lighter=ends_lighter)
    notes = [f"scaled from pp={d_pp} mbs={d_mbs}"]
    rf = rb = rw = 1.0
    if d_mbs != mbs:
        if gpu is None or any(model.get(k) is None for k in ("hidden", "heads", "seq_len")):
            return "stage times at another micro-batch size need hidden, heads, seq_len and a known gpu_type"
        get_gpu(gpu)
        rf, rb, rw = _mbs_ratios(model, gpu, d_mbs, mbs)
        if model.get("ffn_hidden") is None:
            notes.append("ffn 4h assumed")
    return StageTimes(base["T_F"] * units * rf, base["T_B"] * units * rb, base["T_W"] * units * rw,
                      base["T_comm"] * mbs / d_mbs, source=", ".join(notes))


def analytic_stage_times(row: dict[str, Any], *, ends_lighter: bool = True) -> StageTimes | str:
    """One stage of ``row`` priced by the cost model from its dimensions (module docstring), or why not."""
    model, gpu = row["model"], gpu_preset_of(row)
    missing = [k for k in ("layers", "hidden", "heads", "seq_len") if not model.get(k)]
    if missing or gpu is None:
        return "analytic: " + (f"model.{', model.'.join(missing)} not published" if missing else "no known gpu_type")
    pp, mbs = int(row["parallel"]["pp"]), int(row["batch"]["micro_batch_size"])
    cost = layer_cost(layer_work(layer_arch(model), 0, seq_len=int(model["seq_len"]), microbatch_size=mbs,
                                 options=ZB_PAPER_OPTIONS), gpu)
    units = layer_units(int(model["layers"]), pp, ends_lighter=ends_lighter)
    spec = get_gpu(gpu)
    nbytes = 2.0 * mbs * int(model["seq_len"]) * int(model["hidden"])
    comm_ms = 1e3 * (spec.nvlink_latency_us * 1e-6 + nbytes / (spec.nvlink_gbps * 1e9))
    notes = ["analytic"] + (["ffn 4h assumed"] if model.get("ffn_hidden") is None else [])
    return StageTimes(cost.f * units, cost.b * units, cost.w * units, comm_ms, source=", ".join(notes))
