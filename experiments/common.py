"""Arguments shared by the commands: which model, which cluster, how to print."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, ProfileError
from pipeline.runtime import RUNTIMES
from pipeline.spec import DEFAULT_MEMORY_RESERVE_GB, GIB, Cluster, ModelProfile, ProfileWarning, TrainingConfig

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_MODEL",
    "add_model_args",
    "add_granularity_args",
    "add_cluster_args",
    "add_output_args",
    "add_strict_arg",
    "strict_profiles",
    "resolve_profile",
    "resolve_cluster",
    "check_devices",
    "check_microbatches",
    "MAX_MICROBATCH_DEVICES",
    "interrupt_code",
    "interrupted",
    "memory_advice",
    "resolve_scenario",
    "output_folder",
    "positive_int",
    "positive_float",
    "non_negative_int",
    "seed_int",
    "non_negative_float",
    "share",
    "print_table",
    "print_json_lines",
    "digest",
    "prediction_meta",
]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
#: The heterogeneous model that commands use when no model is named.
DEFAULT_MODEL = "gemma-medium"
#: Used while the zoo is not installed or has no DEFAULT_MODEL.
FALLBACK_PROFILE = CONFIG_DIR / "profiles" / "hetero-head-16.json"


def _whole_number_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _whole_number_at_least(text, 0)


def seed_int(text: str, *, most: int = 2**32 - 1) -> int:
    """A random seed: a whole number from 0 to ``most`` (NumPy's and Gymnasium's seeds cannot be negative)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {most}, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def share(text: str) -> float:
    """A share: a number from 0 to 1."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a share from 0 to 1, got {text!r}")
    return value


def check_file_path(path: str | Path | None, field: str) -> None:
    """Refuse, before any work, an output file path that cannot be written: an existing folder, or
    one inside a file (the command would otherwise fail only at its end, losing its results)."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{str(target)!r} is a folder; name a file (e.g. {str(target / 'trace.json')!r})",
                          field=field)
    for part in target.parents:
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"{str(target)!r} is inside {str(part)!r}, which is a file; name a file in a folder",
                                  field=field)
            break


#: The file that marks an output folder as one command's: ``{"command": NAME, "pid": PID}``.
OUT_MARK = ".adaptis-out.json"


def output_folder(path: str | Path, *, field: str = "--out", command: str | None = None,
                  inputs: object = None) -> Path:
    """``path`` as an output folder, created if missing; refused in one line when it, or a folder
    above it, is an existing file.

    With ``command``, the folder is that command's (:func:`claim_folder`): a previous run of the
    same command there is replaced whole (except the files ``inputs``, the command's arguments,
    name), a run still writing there refuses this one."""
    folder = Path(path)
    for part in (folder, *folder.parents):
        if part.exists() and not part.is_dir():
            what = "is a file" if part == folder else f"is inside {str(part)!r}, which is a file"
            raise ConfigError(f"{str(folder)!r} {what}, not a folder; name a new or existing folder for {field}",
                              field=field)
        if part.exists():
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {str(folder)!r}: {exc.strerror}; name a folder you may write for {field}",
                          field=field) from None
    if command is not None:
        claim_folder(folder, command, field=field, keep=_named_paths(inputs))
    return folder


def _named_paths(args: object) -> set[Path]:
    """The existing files and folders that the string values of ``args`` (a Namespace or dataclass) name."""
    import dataclasses

    values = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else vars(args) if args is not None else {}
    out = set()
    for v in values.values():
        if isinstance(v, str) and v and Path(v).exists():
            out.add(Path(v).resolve())
    return out


