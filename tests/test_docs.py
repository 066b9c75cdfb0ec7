"""The docs never drift: every shell command in README.md and docs/*.md runs, and the command
pages in docs/commands/ are exactly what ``--help`` says.

Every fenced ```bash block of each page is split into commands (``\\`` continuations joined,
comments dropped) and run in order with ``bash`` in a scratch folder that links to the
repository's code (so outputs such as ``runs/`` stay out of the checkout), W&B offline there.
Long commands run with tiny budgets: :data:`SHRINK` rewrites flags (e.g. ``--budget N`` ->
``--budget 20``) and :data:`APPEND` adds flags to some commands. Commands that cannot run here
are skipped by :data:`SKIP`, each with its reason. A page's commands that share no file they make
run as separate tests (:func:`command_groups`: ``whole-job.md#5``), so that ``pytest -n`` spreads
them over its workers; a test fails when one of its commands fails.
A command that another page already ran in this session, the same but for its ``--out`` folder
(README's and the tutorial's local ``run``), is not run twice: the earlier output folder is copied
to its ``--out`` (:func:`same_command`).
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: (pattern, reason): commands matching the pattern are not run.
SKIP: list[tuple[str, str]] = [
    (r"^make (run|test)\b", "installs into .venv and runs the whole job / test suite (CI runs `make test`)"),
    (r"^(pip|\S*/pip) install\b", "installs packages (no network in tests)"),
    (r"^wandb\b", "`wandb sync`/`login` upload to a W&B server (no network in tests)"),
    (r"^export WANDB_(API_KEY|BASE_URL)=", "credentials for a W&B server"),
    (r"^torchrun .*--backend nccl\b", "NCCL replay: needs GPUs"),
    (r"^torchrun --nnodes=", "multi-node launch: needs several machines"),
]
#: (regex, replacement) applied to every command: small budgets, so all pages run in ~3 minutes.
SHRINK: list[tuple[str, str]] = [
    (r"--budget \d+s?\b", "--budget 20"),
    (r"--budgets [\d,]+", "--budgets 20"),
    (r"--param budget=[\d,s]+", "--param budget=10,20"),
    (r"--steps \d+", "--steps 2"),
    (r"--timesteps \d+", "--timesteps 64"),
    (r"--repeats \d+", "--repeats 1"),
    (r"--seconds \d+", "--seconds 1"),
    (r"\[(--[a-z-]+)\]", r"\1"),  # optional flags written as [--check]: run them
    (r"\bDIR\b", "runs/docs-dir"),  # placeholder folder in docs/executor.md
]
#: (command regex, flags appended when the flag is not already there): small budgets.
APPEND: list[tuple[str, str]] = [
    (r"-m experiments (search|run)(?=\s|$)", "--budget 20"),
    # the job search: its tuner, and one micro-batch size (a third of the configurations: 35-60% less CPU)
    (r"-m experiments search\b.*--gpus\b", "--calls-per-config 30 --tune-top 2 --microbatch-sizes 1"),
    # (no calibration job: tests/experiments/workflow/test_run_workflow.py calibrates on 4 plans)
    (r"-m experiments run(?=\s|$)", "--steps 2 --warmup 1 --profile-repeats 1 --max-seconds 10 "
                                     "--calibration-plans 0 --candidates 1"),
    (r"-m (experiments replay|executor\.launch)(?=\s|$)", "--steps 2 --warmup 1"),
    (r"-m experiments replay(?=\s|$)", "--profile-repeats 1"),  # the job's own profile: ~1.5 s less a replay
    (r"-m experiments profile(?=\s|$)", "--repeats 1 --warmup 0"),
    (r"-m experiments sweep(?=\s|$)", "--budget 20 --max-trials 4"),
    (r"-m experiments train(?=\s|$)", "--timesteps 64 --eval-every 0"),
    (r"-m experiments reproduce(?=\s|$)", "--families gemma --sizes small --seq-lens 2048 --budget 20"),
    (r"-m experiments\.benchmarks\.engine_speed(?=\s|$)", "--repeats 1 --no-tuner"),
    (r"-m experiments\.benchmarks\.search_speed(?=\s|$)", "--cases small --budgets 20"),
    (r"-m experiments\.benchmarks\.env_speed(?=\s|$)", "--seconds 0.2"),
    (r"-m experiments\.benchmarks\.early_receives(?=\s|$)", "--rounds 1 --steps 2 --warmup 1 --tuner-calls 20 "
                                                              "--microbatches 4"),
    (r"-m experiments\.benchmarks\.mixed_speeds(?=\s|$)", "--scenarios 4"),
]
#: Commands that start a torchrun job (retried once: see the test).
DISTRIBUTED = r"torchrun|-m experiments (replay|profile|run)(?=\s|$)"
#: (command regex, about the CPU seconds it took shrunk on the 2-core machine; the first that matches):
#: what a group of commands is expected to take (:func:`expected_cost`), so that pytest -n starts the
#: costliest first (tests/conftest.py). A wrong figure only reorders the tests.
COST: list[tuple[str, float]] = [
    (r"-m experiments run(?=\s)(?!.*--(gpu|cluster)\b)", 45),  # local: profile, calibration and replay jobs
    (r"-m experiments\.benchmarks\.early_receives\b", 45),  # replays every benchmark plan twice
    (r"-m experiments replay\b", 25),
    (DISTRIBUTED, 15),
    (r"--gpus \d+", 15),  # the job search
    (r"-m experiments (train|evaluate-agent|gpu-check)\b|megatron_check", 8),
    (r"\bpython\b", 3),
    (r".", 0.1),
]
#: Seconds for one command, and for all commands of all pages together (a soft budget).
COMMAND_TIMEOUT = 240
#: Folders and files of the checkout that are not linked into the scratch folder.
NOT_LINKED = {".git", "runs", "docs", "wandb", "out", ".pytest_cache", ".ruff_cache", ".hypothesis"}


def bash_commands(text: str) -> list[str]:
    """The commands of every ```bash block: continuation lines joined, comments and blanks dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\s*\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def skip_reason(command: str) -> str | None:
    for pattern, reason in SKIP:
        if re.search(pattern, command):
            return reason
    return None


def shrink(command: str) -> str:
    """The command with tiny budgets (see :data:`SHRINK` and :data:`APPEND`)."""
    for pattern, repl in SHRINK:
        command = re.sub(pattern, repl, command)
    for pattern, flags in APPEND:
        if re.search(pattern, command):
            missing = [f for f in re.findall(r"--[a-z-]+ \S+|--[a-z-]+", flags) if f.split()[0] not in command]
            command = " ".join([command, *missing])
    return command


#: The commands that ran with an ``--out`` folder in this session: :func:`same_command` -> that folder.
_RAN: dict[str, Path] = {}


def same_command(command: str) -> tuple[str, str] | None:
    """(the command without its ``--out`` folder and with ``python`` for ``.venv/bin/python``, the
    folder), or None for a command without ``--out``: two commands with the same first part do the
    same work."""
    found = re.search(r"\s--out\s+(\S+)", command)
    if found is None:
        return None
    rest = command[:found.start()] + command[found.end():]
    return re.sub(r"(^|\s)\.venv/bin/python\b", r"\1python", rest), found.group(1)


#: Flags whose value is a file or folder the command writes.
OUTPUT_FLAGS = {"--out", "--cluster-out", "--trace", "--gantt", "--gantt-dir"}
#: Names of files that commands write, besides paths with a folder in them (``--out prof.json``).
FILE_NAME = re.compile(r"\.(json|jsonl|csv|txt|toml|png|pt|pth)$")
#: First path parts that name the checkout's own files (inputs, never made by a command).
CHECKOUT = {".venv", "..", *(e.name for e in ROOT.iterdir() if e.name not in NOT_LINKED)}


def made_paths(command: str) -> list[tuple[str, bool]]:
    """(key, whether it is an :data:`OUTPUT_FLAGS` value) of each path in ``command`` that a command
    makes: not the checkout's (:data:`CHECKOUT`); the key is its first part, or two under ``runs/``
    (``runs/deploy/plan.json`` -> ``runs/deploy``; ``prof.json`` -> ``prof.json``)."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    out = []
    for prev, token in zip(["", *tokens], tokens):
        flag, value = token.split("=", 1) if token.startswith("--") and "=" in token else (prev, token)
        if value.startswith("-") or not ("/" in value or FILE_NAME.search(value)):
            continue
        parts = Path(value).parts
        if parts and parts[0] not in CHECKOUT and "=" not in parts[0]:
            out.append(("/".join(parts[:2]) if parts[0] == "runs" else parts[0], flag in OUTPUT_FLAGS))
    return out


def command_groups(commands: list[str]) -> list[list[str]]:
    """``commands`` (a page's, in order) in groups that share no made file, each in page order, the
    groups in the order of their first command: one test each, so that a page's independent commands
    run side by side under ``pytest -n``. Two commands that name the same made path
    (:func:`made_paths`) share a group; a command that reads a made path no earlier command named
    (``ls runs/wandb``: written by another command without naming it) joins the command before it;
    a skipped command goes with the one before it (or the first that runs)."""
    parent = list(range(len(commands)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = sorted((root(i), root(j)))
        parent[b] = a

    first_namer: dict[str, int] = {}
    before: int | None = None
    for i, command in enumerate(commands):
        if skip_reason(command):
            if before is not None:
                join(before, i)
            continue
        for key, output in made_paths(shrink(command)):
            if key in first_namer:
                join(first_namer[key], i)
            elif not output and before is not None:
                join(before, i)
            first_namer.setdefault(key, i)
        if before is None:  # the skipped commands before the first that runs
            for j in range(i):
                join(i, j)
        before = i
    if before is None:  # nothing runs: one group
        return [commands] if commands else []
    groups: dict[int, list[str]] = {}
    for i, command in enumerate(commands):
        groups.setdefault(root(i), []).append(command)
    return list(groups.values())


def expected_cost(commands: list[str]) -> float:
    """Seconds ``commands`` are expected to take here (:data:`COST`; skipped ones take none)."""
    return sum(next(seconds for pattern, seconds in COST if re.search(pattern, shrink(c)))
               for c in commands if not skip_reason(c))


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far: a command's cost on a
    busy machine, where its wall time says more about the other processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _scratch(tmp: Path) -> Path:
    """A checkout of links in ``tmp/repo``, with ``shared/`` beside it as beside the real one."""
    repo = tmp / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (repo / entry.name).symlink_to(entry)
    (repo / "docs").mkdir()
    if (ROOT.parent / "shared").exists():
        (tmp / "shared").symlink_to(ROOT.parent / "shared")
    return repo


def test_shrink_and_skip_rules() -> None:
    assert shrink(".venv/bin/python -m experiments search --budget 400") == \
        ".venv/bin/python -m experiments search --budget 20"
    assert shrink("python -m experiments run --model tiny-hybrid").count("--budget 20") == 1
    assert "--check --json" in shrink("python -m experiments replay --plan DIR/plan.json [--check] [--json]")
    assert "runs/docs-dir/plan.json" in shrink("python -m experiments replay --plan DIR/plan.json")
    assert skip_reason("make run") and skip_reason("wandb sync runs/wandb/x") and not skip_reason("ls runs")
    assert bash_commands("```bash\na \\\n  b  # note\n# only a comment\nc\n```\n") == ["a b", "c"]
    assert same_command(".venv/bin/python -m experiments run --out runs/a --budget 20") == \
        same_command("python -m experiments run --out runs/b --budget 20")[:1] + ("runs/a",)
    assert same_command("python -m experiments run --budget 20") is None


