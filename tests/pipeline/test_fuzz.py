"""Property tests over random and broken inputs: readers raise only our errors, the simulator never
hangs or crashes, and a plan it calls valid really respects every dependency.

Set FUZZ_EXAMPLES to run longer locally (default keeps CI fast); docs/reliability.md records runs.
"""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import AdaptisError
from pipeline.plan import Action, Plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, ModelProfile
from tests.conftest import ideal_cluster, uniform_profile

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
pytestmark = pytest.mark.slow  # 500 examples a test (FUZZ_EXAMPLES for more): ~30 s in all on a slow evening

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**10), st.floats(allow_nan=True),
                         st.text(max_size=6))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=5)), max_leaves=12)
plan_keys = st.sampled_from(["devices", "microbatches", "partition", "placement", "schedule", "meta"])
profile_keys = st.sampled_from(["name", "time_unit", "seq_len", "microbatch_size", "layers"])
layer_keys = st.sampled_from(["name", "kind", "f", "b", "w", "params", "act_bytes", "out_bytes", "w_act_bytes",
                             "w_graph_bytes"])
cluster_keys = st.sampled_from(["devices", "memory_gb", "p2p_gbps", "latency_us", "gpus_per_node",
                                "device_list", "inter_node_gbps"])


@FUZZ
@given(st.dictionaries(plan_keys, json_values, max_size=6))
def test_plan_reader_raises_only_plan_errors(raw) -> None:
    try:
        plan = Plan.from_dict(raw)
    except AdaptisError:
        return
    result = simulate(plan, uniform_profile(4), ideal_cluster(2))
    assert result.valid in (True, False)


@FUZZ
@given(st.dictionaries(profile_keys, json_values, max_size=5),
       st.lists(st.dictionaries(layer_keys, json_values, max_size=9), max_size=3))
def test_profile_reader_raises_only_profile_errors(raw, layers) -> None:
    if layers:
        raw["layers"] = layers
    with contextlib.suppress(AdaptisError):
        ModelProfile.from_dict(raw)


@FUZZ
@given(st.dictionaries(cluster_keys, json_values, max_size=7))
def test_cluster_reader_raises_only_cluster_errors(raw) -> None:
    with contextlib.suppress(AdaptisError):
        Cluster.from_dict(raw)


@st.composite
def random_plans(draw):
    """Orders made of the right actions shuffled, with occasional drops, duplicates and strays."""
    devices = draw(st.integers(1, 3))
    chunks = draw(st.integers(1, 2))
    stages = devices * chunks
    mbs = draw(st.integers(1, 4))
    placement = [s % devices for s in range(stages)]
    split = draw(st.booleans())
    rows: list[list[Action]] = [[] for _ in range(devices)]
    for s in range(stages):
        for m in range(mbs):
            ops = ["F", "I", "W"] if split else ["F", "B"]
            for op in ops:
                rows[placement[s]].append(Action(s, op, m))
    rows = [draw(st.permutations(r)) for r in rows]
    if draw(st.integers(0, 4)) == 0 and any(rows):
        d = draw(st.sampled_from([i for i, r in enumerate(rows) if r]))
        rows[d] = rows[d][1:]
    if draw(st.integers(0, 4)) == 0 and any(rows):
        d = draw(st.sampled_from([i for i, r in enumerate(rows) if r]))
        rows[d] = rows[d] + [rows[d][0]]
    if draw(st.integers(0, 6)) == 0:
        rows[0] = rows[0] + [Action(draw(st.integers(0, stages + 1)), draw(st.sampled_from("FIWB")),
                                    draw(st.integers(0, mbs + 1)))]
    partition = [(s, s + 1) for s in range(stages)]
    return Plan(devices, mbs, partition, placement, rows)


def _respects_dependencies(plan: Plan, result) -> bool:
    end = {(e.action.stage, e.action.op, e.action.mb): e.end for e in result.timeline}
    start = {(e.action.stage, e.action.op, e.action.mb): e.start for e in result.timeline}
    for (s, op, m), t0 in start.items():
        if op == "F" and s > 0 and t0 < end[(s - 1, "F", m)] - 1e-9:
            return False
        if op in "IB":
            if t0 < end[(s, "F", m)] - 1e-9:
                return False
            if s + 1 < plan.num_stages:
                grad = end.get((s + 1, "I", m), end.get((s + 1, "B", m)))
                if t0 < grad - 1e-9:
                    return False
        if op == "W" and t0 < end[(s, "I", m)] - 1e-9:
            return False
    return True


@FUZZ
@given(random_plans())
def test_simulator_never_hangs_and_valid_means_valid(plan) -> None:
    profile = uniform_profile(plan.num_stages)
    result = simulate(plan, profile, ideal_cluster(plan.devices))
    if result.valid:
        assert _respects_dependencies(plan, result)
        assert len(result.timeline) == sum(len(r) for r in plan.schedule)
    else:
        assert result.error and any(w in result.error for w in ("deadlock", "missing", "twice", "outside",
                                                                "placed on", "both a fused"))


HF_TYPES = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "gemma2", "gemma3_text",
            "deepseek_v2", "deepseek_v3", "nemotron_h", "jamba", "gpt_oss", "adaptis", "bert", 7, None]
hf_keys = st.sampled_from(["model_type", "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                           "num_key_value_heads", "intermediate_size", "head_dim", "num_local_experts",
                           "num_experts", "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace",
                           "n_routed_experts", "hybrid_override_pattern", "layer_types", "layers", "attn_layer_period",
                           "expert_layer_period", "full_attention_interval", "kv_lora_rank", "sliding_window"])
small_ints = st.one_of(st.integers(-2, 300), json_scalars)


@FUZZ
@given(st.sampled_from(HF_TYPES), st.dictionaries(hf_keys, st.one_of(small_ints, st.lists(small_ints, max_size=4)),
                                                  max_size=12))
def test_hf_config_reader_raises_only_config_errors(model_type, raw) -> None:
    from pipeline.costs import profile_from_architecture
    from pipeline.hf import architecture_from_config

    raw = {**raw, "model_type": model_type}
    try:
        arch = architecture_from_config(raw, source="fuzz.json")
    except AdaptisError:
        return
    if len(arch.layers) <= 300:
        with contextlib.suppress(AdaptisError):
            profile_from_architecture(arch, gpu="h100", seq_len=128)
