"""Reading a published row: its throughput units, its schedule's name, what is wrong with it, its group.

:func:`row_problem` says in one line which field of a row is missing or contradictory (the
benchmark prints it instead of a prediction); :func:`schedule_kind` maps a published schedule name
to ours and the runtime that ships it; :func:`row_group` names the rows a planner would rank
against each other.
"""

from __future__ import annotations

import math
from typing import Any

from experiments.benchmarks.published_job import is_tflops_unit
from experiments.benchmarks.published_stages import gpu_preset_of
from pipeline.hardware import gpu_names

__all__ = ["SAMPLES_PER_GPU", "TOKENS_PER_GPU", "UNITS", "OTHER_SCHEDULES", "V_SCHEDULES", "schedule_kind",
           "row_problem", "row_group"]

SAMPLES_PER_GPU = "samples/s/GPU"
TOKENS_PER_GPU = "tokens/s/GPU"
#: Throughput units a row may carry (any unit naming TFLOP/s per GPU counts as the last one).
UNITS = (SAMPLES_PER_GPU, TOKENS_PER_GPU, "TFLOP/s per GPU")


def schedule_kind(name: str) -> tuple[str, str] | None:
    """(our schedule, runtime name) for a published schedule name, or None."""
    if name == "1F1B":
        return "1f1b", "megatron"
    if name == "1F1B-I":
        return "interleaved", "megatron"
    if name == "ZB-1p":
        return "zb-1p", "zb"
    if name == "ZB-2p":
        return "zb-2p", "zb"
    if name == "ZB-V":
        return "zbv", "zb"
    if name.startswith("ZB-2p") and "synchronization before optimizer" in name:
        return "zb-2p", "zb-sync"
    return OTHER_SCHEDULES.get(name.lower().replace("_", "-").replace(" ", "-"))


