"""Rows that publish MFU and peak memory instead of a throughput (a model at several vocabulary sizes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from experiments.benchmarks.head_heavy import vocab_table_row
from experiments.benchmarks.published import predict_row
from experiments.benchmarks.published_job import SOURCES, mfu_fraction, predict_job, row_cost_facts


def vocab_row(vocab: int, *, seq_len: int = 2048, mfu: float = 0.2, memory: float | None = 30.0,
              flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """A head-heavy row: a 32-layer GPT (h 3072) on 8 A100s, PP 8, 1F1B, 128 micro-batches of one sequence."""
    return vocab_table_row(vocab, seq_len, mfu=mfu, peak_memory_gb=memory, flags=flags)


def test_an_mfu_row_is_predicted_in_mfu_with_its_memory() -> None:
    row = vocab_row(256_000, mfu=0.17, memory=35.6)
    p = predict_row(row, [row])
    assert p.reason is None and p.unit == "MFU" and p.measured == pytest.approx(0.17)
    assert 0.05 < p.predicted < 0.6
    assert p.memory_measured_gb == 35.6 and 10 < p.memory_predicted_gb < 80
    percent = copy.deepcopy(row)
    percent["measured"]["mfu"] = 17.0
    assert predict_row(percent, [percent]).measured == pytest.approx(0.17)
    assert mfu_fraction(0.5) == 0.5 and mfu_fraction(50.0) == 0.5


def test_the_head_costs_more_the_larger_the_vocabulary() -> None:
    """The heterogeneity the toolkit exists for: one stage carries the head, so MFU falls and the
    fullest device's memory grows with the vocabulary."""
    got = [predict_job(vocab_row(v)) for v in (32_000, 64_000, 128_000, 256_000)]
    mfus = [g.mfu for g in got]
    memory = [g.peak_memory_gib for g in got]
    assert mfus == sorted(mfus, reverse=True) and mfus[0] > 1.5 * mfus[-1]
    assert memory == sorted(memory) and memory[-1] > memory[0] + 5


def test_the_rows_attention_kernel_beats_the_default() -> None:
    """FlashAttention as the row says; where it says nothing, the cost model's default for such a table (the
    2021 TFLOP/s rows keep their codebase's fact), and the default is said."""
    plain, stored = vocab_row(256_000), vocab_row(256_000, flags={"use_flash_attn": False})
    assert row_cost_facts(stored, SOURCES["a100"])[:2] == (False, False)
    facts = row_cost_facts(plain, SOURCES["a100"], default_flash=True)
    assert facts[0] is True and any("flash_attention=True" in n for n in facts[2])
    assert row_cost_facts(plain, SOURCES["a100"])[0] is SOURCES["a100"].flash_attention
    a, b = predict_row(plain, [plain]), predict_row(stored, [stored])
    assert b.memory_predicted_gb > a.memory_predicted_gb + 2  # the scores are stored
    assert b.predicted < a.predicted
    dropout = predict_row(vocab_row(256_000, flags={"use_flash_attn": False, "hidden_dropout": 0.1}), [])
    assert dropout.memory_predicted_gb > b.memory_predicted_gb


def test_memory_is_compared_in_the_rows_unit() -> None:
    """A row's "GB" is 1e9 bytes; a row that says GiB is compared in GiB."""
    row = vocab_row(64_000)
    gib = copy.deepcopy(row)
    gib["measured"]["peak_memory_unit"] = "GiB"
    a, b = predict_row(row, [row]), predict_row(gib, [gib])
    assert a.memory_predicted_gb == pytest.approx(b.memory_predicted_gb * 2**30 / 1e9)


def test_an_mfu_row_without_its_sequence_length_names_the_field() -> None:
    row = vocab_row(64_000)
    row["model"]["seq_len"] = None
    p = predict_row(row, [row])
    assert p.predicted is None and "model.seq_len" in p.reason and "\n" not in p.reason
