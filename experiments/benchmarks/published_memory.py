"""Peak memory of a published pipeline row (the Zero Bubble paper's), from its dimensions and its order.

The row's simulated plan gives each device its actions in the order it runs them; this module
walks that order with what each pass allocates and frees on the Zero Bubble fork of Megatron-LM
(fp16, TP = 1, no FlashAttention: :data:`experiments.benchmarks.published_stages.ZB_PAPER_OPTIONS`):

* **the stages' contents.** The source places one fewer transformer layer on the first and last
  stage (the embedding and the head stand in for one): the model is ``L + 2`` units (embedding,
  ``L`` layers, head) split evenly over the devices (the remainder on the middle ones), a device's
  units evenly over its chunks, in stage order (:func:`stage_contents`). A V schedule's first device
  holds the first and the last chunk: the embedding and the head.
* **static.** ``bytes_per_param`` per parameter (fp16 weights, fp16 or fp32 gradient buffer, fp32
  master weights, Adam's two moments) of the stages a device holds: per layer the attention's
  ``4h^2 + 4h``, the MLP's ``2hf + f + h``, two layer norms; the embedding ``V h + s h`` (learned
  positions); the head its own ``V h`` (untied, or the pipeline's copy of tied weights) and the
  final layer norm.
* **activations.** ``F`` of a layer keeps ``sbh (34 + 5as/h)`` bytes (Korthikanti et al. 2022,
  attention scores stored, dropout on); the head keeps the final norm's input and output (``4sbh``)
  and the cross-entropy's fp32 softmax (``4sbV``). A fused backward ``B`` (Megatron's 1F1B and
  interleaved 1F1B) frees all of it. A split backward (the fork's ``I`` then ``W``) keeps, from
  ``I`` until ``W``, only what the weight GEMMs need (the fork's ``WeightGradStore`` holds each
  linear layer's input and output gradient: ``32 sbh`` per layer, ``2sbh + 2sbV`` for the head);
  ``W`` frees that.
* **the pass itself.** While a pass of a layer runs it holds ``transient_scores`` x ``a s^2 b``
  bytes beyond what it keeps (the score matrices and their gradients); the head's forward holds its
  fp16 logits (``2sbV``) beside the fp32 copy it keeps, its backward the fp16 gradient of the
  logits. A forward's transient is counted over all it keeps, a backward's over all it will free.

A device's peak is its static bytes plus the highest of (held activations + the running pass's
transient) along its order, plus ``overhead_gb``; the row's peak is the highest device's, as the
source's one "Memory (GB)" per row is read (the peak over GPUs). The constants of
:class:`MemoryModel` are fitted once across every Zero Bubble row that gives memory (docs/fidelity.md),
never per row.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.plan import Plan

__all__ = ["MemoryModel", "ZB_MEMORY", "StageContent", "stage_contents", "peak_memory", "row_memory_inputs",
           "ends_lighter", "row_peak_memory", "device_walks", "device_peaks", "memory_pairs", "MEMORY_TIE",
           "FIT_GRID", "fit_memory"]

GB = 1e9


@dataclass(frozen=True)
class MemoryModel:
    """The constants of the walk (module docstring); the defaults are the ones fitted on the dev rows
    (``--fit-memory`` over both Zero Bubble files at once: :data:`FIT_GRID`)."""

    bytes_per_param: float = 16.0
    """Static bytes per parameter: fp16 weight (2), fp16 gradient buffer (2), fp32 master weight (4),
    Adam's moments (8): Megatron-LM's fp16 mixed precision (its gradient buffer is fp32 only for bf16).
    Fitted between 16 and 18 (an fp32 gradient buffer)."""
    vocab: int = 32000
    """Vocabulary where the row gives none (the Zero Bubble paper does not say): fitted between GPT-2's
    50257 padded to 50304 and a 32000-token SentencePiece vocabulary (the fork's example script runs
    ``GPTSentencePieceTokenizer``). It moves only the end stages' memory."""
    transient_scores: float = 0.0
    """Bytes per ``a s^2 b`` element a running layer pass holds beyond what it keeps (fitted, 0-4)."""
    overhead_gb: float = 0.5
    """GB every device holds beyond the model: p2p and workspace buffers not modelled here (fitted, 0-1)."""
    unit_bytes: float = GB
    """What the source's "GB" is (1e9: bytes / 1e9)."""
    layer_sbh_bytes: float = 34.0
    """Bytes a layer's forward keeps per ``s b h`` beside the scores (Korthikanti et al.: 34 with f = 4h)."""


#: The fitted constants for the Zero Bubble fork (``--fit-memory`` over both dev files).
ZB_MEMORY = MemoryModel()


@dataclass(frozen=True)
class StageContent:
    """What one stage (chunk) holds: the embedding, transformer layers, the head."""

    embedding: bool
    layers: float
    """Transformer layers (a share of one where a device's layers do not split evenly over its chunks)."""
    head: bool