#: The other schedules we ship, by their published names, with the runtime that ships them: the
#: Zero Bubble fork runs ZB-H1/H2 and its V family (V-Half, V-Min and V-ZB of "Pipeline Parallelism
#: with Controllable Memory", arXiv 2405.15362, in the same repository); torch.distributed.pipelining
#: runs GPipe and DualPipeV (``ScheduleGPipe``, ``ScheduleDualPipeV``).
OTHER_SCHEDULES: dict[str, tuple[str, str]] = {
    "zb-h1": ("zb-h1", "zb"), "zb-h2": ("zb-h2", "zb"), "v-half": ("v-half", "zb"), "v-min": ("v-min", "zb"),
    "v-zb": ("zbv", "zb"), "gpipe": ("gpipe", "pytorch"), "dualpipev": ("dualpipev", "pytorch"),
    "dualpipe-v": ("dualpipev", "pytorch"), "interleaved-1f1b": ("interleaved", "megatron"),
    "interleaved": ("interleaved", "megatron"),
}
#: Our schedules that run two chunks per device in a V (the stage times split in two).
V_SCHEDULES = ("zbv", "v-half", "v-min", "dualpipev")


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a row cannot be read as it stands (one line naming the field and the fix), or None."""
    for key in ("model", "parallel", "batch", "measured"):
        if not isinstance(row.get(key), dict):
            return f"row field {key!r} is missing or not an object (see shared/data/published/README.md)"
    for key in ("training_flags", "profiled_inputs"):
        if row.get(key) is not None and not isinstance(row[key], dict):
            return f"row field {key!r} must be an object or null, got {row[key]!r}"
    for key in ("schedule", "gpu_type"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return f"row field {key!r} must be text or null, got {row[key]!r}"
    model = row["model"]
    for section, keys in (("model", ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len")),
                          ("batch", ("micro_batch_size", "num_microbatches", "global_batch", "local_batch")),
                          (None, ("gpus",))):
        where = row if section is None else row[section]
        for key in keys:
            value = where.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                name = key if section is None else f"{section}.{key}"
                return f"row field {name!r} must be a whole number >= 1 or null, got {value!r}"
    for key in ("throughput", "mfu", "peak_memory_gb"):
        value = row["measured"].get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            return f"row field 'measured.{key}' must be a positive number or null, got {value!r}"
    if not row.get("profiled_inputs"):
        for key in ("hidden", "heads"):
            if model.get(key) is None:
                return (f"row field 'model.{key}' is missing: the analytic model needs it; state it, or give the "
                        "profiled stage times ('profiled_inputs')")
    par = row["parallel"]
    for key in ("tp", "pp", "dp", "cp", "ep"):
        value = par.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"row field 'parallel.{key}' must be a whole number >= 1 or null, got {value!r}"
    degrees = [par.get(k) for k in ("tp", "pp", "dp")]
    gpus = row.get("gpus")
    if gpus is not None and all(isinstance(d, int) for d in degrees):
        product = math.prod(degrees) * int(par.get("cp") or 1)
        if product != gpus:
            return (f"row field 'parallel': tp*pp*dp*cp = {product} but 'gpus' = {gpus}; make the degrees "
                    "multiply to the GPUs")
    layers, pp, vpp = model.get("layers"), par.get("pp"), par.get("vpp")
    if isinstance(layers, int) and isinstance(pp, int):
        if pp > layers + 2:
            return (f"row field 'parallel.pp': {pp} pipeline stages but the model has {layers} layers (and an "
                    "embedding and a head); give pp at most layers + 2")
        if isinstance(vpp, int) and not isinstance(vpp, bool) and vpp * pp > layers + 2:
            return (f"row field 'parallel.vpp': {vpp} chunks on each of {pp} stages but the model has {layers} "
                    "layers; give pp x vpp at most layers + 2")
    for key, value in (row.get("profiled_inputs") or {}).items():
        if key in ("T_F", "T_B", "T_W", "T_comm") and (isinstance(value, bool) or not isinstance(value, int | float)
                                                         or value < 0 or (value == 0 and key != "T_comm")):
            return f"row field 'profiled_inputs.{key}' must be a positive number of milliseconds, got {value!r}"
    if row.get("gpu_type") and gpu_preset_of(row) is None:
        return (f"row field 'gpu_type': unknown GPU {row['gpu_type']!r}; name one of {', '.join(gpu_names())} "
                "in it")
    unit = row["measured"].get("throughput_unit")
    if row["measured"].get("throughput") is not None and unit not in UNITS[:2] and not is_tflops_unit(unit):
        return f"row field 'measured.throughput_unit': unknown unit {unit!r}; use one of {', '.join(UNITS)}"
    memory_unit = row["measured"].get("peak_memory_unit")
    if row["measured"].get("peak_memory_gb") is not None and memory_unit is not None and \
            str(memory_unit).lower() not in ("gb", "gib"):
        return (f"row field 'measured.peak_memory_unit': unknown unit {memory_unit!r}; use GB (1e9 bytes) or "
                "GiB (2**30 bytes), or leave it out for GB")
    return None


def row_group(row: dict[str, Any]) -> str:
    """Rows comparable to each other: the same model, pipeline and global batch (any schedule or
    micro-batch size); whole-job rows: the same model on the same GPUs (the choices a planner ranks
    for one job)."""
    def section(key: str) -> dict[str, Any]:
        value = row.get(key)
        return value if isinstance(value, dict) else {}

    batch, par, model = section("batch"), section("parallel"), section("model")
    if is_tflops_unit(section("measured").get("throughput_unit")) or row.get("gpus") != par.get("pp"):
        return f"{model.get('name')} on {row.get('gpus')} {row.get('gpu_type')}"
    B = batch.get("global_batch")
    whole = all(isinstance(batch.get(k), int) for k in ("micro_batch_size", "num_microbatches"))
    if B is None and whole and isinstance(par.get("dp") or 1, int):
        B = int(batch["micro_batch_size"]) * int(batch["num_microbatches"]) * int(par.get("dp") or 1)
    return f"{model.get('name')} p={par.get('pp')} B={B}"