def test_command_groups_keep_what_reads_a_made_file_with_what_makes_it() -> None:
    assert made_paths("python -m x --plan runs/a/plan.json --out=b.json --profile experiments/p.json") == \
        [("runs/a", False), ("b.json", True)]
    commands = ["make run", "python -m experiments search --out runs/a", "python -m experiments baselines",
                "python -m experiments profile --out prof.json", "python -m experiments replay --plan runs/a/plan.json",
                "wandb sync runs/wandb/x", "python -m experiments sweep", "ls runs/wandb",
                "python -m experiments simulate --profile prof.json"]
    assert command_groups(commands) == [
        ["make run", commands[1], commands[4], commands[5]], [commands[2]], [commands[3], commands[8]],
        [commands[6], commands[7]]]
    assert command_groups(["export A=1", "wandb sync runs/wandb/x"]) == [["export A=1", "wandb sync runs/wandb/x"]]


PAGES_WITH_COMMANDS = [p for p in PAGES if bash_commands(p.read_text())]
#: One test of :func:`test_shell_commands_in_docs_run` per :func:`command_groups` group of each page.
DOCS_RUNS = [pytest.param(page, group, id=str(page.relative_to(ROOT)) + (f"#{k}" if len(groups) > 1 else ""),
                          marks=pytest.mark.cost(expected_cost(group)))
             for page in PAGES_WITH_COMMANDS
             for groups in [command_groups(bash_commands(page.read_text()))]
             for k, group in enumerate(groups, 1)]


