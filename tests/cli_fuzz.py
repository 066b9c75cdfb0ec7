"""CLI fuzz, a test tool (tests/experiments/test_cli_fuzz.py runs it): random command lines drawn
from every command's own flags, with random values and files.

Every command's flags are read from its argparse parser (``experiments.cli.build_parser``). Each
invocation takes a small base command line that keeps the work short (a tiny budget, a 16-layer
profile) and adds 0-3 random flags: values from pools by the flag's type (whole numbers, numbers,
choices, text), and files from a pool of real outputs of other commands (a plan.json of a tiny
``search``, a profile of ``profile-info --out``, a trace of ``simulate --trace``, a sweep's
trials.jsonl), a corrupt JSON, an empty file, a folder, a missing path and a path inside a file.

The property: exit 0, or exit != 0 with no ``Traceback`` on stderr, something said and at most
three ``error`` lines (argparse's usage block, warnings and progress lines aside); within
``--timeout`` seconds (never more than 60) and under ``--max-rss-gb`` of memory. Each invocation
runs in a forked child of one process that imported the commands once (so hundreds take a minute
or two), in its own scratch folder.

A share of the draws (:data:`SCALE_SHARE`) are scale and semantic cases instead (issue 47):
devices up to 4,096, head shards up to 10^5, an all-zero-cost profile, a config with a huge
vocabulary or key/value heads that do not divide the heads, a plan simulated for another model of
the same depth, and a flag another makes irrelevant (``--devices`` beside ``--gpus``).

Not drawn: ``replay`` (its torchrun job), ``profile --cluster-out`` (a torchrun link test) and
``profile --calibrate`` (torchrun replays);
``run`` always gets ``--gpu`` (no local torchrun profiling); ``train``'s and the searches' sizes
come from small pools.

  python -m tests.cli_fuzz [--count 1000] [--seed 0] [--timeout 60] [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = str(ROOT / "experiments/configs/clusters/h100x4.json")
#: Most lines an error may take (argparse's usage block and ``warning:`` lines aside).
MAX_ERROR_LINES = 3
#: Tracebacks found by this fuzz whose cause lies outside experiments/ (left to the owners of that code):
#: (text of the traceback's last line, where it is raised). Counted as ``known``, not as failures.
#: None now: the binary --plan/--profile/--cluster files it found are one line each (pipeline/plan.py, spec.py).
KNOWN: tuple[tuple[str, str], ...] = ()
#: Modules the commands import on first use, imported by the fuzz before it forks (as ``experiments.cli``
#: is): without them each child of ``profile`` or ``gpu-check`` spends seconds importing torch.
PRELOADED = ("torch", "executor.profiler", "experiments.gpu_check")
#: Commands never drawn: they start torchrun jobs.
SKIPPED = ("replay",)
#: Flags never drawn, per command ("*": every command).
NOT_DRAWN = {"*": ("-h", "--help"), "run": ("--gpu",), "profile": ("--cluster-out", "--calibrate", "--device")}

#: The base command line of each command: short work, so that the drawn flags decide what happens.
BASE = {
    # one layer kind at tiny widths, no plan: the flags are checked in under a second
    "gpu-check": ["--tiny", "--skip-plan", "--models", "hybrid"],
    "baselines": ["--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "4"],
    "evaluate-agent": ["--models", "tiny-hybrid", "--devices", "2", "--heldout", "0", "--methods", "adaptis",
                       "--budget", "5", "--max-seconds", "2"],
    "profile": ["--model", "tiny-hybrid", "--scale", "0.1", "--repeats", "1", "--warmup", "0"],
    "profile-info": ["--profile", PROFILE],
    "prove": ["--plan", "{plan}", "--profile", PROFILE, "--cluster", CLUSTER, "--seconds", "2"],
    "reproduce": ["--families", "gemma", "--sizes", "small", "--seq-lens", "1024", "--budget", "5", "--methods",
                  "megatron"],
    "run": ["--model", "gemma-small", "--gpu", "h100", "--devices", "4", "--method", "megatron,1f1b", "--budget", "5",
            "--max-seconds", "2"],
    "search": ["--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "4", "--method", "megatron,1f1b",
               "--budget", "5"],
    "simulate": ["--plan", "{plan}", "--profile", PROFILE, "--cluster", CLUSTER],
    "sweep": ["--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "4", "--budget", "5", "--param",
              "seed=0"],
    "train": ["--timesteps", "32", "--n-envs", "1", "--vec", "dummy", "--eval-every", "0", "--n-steps", "16",
              "--checkpoint-every", "32", "--no-progress"],
}
#: Share of the draws that are :func:`draw_scale` cases.
SCALE_SHARE = 0.15
#: Devices, head shards and vocabularies of the scale cases.
SCALE_DEVICES = ["33", "48", "130", "512", "4096"]
SCALE_SHARDS = ["256", "257", "4097", "100000"]
#: How often each command is drawn (train is the slowest per invocation).
WEIGHT = {"train": 0.3, "evaluate-agent": 0.6, "profile": 0.5}

INTS = ["0", "1", "2", "3", "8", "-1", "x", "1.5", "", "1e3", "100000", "99999999999"]
FLOATS = ["0", "-1", "0.5", "1", "80", "nan", "inf", "x", "1e-9", "1e9", ""]
#: Flags whose value sets how much work is done: small values only (a big one is a long run, not a mistake).
SIZES = {"timesteps", "imitation_states", "ranker_scenarios", "eval_scenarios", "heldout", "repeats", "steps",
         "warmup", "profile_repeats", "calibration_plans", "train_policy", "max_trials", "n_steps", "n_envs",
         "samples", "eval_every", "checkpoint_every", "imitation_epochs", "max_seconds", "timeout", "threads",
         "eval_tuner_calls", "max_calls", "max_steps", "repeat_scenario", "n_epochs", "batch_size", "torch_threads",
         "calibrate", "calibration_microbatches", "seconds", "workers", "max_actions"}
SMALL = ["0", "1", "2", "-1", "x", "0.5", ""]
TEXT = {
    "model": ["gemma-small", "tiny-hybrid", "nemotronh-small", "gemma-large", "nope", ""],
    "models": ["gemma-small", "tiny-hybrid", "heldout", "none", "nope", "tiny-hybrid,gemma-small", ","],
    "gpu": ["h100", "a100", "h200", "nope", ""],
    "method": ["megatron", "1f1b,zbv", "adaptis", "random", "rl", "rl-zero", "nope", ",", "adaptis@5",
               "megatron+layout", "zbv+dp", "all"],
    "budget": ["1", "5", "20", "0", "-5", "x", "1s", "0s", "infs", "nans", "0.5s", "", "1e3"],
    "param": ["seed=0,1", "budget=1,5", "perturb_moves=-3,x", "devices=100", "devices=2", "microbatches=0",
              "memory-gb=0.1", "memory-gb=30,80", "nope=1", "seed", "=", "rl_share=1.5", "method=megatron,nope",
              "microbatches=100000", "budget=0s"],
    "devices": ["2", "4", "8,16", "0", "x", "2,", "-4", "1000"],
    "families": ["gemma", "deepseek", "nope", ",", "gemma,nemotronh"],
    "sizes": ["small", "medium", "nope", ","],
    "seq_lens": ["1024", "x", "0", "-5", "1024,2048", ""],
    "head_shards": ["1", "auto", "0", "x", "4"],
    "rl_tuner_order": ["tuner-first", "x"],
    "eval_every": ["0", "-1", "x", "64"],  # 1 evaluates the policy on 6 scenarios at every step: slow, not wrong
}
TOKENS = ["x", "", "-1", "0", "all", "none", "a,b", ",,", "\u00e9t\u00e9", "' ;", "--", "1e9"]
#: Flags that name a file or folder the command reads or writes.
FILE_FLAGS = {"plan", "profile", "cluster", "hf_config", "policy", "ranker", "trace", "gantt", "out", "cluster_out",
              "train_dir", "gantt_dir"}


@dataclass
class Outcome:
    """One invocation: its command line, how it ended (``kind``), its exit code, seconds and stderr's tail."""

    argv: list[str]
    kind: str
    """ok | refused (exit != 0, a short clean message) | traceback | known (a :data:`KNOWN` traceback) | noisy |
    hang | oom | crash"""
    code: int | None
    seconds: float
    err: str = ""


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(o.kind for o in self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind not in ("ok", "refused", "known")]

    @property
    def known(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == "known"]


