"""Shared fixtures: small profiles and clusters built in code, W&B off unless a test turns it on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# Under pytest -n each worker is one of as many processes as there are cores: torch's and BLAS's thread
# pools (a thread per core by default) would oversubscribe them, and their spinning threads then burn
# up to twice the CPU for the same work (test_imitation's policy fit on the busy 2-core machine: 14 s
# of CPU, 7 s with one thread). One thread per worker (a value set outside is kept); the commands
# the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported before this file: the variable is read at import
        sys.modules["torch"].set_num_threads(1)

from pipeline.spec import Cluster, LayerCost, ModelProfile  # noqa: E402


@contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Kill ``proc``'s process group on the way out if it still runs (``start_new_session=True``)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def sigint_default() -> None:
    """A ``preexec_fn`` for a child the test will Ctrl-C: SIGINT back to its default, so Python in
    the child raises KeyboardInterrupt even where the test runner itself was started with SIGINT
    ignored (a background job of a non-interactive shell, as some CI runners start it); a
    terminal's foreground job never is."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ended_by_ctrl_c(returncode: int | None) -> bool:
    """Exit code 130, or killed by SIGINT: a shell reports both as 130. When Ctrl-C lands inside
    ``import torch``, CPython 3.11 ends the process by SIGINT after a clean shutdown although the
    command caught the KeyboardInterrupt and returned 130 (seen in 2 of 12 interrupts 0.5 s in)."""
    return returncode in (130, -signal.SIGINT)


def exit_after(proc: subprocess.Popen, interrupt: Callable[[], None], *,
               timeout: float) -> tuple[str | None, str | None]:
    """Call ``interrupt`` (send a signal, kill a rank) and wait for ``proc`` to end: its stdout and
    stderr. ``timeout`` is the hang guard (``subprocess.TimeoutExpired`` fails the test); how fast it
    exits is for a benchmark to measure, not a test."""
    interrupt()
    return proc.communicate(timeout=timeout)


def uniform_profile(layers: int, *, f: float = 1.0, b: float = 1.0, w: float = 1.0, act: int = 1000,
                    params: int = 1000, out: int = 0) -> ModelProfile:
    return ModelProfile("uniform", tuple(LayerCost(f"l{i}", "attention+mlp", f, b, w, params, act, out)
                                         for i in range(layers)))


def ideal_cluster(devices: int, memory_gb: float = 1e9) -> Cluster:
    """Free communication and (by default) no memory limit."""
    return Cluster(devices=devices, memory_gb=memory_gb, p2p_gbps=1e12, latency_us=0.0)


@pytest.fixture
def hetero_profile() -> ModelProfile:
    return ModelProfile.load(ROOT / "experiments/configs/profiles/hetero-head-16.json")


@pytest.fixture
def h100x4() -> Cluster:
    return Cluster.load(ROOT / "experiments/configs/clusters/h100x4.json")


#: Node ids that take 1 s or more, measured (tests/slow_tests.txt): marked slow, so `make test-fast`
#: leaves them out and `make test` runs them.
SLOW_TESTS_FILE = Path(__file__).with_name("slow_tests.txt")


def measured_slow_tests() -> set[str]:
    """The node ids listed in :data:`SLOW_TESTS_FILE` (comments after ``#`` dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_TESTS_FILE.read_text().splitlines())
    return {line for line in lines if line}


def measured_seconds() -> dict[str, float]:
    """Node id -> seconds, for the lines of :data:`SLOW_TESTS_FILE` whose comment gives them (``# 1.6 s``)."""
    out = {}
    for line in SLOW_TESTS_FILE.read_text().splitlines():
        node, _, comment = line.partition("#")
        found = re.match(r"\s*([\d.]+)\s*s\b", comment)
        if node.strip() and found:
            out[node.strip()] = float(found.group(1))
    return out


#: Seconds assumed for a test marked slow that neither :data:`SLOW_TESTS_FILE` nor a ``cost`` mark sizes
#: (a torchrun job, a training run: most take 5-30 s).
SLOW_DEFAULT_S = 10.0


def expected_seconds(item: pytest.Item, measured: dict[str, float]) -> float:
    """What ``item`` is expected to take: its ``cost`` mark, its :func:`measured_seconds`, else
    :data:`SLOW_DEFAULT_S` when it is marked slow, else 0."""
    mark = item.get_closest_marker("cost")
    if mark is not None:
        return float(mark.args[0])
    if item.nodeid in measured:
        return measured[item.nodeid]
    return SLOW_DEFAULT_S if item.get_closest_marker("slow") else 0.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cost(seconds): the test's expected seconds on 2 cores; under pytest -n "
                                       "the costliest tests start first")
    # Under `pytest -n` (xdist's load scheduling) hand tests out two at a time, not in chunks of an eighth
    # of the suite: the costliest come first (pytest_collection_modifyitems), and a worker that finishes
    # early takes the next one instead of waiting while the other works through a queue of slow tests.
    if getattr(config.option, "dist", "no") == "load" and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = measured_slow_tests()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of pytest -n: the costliest first (a stable sort)
        measured = measured_seconds()
        items.sort(key=lambda item: -expected_seconds(item, measured))
