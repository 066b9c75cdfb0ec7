"""Shared fixtures: small profiles and clusters built in code, W&B off unless a test turns it on."""

from __future__ import annotations

import os
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = measured_slow_tests()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
