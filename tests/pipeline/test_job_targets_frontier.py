"""Frontier jobs deployed as the runtimes take them, checked by the runtimes' own code.

torchtitan 0.3.0: our ``torchtitan.toml`` builds its ``ParallelismConfig``, ``TrainingConfig``,
activation-checkpoint config and ``Trainer.Config`` (which validates the batch and the pipeline);
``ParallelDims`` checks the degrees multiply to the GPUs; ``_get_pp_rank_to_stage_indices_mapping``
(what ``_pipeline_module_split`` places by) equals our plan's placement; and every FQN is a module of
torchtitan's own model for that config (``model_registry(flavor)``), built on the meta device, whose
``update_from_config`` accepts the job; its ``_split_module`` keeps exactly each stage's modules.

torchtitan's model and trainer modules import its minimal-async-EP kernels, which import triton, a
GPU-only package this CPU build lacks. Where triton is missing, :func:`_torchtitan_models` registers,
for that one module only, a stand-in whose functions raise if called (nothing here calls them: they
are EP dispatch kernels); everything else imported is torchtitan's real code.

megatron-core 0.16.1: ``PipelineParallelLayerLayout`` parses and validates our layout, its per-stage
contents are our plan's, and ``TransformerConfig`` (``MLATransformerConfig`` for MLA) built from the
exported flags accepts them (parallel sizes, VPP from the layout, recompute, MoE, the model's sizes).
"""

from __future__ import annotations

import dataclasses
import importlib
import shlex
import sys
import tomllib
import types
import typing
from functools import cache

import pytest

from pipeline.errors import ConfigError
from pipeline.hardware import build_cluster
from pipeline.job_targets import TORCHTITAN_MODELS, job_ac_mode, megatron_job_args, torchtitan_job_fragment
from pipeline.parallelism import Parallelism, job_cluster, job_profile, megatron_job_plan
from pipeline.plan import Plan
from pipeline.schedules import build_plan
from pipeline.zoo import load_zoo_architecture

pytestmark = pytest.mark.filterwarnings("ignore")  # torchtitan/megatron-core import-time notices

#: (zoo model, degrees, global batch, seq len, megatron chunks per rank) of frontier jobs.
JOBS = {
    "llama3.1-405b": (Parallelism(tp=8, pp=8, dp=8, global_batch=1024, recompute=True), 8192, 2),
    "llama3.1-70b": (Parallelism(tp=8, pp=4, dp=4, global_batch=256, selective_recompute=True), 8192, 1),
    "qwen3-235b-a22b": (Parallelism(tp=4, pp=8, dp=16, ep=8, global_batch=1024, selective_recompute=True), 4096, 2),
    "deepseek-v3": (Parallelism(tp=4, pp=16, dp=32, ep=32, global_batch=2048, recompute=True), 4096, 1),
}


@cache
def _job(model: str, chunks: int | None = None) -> tuple:
    par, seq_len, v = JOBS[model]
    arch = load_zoo_architecture(model)
    profile = job_profile(arch, par, gpu="h100", seq_len=seq_len)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h100"), par, chunks=[chunks or v])
    return arch, par, profile, plan, seq_len


def _toml(model: str, plan: Plan | None = None) -> dict:
    arch, par, profile, own, seq_len = _job(model)
    return tomllib.loads(torchtitan_job_fragment(plan or own, profile, par, csv_path="plan.csv", seq_len=seq_len,
                                                 arch=arch))


# ---------------------------------------------------------------- torchtitan 0.3.0

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


@cache
def _torchtitan_models() -> types.SimpleNamespace:
    """torchtitan's trainer and model registries (see the module docstring on triton)."""
    pytest.importorskip("torchtitan")
    try:
        importlib.import_module("triton")
    except ImportError:
        if _KERNELS not in sys.modules:
            stand_in = types.ModuleType(_KERNELS)

            def _no_triton(*args: object, **kwargs: object) -> None:
                raise RuntimeError("torchtitan's minimal-async-EP kernels need triton, absent here")

            for name in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                         "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel",
                         "invert_flat_indices_kernel", "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
                setattr(stand_in, name, _no_triton)
            sys.modules[_KERNELS] = stand_in
    from torchtitan.trainer import Trainer

    return types.SimpleNamespace(Trainer=Trainer, registry=lambda module: importlib.import_module(
        f"torchtitan.models.{module}").model_registry)


