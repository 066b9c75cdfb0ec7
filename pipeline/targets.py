"""Deployment targets: what Megatron-LM and torchtitan can run, and a plan in their own terms.

Three runtimes run our plans:

* ``executor`` — this project's executor (``torch.distributed.pipelining``'s
  ``_PipelineScheduleRuntime`` over our CSV): any valid plan.
* ``torchtitan`` (0.3.0) — stages built from module names (``module_fqns_per_model_part``),
  placed loop-style (stage ``s`` on rank ``s % P``, any number of stages per rank) or V-style
  (rank ``r`` holds stages ``r`` and ``2P-1-r``; selected by a V schedule name), run by any CSV
  order (``pipeline_parallel_schedule_csv``). The model must be an embedding, blocks and a head
  (``tok_embeddings``, ``layers.{i}``, ``norm`` + ``lm_head``).
* ``megatron`` (megatron-core 0.16.1) — looped placement with ``v`` chunks per rank and its own
  order only: 1F1B for ``v = 1``, interleaved 1F1B for ``v > 1``; the layout may be uneven
  (``--pipeline-model-parallel-layout``). One embedding first (``E``), one loss/head last
  (``L``), decoder layers (``t``) and MTP layers (``m``) between; all MTP layers in one virtual
  stage of the last chunk.

:func:`target_reason` says why a target cannot run a plan (``None`` when it can);
:func:`megatron_layout` / :func:`megatron_args` and :func:`torchtitan_fragment` write the plan
for those runtimes. Pure functions over a :class:`~pipeline.plan.Plan` and a
:class:`~pipeline.spec.ModelProfile` (no torch, no third-party import).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from pipeline.errors import ConfigError
from pipeline.orders import interleaved_order, one_f_one_b_order
from pipeline.plan import Plan, interleaved_placement, v_placement
from pipeline.spec import ModelProfile

__all__ = [
    "TARGETS",
    "MEGATRON_CHARS",
    "looped_chunks",
    "is_v_placement",
    "placement_reason",
    "model_reason",
    "target_reason",
    "megatron_group_size",
    "megatron_stage_layers",
    "megatron_layout",
    "megatron_args",
    "torchtitan_fqns",
    "torchtitan_schedule_name",
    "torchtitan_fragment",
]

#: The runtimes a plan can be deployed to, most constrained last.
TARGETS = ("executor", "torchtitan", "megatron")
#: Megatron's layout letters for our layer kinds (any other kind but ``vision`` is a decoder layer ``t``).
MEGATRON_CHARS = {"embedding": "E", "head": "L", "mtp": "m"}


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}", field="--target")


def looped_chunks(placement: Sequence[int], devices: int) -> int | None:
    """``v`` when ``placement`` is the looped placement with ``v`` chunks per device, else None."""
    S = len(placement)
    if devices < 1 or S % devices or not S:
        return None
    v = S // devices
    return v if tuple(placement) == interleaved_placement(devices, v) else None


def is_v_placement(placement: Sequence[int], devices: int) -> bool:
    """Whether ``placement`` is the V placement (device ``d`` holds stages ``d`` and ``2P-1-d``)."""
    return devices > 1 and tuple(placement) == v_placement(devices)


def placement_reason(target: str, placement: Sequence[int], devices: int) -> str | None:
    """Why ``target`` cannot place stages this way; None when it can."""
    _check_target(target)
    if target == "executor":
        return None
    if looped_chunks(placement, devices) is not None:
        return None
    if target == "torchtitan":
        if is_v_placement(placement, devices):
            return None
        return (f"torchtitan places stages loop-style (stage s on rank s % {devices}) or V-style only; "
                f"this placement {list(placement)} is neither")
    return (f"Megatron places stages looped only (stage s on rank s % {devices}, v chunks per rank); "
            f"this placement {list(placement)} is not")


def model_reason(target: str, profile: ModelProfile) -> str | None:
    """Why ``target`` cannot express this model's layers; None when it can."""
    _check_target(target)
    if target == "executor":
        return None
    kinds = [x.kind for x in profile.layers]
    if "vision" in kinds:
        return f"{target}'s pipeline layout has no vision-encoder layers; this model has {kinds.count('vision')}"
    if not kinds or kinds[0] != "embedding" or kinds.count("embedding") != 1:
        return f"{target} needs exactly one embedding layer, first; this profile's layers start with {kinds[:2]}"
    if kinds[-1] != "head" or kinds.count("head") != 1:
        return f"{target} needs exactly one head (loss) layer, last; this profile's layers end with {kinds[-2:]}"
    if target == "torchtitan" and "mtp" in kinds:
        return ("torchtitan 0.3.0 runs MTP layers without pipeline parallelism only (its MTPDecoder refuses pp > 1); "
                "this model has them: drop them (torchtitan's default) or use --target megatron or executor")
    if target == "megatron" and "mtp" in kinds:
        first = kinds.index("mtp")
        if any(k != "mtp" for k in kinds[first:-1]):
            return "Megatron places decoder layers before every MTP layer; this model interleaves them"
    return None


