"""A whole job's plan in Megatron-LM's and torchtitan's terms: every parallel degree, the batch, the overlaps.

:func:`megatron_job_args` extends :func:`pipeline.targets.megatron_args` (the pipeline: size,
layout, micro-batch group) with the job's TP, CP and EP sizes, sequence parallelism, the
distributed optimizer (ZeRO-1) or FSDP (ZeRO-3), the overlap flags, full recomputation, and the
whole job's global batch and sequence length. :func:`torchtitan_job_fragment` extends
:func:`pipeline.targets.torchtitan_fragment` with the ``[parallelism]`` degrees and the
``[training]`` batch. ``profile`` is the job's per-rank profile
(:func:`pipeline.parallelism.job_profile`), whose ``seq_len`` is a context-parallel rank's share.
"""

from __future__ import annotations

import re
import shlex

from pipeline.errors import ConfigError
from pipeline.parallelism import Parallelism
from pipeline.plan import Plan
from pipeline.spec import ModelProfile
from pipeline.targets import megatron_args, torchtitan_fragment

__all__ = ["megatron_job_args", "torchtitan_job_fragment"]


def megatron_job_args(plan: Plan, profile: ModelProfile, par: Parallelism, *, seq_len: int) -> str:
    """Megatron-LM's arguments for the whole job, one ``--flag [value]`` per line (see the module docstring)."""
    if par.pp != plan.devices:
        raise ConfigError(f"the plan has {plan.devices} devices, the job pp={par.pp}; give the plan of this job",
                          field="pp")
    if par.zero_stage == 2:
        raise ConfigError("Megatron-LM has no ZeRO-2: use the distributed optimizer (zero1) or FSDP (zero3)",
                          field="zero_stage")
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
    if par.recompute:
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    extra = "".join(f"{flag}\n" if value is None else f"{flag} {shlex.quote(str(value))}\n" for flag, value in args)
    return "".join(line + "\n" for line in keep) + extra


def torchtitan_job_fragment(plan: Plan, profile: ModelProfile, par: Parallelism, *, csv_path: str,
                            seq_len: int) -> str:
    """torchtitan's ``[parallelism]`` and ``[training]`` for the whole job. torchtitan shards data
    parallelism with FSDP2 (``data_parallel_shard_degree``) or replicates it (DDP,
    ``data_parallel_replicate_degree``); it has no ZeRO-1/2, so ZeRO >= 1 becomes FSDP, which holds
    less than the model counts for ZeRO-1/2."""
    if par.pp != plan.devices:
        raise ConfigError(f"the plan has {plan.devices} devices, the job pp={par.pp}; give the plan of this job",
                          field="pp")
    text = torchtitan_fragment(plan, profile, csv_path=csv_path)
    shard = par.dp if par.zero_stage >= 1 else 1
    replicate = 1 if par.zero_stage >= 1 else par.dp
    degrees = (f"data_parallel_replicate_degree = {replicate}\n"
               f"data_parallel_shard_degree = {shard}\n"
               f"tensor_parallel_degree = {par.tp}\n"
               f"enable_sequence_parallel = {'true' if par.sequence_parallel and par.tp > 1 else 'false'}\n"
               f"context_parallel_degree = {par.cp}\n"
               f"expert_parallel_degree = {par.ep}\n")
    text = text.replace("[parallelism]\n", "[parallelism]\n" + degrees, 1)
    text = re.sub(r"(?m)^seq_len = \d+$", f"seq_len = {seq_len}", text)
    return text.replace("[training]\n", f"[training]\nglobal_batch_size = {par.batch}\n", 1)