def command_flags() -> dict[str, list[argparse.Action]]:
    """Every command's optional flags, from its own argparse parser."""
    from experiments.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [a for a in p._actions if a.option_strings] for name, p in sub.choices.items()}


def make_files(folder: Path) -> dict[str, list[str]]:
    """Inputs (real outputs of other commands, and broken ones) and output paths to draw from."""
    from experiments.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "disabled")
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        main(["search", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "4", "--method",
              "megatron,zbv", "--budget", "5", "--out", str(folder / "search")])
        main(["profile-info", "--model", "gemma-small", "--out", str(folder / "gemma-small.json")])
        main(["simulate", "--plan", str(folder / "search" / "plan.json"), "--profile", PROFILE, "--cluster", CLUSTER,
              "--trace", str(folder / "trace.json")])
        main(["sweep", "--profile", PROFILE, "--cluster", CLUSTER, "--microbatches", "4", "--budget", "5",
              "--param", "seed=0", "--out", str(folder / "sweep")])
    (folder / "corrupt.json").write_text('{"layers": [{"name": "a", "f": 1,')
    (folder / "empty.json").write_text("")
    (folder / "list.json").write_text("[1, 2, 3]")
    (folder / "binary.pth").write_bytes(bytes(range(256)) * 4)
    (folder / "a-folder").mkdir(exist_ok=True)
    taken = folder / "taken.txt"
    taken.write_text("a file")
    inputs = [str(p) for p in (folder / "search" / "plan.json", folder / "search" / "plan.csv",
                               folder / "search" / "results.jsonl", folder / "gemma-small.json",
                               folder / "trace.json", folder / "sweep" / "trials.jsonl",
                               folder / "sweep" / "best_plan.json", folder / "corrupt.json", folder / "empty.json",
                               folder / "list.json", folder / "binary.pth", folder / "a-folder",
                               folder / "missing.json", taken / "inside.json")] + [PROFILE, CLUSTER]
    zero = json.loads(Path(PROFILE).read_text())
    for layer in zero["layers"]:
        layer.update(f=0.0, b=0.0, w=0.0)
    (folder / "zero-cost.json").write_text(json.dumps(zero))
    llama = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
             "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000}
    (folder / "huge-vocab.json").write_text(json.dumps({**llama, "vocab_size": 10**12}))
    (folder / "odd-kv-heads.json").write_text(json.dumps({**llama, "num_key_value_heads": 3}))
    outputs = ["new-out", "new/deep/out.json", str(taken), str(taken / "inside"), str(folder / "a-folder"),
               "/proc/cannot-write-here", "out.png"]
    return {"inputs": inputs, "outputs": outputs, "plan": str(folder / "search" / "plan.json"),
            "zero": str(folder / "zero-cost.json"), "huge_vocab": str(folder / "huge-vocab.json"),
            "odd_kv": str(folder / "odd-kv-heads.json")}


