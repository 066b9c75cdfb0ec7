"""The memory model against what PyTorch's pipeline runtime really keeps (CPU, one process).

The plan has three stages on three devices and defers every W to the end on each, so every stage
holds each micro-batch from F until W. Measured: the bytes each stage keeps over one step of
``_PipelineScheduleRuntime`` with all stages on this one rank (each stage runs its own actions in
its device's order, so its curve is the one it has on its device): the tensors autograd saves
(``saved_tensors_hooks``) plus the gradients ``stage_backward_input`` keeps for
``stage_backward_weight`` (``PipelineStage.backward_state``), each storage once.

Figures (tiny-hybrid, 64 tokens, 4 micro-batches, fp32; ``pytest -s -k figures`` prints them),
peak bytes per device, measured kept / predicted from the measured profile / predicted by a model
whose I frees what W does not need (``input_backward_keeps_graph=False``):
device 0 (embedding..layer2) 4,557,824 / 4,688,896 / 4,688,896 (the first stage: I is a no-op);
device 1 (layers 3-5) 10,134,656 / 10,680,064 / 7,772,416; device 2 (layer 6, head)
11,925,632 / 12,148,896 / 4,936,492. The saved tensors alone peak at 7,227,008 on device 1 (it
keeps 1.40x that with the gradients) and 4,698,756 on device 2 (2.54x: the head's logits gradient).
"""

from __future__ import annotations

import pytest
import torch

from executor.memory import merged_order, run_plan_here, run_runtime_here
from executor.model import build_stage, make_batch, resolve_architecture
from executor.profiler import ProfileConfig, profile_architecture
from pipeline.costs import architecture_work
from pipeline.plan import Action, Plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, TrainingConfig

SEQ, M = 64, 4
PARTITION = ((0, 3), (3, 6), (6, 8))
FP32 = 4


def _deferred_w_plan() -> Plan:
    def device(s: int) -> tuple[Action, ...]:
        return tuple(Action(s, op, m) for m in range(M) for op in "FI") + tuple(Action(s, "W", m) for m in range(M))

    return Plan(len(PARTITION), M, PARTITION, (0, 1, 2), tuple(device(s) for s in range(len(PARTITION))))


@pytest.fixture(scope="module")
def measured() -> dict:
    torch.set_num_threads(1)
    arch = resolve_architecture("tiny-hybrid")
    profile = profile_architecture(arch, config=ProfileConfig(seq_len=SEQ, warmup=0, repeats=1))
    plan = _deferred_w_plan()
    cluster = Cluster(devices=plan.devices)
    torch_rt = simulate(plan, profile, cluster, training=TrainingConfig(bytes_per_param=0))
    frees_at_i = simulate(plan, profile, cluster,
                          training=TrainingConfig(bytes_per_param=0, input_backward_keeps_graph=False))
    tokens, labels = make_batch(arch, batch=M, seq_len=SEQ)
    order = merged_order(plan, torch_rt.timeline)
    runtime = run_runtime_here(plan, order, arch, tokens=tokens, labels=labels)
    driver = run_plan_here(plan, order, [build_stage(arch, a, b) for a, b in plan.partition], tokens=tokens,
                           labels=labels)
    return {"arch": arch, "profile": profile, "plan": plan, "cluster": cluster, "predicted": torch_rt.peak_memory,
            "frees_at_i": frees_at_i.peak_memory, "runtime": runtime, "driver": driver}


def test_figures(measured, capsys) -> None:
    """Prints the figures of the module docstring (run with ``pytest -s -k figures``)."""
    rt = measured["runtime"]
    with capsys.disabled():
        print("\ndevice  saved  kept (saved + grads for W)  predicted  predicted if I freed  kept/predicted")
        for d in range(measured["plan"].devices):
            kept, pred = rt.kept_peak_device[d], measured["predicted"][d]
            print(f"{d:>6} {rt.saved_peak_device[d]:>10,} {kept:>12,} {pred:>14,.0f}"
                  f" {measured['frees_at_i'][d]:>14,.0f} {kept / pred:8.3f}")
    assert set(rt.kept_peak_device) == {0, 1, 2}


def test_deferred_w_peaks_include_what_the_runtime_keeps_until_w(measured) -> None:
    profile, kept, predicted = measured["profile"], measured["runtime"].kept_peak_device, measured["predicted"]
    act0 = sum(x.act_bytes for x in profile.layers[0:3])
    # every micro-batch's stage-0 activations are alive at once, until the W's at the end
    assert predicted[0] == pytest.approx(M * act0)
    for d in range(3):
        assert predicted[d] == pytest.approx(kept[d], rel=0.10), (d, predicted[d], kept[d])


def test_later_stages_keep_the_graph_and_the_gradients_w_needs(measured) -> None:
    """On a stage after the first, PyTorch's I keeps the autograd graph and the gradient at every
    weight operation's output until W: more than F saved. A model whose I frees what W does not
    need under-predicts those stages' peaks."""
    rt, frees_at_i = measured["runtime"], measured["frees_at_i"]
    for d in (1, 2):
        grads = rt.kept_peak_device[d] - rt.saved_peak_device[d]
        assert grads > 0.3 * rt.saved_peak_device[d], (d, grads)
        assert frees_at_i[d] < 0.8 * rt.kept_peak_device[d], (d, frees_at_i[d], rt.kept_peak_device[d])
    assert rt.kept_peak_device[0] == rt.saved_peak_device[0]  # the first stage's I does nothing


def test_analytic_gradients_kept_for_w_match_the_runtime(measured) -> None:
    """The analytic model's ``w_grad_bytes`` (BF16) against the gradients the runtime keeps (fp32
    here): within 10% per later stage."""
    work = architecture_work(measured["arch"], seq_len=SEQ)
    layers = measured["profile"].layers
    for a, b in PARTITION[1:]:
        measured_grads = sum(x.w_graph_bytes - x.w_act_bytes for x in layers[a:b])
        analytic = sum(w.w_grad_bytes for w in work[a:b]) * FP32 / 2
        assert analytic == pytest.approx(measured_grads, rel=0.10), (a, b, analytic, measured_grads)


def test_measured_w_act_bytes_follow_what_input_backward_frees(measured) -> None:
    layers = measured["profile"].layers
    assert layers[0].w_act_bytes == layers[0].w_graph_bytes == layers[0].act_bytes  # the first layer's I is a no-op
    blocks = layers[1:-1]
    # stage_backward_input keeps the graph for W: inside blocks it frees (almost) nothing
    assert all(x.w_act_bytes >= 0.8 * x.act_bytes for x in blocks)
    # ... and keeps the gradients W needs on top
    assert all(x.w_graph_bytes >= 1.2 * x.act_bytes for x in blocks)
    head = layers[-1]
    assert head.w_act_bytes < 0.2 * head.act_bytes  # the loss side is freed at I
    assert head.w_graph_bytes > 0.8 * head.act_bytes  # but the logits' gradient is kept for W


def test_one_process_driver_keeps_what_the_runtime_keeps(measured) -> None:
    runtime, driver = measured["runtime"], measured["driver"]
    assert driver.saved_peak_stage.keys() == runtime.saved_peak_stage.keys() == {0, 1, 2}
    for s in (0, 1, 2):
        assert driver.saved_peak_stage[s] == pytest.approx(runtime.saved_peak_stage[s], rel=0.01)
        assert driver.kept_peak_stage[s] == pytest.approx(runtime.kept_peak_stage[s], rel=0.01)
    assert driver.loss == pytest.approx(runtime.loss, rel=1e-5)