def claim_folder(folder: Path, command: str, *, field: str = "--out", keep: set[Path] | None = None) -> None:
    """Make ``folder`` this run's output of ``command``, so no file of an earlier run is taken for this one's.

    * empty: marked (:data:`OUT_MARK`) as this command's;
    * marked by a run of ``command`` that is over: its files are removed, then marked again;
    * marked by a run still alive (another process): refused in one line (one folder, one writer);
    * anything else (a folder of your own, another command's output): left as it is, not marked,
      so nothing there is ever removed.

    Entries that are, or hold, a path in ``keep`` (the run's inputs) are never removed.
    """
    import os
    import shutil

    mark = folder / OUT_MARK
    try:
        previous = json.loads(mark.read_text())
    except (OSError, ValueError):
        previous = None
    if isinstance(previous, dict):
        pid = previous.get("pid")
        if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
            raise ConfigError(f"{str(folder)!r} is being written by a running {previous.get('command')} (pid {pid}); "
                              f"wait for it to end or name another folder for {field}", field=field)
        if previous.get("command") != command:
            return
        keep = keep or set()
        for entry in folder.iterdir():
            full = entry.resolve()
            if entry.name != OUT_MARK and not any(k == full or full in k.parents for k in keep):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    elif any(folder.iterdir()):
        return
    mark.write_text(json.dumps({"command": command, "pid": os.getpid()}) + "\n")


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--model NAME | --hf-config FILE | --profile FILE`` plus sequence length and micro-batch size."""
    group = parser.add_argument_group("model (one of)")
    ex = group.add_mutually_exclusive_group()
    ex.add_argument("--model", metavar="NAME",
                    help=f"a model of the zoo (experiments/configs/models/; default {DEFAULT_MODEL})")
    ex.add_argument("--hf-config", metavar="FILE", help="a Hugging Face config.json on disk")
    ex.add_argument("--profile", metavar="FILE", help="a profile JSON with per-layer costs")
    group.add_argument("--seq-len", type=positive_int, default=None,
                       help="sequence length (default: the model's, or 4096)")
    group.add_argument("--microbatch-size", type=positive_int, default=1, help="sequences per micro-batch")
    add_granularity_args(group)
    add_strict_arg(group)


def add_strict_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--strict``, for every command that reads a profile (``--profile``): :func:`strict_profiles`."""
    parser.add_argument("--strict", action="store_true",
                        help="an unknown field in a profile layer (a typo such as b_ful) is an error naming it, "
                             "not a warning")


@contextmanager
def strict_profiles(strict: bool) -> Iterator[None]:
    """Under ``strict``, a profile with unknown per-layer fields (:class:`pipeline.spec.ProfileWarning`)
    is refused: one :class:`ProfileError` naming the field and the closest known field. Without it the
    warning stands (``experiments.cli`` prints it as one ``warning:`` line)."""
    if not strict:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        try:
            yield
        except ProfileWarning as found:
            fields = found.fields or {"?": None}
            name, close = next(iter(fields.items()))
            hint = f"did you mean {close!r}? " if close else ""
            others = [k for k in fields if k != name]
            also = f" (also unknown: {', '.join(map(repr, others))})" if others else ""
            detail = str(found).split(": ", 1)[-1].removesuffix(": kept, but not used")
            raise ProfileError(f"unknown layer field{also}, refused under --strict: {hint}rename it or remove it, or "
                               f"drop --strict to keep it with a warning ({detail})", source=found.source,
                               field=name) from None


def add_granularity_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--granularity {layer,sublayer}`` and ``--head-shards K``: the units a model is cut into
    (see ``pipeline.arch.refine_architecture``)."""
    parser.add_argument("--granularity", choices=("layer", "sublayer"), default="layer",
                        help="plan units: whole layers, or each block cut between its mixer and its MLP/MoE")
    parser.add_argument("--head-shards", type=positive_int, default=1, metavar="K",
                        help="cut the LM head + loss into K units over the tokens (shared weights; default 1)")


def _check_units(args: argparse.Namespace) -> None:
    if getattr(args, "granularity", "layer") != "layer" or getattr(args, "head_shards", 1) != 1:
        raise ConfigError("a profile's units are fixed when it is written; give --model or --hf-config to cut "
                          "finer, or drop --granularity/--head-shards", field="--granularity")


def add_cluster_args(parser: argparse.ArgumentParser, *, default_devices: int = 4) -> None:
    """``--gpu/--devices/--gpus-per-node | --cluster FILE`` plus ``--memory-gb`` and ``--memory-reserve-gb``."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--cluster", metavar="FILE", help="a cluster JSON (overrides --gpu/--devices)")
    group.add_argument("--gpu", default="h100", help="GPU preset for analytic costs and the cluster")
    group.add_argument("--devices", type=positive_int, default=default_devices, help="pipeline devices")
    group.add_argument("--gpus-per-node", type=positive_int, default=8, help="devices per node")
    group.add_argument("--memory-gb", type=positive_float, default=None,
                       help="memory capacity per device in GiB, 2**30 bytes (default: the GPU's as nvidia-smi "
                            "reports it, e.g. 79.6 for an '80GB' H100, or the cluster file's)")
    group.add_argument("--memory-reserve-gb", type=non_negative_float, default=None,
                       help="GiB per device that plans may not use: CUDA context, NCCL buffers, allocator "
                            f"fragmentation (default: the cluster file's, else {DEFAULT_MEMORY_RESERVE_GB:g} "
                            "for a GPU preset)")


#: The runtime each deployment target runs a plan on (``--runtime``'s default for ``--target``).
TARGET_RUNTIMES = {"executor": "pytorch", "torchtitan": "pytorch", "megatron": "megatron"}