def _even(total: int, parts: int) -> list[int]:
    """``total`` split over ``parts``: equal shares, the remainder to the parts nearest the middle."""
    base, extra = divmod(total, parts)
    middle = set(sorted(range(parts), key=lambda k: (abs(2 * k - (parts - 1)), k))[:extra])
    return [base + (k in middle) for k in range(parts)]


def stage_contents(layers: int, placement: Sequence[int], *, ends_lighter: bool) -> tuple[StageContent, ...]:
    """What each stage (chunk) of ``placement`` holds. With ``ends_lighter`` the ``L + 2`` units
    (embedding, layers, head) go evenly to the devices (the remainder to the middle ones) and a
    device's units evenly to its chunks (a share of a layer where they do not divide: a V of 46
    layers on 16 devices gives each chunk 1.5), in stage order, the embedding on the first stage and
    the head on the last; else the ``L`` layers so, beside the embedding and the head."""
    devices = max(placement) + 1
    per_device = _even(layers + 2 if ends_lighter else layers, devices)
    count = [placement.count(d) for d in range(devices)]
    last = len(placement) - 1
    return tuple(StageContent(s == 0, max(0.0, per_device[d] / count[d] - ends_lighter * ((s == 0) + (s == last))),
                              s == last) for s, d in enumerate(placement))


@dataclass(frozen=True)
class RowDims:
    """The row's dimensions the walk reads (vocabulary and FFN filled in where the row gives none)."""

    hidden: int
    heads: int
    seq_len: int
    ffn: int
    vocab: int
    mbs: int
    notes: tuple[str, ...]


def row_memory_inputs(row: dict[str, Any], model: MemoryModel = ZB_MEMORY) -> RowDims | str:
    """The dimensions of ``row`` the memory walk needs, or why they are missing."""
    m = row.get("model") or {}
    missing = [k for k in ("hidden", "heads", "seq_len") if not m.get(k)]
    if missing:
        return "peak memory needs model." + ", model.".join(missing)
    h = int(m["hidden"])
    notes = [] if m.get("ffn_hidden") is not None else ["ffn 4h"]
    notes += [] if m.get("vocab") is not None else [f"vocab {model.vocab}"]
    notes += [f"{model.bytes_per_param:g} B/param (fp16, Adam)", "scores and dropout masks kept (no FlashAttention)"]
    notes = ["assumed: " + ", ".join(notes)]
    return RowDims(h, int(m["heads"]), int(m["seq_len"]), int(m.get("ffn_hidden") or 4 * h),
                   int(m.get("vocab") or model.vocab), int(row["batch"]["micro_batch_size"]), tuple(notes))


def _stage_bytes(c: StageContent, d: RowDims, model: MemoryModel) -> tuple[float, float, float, float, float]:
    """(params, kept by F, kept from I until W, transient of F, transient of a backward) of one chunk."""
    h, a, s, b, f, V = d.hidden, d.heads, d.seq_len, d.mbs, d.ffn, d.vocab
    sbh = s * b * h
    layer_params = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    params = c.layers * layer_params + c.embedding * (V * h + s * h) + c.head * (V * h + 2 * h)
    # Korthikanti's 34 sbh assume f = 4h: of the MLP's 19, the GELU's input and fc2's (8 + 8) scale with f
    per_layer = sbh * (model.layer_sbh_bytes - 16 + 4 * f / h) + 5 * a * s * s * b
    keep = c.layers * per_layer + c.head * (4 * sbh + 4 * s * b * V)
    w_keep = c.layers * sbh * (16 + 4 * f / h) + c.head * (2 * sbh + 2 * s * b * V)
    scores = model.transient_scores * a * s * s * b if c.layers else 0.0
    fwd = max(scores, c.head * 2 * s * b * V)
    bwd = max(scores, c.head * 2 * s * b * V)
    return params, keep, w_keep, fwd, bwd


def device_walks(plan: Plan, row: dict[str, Any], *, model: MemoryModel = ZB_MEMORY,
                 ends_lighter: bool = True) -> tuple[tuple[tuple[float, float], ...], tuple[str, ...]] | str:
    """(per device, its parameters and the most activation bytes it holds along its order; the
    assumptions made) of ``plan`` for ``row``, or why it cannot be priced. What it reads of ``model``:
    ``vocab``, ``transient_scores``, ``layer_sbh_bytes`` (the rest prices it: :func:`device_peaks`)."""
    dims = row_memory_inputs(row, model)
    if isinstance(dims, str):
        return dims
    contents = stage_contents(int(row["model"]["layers"]), plan.placement, ends_lighter=ends_lighter)
    per_stage = [_stage_bytes(c, dims, model) for c in contents]
    walks = []
    for dev, actions in enumerate(plan.schedule):
        params = sum(per_stage[s][0] for s in plan.stages_of(dev))
        held = top = 0.0
        for act in actions:
            _, keep, w_keep, fwd, bwd = per_stage[act.stage]
            if act.op == "F":  # its transient peaks at its end (the head's logits), over what it keeps
                top = max(top, held + keep + fwd)
                held += keep
            elif act.op == "B":
                top = max(top, held + bwd)
                held -= keep
            elif act.op == "I":
                top = max(top, held + bwd)
                held -= keep - w_keep
            elif act.op == "W":
                held -= w_keep
            top = max(top, held)
        walks.append((params, top))
    return tuple(walks), dims.notes


