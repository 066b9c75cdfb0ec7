"""The docs never drift: every shell command in README.md and docs/*.md runs, and the command
pages in docs/commands/ are exactly what ``--help`` says.

Every fenced ```bash block of each page is split into commands (``\\`` continuations joined,
comments dropped) and run in order with ``bash`` in a scratch folder that links to the
repository's code (so outputs such as ``runs/`` stay out of the checkout), W&B offline there.
Long commands run with tiny budgets: :data:`SHRINK` rewrites flags (e.g. ``--budget N`` ->
``--budget 20``) and :data:`APPEND` adds flags to some commands. Commands that cannot run here
are skipped by :data:`SKIP`, each with its reason. A page's test fails when one command fails.
A command that another page already ran in this session, the same but for its ``--out`` folder
(README's and the tutorial's local ``run``), is not run twice: the earlier output folder is copied
to its ``--out`` (:func:`same_command`).
"""

from __future__ import annotations

import os
import re
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
    (r"-m experiments search\b.*--gpus\b", "--calls-per-config 30 --tune-top 2"),  # the job search's tuner
    (r"-m experiments run(?=\s|$)", "--steps 2 --warmup 1 --profile-repeats 2 --max-seconds 10 "
                                     "--calibration-plans 4 --candidates 2"),
    (r"-m (experiments replay|executor\.launch)(?=\s|$)", "--steps 2 --warmup 1"),
    (r"-m experiments profile(?=\s|$)", "--repeats 1 --warmup 0"),
    (r"-m experiments sweep(?=\s|$)", "--budget 20 --max-trials 4"),
    (r"-m experiments train(?=\s|$)", "--timesteps 64 --eval-every 0"),
    (r"-m experiments reproduce(?=\s|$)", "--families gemma --sizes small --seq-lens 2048 --budget 20"),
    (r"-m experiments\.benchmarks\.engine_speed(?=\s|$)", "--repeats 1 --no-tuner"),
    (r"-m experiments\.benchmarks\.search_speed(?=\s|$)", "--cases small --budgets 20"),
    (r"-m experiments\.benchmarks\.env_speed(?=\s|$)", "--seconds 1"),
    (r"-m experiments\.benchmarks\.lowering(?=\s|$)", "--rounds 1 --steps 2 --tuner-calls 20"),
    (r"-m experiments\.benchmarks\.mixed_speeds(?=\s|$)", "--scenarios 4"),
]
#: Commands that start a torchrun job (retried once: see the test).
DISTRIBUTED = r"torchrun|-m experiments (replay|profile|run)(?=\s|$)"
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


PAGES_WITH_COMMANDS = [p for p in PAGES if bash_commands(p.read_text())]


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
@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS, ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_COMMANDS])
def test_shell_commands_in_docs_run(page: Path, tmp_path: Path) -> None:
    commands = bash_commands(page.read_text())
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
        t0 = time.perf_counter()
        proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
        if proc.returncode != 0 and re.search(DISTRIBUTED, run):
            # A gloo job on a loaded 2-core machine occasionally loses a rank (SIGABRT); one retry, logged.
            log.append(f"RETRY after rc {proc.returncode}: {run}\n{proc.stdout[-1500:]}")
            proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)
        log.append(f"{time.perf_counter() - t0:5.1f} s  rc {proc.returncode}: {run}")
        if proc.returncode == 0 and same is not None:
            _RAN[same[0]] = cwd / same[1]
        assert proc.returncode == 0, (f"{page.name}: `{run}` (from `{command}`) failed with exit code "
                                      f"{proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n"
                                      f"{proc.stderr[-3000:]}\n--- log\n" + "\n".join(log))
    print("\n".join(log))
