"""What one ``python -m experiments run`` depends on: :class:`WorkflowConfig`, which is also its command line.

Every field is one flag of ``run`` (experiments/commands/run.py builds them with
:mod:`experiments.dataclass_args`): the field's name is the flag's (``devices`` -> ``--devices``,
the few exceptions in that module's ``RENAME``), its default is the flag's default and the
docstring under it is the flag's help. A default of None is resolved here (:meth:`__post_init__`),
so a config built in Python and one parsed from the command line mean the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agents.base import DEFAULT_CALLS

__all__ = ["WorkflowConfig", "DEFAULT_METHODS", "LOCAL_MODEL"]

#: Methods searched unless told otherwise: the baseline, three named schedules, the tuner, the policy.
DEFAULT_METHODS = ("megatron", "1f1b", "zb-h1", "zbv", "adaptis", "rl")
#: The model built and run on this machine when none is named.
LOCAL_MODEL = "tiny-hybrid"


@dataclass
class WorkflowConfig:
    """Everything one workflow run depends on (logged as the config of every W&B run)."""

    model: str | None = None
    """Zoo model; on this machine the executor builds it with real layers (default ``tiny-hybrid``,
    unless ``hf_config``, or ``profile_path`` with a ``gpu``, stands for the model)."""
    hf_config: str | None = None
    """A Hugging Face config.json (analytic costs only: needs ``gpu``)."""
    profile_path: str | None = None
    """A profile JSON to use instead of profiling (or of the analytic costs)."""
    cluster_path: str | None = None
    """A cluster JSON (not this machine: no replay)."""
    gpu: str | None = None
    """GPU preset (h100, a100, ...): analytic costs, no replay (default: this machine, profiled and
    replayed here)."""
    devices: int = 2
    """Pipeline devices (local ranks on this machine)."""
    gpus_per_node: int = 8
    """Devices per node."""
    memory_gb: float | None = None
    """Memory capacity per device in GiB, 2**30 bytes (default: the GPU's; 64 on this machine)."""
    memory_reserve_gb: float | None = None
    """GiB per device plans may not use: CUDA context, NCCL, fragmentation (default: the GPU preset's
    or cluster file's; 0 on CPU ranks)."""
    seq_len: int | None = None
    """Tokens per sequence (default: the model's)."""
    microbatch_size: int = 1
    """Sequences per micro-batch."""
    scale: float = 1.0
    """Width scale of the locally built model, in (0, 1]."""
    granularity: Literal["layer", "sublayer"] = "layer"
    """Plan units: whole layers, or each block cut between its mixer and its MLP/MoE (``sublayer``)."""
    head_shards: int = 1
    """The LM head + loss cut into this many units over the tokens (shared weights)."""
    microbatches: int | None = None
    """Micro-batches per iteration (default 8 on this machine, 32 for a GPU cluster)."""
    methods: tuple[str, ...] = DEFAULT_METHODS
    """Methods to search, comma-separated (``megatron`` always is, as the baseline); ``rl`` is skipped
    with a note when no policy loads."""
    budget: str = str(DEFAULT_CALLS)
    """Per search method: simulator calls (e.g. 400) or seconds (e.g. 30s)."""
    max_seconds: float = 60.0
    """Cap on each method's search time, whatever the budget."""
    seed: int = 0
    """Seed of the searches, the calibration plans and the policy training."""
    perturb_moves: int | None = None
    """The tuner's perturbation strength (default: the tuner's)."""
    policy: str | None = None
    """RL policy file for ``rl`` (default: the shipped one)."""
    train_policy: int = 0
    """First train an RL policy this many steps and use it (0: no training)."""
    replay: bool = True
    """Replay the searched plans and Megatron's on this machine and measure them (off: search only)."""
    steps: int = 20
    """Timed steps per replayed plan (the median is kept; with --choose measured the even ones
    choose and the odd ones are reported: at 10, five a half, one plan's halves were 19% apart on
    this machine's 2 cores and the choice took the slower of two plans in 2 of 5 runs)."""
    choose: Literal["measured", "predicted"] = "measured"
    """How the plan is chosen when it is replayed here: measured (the fastest predicted plans, up to
    --candidates, are replayed with Megatron's and the one fastest on the even timed steps is kept;
    every time reported comes from the odd steps, which the choice never saw) or predicted (the
    fastest predicted plan, replayed with Megatron's)."""
    candidates: int = 4
    """With --choose measured: how many of the fastest predicted distinct plans to replay (>= 1)."""
    warmup: int = 2
    """Untimed steps before the timed ones."""
    profile_repeats: int = 5
    """Timed repeats per layer when profiling."""
    calibration_plans: int = 8
    """Random plans replayed on this machine to calibrate the profile before the search (0: none).
    Each operation's factor and per-layer time are fitted from them: 4 were too few on the replay
    sets of docs/fidelity.md, 6 and 8 ranked plans better than a factor alone."""
    contention: bool = True
    """Calibrate the compute contention between the local ranks too (they share this machine's
    cores and memory; docs/fidelity.md), so the search prices plans whose ranks compute together
    (off: one factor per operation and the overheads only)."""
    layer_factors: bool = False
    """Calibrate each layer's own factor too, from two more replayed plans with every layer a stage
    of its own (the profile times a layer after its neighbour in the model, which the pipeline does
    not; off by default: on quiet replays it priced the benchmark plans worse than the factors per
    operation with the contention; docs/fidelity.md)."""
    threads: int = 1
    """Torch threads per rank."""
    timeout: float = 900.0
    """Seconds for each torchrun job."""
    out: str | None = None
    """Output folder (default ``runs/run-<model>``)."""
    group: str | None = None
    """W&B group (default ``run-<model>-<time>``)."""
    project: str = "adaptis"
    """W&B project (runs are offline by default)."""
    target: Literal["executor", "torchtitan", "megatron"] = "executor"
    """Runtime the plan must run in: executor (any plan), torchtitan (loop or V placement, any CSV
    order), megatron (looped placement, Megatron's own 1F1B/interleaved order, uneven layout);
    experiments.deploy writes its files."""
    trace: str | None = None
    """Write the best plan's predicted (and measured) timelines here, in the Chrome trace format
    (Perfetto, chrome://tracing)."""

    def __post_init__(self) -> None:
        """Resolve the defaults that depend on other fields: the model and the output folder."""
        if not self.model:
            self.model = None if self.hf_config or (self.profile_path and self.gpu) else LOCAL_MODEL
        if not self.out:
            named = self.hf_config or (self.profile_path if not self.model else None)
            self.out = f"runs/run-{Path(named).stem if named else self.model or 'model'}"

    @property
    def local(self) -> bool:
        """The cluster is this machine (no GPU preset and no cluster file)."""
        return self.gpu is None and self.cluster_path is None

    @property
    def label(self) -> str:
        if self.model:
            return self.model
        src = self.hf_config or self.profile_path or "model"
        return Path(src).stem if Path(src).name != "config.json" else Path(src).parent.name or "model"
