"""A whole job's plan in Megatron-LM's and torchtitan's terms: every parallel degree, the batch, the overlaps.

:func:`megatron_job_args` extends :func:`pipeline.targets.megatron_args` (the pipeline: size,
layout, micro-batch group) with the job's TP, CP and EP sizes, sequence parallelism, the
distributed optimizer (ZeRO-1) or FSDP (ZeRO-3), the overlap flags, the activation recomputation
(:func:`job_ac_mode`), the whole job's global batch and sequence length and, given the model's
:class:`~pipeline.arch.Architecture`, the model's own flags (:func:`megatron_model_args`).
:func:`torchtitan_job_fragment` extends :func:`pipeline.targets.torchtitan_fragment` with the
``[parallelism]`` degrees, the ``[training]`` batch and ``[activation_checkpoint]``, in
torchtitan 0.3.0's names (its ``ParallelismConfig``/``TrainingConfig`` fields and its
activation-checkpoint subcommands). ``profile`` is the job's per-rank profile
(:func:`pipeline.parallelism.job_profile`), whose ``seq_len`` is a context-parallel rank's share.
"""

from __future__ import annotations

import re
import shlex

from pipeline.arch import Architecture
from pipeline.errors import ConfigError
from pipeline.parallelism import SELECTIVE_MODULES, Parallelism
from pipeline.plan import Plan
from pipeline.spec import ModelProfile
from pipeline.targets import megatron_args, torchtitan_fragment

__all__ = ["TORCHTITAN_MODELS", "TORCHTITAN_AC_MODES", "job_ac_mode", "megatron_layout_reason", "megatron_model_args",
           "megatron_job_args", "torchtitan_job_fragment"]