def test_command_pages_match_help() -> None:
    from experiments.gen_docs import stale_pages

    stale = stale_pages()
    assert not stale, f"docs/commands out of date: {stale}; run: .venv/bin/python -m experiments.gen_docs"


def test_every_page_links_exist() -> None:
    for page in PAGES + sorted((ROOT / "docs" / "commands").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("page", "commands"), DOCS_RUNS)
def test_shell_commands_in_docs_run(page: Path, commands: list[str], tmp_path: Path) -> None:
    cwd = _scratch(tmp_path)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT),
           "MPLBACKEND": "Agg"}
    env.pop("WANDB_DIR", None)
    # `python` in the docs is the project's interpreter (.venv's, or the one running the tests).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    log = []
    for command in commands:
        reason = skip_reason(command)
        if reason:
            log.append(f"SKIPPED ({reason}): {command}")
            continue
        run = shrink(command)
        same = same_command(run)
        if same is not None and same[0] in _RAN and _RAN[same[0]].is_dir():
            shutil.copytree(_RAN[same[0]], cwd / same[1], symlinks=True, dirs_exist_ok=True)
            log.append(f"REUSED {_RAN[same[0]]} (the same command ran on another page): {run}")
            continue
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
        if proc.returncode != 0 and re.search(DISTRIBUTED, run):
            # A gloo job on a loaded 2-core machine occasionally loses a rank (SIGABRT); one retry, logged.
            log.append(f"RETRY after rc {proc.returncode}: {run}\n{proc.stdout[-1500:]}")
            proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)
        cpu = _children_cpu() - cpu0
        log.append(f"{time.perf_counter() - t0:5.1f} s ({cpu:5.1f} s cpu)  rc {proc.returncode}: {run}")
        if proc.returncode == 0 and same is not None:
            _RAN[same[0]] = cwd / same[1]
        assert proc.returncode == 0, (f"{page.name}: `{run}` (from `{command}`) failed with exit code "
                                      f"{proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n"
                                      f"{proc.stderr[-3000:]}\n--- log\n" + "\n".join(log))
    print("\n".join(log))