def draw_scale(rng: random.Random, files: dict[str, list[str]]) -> list[str]:
    """One scale or semantic case (see the module docstring): a whole command line."""
    devices, shards = rng.choice(SCALE_DEVICES), rng.choice(SCALE_SHARDS)
    cases = [
        ["search", "--model", "gemma-large", "--devices", devices, "--method", "megatron,rl", "--budget", "3"],
        ["search", "--model", "gemma-large", "--devices", devices, "--method", "rl+tuner", "--budget", "3"],
        ["evaluate-agent", "--models", "gemma-large", "--devices", devices, "--heldout", "0", "--methods",
         "rl,rl-zero", "--budget", "3"],
        ["search", "--model", "gemma-small", "--devices", "4", "--head-shards", shards, "--budget", "3"],
        ["profile-info", "--model", "gemma-small", "--head-shards", shards],
        ["search", "--profile", files["zero"], "--devices", "4", "--budget", "3"],
        ["profile-info", "--hf-config", rng.choice([files["huge_vocab"], files["odd_kv"]])],
        ["simulate", "--plan", files["plan"], "--profile", files["inputs"][3], "--devices", "4"],
        ["search", "--model", "gemma-small", "--gpus", "8", "--global-batch", "64", "--devices", devices],
        ["search", "--model", "deepseek-large", "--gpus", rng.choice(["2", "8"]), "--global-batch", "64"],
        ["search", "--model", "gemma-small", "--devices", "4", "--method", rng.choice(["", ",", " "])],
    ]
    return rng.choice(cases)


def _key(action: argparse.Action) -> str:
    """The name the pools know a flag by: its dest, or the flag's own name when only that is known
    (a config field named apart from its flag: ``run --method`` sets ``WorkflowConfig.methods``)."""
    named = max(action.option_strings, key=len).lstrip("-").replace("-", "_")
    known = {*TEXT, *SIZES, *FILE_FLAGS}
    return named if action.dest not in known and named in known else action.dest