def device_peaks(walks: Sequence[tuple[float, float]], model: MemoryModel) -> tuple[float, ...]:
    """Each device's peak in the source's GB from its :func:`device_walks` entry: its static bytes
    (``bytes_per_param`` a parameter) and its activations' top, plus ``overhead_gb``."""
    return tuple((params * model.bytes_per_param + top) / model.unit_bytes + model.overhead_gb * GB / model.unit_bytes
                 for params, top in walks)


def peak_memory(plan: Plan, row: dict[str, Any], *, model: MemoryModel = ZB_MEMORY,
                ends_lighter: bool = True) -> tuple[tuple[float, ...], tuple[str, ...]] | str:
    """(peak of each device in the source's GB, the assumptions made) of ``plan`` for ``row``, or why
    it cannot be priced."""
    walked = device_walks(plan, row, model=model, ends_lighter=ends_lighter)
    if isinstance(walked, str):
        return walked
    walks, notes = walked
    return device_peaks(walks, model), notes


def ends_lighter(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
    """Whether the source places one fewer layer on the first and last stage: the row's
    ``layer_placement`` says so, or (where the row is silent) a row of the same source does."""
    own = row.get("layer_placement")
    texts = [own] if own else [r.get("layer_placement") for r in rows if r.get("_source") == row.get("_source")]
    return any("one fewer" in str(t or "") for t in texts)


def row_peak_memory(plan: Plan, row: dict[str, Any], rows: Sequence[dict[str, Any]], *,
                    model: MemoryModel = ZB_MEMORY) -> tuple[float | None, str | None]:
    """(the row's predicted peak memory in the source's GB, the assumptions made), or (None, why
    not), for a pipeline row whose simulated plan is ``plan`` (``rows``: its source's rows)."""
    walked = peak_memory(plan, row, model=model, ends_lighter=ends_lighter(row, rows))
    if isinstance(walked, str):
        return None, walked
    peaks, notes = walked
    return max(peaks), ", ".join(notes) or None


#: A measured pair of peaks within this share of each other is a tie (either order is right).
MEMORY_TIE = 0.01


def memory_pairs(rows: Sequence[tuple[str, float, float]]) -> tuple[int, int]:
    """(pairs ranked as measured, pairs) of ``(group, measured, predicted)`` peaks within each group."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for group, measured, predicted in rows:
        groups.setdefault(group, []).append((measured, predicted))
    ranked = total = 0
    for members in groups.values():
        for (m1, p1), (m2, p2) in itertools.combinations(members, 2):
            total += 1
            ranked += abs(m1 / m2 - 1) <= MEMORY_TIE or (m1 > m2) == (p1 > p2)
    return ranked, total


#: The ``--fit-memory`` grid: bytes per parameter, vocabulary (where rows give none), transient
#: bytes per ``a s^2 b`` element, overhead (GB), and what the source's "GB" is.
FIT_GRID = ((16.0, 18.0), (50304, 32000), (0.0, 1.0, 2.0, 4.0), (0.0, 0.5, 1.0), (GB, 2.0**30), (32.0, 33.0, 34.0))


def fit_memory(items: Sequence[tuple[dict[str, Any], Plan, str]],
               rows: Sequence[dict[str, Any]]) -> tuple[MemoryModel, dict[str, Any]]:
    """The :data:`FIT_GRID` point with the fewest pairs ranked unlike the measurements, then the least
    median, then max, |error| over every ``(row, plan, group)`` at once (``rows``: the rows' sources),
    and its figures."""
    best: tuple[tuple[int, float, float], MemoryModel, dict[str, Any]] | None = None
    lighter = [ends_lighter(row, rows) for row, _, _ in items]
    walked: dict[tuple, list[tuple[str, float, Any]]] = {}  # each row walked once per walk's constants
    for point in itertools.product(*FIT_GRID):
        model = MemoryModel(*point)
        walk_key = (model.vocab, model.transient_scores, model.layer_sbh_bytes)
        if walk_key not in walked:
            walked[walk_key] = [(group, float(row["measured"]["peak_memory_gb"]),
                                 device_walks(plan, row, model=model, ends_lighter=light))
                                for (row, plan, group), light in zip(items, lighter)]
        got = [(g, m, max(device_peaks(w[0], model))) for g, m, w in walked[walk_key] if not isinstance(w, str)]
        if not got:
            raise SystemExit("no pipeline rows with a peak memory to fit")
        errors = sorted(abs(p / m - 1) for _, m, p in got)
        ranked, pairs = memory_pairs(got)
        median = statistics.median(errors)
        rank_key = (pairs - ranked, median, errors[-1])
        if best is None or rank_key < best[0]:
            best = (rank_key, model, {"memory_rows": len(got), "memory_median_abs_error": median,
                                      "memory_max_abs_error": errors[-1], "memory_pairs": pairs,
                                      "memory_pairs_ranked_as_measured": ranked})
    assert best is not None
    return best[1], best[2]