def megatron_group_size(devices: int, microbatches: int) -> int:
    """Micro-batches per group of Megatron's interleaved order that :func:`interleaved_order` uses
    (``--microbatch-group-size-per-virtual-pipeline-stage``; Megatron's default is ``devices``)."""
    if microbatches % devices == 0:
        return devices
    return next((g for g in range(devices, microbatches + 1) if microbatches % g == 0), microbatches)


def _mtp_reason(plan: Plan, profile: ModelProfile) -> str | None:
    kinds = [x.kind for x in profile.layers]
    mtp = [i for i, k in enumerate(kinds) if k == "mtp"]
    if not mtp:
        return None
    holders = {s for s, (a, b) in enumerate(plan.partition) for i in mtp if a <= i < b}
    if len(holders) != 1:
        return ("Megatron needs every MTP layer in one virtual stage; this plan spreads them over stages "
                f"{sorted(holders)}")
    (s,) = holders
    if s < plan.num_stages - plan.devices:
        return f"Megatron keeps MTP layers in the last chunk of a rank; this plan has them in stage {s}"
    return None


def target_reason(target: str, plan: Plan, profile: ModelProfile) -> str | None:
    """Why ``target`` cannot run ``plan`` for this model, in one line; None when it can."""
    _check_target(target)
    if target == "executor":
        return None
    reason = model_reason(target, profile) or placement_reason(target, plan.placement, plan.devices)
    if reason or target == "torchtitan":
        return reason
    v = looped_chunks(plan.placement, plan.devices)
    assert v is not None
    P, M = plan.devices, plan.microbatches
    if v > 1 and M < P:
        return f"Megatron's interleaved 1F1B needs at least {P} micro-batches (one per rank); the plan has {M}"
    own = one_f_one_b_order(P, M) if v == 1 else interleaved_order(P, v, M)
    if tuple(plan.schedule) != own:
        name = "1F1B" if v == 1 else "interleaved 1F1B"
        return f"Megatron runs its own {name} order only; this plan's schedule differs"
    return _mtp_reason(plan, profile)


# ---------------------------------------------------------------- Megatron-LM


def megatron_stage_layers(plan: Plan, profile: ModelProfile) -> list[str]:
    """Layout letters of each stage, in stage order (= Megatron's virtual-rank-major listing)."""
    out = []
    for a, b in plan.partition:
        out.append("".join(MEGATRON_CHARS.get(x.kind, "t") for x in profile.layers[a:b]))
    return out


def _compress(stage: str) -> str:
    """``Etttt`` -> ``Et*4`` (Megatron unrolls ``x*N``)."""
    out, k = [], 0
    while k < len(stage):
        j = k
        while j < len(stage) and stage[j] == stage[k]:
            j += 1
        n = j - k
        out.append(stage[k] if n == 1 else f"{stage[k]}*{n}")
        k = j
    return "".join(out)


def megatron_layout(plan: Plan, profile: ModelProfile) -> str:
    """``--pipeline-model-parallel-layout`` of a looped plan: one ``|``-separated entry per stage,
    virtual rank 0 across all ranks, then virtual rank 1, ... (stage ``s`` of a looped placement
    is exactly Megatron's layout entry ``s``)."""
    reason = model_reason("megatron", profile) or placement_reason("megatron", plan.placement, plan.devices)
    if reason:
        raise ConfigError(reason, field="plan")
    return "|".join(_compress(s) for s in megatron_stage_layers(plan, profile))


