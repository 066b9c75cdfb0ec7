"""``python -m experiments profile`` and ``replay`` end to end (small budgets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.model import resolve_architecture, scale_architecture
from executor.profiler import ProfileConfig, profile_architecture
from experiments.cli import main
from pipeline.calibration.fidelity import runtime_profile
from pipeline.spec import ModelProfile
from pipeline.trace import SEND_TRACK, validate_trace
from tests.executor.plans import named_plans


def test_profiler_measures_every_layer() -> None:
    arch = scale_architecture(resolve_architecture("tiny-hybrid"), 0.5)
    prof = profile_architecture(arch, config=ProfileConfig(seq_len=16, warmup=1, repeats=1))
    assert prof.num_layers == len(arch.layers) and prof.extra["measured"]
    for i, layer in enumerate(prof.layers):
        assert layer.f > 0 and layer.w > 0 and layer.params > 0
        assert layer.b > 0 or i == 0  # the embedding has no input gradient
        assert layer.act_bytes > 0 and layer.out_bytes > 0
    assert prof.layers[1].out_bytes == 16 * arch.hidden_size * 4  # one micro-batch of fp32 hidden states
    assert ModelProfile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof


def test_only_the_untimed_metering_run_has_saved_tensor_hooks(monkeypatch) -> None:
    """The hooks' Python pack/unpack calls are not the runtime's: no timed run may carry them."""
    import executor.profiler as profiler

    real, entered = torch.autograd.graph.saved_tensors_hooks, []

    def counting(pack, unpack):  # noqa: ANN001, ANN202
        entered.append(1)
        return real(pack, unpack)

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", counting)
    arch = scale_architecture(resolve_architecture("tiny-hybrid"), 0.5)
    prof = profiler.profile_architecture(arch, config=ProfileConfig(seq_len=16, warmup=0, repeats=3))
    assert len(entered) == len(arch.layers)  # one forward per layer, in the metering run only
    assert all(layer.f > 0 and layer.act_bytes > 0 for layer in prof.layers)


def test_runtime_profile_follows_pytorch_runtime() -> None:
    arch = resolve_architecture("tiny-hybrid")
    prof = profile_architecture(arch, config=ProfileConfig(seq_len=16, warmup=0, repeats=1))
    plans = dict(named_plans(4))
    zb = runtime_profile(prof, plans["zb-h1"])
    first = range(*plans["zb-h1"].partition[0])
    assert all(zb.layers[i].b == 0 for i in first)  # I on the first stage does nothing
    fused = runtime_profile(prof, plans["1f1b"], {"B": 2.0})
    last = prof.layers[-1]
    assert fused.layers[-1].extra["b_full"] == pytest.approx(2.0 * last.extra["b_full"])  # B is priced by b_full


@pytest.mark.parametrize("units,count", [([], 8), (["--granularity", "sublayer", "--head-shards", "2"], 13)])
def test_profile_command_writes_a_profile(tmp_path: Path, units: list[str], count: int) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "tiny-hybrid", "--seq-len", "16", "--repeats", "1", "--warmup", "0",
                 *units, "--out", str(out)]) == 0
    prof = ModelProfile.load(out)
    assert prof.num_layers == count
    if units:  # one entry per unit, naming the block or head it comes from
        assert [x.extra["part"] for x in prof.layers if "part" in x.extra] == ["mixer", "ffn"] * 4
        heads = prof.layers[-2:]
        assert [x.extra["shard"] for x in heads] == [0, 1] and heads[0].out_bytes > heads[1].out_bytes == 4
        assert all(x.f > 0 and x.b > 0 and x.w > 0 for x in heads)


@pytest.mark.slow  # a torchrun job
def test_profile_calibrate_fits_the_runtime_terms_into_the_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "tiny-hybrid", "--seq-len", "16", "--repeats", "1", "--warmup", "0",
                 "--calibrate", "2", "--calibration-microbatches", "4", "--out", str(out)]) == 0
    prof = ModelProfile.load(out)
    scales = prof.extra["runtime_scales"]
    assert set(scales) >= {"F", "I", "W", "overhead", "transfer"} and all(v >= 0 for v in scales.values())
    # extra["runtime_scales"] keeps each value rounded to 6 decimals: equal to that
    assert prof.action_overhead == pytest.approx(scales["overhead"], abs=1e-6)
    assert prof.transfer_overhead == pytest.approx(scales["transfer"], abs=1e-6)


def test_profile_calibrate_needs_two_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "tiny-hybrid", "--seq-len", "16", "--repeats", "1", "--warmup", "0",
                 "--calibrate", "2", "--devices", "1", "--out", str(tmp_path / "p.json")]) == 2
    assert "--devices 2 or more" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow  # a torchrun job
def test_replay_command_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = dict(named_plans(4))["zbv"]
    plan.save(tmp_path / "plan.json")
    code = main(["replay", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-hybrid", "--seq-len", "32",
                 "--steps", "2", "--warmup", "1", "--check", "--json", "--out", str(tmp_path / "r"),
                 "--timeout", "240", "--trace", str(tmp_path / "trace.json"), "--profile-repeats", "2"])
    assert code == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["measured_iteration_time"] > 0 and row["predicted_iteration_time"] > 0
    assert row["max_grad_error"] <= 1e-5
    assert (tmp_path / "r" / "gantt.png").stat().st_size > 0
    measured = json.loads((tmp_path / "r" / "measured_timeline.json").read_text())
    assert set(measured) >= {"time_unit", "devices", "events"} and measured["events"][0]["action"]
    calibrated = ModelProfile.load(tmp_path / "r" / "calibrated_profile.json")  # the measurements fed back
    assert calibrated.extra["repeats"] == 2  # --profile-repeats: the job's profile timed each layer twice
    assert calibrated.extra["runtime_scales"]["F"] == pytest.approx(row["runtime_scales"]["F"], rel=1e-3)
    assert set(row["runtime_scales"]) == {"F", "I", "W", "W0", "F+", "I+", "W+", "W0+", "w_depth", "overhead",
                                          "transfer"}  # zbv: split backward; each with the time a layer adds
    assert calibrated.action_overhead == pytest.approx(row["runtime_scales"]["overhead"], abs=1e-4)
    # --trace: measured (pid 1) and predicted (pid 2) in one Chrome trace, one slice per action each
    trace = json.loads((tmp_path / "trace.json").read_text())
    validate_trace(trace)
    actions = sum(len(a) for a in plan.schedule)
    for pid in (1, 2):
        assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid
                   and e["tid"] < SEND_TRACK) == actions
