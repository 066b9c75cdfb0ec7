"""Target-restricted search, checked by the targets' own code: every Megatron layout we write is
accepted by megatron-core 0.16.1 and its per-stage layer counts are our plan's."""

from __future__ import annotations

import shlex
from dataclasses import replace
from functools import cache

import pytest

from agents.base import Budget
from agents.baselines import NamedSearcher
from agents.target_search import MegatronLayoutSearch, target_rows, target_searcher
from pipeline import zoo
from pipeline.candidates import Scenario, objective_key
from pipeline.hardware import build_cluster
from pipeline.spec import LayerCost
from pipeline.targets import megatron_args, target_reason

pytest.importorskip("megatron.core", reason="megatron-core is a dev requirement (requirements-dev.txt)")
import torch  # noqa: E402
from megatron.core.transformer.enums import LayerType  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:full scope is deprecated")  # megatron-core's own default

MODELS = [m for m in zoo.list_models() if m != "tiny-hybrid"]
MICROBATCHES = 16


@cache
def _profile(name: str):
    return zoo.zoo_profile(name)


def _args(text: str) -> dict[str, str]:
    words = shlex.split(text)
    assert len(words) % 2 == 0 and all(w.startswith("--") for w in words[::2]), text
    return dict(zip(words[::2], words[1::2]))


def _check_with_megatron(plan, profile) -> PipelineParallelLayerLayout:
    """Megatron's parser and validator accept the arguments; its counts per (pp rank, virtual
    stage) equal our plan's stage contents."""
    args = _args(megatron_args(plan, profile))
    P = int(args["--pipeline-model-parallel-size"])
    assert plan.devices == P
    mtp = int(args["--mtp-num-layers"]) if "--mtp-num-layers" in args else None
    layout = PipelineParallelLayerLayout(args["--pipeline-model-parallel-layout"], P)
    layout.validate_layer_layout(num_layers=int(args["--num-layers"]), mtp_num_layers=mtp)
    assert layout.virtual_pipeline_model_parallel_size * P == plan.num_stages
    # the model config Megatron builds from these arguments (it re-validates and derives the VPP size)
    config = TransformerConfig(num_layers=int(args["--num-layers"]), hidden_size=64, num_attention_heads=4,
                               pipeline_model_parallel_size=P, pipeline_dtype=torch.float32, mtp_num_layers=mtp,
                               pipeline_model_parallel_layout=args["--pipeline-model-parallel-layout"])
    v = plan.num_stages // P
    assert config.virtual_pipeline_model_parallel_size == (v if v > 1 else None)
    kinds = {"embedding": LayerType.embedding, "head": LayerType.loss, "mtp": LayerType.mtp}
    for s, (a, b) in enumerate(plan.partition):
        theirs = layout.layout[s % P][s // P]  # stage s of a looped placement: rank s % P, chunk s // P
        ours = [kinds.get(x.kind, LayerType.decoder) for x in profile.layers[a:b]]
        assert theirs == ours, (s, theirs, ours)
    return layout


@pytest.mark.parametrize("devices", [4, 8, 16])
@pytest.mark.parametrize("model", MODELS)
def test_megatron_target_layout_is_accepted_by_megatron_core(model: str, devices: int) -> None:
    profile = _profile(model)
    scenario = Scenario(profile, build_cluster("h100", devices=devices), MICROBATCHES)
    found = MegatronLayoutSearch().search(scenario, budget=Budget(sim_calls=12))
    assert found.ok, found.note
    assert target_reason("megatron", found.plan, profile) is None
    _check_with_megatron(found.plan, profile)
    base = NamedSearcher("megatron").search(scenario)
    # Megatron's even split is one of its seeds: never worse (feasible first, then least overflow, then time)
    assert objective_key(found.result) <= objective_key(base.result)


def test_megatron_target_keeps_mtp_layers_where_megatron_wants_them() -> None:
    base = _profile("deepseek-small")
    layers = list(base.layers)
    mtp = replace(layers[-2], name="mtp0", kind="mtp")
    profile = replace(base, layers=tuple(layers[:-1] + [mtp, layers[-1]]))
    assert isinstance(mtp, LayerCost)
    scenario = Scenario(profile, build_cluster("h100", devices=4), MICROBATCHES)
    found = MegatronLayoutSearch().search(scenario, budget=Budget(sim_calls=40))
    assert found.ok
    layout = _check_with_megatron(found.plan, profile)
    assert layout.flatten_layout.count(LayerType.mtp) == 1


def test_torchtitan_target_stays_loop_or_v_and_targets_rank_by_flexibility() -> None:
    profile = _profile("gemma-small")
    scenario = Scenario(profile, build_cluster("h100", devices=4), MICROBATCHES)
    budget = Budget(sim_calls=60)
    mega = NamedSearcher("megatron").search(scenario)
    results = [mega, target_searcher("megatron", 4).search(scenario, budget=budget),
               target_searcher("torchtitan", 4).search(scenario, budget=budget),
               target_searcher("executor", 4).search(scenario, budget=budget)]
    assert target_reason("torchtitan", results[2].plan, profile) is None
    rows = {r["target"]: r for r in target_rows(results, scenario, mega.iteration_time)}
    # a more flexible runtime runs every plan a stricter one does: never slower
    assert rows["executor"]["iteration_time"] <= rows["torchtitan"]["iteration_time"] <= \
        rows["megatron"]["iteration_time"] <= mega.iteration_time * (1 + 1e-9)
    assert rows["megatron"]["method"] == "megatron+layout"
    assert rows["megatron"]["speedup"] > 1.05  # the cost-balanced layout alone beats the even split here


def test_megatron_layout_stops_before_a_step_would_end_past_a_seconds_budget(monkeypatch) -> None:
    """Under a budget in seconds the layout search counts the budget spent once the next step and the
    final plan's build (each as dear as the dearest step so far) would end past it (it overran by
    one ~0.15 s step at 32 devices); a budget in calls is untouched."""
    import agents.target_search as targets

    now = [100.0]
    monkeypatch.setattr(targets.time, "perf_counter", lambda: now[0])
    scenario = Scenario(zoo.zoo_profile("gemma-small"), build_cluster("h100", devices=4), 8)
    from pipeline.evaluator import Evaluator

    clock = targets._StepClock(Budget(sim_calls=None, seconds=1.0), Evaluator(scenario))
    with clock.step():
        now[0] += 0.3  # one step took 0.3 s
    assert not clock.spent()  # 0.3 elapsed + 2 x 0.3 = 0.9 <= 1
    now[0] += 0.15
    assert clock.spent()  # 0.45 + 0.6 > 1: the next step and the plan's build would overrun
    by_calls = targets._StepClock(Budget(sim_calls=10), Evaluator(scenario))
    with by_calls.step():
        now[0] += 50.0
    assert not by_calls.spent()