@cache
def _titan_model(model: str):
    """torchtitan's own model for ``model`` (its registry's flavor), built on the meta device."""
    import torch

    module, flavor = TORCHTITAN_MODELS[model]
    spec = _torchtitan_models().registry(module)(flavor)
    with torch.device("meta"):
        return spec.model, spec.model.build()


def _ac_config(mode: str):
    """The activation-checkpoint config torchtitan 0.3.0 selects for subcommand ``mode``."""
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig

    for option in typing.get_args(ActivationCheckpointingConfig):
        cls, *meta = typing.get_args(option)
        if any(getattr(m, "name", None) == mode for m in meta):
            return None if cls is type(None) else cls()
    raise AssertionError(f"torchtitan 0.3.0 has no activation-checkpoint mode {mode!r}")


def _titan_configs(raw: dict):
    from torchtitan.config import ParallelismConfig, TrainingConfig

    return ParallelismConfig(**raw["parallelism"]), TrainingConfig(**raw["training"])


@pytest.mark.parametrize("model", ["llama3.1-405b", "llama3.1-70b", "qwen3-235b-a22b"])
def test_torchtitan_takes_the_frontier_toml(model: str) -> None:
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping, _split_module

    arch, par, profile, plan, seq_len = _job(model)
    raw = _toml(model)
    parallelism, training = _titan_configs(raw)  # unknown or mistyped fields fail here
    dims = ParallelDims.from_config(parallelism, par.gpus)  # asserts dp_r * dp_s * cp * tp * pp == world size
    assert (dims.dp_shard, dims.tp, dims.pp, dims.cp, dims.ep) == (par.dp, par.tp, par.pp, par.cp, par.ep)
    with pytest.raises(AssertionError, match="WORLD_SIZE"):
        ParallelDims.from_config(parallelism, 2 * par.gpus)
    trainer = _torchtitan_models().Trainer.Config(parallelism=parallelism, training=training,
                                                   activation_checkpoint=_ac_config(raw["activation_checkpoint"]["mode"]))
    assert raw["activation_checkpoint"]["mode"] == job_ac_mode(plan, par)[0] == par.ac
    # the trainer's batch arithmetic: one gradient-accumulation step, the plan's micro-batch count
    degree = dims.dp_replicate * dims.dp_shard
    assert training.global_batch_size == par.batch == training.local_batch_size * degree
    assert training.local_batch_size // parallelism.pipeline_parallel_microbatch_size == plan.microbatches
    assert training.seq_len == seq_len
    # the stages torchtitan builds on each pipeline rank are the plan's
    fqns = parallelism.module_fqns_per_model_part
    for rank in range(plan.devices):
        assert _get_pp_rank_to_stage_indices_mapping(rank, plan.devices, parallelism.pipeline_parallel_schedule,
                                                     len(fqns)) == plan.stages_of(rank)
    # every name is a module of torchtitan's model, each top-level module in exactly one stage, in order
    config, titan = _titan_model(model)
    modules = dict(titan.named_modules())
    flat = [name for stage in fqns for name in stage]
    assert all(name in modules for name in flat), sorted(set(flat) - set(modules))
    whole = ["tok_embeddings", *(f"layers.{k}" for k in range(len(titan.layers))), "norm", "lm_head"]
    assert [n for n, _ in titan.named_children()] == ["tok_embeddings", "layers", "norm", "lm_head"]
    assert flat == whole
    assert len(titan.layers) == arch.num_blocks
    for s in (0, len(fqns) // 2, len(fqns) - 1):  # torchtitan's own splitter keeps exactly the stage's modules
        part = _split_module(titan, fqns[s])
        kept = [f"layers.{k}" if n == "layers" else n for n, m in part.named_children() if m is not None
                for k in (part.layers.keys() if n == "layers" else [None])]
        assert kept == fqns[s], (s, kept[:4], fqns[s][:4])
    config.update_from_config(config=trainer)  # torchtitan's own model-vs-job checks (tp | heads, rope length)


def test_torchtitan_v_placement_maps_ranks_as_our_plan() -> None:
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    arch, par, profile, _, seq_len = _job("llama3.1-405b")
    plan = build_plan("zbv", profile, build_cluster("h100", devices=par.pp), microbatches=par.microbatches)
    raw = _toml("llama3.1-405b", plan)
    parallelism, _ = _titan_configs(raw)
    assert parallelism.pipeline_parallel_schedule == "ZBVZeroBubble"
    for rank in range(par.pp):
        assert _get_pp_rank_to_stage_indices_mapping(rank, par.pp, "ZBVZeroBubble", 2 * par.pp) == plan.stages_of(rank)


def test_torchtitan_refusals_are_torchtitans_own() -> None:
    """Our export refuses what torchtitan 0.3.0 refuses: MTP layers and tied weights under a pipeline."""
    from torchtitan.config import ParallelismConfig, TrainingConfig

    titan = _torchtitan_models()
    job = titan.Trainer.Config(parallelism=ParallelismConfig(pipeline_parallel_degree=16),
                               training=TrainingConfig(disable_cuda_graphs=True))
    with pytest.raises(ConfigError, match="MTP"):
        _toml("deepseek-v3")
    mtp = titan.registry("deepseek_v3")("671B", num_mtp_layers=1).model
    with pytest.raises(NotImplementedError, match="MTP does not support pipeline parallelism"):
        mtp.update_from_config(config=job)
    gemma = load_zoo_architecture("gemma3-27b")
    par = Parallelism(tp=8, pp=4, dp=2, global_batch=64)
    profile = job_profile(gemma, par, gpu="h100", seq_len=4096)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h100"), par, chunks=[1])
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        torchtitan_job_fragment(plan, profile, par, csv_path="plan.csv", seq_len=4096, arch=gemma)
    tied = dataclasses.replace(titan.registry("llama3")("debugmodel").model, enable_weight_tying=True)
    with pytest.raises(NotImplementedError, match="Weight tying"):
        tied.update_from_config(config=job)
    # the pipeline needs CUDA graphs off in 0.3.0: our [training] says so
    with pytest.raises(ValueError, match="disable_cuda_graphs"):
        titan.Trainer.Config(parallelism=ParallelismConfig(pipeline_parallel_degree=2))
    assert _toml("llama3.1-405b")["training"]["disable_cuda_graphs"] is True


def test_a_model_torchtitan_lacks_is_exported_with_its_decoder_names() -> None:
    arch = load_zoo_architecture("nemotron-h-56b")
    par = Parallelism(tp=8, pp=8, dp=8, global_batch=512)
    profile = job_profile(arch, par, gpu="h100", seq_len=8192)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h100"), par, chunks=[1])
    text = torchtitan_job_fragment(plan, profile, par, csv_path="plan.csv", seq_len=8192, arch=arch)
    assert "no model of its own known for nemotron-h-56b" in text
    fqns = tomllib.loads(text)["parallelism"]["module_fqns_per_model_part"]
    assert [n for stage in fqns for n in stage] == ["tok_embeddings", *(f"layers.{k}" for k in range(118)),
                                                    "norm", "lm_head"]


def test_a_plan_recomputing_some_stages_is_deployed_as_full() -> None:
    _, par, _, plan, _ = _job("llama3.1-70b")
    some = dataclasses.replace(plan, recompute=(True,) + (False,) * (plan.num_stages - 1))
    mode, note = job_ac_mode(some, par)
    assert mode == "full" and "stages [0]" in note
    assert job_ac_mode(plan, par) == ("selective", None)
    assert job_ac_mode(plan, dataclasses.replace(par, selective_recompute=False)) == ("none", None)


# ---------------------------------------------------------------- megatron-core 0.16.1


def _megatron_args(text: str) -> dict[str, list[str]]:
    """``--flag [value ...]`` lines as a dict (a flag alone: an empty list)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        flag, *values = shlex.split(line)
        assert flag.startswith("--") and flag not in out, line
        out[flag] = values
    return out


#: Megatron-LM flag -> megatron-core config field, where the names differ.
_FIELDS = {"--num-experts": "num_moe_experts", "--swiglu": "gated_linear_unit", "--fp8-format": "fp8",
           "--disable-bias-linear": "add_bias_linear", "--pipeline-model-parallel-size": "pipeline_model_parallel_size"}
#: Flags that Megatron-LM's training script reads, not the model config.
_SCRIPT = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--vocab-size", "--max-position-embeddings",
           "--position-embedding-type", "--untie-embeddings-and-output-weights", "--use-distributed-optimizer",
           "--overlap-grad-reduce", "--overlap-param-gather", "--use-torch-fsdp2", "--group-query-attention"}


def _config_kwargs(args: dict[str, list[str]]) -> dict[str, object]:
    import torch

    kwargs: dict[str, object] = {"pipeline_dtype": torch.bfloat16, "bf16": True}
    for flag, values in args.items():
        if flag in _SCRIPT:
            continue
        name = _FIELDS.get(flag, flag[2:].replace("-", "_"))
        if flag == "--disable-bias-linear":
            kwargs[name] = False
        elif not values:
            kwargs[name] = True
        elif flag == "--recompute-modules":
            kwargs[name] = values
        elif flag == "--moe-layer-freq":  # Megatron-LM's moe_freq_type evaluates the list expression
            kwargs[name] = eval(values[0], {"__builtins__": {}})  # noqa: S307 (our own export)
        else:
            kwargs[name] = int(values[0]) if values[0].isdigit() else values[0]
    return kwargs


@pytest.mark.parametrize("model", sorted(JOBS))
def test_megatron_core_takes_the_frontier_args(model: str) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    arch, par, profile, plan, seq_len = _job(model)
    args = _megatron_args(megatron_job_args(plan, profile, par, seq_len=seq_len, arch=arch))
    P = int(args["--pipeline-model-parallel-size"][0])
    layout_text = args["--pipeline-model-parallel-layout"][0]
    mtp = int(args["--mtp-num-layers"][0]) if "--mtp-num-layers" in args else None
    layout = PipelineParallelLayerLayout(layout_text, P)
    layout.validate_layer_layout(num_layers=int(args["--num-layers"][0]), mtp_num_layers=mtp)
    kinds = {"embedding": LayerType.embedding, "head": LayerType.loss, "mtp": LayerType.mtp}
    for s, (a, b) in enumerate(plan.partition):
        assert layout.layout[s % P][s // P] == [kinds.get(x.kind, LayerType.decoder) for x in profile.layers[a:b]]
    cls = MLATransformerConfig if "--multi-latent-attention" in args else TransformerConfig
    config = cls(**_config_kwargs(args))  # megatron-core's own validation of every flag together
    v = plan.num_stages // P
    assert config.virtual_pipeline_model_parallel_size == (v if v > 1 else None)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (par.tp, par.pp, par.cp, par.ep)
    assert args["--global-batch-size"] == [str(par.batch)] and args["--seq-length"] == [str(seq_len)]
    assert args["--micro-batch-size"] == [str(par.microbatch_size)]
    assert config.recompute_granularity == {"none": None}.get(par.ac, par.ac)
    assert config.hidden_size == arch.hidden_size and config.num_layers == arch.num_blocks
    if arch.num_experts:
        assert config.num_moe_experts == arch.num_experts and config.moe_router_topk == arch.num_experts_per_tok
        assert len(config.moe_layer_freq) == arch.num_blocks
        assert sum(config.moe_layer_freq) == sum(1 for x in arch.layers if x.kind == "block" and x.ffn == "moe")


def test_deepseeks_knobs_are_exported_and_megatron_core_takes_them() -> None:
    """--fp8, --ep-overlap and --moe-max-nodes (the job model's DeepSeek-V3 recipe) become Megatron-LM's
    FP8 (E4M3, blockwise scales), MoE all-to-all overlap and group-limited routing flags. megatron-core's
    MLATransformerConfig takes the overlap and routing flags with the rest of the launch line; its FP8
    check asks the installed Transformer Engine's version, which this CPU build lacks, so the two FP8
    flags are checked by name and value only."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    arch = load_zoo_architecture("deepseek-v3")
    par = Parallelism(tp=4, pp=16, dp=32, ep=32, global_batch=2048, selective_recompute=True, fp8=True,
                      ep_overlap=1.0, moe_max_nodes=4)
    profile = job_profile(arch, par, gpu="h800", seq_len=4096)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h800"), par, chunks=[2])
    args = _megatron_args(megatron_job_args(plan, profile, par, seq_len=4096, arch=arch))
    assert args["--fp8-format"] == ["e4m3"] and args["--fp8-recipe"] == ["blockwise"]
    assert args["--moe-router-num-groups"] == ["4"] and args["--moe-router-group-topk"] == ["4"]
    assert "--overlap-moe-expert-parallel-comm" in args
    no_fp8 = {k: v for k, v in args.items() if k not in ("--fp8-format", "--fp8-recipe")}
    config = MLATransformerConfig(**_config_kwargs(no_fp8))
    assert config.moe_router_num_groups == 4 and config.moe_router_group_topk == 4
    assert config.overlap_moe_expert_parallel_comm
    full = dataclasses.replace(par, selective_recompute=False, recompute=True)
    plan = megatron_job_plan(job_profile(arch, full, gpu="h800", seq_len=4096), job_cluster(full, gpu="h800"), full,
                             chunks=[1])
    text = megatron_job_args(plan, profile, full, seq_len=4096, arch=arch)
    assert "--overlap-moe-expert-parallel-comm" not in text  # Megatron refuses it with full recomputation
    plain = megatron_job_plan(profile, job_cluster(par, gpu="h800"), par, chunks=[1])
    assert "--overlap-moe-expert-parallel-comm" not in megatron_job_args(plain, profile, par, seq_len=4096, arch=arch)


def test_megatron_core_refuses_a_layout_that_does_not_match() -> None:
    """The check above can fail: one decoder layer too many, or a pipeline size that does not divide the stages."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    arch, par, profile, plan, seq_len = _job("llama3.1-405b")
    args = _megatron_args(megatron_job_args(plan, profile, par, seq_len=seq_len, arch=arch))
    layout = PipelineParallelLayerLayout(args["--pipeline-model-parallel-layout"][0], par.pp)
    with pytest.raises(AssertionError, match="num_layers"):
        layout.validate_layer_layout(num_layers=arch.num_blocks + 1, mtp_num_layers=None)
    with pytest.raises(AssertionError, match="divisible"):
        PipelineParallelLayerLayout(args["--pipeline-model-parallel-layout"][0], 3)


def test_megatron_refuses_a_hybrid_mamba_model_with_the_reason() -> None:
    arch = load_zoo_architecture("nemotron-h-56b")
    par = Parallelism(tp=8, pp=8, dp=8, global_batch=512)
    profile = job_profile(arch, par, gpu="h100", seq_len=8192)
    plan = megatron_job_plan(profile, job_cluster(par, gpu="h100"), par, chunks=[1])
    with pytest.raises(ConfigError, match="MambaStack"):
        megatron_job_args(plan, profile, par, seq_len=8192, arch=arch)
    assert "--hidden-size" not in megatron_job_args(plan, profile, par, seq_len=8192)  # without arch: the pipeline