def add_runtime_arg(parser: argparse.ArgumentParser) -> None:
    """``--runtime NAME``: the runtime whose execution the prediction models (pipeline.runtime)."""
    parser.add_argument("--runtime", choices=tuple(RUNTIMES), default=None,
                        help="runtime model of the prediction: " + "; ".join(f"{r.name}: {r.description}"
                                                                          for r in RUNTIMES.values())
                        + " (default: the --target's runtime, pytorch for the executor; see docs/fidelity.md)")


def resolve_training(args: argparse.Namespace, *, target: str = "executor") -> TrainingConfig:
    """The TrainingConfig of ``--runtime`` (:func:`add_runtime_arg`; default: the runtime of ``target``,
    which a command with ``--target`` passes, else ``pytorch``)."""
    return TrainingConfig(runtime=args.runtime or TARGET_RUNTIMES.get(target, "pytorch"))


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object per line instead of a table")
    parser.add_argument("--wandb-project", default="adaptis", help="W&B project (runs are offline by default)")


def resolve_profile(args: argparse.Namespace) -> ModelProfile:
    """The profile that ``--model/--hf-config/--profile`` name."""
    if getattr(args, "profile", None):
        _check_units(args)
        return ModelProfile.load(args.profile)
    units = {"granularity": getattr(args, "granularity", "layer"), "head_shards": getattr(args, "head_shards", 1)}
    seq_len = getattr(args, "seq_len", None)
    mbs = getattr(args, "microbatch_size", 1)
    gpu = getattr(args, "gpu", "h100")
    if getattr(args, "hf_config", None):
        from pipeline.costs import profile_from_architecture
        from pipeline.hf import load_hf_config

        arch = load_hf_config(args.hf_config, **units)
        return profile_from_architecture(arch, gpu=gpu, seq_len=seq_len or 4096, microbatch_size=mbs)
    name = getattr(args, "model", None)
    try:
        from pipeline import zoo
    except ImportError:
        zoo = None
    if zoo is None:
        if name:
            raise ConfigError("the model zoo is not installed; pass --profile FILE", field="--model")
        _check_units(args)
        return ModelProfile.load(FALLBACK_PROFILE)
    return zoo.zoo_profile(name or DEFAULT_MODEL, gpu=gpu, seq_len=seq_len, microbatch_size=mbs, **units)


def resolve_cluster(args: argparse.Namespace) -> Cluster:
    """The cluster that ``--cluster`` or ``--gpu/--devices`` name, with ``--memory-gb`` and
    ``--memory-reserve-gb`` applied."""
    if getattr(args, "cluster", None):
        cluster = Cluster.load(args.cluster)
    else:
        try:
            from pipeline.hardware import build_cluster
        except ImportError:
            cluster = Cluster(devices=args.devices, gpus_per_node=args.gpus_per_node, name=f"{args.devices}-dev")
        else:
            cluster = build_cluster(args.gpu, devices=args.devices, gpus_per_node=args.gpus_per_node)
    memory = getattr(args, "memory_gb", None)
    reserve = getattr(args, "memory_reserve_gb", None)
    if memory is not None or reserve is not None:
        bare = cluster.with_reserve(0.0)
        if memory is not None:
            bare = bare.with_memory(memory)
        cluster = bare.with_reserve(cluster.memory_reserve_gb if reserve is None else reserve)
    return cluster


def check_devices(devices: int, layers: int, *, model: str, cluster_file: str | None = None) -> None:
    """Refuse more pipeline devices than the model has layers, naming the field and the fix.

    Every stage holds at least one whole layer (the profile's units: the embedding and the head
    count as layers), so a plan cannot use more devices than there are layers. Without this
    check the search finds no plan at all and says so in terms of memory.
    """
    if devices <= layers:
        return
    why = (f"{devices} devices but {model} has only {layers} layers; every device needs a pipeline stage of at "
           f"least one whole layer (the embedding and the head count as layers)")
    if cluster_file:
        raise ConfigError(f"{why}: set devices to {layers} or fewer in this cluster file, or pick a deeper model",
                          source=cluster_file, field="devices")
    raise ConfigError(f"{why}: use --devices {layers} or fewer, or a deeper model", field="--devices")


#: The most micro-batches x pipeline devices a command simulates. Measured on `baselines` (every
#: named schedule, each result kept, gemma-small, 4-16 devices, 500-8,000 micro-batches): about
#: 16 KB of memory and 0.22 ms per micro-batch per device, so the limit is about 1 GiB and 15 s there
#: (100,000 micro-batches on 4 devices was 6 GiB and minutes without a line of output).
MAX_MICROBATCH_DEVICES = 65_536
#: Memory per micro-batch per device measured as above, quoted in the refusal.
KB_PER_MICROBATCH_DEVICE = 16