def _value(action: argparse.Action, rng: random.Random, files: dict[str, list[str]]) -> str | None:
    """A random value for ``action`` (None: a flag that takes none)."""
    if action.nargs == 0:
        return None
    dest = _key(action)
    if dest in FILE_FLAGS or (action.metavar and any(k in str(action.metavar) for k in ("FILE", ".json", "DIR",
                                                                                         "PNG"))):
        writes = dest in ("out", "trace", "gantt", "cluster_out", "gantt_dir")
        pool = files["outputs"] + files["inputs"][:3] if writes else files["inputs"]
        if dest == "out" and action.metavar == "P.json":  # profile-info/profile --out: a file
            pool = files["outputs"]
        return rng.choice(pool)
    if action.choices:
        return rng.choice([*map(str, action.choices), "bogus"])
    if dest in TEXT:
        return rng.choice(TEXT[dest])
    if dest in SIZES:
        return rng.choice(SMALL)
    if dest in TEXT:
        return rng.choice(TEXT[dest])
    kind = getattr(action.type, "__name__", "")
    if kind in ("int", "positive_int"):
        return rng.choice(INTS)
    if kind in ("float", "positive_float", "non_negative_float"):
        return rng.choice(FLOATS)
    return rng.choice(TOKENS + INTS[:4])


def draw(rng: random.Random, flags: dict[str, list[argparse.Action]], files: dict[str, list[str]]) -> list[str]:
    """One random command line: a command, its base arguments and 0-3 random flags after them."""
    names = [n for n in flags if n not in SKIPPED]
    command = rng.choices(names, weights=[WEIGHT.get(n, 1.0) for n in names])[0]
    skip = set(NOT_DRAWN["*"]) | set(NOT_DRAWN.get(command, ()))
    actions = [a for a in flags[command] if not skip & set(a.option_strings)]
    argv = [command, *(files["plan"] if a == "{plan}" else a for a in BASE.get(command, []))]
    for action in rng.sample(actions, k=min(len(actions), rng.randint(0, 3))):
        value = _value(action, rng, files)
        flag = rng.choice(action.option_strings)
        if value is None:
            argv.append(flag)
        elif value.startswith("-") and not _number(value):  # "--" alone would read as a flag
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, value]
    return argv


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _message_lines(err: str) -> list[str]:
    """The error lines of stderr (``error: ...``, argparse's ``PROG: error: ...``): not its usage block,
    ``warning:`` lines or the progress lines a command printed before it stopped."""
    return [line for line in err.splitlines() if line.startswith("error") or ": error: " in line]


def classify(code: int | None, err: str, *, killed: str | None) -> str:
    if killed:
        return killed
    if code == 0:
        return "ok"
    if "Traceback" in err:
        last = err.strip().splitlines()[-1]
        return "known" if any(last.startswith(text) for text, _ in KNOWN) else "traceback"
    if code is not None and code < 0:
        return "oom" if code == -signal.SIGKILL else "crash"
    lines = [line for line in err.splitlines() if line.strip()]
    if not lines or len(_message_lines(err)) > MAX_ERROR_LINES:
        return "noisy"  # a failure that says nothing, or says it many times
    return "refused"


def _child(argv: list[str], scratch: Path, out_path: Path, err_path: Path) -> None:
    """In the forked child: run the command line in ``scratch`` with stdout/stderr to files; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        os.chdir(scratch)
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # Under a test runner sys.stdout/sys.stderr are its capture objects, not fds 1 and 2.
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)  # noqa: SIM115
        sys.argv = ["experiments", *argv]
        from experiments.cli import main

        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _start(argv: list[str], scratch: Path) -> tuple[int, float]:
    """Fork a child that runs ``argv`` in ``scratch``: (its pid, its start time)."""
    scratch.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, scratch, scratch / ".stdout", scratch / ".stderr")
    return pid, start


def _poll(pid: int, start: float, *, timeout: float, max_rss: float) -> tuple[bool, int | None, str | None]:
    """(ended, wait status, why it was killed) of a child, killing it past ``timeout`` s or ``max_rss`` bytes."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        return True, status, None
    killed = "hang" if time.monotonic() - start > timeout else ("oom" if _rss_bytes(pid) > max_rss else None)
    if killed is None:
        return False, None, None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return True, status, killed


def _outcome(argv: list[str], scratch: Path, start: float, status: int | None, killed: str | None) -> Outcome:
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    err_path = scratch / ".stderr"
    err = err_path.read_text(errors="replace") if err_path.exists() else ""
    return Outcome(argv, classify(code, err, killed=killed), code, round(time.monotonic() - start, 2), err[-1500:])