def megatron_args(plan: Plan, profile: ModelProfile) -> str:
    """The Megatron-LM arguments that run ``plan``: one ``--flag value`` per line, values quoted
    for a shell (``xargs -a megatron_args.txt python pretrain_gpt.py ...`` or pasted into a launch
    script); raises ConfigError naming the reason when Megatron cannot run the plan.

    ``--global-batch-size`` is the plan's micro-batches times ``--micro-batch-size`` for
    data-parallel size 1: multiply it by yours."""
    reason = target_reason("megatron", plan, profile)
    if reason:
        raise ConfigError(reason, field="plan")
    kinds = [x.kind for x in profile.layers]
    decoder = sum(1 for k in kinds if MEGATRON_CHARS.get(k, "t") == "t")
    mtp = kinds.count("mtp")
    v = plan.num_stages // plan.devices
    P, M = plan.devices, plan.microbatches
    mbs = profile.microbatch_size
    args: list[tuple[str, object]] = [
        ("--pipeline-model-parallel-size", P),
        ("--pipeline-model-parallel-layout", megatron_layout(plan, profile)),
        ("--num-layers", decoder),
    ]
    if mtp:
        args.append(("--mtp-num-layers", mtp))
    args += [("--micro-batch-size", mbs), ("--global-batch-size", M * mbs), ("--seq-length", profile.seq_len)]
    g = megatron_group_size(P, M)
    if v > 1 and g != P:
        args.append(("--microbatch-group-size-per-virtual-pipeline-stage", g))
    return "".join(f"{flag} {shlex.quote(str(value))}\n" for flag, value in args)


# ---------------------------------------------------------------- torchtitan


def torchtitan_fqns(plan: Plan, profile: ModelProfile) -> list[list[str]]:
    """``module_fqns_per_model_part``: the module names of each stage in a torchtitan decoder
    (``tok_embeddings``, ``layers.{i}`` for the i-th block, ``norm`` and ``lm_head`` for the head)."""
    reason = model_reason("torchtitan", profile)
    if reason:
        raise ConfigError(reason, field="plan")
    names: list[list[str]] = []
    block = 0
    for layer in profile.layers:
        if layer.kind == "embedding":
            names.append(["tok_embeddings"])
        elif layer.kind == "head":
            names.append(["norm", "lm_head"])
        else:
            names.append([f"layers.{block}"])
            block += 1
    return [[n for i in range(a, b) for n in names[i]] for a, b in plan.partition]


def torchtitan_schedule_name(plan: Plan) -> str:
    """The ``pipeline_parallel_schedule`` whose placement style torchtitan uses for this plan:
    ``ZBVZeroBubble`` (V style) or ``Interleaved1F1B``/``1F1B`` (loop style). With a schedule
    CSV the order itself comes from the CSV; the name only picks the style."""
    if is_v_placement(plan.placement, plan.devices):
        return "ZBVZeroBubble"
    v = looped_chunks(plan.placement, plan.devices)
    if v is None:
        raise ConfigError(str(placement_reason("torchtitan", plan.placement, plan.devices)), field="plan")
    return "1F1B" if v == 1 else "Interleaved1F1B"


def torchtitan_fragment(plan: Plan, profile: ModelProfile, *, csv_path: str) -> str:
    """A TOML fragment with torchtitan's ``[parallelism]`` fields for ``plan`` (and the
    ``[training]`` batch that gives its micro-batch count); ``csv_path`` is the plan's CSV."""
    reason = target_reason("torchtitan", plan, profile)
    if reason:
        raise ConfigError(reason, field="plan")
    name = torchtitan_schedule_name(plan)
    style = "v" if name == "ZBVZeroBubble" else "loop"
    fqns = torchtitan_fqns(plan, profile)
    parts = ",\n".join("    " + json.dumps(stage) for stage in fqns)
    mbs = profile.microbatch_size
    return (
        f"# torchtitan [parallelism] for {profile.name}: {plan.num_stages} stages on {plan.devices} ranks,\n"
        f"# layout style {style} ({'rank r holds stages r and 2P-1-r' if style == 'v' else 'stage s on rank s % P'};\n"
        "# torchtitan derives the style from pipeline_parallel_schedule, the order comes from the CSV).\n"
        "[parallelism]\n"
        f"pipeline_parallel_degree = {plan.devices}\n"
        f"pipeline_parallel_schedule = {json.dumps(name)}\n"
        f"pipeline_parallel_schedule_csv = {json.dumps(csv_path)}\n"
        f"pipeline_parallel_microbatch_size = {mbs}\n"
        f"module_fqns_per_model_part = [\n{parts},\n]\n"
        "\n"
        f"[training]\n"
        f"# {plan.microbatches} micro-batches of {mbs} per data-parallel rank\n"
        f"local_batch_size = {plan.microbatches * mbs}\n"
        f"seq_len = {profile.seq_len}\n"
    )