#: torchtitan 0.3.0's own model for a zoo architecture: ``(--module, model_registry flavor)``.
#: Gemma 3 and Nemotron-H have none in 0.3.0 (``torchtitan.models``).
TORCHTITAN_MODELS: dict[str, tuple[str, str]] = {
    "llama3.1-405b": ("llama3", "405B"),
    "llama3.1-70b": ("llama3", "70B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
}
#: torchtitan 0.3.0's activation-checkpoint modes: the subcommands of ``Trainer.Config.activation_checkpoint``
#: (``none`` is ``None``, ``selective`` ``SelectiveAC.Config()``, ``full`` ``FullAC.Config()``).
TORCHTITAN_AC_MODES = ("none", "selective", "full")
#: Mixers megatron-core 0.16.1 builds in a GPT model (its ``--pipeline-model-parallel-layout`` is a
#: GPT/TransformerBlock feature: the hybrid MambaStack splits its layers evenly and ignores it).
_GPT_MIXERS = frozenset({"attention", "sliding_attention", "mla", "none"})


def job_ac_mode(plan: Plan, par: Parallelism) -> tuple[str, str | None]:
    """The activation checkpointing to deploy, ``(mode, note)``: the job's mode (``par.ac``: none,
    selective, full), or ``full`` where the plan recomputes stages. Neither runtime takes a mode per
    stage, so a plan that recomputes some stages only is deployed as ``full`` (it then fits the
    memory, at more recomputation than priced) and ``note`` says so; None otherwise."""
    mode = par.ac
    marks = plan.recompute or ()
    if mode == "full" or not any(marks):
        return mode, None
    if all(marks):
        return "full", None
    stages = [s for s, on in enumerate(marks) if on]
    return "full", (f"the plan recomputes stages {stages} only; torchtitan and Megatron-LM take one mode for every "
                    "stage, so the export recomputes all of them (it fits; its step is slower than priced)")


def _recompute_args(mode: str, *, moe: bool) -> list[tuple[str, object | None]]:
    if mode == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", 1)]
    if mode == "selective":  # what the model prices as selective; moe_act only where there are experts
        modules = [m for m in SELECTIVE_MODULES if moe or m != "moe_act"]
        return [("--recompute-granularity", "selective"), ("--recompute-modules", " ".join(modules))]
    return []


def _moe_layer_freq(arch: Architecture) -> str:
    """``--moe-layer-freq`` as Megatron-LM's Python list expression (``[0]*3+[1]*58``)."""
    flags = [1 if spec.ffn == "moe" else 0 for spec in arch.layers if spec.kind == "block"]
    runs: list[str] = []
    k = 0
    while k < len(flags):
        j = k
        while j < len(flags) and flags[j] == flags[k]:
            j += 1
        runs.append(f"[{flags[k]}]*{j - k}")
        k = j
    return "+".join(runs)


def megatron_layout_reason(arch: Architecture) -> str | None:
    """Why megatron-core 0.16.1 cannot take ``--pipeline-model-parallel-layout`` for ``arch``
    (blocks its GPT model lacks: Mamba, linear attention); None when it can."""
    other = sorted({spec.mixer for spec in arch.layers if spec.kind == "block"} - _GPT_MIXERS)
    if not other:
        return None
    return (f"megatron-core 0.16.1's GPT model has no {', '.join(other)} blocks, and its hybrid MambaStack splits "
            "layers evenly, ignoring --pipeline-model-parallel-layout; deploy this model with --target executor or "
            "torchtitan")


def megatron_model_args(arch: Architecture) -> list[tuple[str, object | None]]:
    """Megatron-LM's model flags for ``arch`` (``--num-layers`` and ``--mtp-num-layers`` come with
    the layout): sizes, heads and key/value groups, vocabulary, rope, RMSNorm, SwiGLU, untied
    output, QK-norm, MoE experts / top-k / shared experts / layer frequency, MLA. Not in the architecture,
    so not written: ``--rotary-base``, ``--norm-epsilon``, the router's settings and the tokenizer.
    Raises ConfigError (field ``model_flags``) for a model these flags cannot describe (Gemma:
    GeLU-gated MLP, sandwich norms, local/global attention), and (field ``model``, via
    :func:`megatron_layout_reason`) for one whose layout Megatron cannot take."""
    reason = megatron_layout_reason(arch)
    if reason:
        raise ConfigError(reason, source=arch.name, field="model")
    if arch.model_type.startswith("gemma"):
        raise ConfigError("Megatron-LM's GPT flags cannot describe Gemma (GeLU-gated MLP, sandwich norms, local/global "
                          "attention); give the model with Megatron-Bridge's Gemma 3 provider and these parallel flags",
                          source=arch.name, field="model_flags")
    blocks = [spec for spec in arch.layers if spec.kind == "block"]
    args: list[tuple[str, object | None]] = [("--hidden-size", arch.hidden_size),
                                             ("--num-attention-heads", arch.num_attention_heads)]
    mla = any(spec.mixer == "mla" for spec in blocks)
    if mla:
        args += [("--multi-latent-attention", None), ("--kv-lora-rank", arch.kv_lora_rank),
                 ("--qk-head-dim", arch.qk_nope_head_dim), ("--qk-pos-emb-head-dim", arch.qk_rope_head_dim),
                 ("--v-head-dim", arch.v_head_dim)]
        if arch.q_lora_rank:
            args.append(("--q-lora-rank", arch.q_lora_rank))
    else:
        args.append(("--kv-channels", arch.attn_head_dim))
        if arch.num_key_value_heads != arch.num_attention_heads:
            args += [("--group-query-attention", None), ("--num-query-groups", arch.num_key_value_heads)]
    if mla or arch.model_type.startswith("qwen3"):  # Qwen3's QK-norm; MLA's norms on the q and kv latents
        args.append(("--qk-layernorm", None))
    if arch.intermediate_size:
        args.append(("--ffn-hidden-size", arch.intermediate_size))
    if arch.num_experts:
        args += [("--num-experts", arch.num_experts), ("--moe-router-topk", arch.num_experts_per_tok),
                 ("--moe-ffn-hidden-size", arch.moe_intermediate_size), ("--moe-grouped-gemm", None),
                 ("--moe-layer-freq", _moe_layer_freq(arch))]
        if arch.num_shared_experts:
            size = arch.shared_expert_intermediate_size or arch.moe_intermediate_size
            args.append(("--moe-shared-expert-intermediate-size", arch.num_shared_experts * size))
    args += [("--vocab-size", arch.vocab_size), ("--max-position-embeddings", arch.max_position_embeddings),
             ("--position-embedding-type", "rope"), ("--normalization", "RMSNorm"), ("--disable-bias-linear", None)]
    if arch.gated_mlp:
        args.append(("--swiglu", None))
    if not arch.tie_word_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    return args


def _flags(args: list[tuple[str, object | None]]) -> str:
    """One ``--flag [value]`` per line; a multi-word value (``--recompute-modules a b``) stays words."""
    out = []
    for flag, value in args:
        if value is None:
            out.append(f"{flag}\n")
        else:
            words = str(value).split(" ") if flag == "--recompute-modules" else [str(value)]
            out.append(f"{flag} {' '.join(shlex.quote(w) for w in words)}\n")
    return "".join(out)


def megatron_job_args(plan: Plan, profile: ModelProfile, par: Parallelism, *, seq_len: int,
                      arch: Architecture | None = None) -> str:
    """Megatron-LM's arguments for the whole job, one ``--flag [value]`` per line (see the module
    docstring); with ``arch``, the model's own flags too (:func:`megatron_model_args`)."""
    if par.pp != plan.devices:
        raise ConfigError(f"the plan has {plan.devices} devices, the job pp={par.pp}; give the plan of this job",
                          field="pp")
    if par.zero_stage == 2:
        raise ConfigError("Megatron-LM has no ZeRO-2: use the distributed optimizer (zero1) or FSDP (zero3)",
                          field="zero_stage")
    reason = megatron_layout_reason(arch) if arch is not None else None
    if reason:
        raise ConfigError(reason, source=arch.name if arch else None, field="model")
    model = megatron_model_args(arch) if arch is not None else []
    keep = [line for line in megatron_args(plan, profile).splitlines()
            if not line.startswith(("--global-batch-size ", "--seq-length "))]
    args: list[tuple[str, object | None]] = [
        ("--tensor-model-parallel-size", par.tp),
        ("--context-parallel-size", par.cp),
        ("--expert-model-parallel-size", par.ep),
        ("--global-batch-size", par.batch),
        ("--seq-length", seq_len),
    ]
    if par.tp > 1 and par.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if par.tp > 1 and par.tp_comm_overlap:
        args.append(("--tp-comm-overlap", None))
    if par.zero_stage == 1:
        args.append(("--use-distributed-optimizer", None))
    elif par.zero_stage == 3:
        args.append(("--use-torch-fsdp2", None))
    if par.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce", None))
    if par.overlap_param_gather and par.zero_stage == 1:
        args.append(("--overlap-param-gather", None))
    moe = any(layer.extra.get("expert") for layer in profile.layers)
    ac = job_ac_mode(plan, par)[0]
    args += _recompute_args(ac, moe=moe) + _deepseek_args(par, moe=moe, ac=ac,
                                                          interleaved=plan.num_stages > plan.devices)
    return "".join(line + "\n" for line in keep) + _flags(args + model)


def _deepseek_args(par: Parallelism, *, moe: bool, ac: str, interleaved: bool) -> list[tuple[str, object | None]]:
    """Megatron-LM's flags for the job's DeepSeek-V3 knobs (:class:`pipeline.parallelism.Parallelism`):
    FP8 as E4M3 with blockwise (1x128 / 128x128) scales, the all-to-all overlapped, and node-limited
    routing as group-limited routing over the EP group's nodes (8 GPUs a node). Megatron runs the
    overlap only with virtual pipeline stages (or no pipeline) and never under full recomputation:
    elsewhere the flag is left out, though the job model priced the overlap (a gap it does not close)."""
    out: list[tuple[str, object | None]] = []
    if moe and par.ep > 1:  # the job model prices expert parallelism as an all-to-all (Megatron's default: allgather)
        out.append(("--moe-token-dispatcher-type", "alltoall"))
    if par.fp8:
        out += [("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")]
    if moe and par.ep_overlap > 0 and ac != "full" and (interleaved or par.pp == 1):
        out.append(("--overlap-moe-expert-parallel-comm", None))
    if moe and par.moe_max_nodes > 0:
        out += [("--moe-router-num-groups", max(1, par.ep // 8)),
                ("--moe-router-group-topk", min(par.moe_max_nodes, max(1, par.ep // 8)))]
    return out


def _torchtitan_model_comment(arch: Architecture | None) -> str:
    if arch is None:
        return ""
    found = TORCHTITAN_MODELS.get(arch.name)
    if found is None:
        return (f"# torchtitan 0.3.0: no model of its own known for {arch.name} (job_targets.TORCHTITAN_MODELS);\n"
                "# the names are those of its Decoder (tok_embeddings, layers.{i}, norm, lm_head)\n")
    module, flavor = found
    return (f"# torchtitan 0.3.0 model: --module {module}, model_registry({flavor!r}) "
            "(tok_embeddings, layers.{i}, norm, lm_head)\n")


def torchtitan_job_fragment(plan: Plan, profile: ModelProfile, par: Parallelism, *, csv_path: str,
                            seq_len: int, arch: Architecture | None = None) -> str:
    """torchtitan's ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]`` for the whole job.

    torchtitan shards data parallelism with FSDP2 (``data_parallel_shard_degree``) or replicates it
    (DDP, ``data_parallel_replicate_degree``); it has no ZeRO-1/2, so ZeRO >= 1 becomes FSDP, which
    holds less than the model counts for ZeRO-1/2. ``[training]`` holds the global batch, the local
    batch (micro-batches x ``pipeline_parallel_microbatch_size``), the whole sequence (torchtitan
    splits it for CP itself) and, with a pipeline, ``disable_cuda_graphs = true`` (0.3.0's
    ``Trainer.Config`` refuses a pipeline otherwise). ``[activation_checkpoint] mode`` is one of
    :data:`TORCHTITAN_AC_MODES` (:func:`job_ac_mode`). With ``arch``: refused for a model that ties
    its embedding and head (0.3.0 has no weight tying under a pipeline), and a comment names
    torchtitan's own model for it (:data:`TORCHTITAN_MODELS`)."""
    if par.pp != plan.devices:
        raise ConfigError(f"the plan has {plan.devices} devices, the job pp={par.pp}; give the plan of this job",
                          field="pp")
    if arch is not None and arch.tie_word_embeddings and plan.devices > 1:
        raise ConfigError(f"{arch.name} ties its embedding and output weights; torchtitan 0.3.0 refuses weight "
                          "tying with pipeline parallelism ('Weight tying is not supported with Pipeline Parallel')",
                          source=arch.name, field="tie_word_embeddings")
    text = torchtitan_fragment(plan, profile, csv_path=csv_path)
    shard = par.dp if par.zero_stage >= 1 else 1
    replicate = 1 if par.zero_stage >= 1 else par.dp
    if par.ep > 1 and (shard * par.cp * par.tp) % par.ep:
        raise ConfigError(f"torchtitan carves expert parallelism out of data_parallel_shard_degree * cp * tp = "
                          f"{shard * par.cp * par.tp}, which ep={par.ep} does not divide; use FSDP (zero3) or an ep "
                          "that divides it", field="ep")
    degrees = (f"data_parallel_replicate_degree = {replicate}\n"
               f"data_parallel_shard_degree = {shard}\n"
               f"tensor_parallel_degree = {par.tp}\n"
               f"enable_sequence_parallel = {'true' if par.sequence_parallel and par.tp > 1 else 'false'}\n"
               f"context_parallel_degree = {par.cp}\n"
               f"expert_parallel_degree = {par.ep}\n")
    text = _torchtitan_model_comment(arch) + text
    text = text.replace("[parallelism]\n", "[parallelism]\n" + degrees, 1)
    text = re.sub(r"(?m)^seq_len = \d+$", f"seq_len = {seq_len}", text)
    batch = f"[training]\nglobal_batch_size = {par.batch}\n"
    text = text.replace("[training]\n", batch, 1)
    if plan.devices > 1:
        text += "disable_cuda_graphs = true\n"
    mode, note = job_ac_mode(plan, par)
    ac = ("\n[activation_checkpoint]\n"
          "# torchtitan 0.3.0: Trainer.Config.activation_checkpoint = None (none), SelectiveAC.Config()\n"
          "# (selective) or FullAC.Config() (full); on its command line the subcommand activation_checkpoint:<mode>\n")
    if mode == "selective":
        ac += ("# torchtitan's selective is per-op (saves matmul outputs, recomputes every second one), not the\n"
               "# layernorm/moe_act recomputation the plan was priced with\n")
    if note:
        ac += f"# {note}\n"
    return text + ac + f'mode = "{mode}"\n'
