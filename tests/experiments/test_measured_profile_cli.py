"""A measured-style profile (256 layers, every cost different, a measured fused backward and a
per-action overhead) through baselines, search and simulate: each finishes promptly and no plan
comes out faster than the lower bound."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from experiments.cli import main
from pipeline.spec import LayerCost, ModelProfile


@pytest.fixture(scope="module")
def measured_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(7)
    layers = [LayerCost("embed", "embedding", 0.05, 0.0, 0.08, 400_000_000, 10_000_000, 8_000_000,
                        extra={"b_full": 0.07})]
    for i in range(254):
        f = rng.uniform(0.9, 1.1)
        b, w = f * rng.uniform(0.95, 1.05), f * rng.uniform(0.8, 1.0)
        layers.append(LayerCost(f"layer{i}", "attention+mlp", f, b, w, rng.randrange(40_000_000, 60_000_000),
                                rng.randrange(150_000_000, 250_000_000), 8_000_000,
                                extra={"b_full": (b + w) * rng.uniform(0.7, 0.95)}))
    layers.append(LayerCost("head", "head", 4.1, 4.0, 3.7, 400_000_000, 1 << 30, 0, extra={"b_full": 6.9}))
    path = tmp_path_factory.mktemp("measured") / "profile.json"
    ModelProfile("measured-256", tuple(layers), action_overhead=0.02).save(path)
    return path


def _rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def test_baselines_are_prompt_and_never_beat_the_bound(measured_profile: Path, capsys) -> None:
    t0 = time.perf_counter()
    assert main(["baselines", "--profile", str(measured_profile), "--gpu", "h100", "--devices", "8",
                 "--microbatches", "16", "--json"]) == 0
    elapsed = time.perf_counter() - t0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) >= 8
    assert all(r["vs_lower_bound"] >= 1.0 for r in rows if r.get("vs_lower_bound") is not None), rows
    assert elapsed < 120, elapsed  # minutes and hangs are what this guards against, not speed


def test_search_and_simulate_are_prompt_and_never_beat_the_bound(measured_profile: Path, tmp_path: Path,
                                                                 capsys) -> None:
    t0 = time.perf_counter()
    assert main(["search", "--profile", str(measured_profile), "--gpu", "h100", "--devices", "8",
                 "--microbatches", "16", "--method", "zbv,adaptis", "--budget", "60", "--out", str(tmp_path),
                 "--json"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert all(r["vs_lower_bound"] >= 1.0 for r in rows if r.get("vs_lower_bound") is not None), rows
    assert main(["simulate", "--plan", str(tmp_path / "plan.json"), "--profile", str(measured_profile), "--gpu",
                 "h100", "--devices", "8", "--json"]) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row["vs_lower_bound"] >= 1.0
    assert time.perf_counter() - t0 < 120