def invoke(argv: list[str], scratch: Path, *, timeout: float, max_rss: float) -> Outcome:
    """Run one command line in a forked child: how it ended, within ``timeout`` s and ``max_rss`` bytes."""
    pid, start = _start(argv, scratch)
    while True:
        ended, status, killed = _poll(pid, start, timeout=timeout, max_rss=max_rss)
        if ended:
            return _outcome(argv, scratch, start, status, killed)
        time.sleep(0.02)


def fuzz(count: int, *, seed: int = 0, timeout: float = 60.0, max_rss_gb: float = 4.0,
         folder: Path | None = None, progress: bool = False, jobs: int = 1) -> Report:
    """``count`` random invocations, ``jobs`` at a time; each is an :class:`Outcome` of the :class:`Report`
    (in draw order: the draws depend on ``seed`` only, not on ``jobs``)."""
    timeout = min(timeout, 60.0)
    os.environ["WANDB_MODE"] = "disabled"
    os.environ.setdefault("WANDB_SILENT", "true")
    # The children run in scratch folders: processes they start (train's ranker pool) must find the packages.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    own = folder is None
    tmp = tempfile.TemporaryDirectory(prefix="cli-fuzz-") if own else None
    base = Path(tmp.name) if tmp else Path(folder)
    max_rss = max_rss_gb * 2**30
    try:
        files = make_files(base / "files")
        flags = command_flags()
        # what commands import lazily (torch, the profiler, the GPU check), imported once here so every
        # forked child starts with it, as the commands themselves are
        for module in PRELOADED:
            importlib.import_module(module)
        rng = random.Random(seed)
        draws = [draw_scale(rng, files) if rng.random() < SCALE_SHARE else draw(rng, flags, files)
                 for _ in range(count)]
        outcomes: dict[int, Outcome] = {}
        running: dict[int, tuple[int, float]] = {}
        pending = list(range(count))
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i = pending.pop(0)
                running[i] = _start(draws[i], base / f"run-{i}")
            for i, (pid, start) in list(running.items()):
                ended, status, killed = _poll(pid, start, timeout=timeout, max_rss=max_rss)
                if not ended:
                    continue
                del running[i]
                outcome = outcomes[i] = _outcome(draws[i], base / f"run-{i}", start, status, killed)
                if progress and outcome.kind not in ("ok", "refused", "known"):
                    print(f"[{i}] {outcome.kind} ({outcome.seconds} s): {_shell(draws[i])}\n{outcome.err[-600:]}",
                          file=sys.stderr, flush=True)
            time.sleep(0.02)
        report = Report()
        report.outcomes.extend(outcomes[i] for i in range(count))
        return report
    finally:
        if tmp is not None:
            tmp.cleanup()


def _shell(argv: Sequence[str]) -> str:
    import shlex

    return "python -m experiments " + " ".join(shlex.quote(a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="invocations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per invocation (at most 60)")
    parser.add_argument("--max-rss-gb", type=float, default=4.0, help="memory per invocation before it is killed")
    parser.add_argument("--json", action="store_true", help="print the figures and the failures as JSON")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="invocations at a time (default: one per core)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    start = time.monotonic()
    report = fuzz(args.count, seed=args.seed, timeout=args.timeout, max_rss_gb=args.max_rss_gb, progress=True,
                  jobs=args.jobs)
    counts = report.counts
    figures = {"invocations": len(report.outcomes), "tracebacks": counts["traceback"] + counts["known"],
               "known_tracebacks_outside_experiments": counts["known"], "hangs_past_60s": counts["hang"],
               "oom_kills": counts["oom"], "noisy_errors": counts["noisy"], "crashes": counts["crash"],
               "exit_0": counts["ok"], "refused_in_a_line": counts["refused"],
               "per_command": dict(Counter(o.argv[0] for o in report.outcomes)),
               "seconds_per_command": {c: round(sum(o.seconds for o in report.outcomes if o.argv[0] == c), 1)
                                       for c in sorted({o.argv[0] for o in report.outcomes})},
               "seconds": round(time.monotonic() - start, 1),
               "slowest_s": max((o.seconds for o in report.outcomes), default=0.0)}
    if args.json:
        print(json.dumps({**figures, "failures": [asdict(o) for o in report.failures]}))
    else:
        for key, value in figures.items():
            print(f"{key:>18}: {value}")
        for o in report.failures:
            print(f"\n{o.kind} ({o.seconds} s, exit {o.code}): {_shell(o.argv)}\n{o.err[-800:]}")
        for text, where in KNOWN:
            hits = [o for o in report.known if text in o.err]
            if hits:
                print(f"\nknown, outside experiments/ ({len(hits)}x): {where}; e.g. {_shell(hits[0].argv)}")
    return 0 if not report.failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