def check_microbatches(microbatches: int, devices: int, *, field: str = "--microbatches") -> None:
    """Refuse work that grows past :data:`MAX_MICROBATCH_DEVICES` before any of it starts, naming the field,
    the limit and the most micro-batches that fit on ``devices``."""
    if microbatches * devices <= MAX_MICROBATCH_DEVICES:
        return
    need_gib = microbatches * devices * KB_PER_MICROBATCH_DEVICE / 2**20
    most = max(1, MAX_MICROBATCH_DEVICES // devices)
    raise ConfigError(f"{microbatches} micro-batches on {devices} devices is {microbatches * devices:,} (micro-batch, "
                      f"device) steps to simulate, above the limit of {MAX_MICROBATCH_DEVICES:,} (measured: about "
                      f"{KB_PER_MICROBATCH_DEVICE} KB of memory each, ~{need_gib:.1f} GiB here); use {field} {most} "
                      f"or fewer on {devices} devices", field=field)


def interrupt_code(stop: BaseException) -> int:
    """The exit code of a command stopped by ``stop``: 130 for Ctrl-C (KeyboardInterrupt), 128+N for a
    signal N that :mod:`experiments.cli` turned into SystemExit (SIGTERM: 143); an
    :class:`agents.run_methods.Interrupted` by the stop it carries."""
    from agents.run_methods import Interrupted

    if isinstance(stop, Interrupted):
        stop = stop.stop
    if isinstance(stop, KeyboardInterrupt):
        return 130
    code = getattr(stop, "code", None)
    return code if isinstance(code, int) else 1


def interrupted(stop: BaseException, kept: str) -> int:
    """Print the one line an interrupted command ends with (``interrupted: <what was kept, where>``)
    and return its exit code (:func:`interrupt_code`)."""
    print(f"interrupted: {kept}", file=sys.stderr, flush=True)
    return interrupt_code(stop)


def memory_advice(cluster: Cluster, profile: ModelProfile | None = None,
                  training: TrainingConfig | None = None) -> str:
    """What ``search`` (and ``sweep``, for each trial) says after the peak of a plan that does not fit:
    ``against U GiB usable per device (M less a R GiB reserve): ADVICE``. The advice names the devices
    needed when the weights, gradients and optimizer state alone (spread evenly over the devices: what
    no schedule can shrink) exceed the usable memory (known with ``profile``; ``training`` defaults to
    :class:`TrainingConfig`'s); otherwise more devices or memory, or fewer micro-batches in flight."""
    usable = cluster.memory_gb - cluster.memory_reserve_gb
    advice = "add devices or memory, or use fewer micro-batches in flight"
    if profile is not None and usable > 0:
        param_bytes = (training or TrainingConfig()).param_bytes
        state = param_bytes * sum(x.params for x in profile.layers) / cluster.devices / GIB
        if state > usable:
            advice = (f"the weights and optimizer state alone need {state:.2f} GiB per device even spread over "
                      f"{cluster.devices}, so no schedule fits: use at least "
                      f"{math.ceil(state * cluster.devices / usable)} devices or more memory per device")
    return (f"against {usable:g} GiB usable per device ({cluster.memory_gb:g} less a "
            f"{cluster.memory_reserve_gb:g} GiB reserve): {advice}")


def resolve_scenario(args: argparse.Namespace) -> tuple[ModelProfile, Cluster]:
    """:func:`resolve_profile` and :func:`resolve_cluster`, checked together (:func:`check_devices`)."""
    profile = resolve_profile(args)
    cluster = resolve_cluster(args)
    check_devices(cluster.devices, profile.num_layers, model=profile.name, cluster_file=getattr(args, "cluster", None))
    return profile, cluster


def _fmt(value: Any) -> str:
    if value is None:  # a figure the row does not have (a skipped or failed method): a dash, not "None"
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, title: str | None = None) -> None:
    """Print rows as an aligned text table with the given columns."""
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))))


def print_json_lines(rows: Iterable[dict[str, Any]]) -> None:
    for row in rows:
        print(json.dumps(row), flush=True)


def digest(thing: ModelProfile | Cluster) -> str:
    """A short fingerprint of a profile's or cluster's content (its JSON), the same after a save and a load."""
    text = json.dumps(thing.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prediction_meta(iteration_time: float, *, profile: ModelProfile, cluster: Cluster, runtime: str,
                    profile_file: str | None = None) -> dict[str, Any]:
    """What a searched plan's ``meta["predicted"]`` records: the iteration time the search predicted and
    the profile and cluster it priced the plan with (name, file when known, :func:`digest`), so that
    ``replay`` can say when it predicts with other costs."""
    out: dict[str, Any] = {"iteration_time": iteration_time, "time_unit": profile.time_unit, "runtime": runtime,
                           "profile": profile.name, "profile_digest": digest(profile), "cluster": cluster.name,
                           "cluster_digest": digest(cluster)}
    if profile_file:
        out["profile_file"] = str(profile_file)
    return out
