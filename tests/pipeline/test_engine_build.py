"""Building the compiled engine, and what happens without it: a clear message and the Python engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import engine

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], *, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_missing_compiler_is_explained_and_not_fatal() -> None:
    proc = run(["-m", "pipeline._native.build", "--force"], CXX="/nonexistent/g++")
    assert proc.returncode == 0
    assert "no C++ compiler" in proc.stderr and "pure-Python engine" in proc.stderr
    strict = run(["-m", "pipeline._native.build", "--force", "--strict"], CXX="/nonexistent/g++")
    assert strict.returncode == 1


def test_the_build_is_up_to_date_after_make() -> None:
    if not engine.compiled():
        pytest.skip("the compiled engine is not built here")
    proc = run(["-m", "pipeline._native.build"])
    assert proc.returncode == 0 and "up to date" in proc.stdout


@pytest.fixture
def tree_without_engine(tmp_path: Path) -> Path:
    """A copy of the pipeline package without the compiled module."""
    shutil.copytree(ROOT / "pipeline", tmp_path / "pipeline",
                    ignore=shutil.ignore_patterns("_engine*.so", "__pycache__"))
    return tmp_path


SIMULATE = ("from pipeline import engine; from pipeline.schedules import build_plan; "
            "from pipeline.simulator import simulate; from pipeline.spec import Cluster, LayerCost, ModelProfile; "
            "p = ModelProfile('m', tuple(LayerCost(f'l{i}', 'attention+mlp', 1, 1, 1, 1, 1, 0) for i in range(8))); "
            "c = Cluster(devices=2); "
            "print(engine.ENGINE, simulate(build_plan('zb-h1', p, c, microbatches=4), p, c).iteration_time)")


def test_without_the_module_the_python_engine_runs(tree_without_engine: Path) -> None:
    proc = run(["-c", SIMULATE], cwd=tree_without_engine)
    assert proc.returncode == 0, proc.stderr
    name, time = proc.stdout.split()
    assert name == "python" and float(time) > 0


def test_asking_for_the_missing_native_engine_says_how_to_build_it(tree_without_engine: Path) -> None:
    proc = run(["-c", SIMULATE], cwd=tree_without_engine, ADAPTIS_ENGINE="native")
    assert proc.returncode != 0
    assert "make engine" in proc.stderr and "ADAPTIS_ENGINE=python" in proc.stderr


def test_a_bad_engine_name_is_refused() -> None:
    proc = run(["-c", "import pipeline.engine"], ADAPTIS_ENGINE="fortran")
    assert proc.returncode != 0 and "use auto, native or python" in proc.stderr


def test_the_python_engine_can_be_chosen_even_when_built() -> None:
    proc = run(["-c", SIMULATE], ADAPTIS_ENGINE="python")
    assert proc.returncode == 0 and proc.stdout.split()[0] == "python"


def test_another_build_runs_inside_compiled_build_and_the_own_one_after(tmp_path: Path) -> None:
    """engine_speed --against: a second build (here a copy of this one's library) runs in the block."""
    if not engine.compiled():
        pytest.skip("the compiled engine is not built here")
    from pipeline import _engine
    from pipeline.event_sim import StageCosts

    other = tmp_path / Path(_engine.__file__).name
    shutil.copy(_engine.__file__, other)
    costs = StageCosts((1.0, 2.0), (1.0, 1.5), (0.5, 0.5), (1.0, 1.0), (0.5, 0.5), (0.1, 0.0), (0.0, 0.0),
                       (1e9, 1e9))
    mine = engine.schedule_and_simulate(costs, (0, 1), 2, microbatches=4)
    calls: list[int] = []
    with engine.compiled_build(other) as module:
        assert module is not _engine and Path(module.__file__) == other
        real = module.schedule_and_simulate

        def counted(*args: object) -> object:
            calls.append(1)
            return real(*args)

        module.schedule_and_simulate = counted
        try:
            assert engine.schedule_and_simulate(costs, (0, 1), 2, microbatches=4) == mine
        finally:
            module.schedule_and_simulate = real
    assert calls == [1]
    engine.schedule_and_simulate(costs, (0, 1), 2, microbatches=4)
    assert calls == [1]  # this checkout's build again


def test_compiled_build_refuses_a_missing_library_and_the_one_in_use(tmp_path: Path) -> None:
    if not engine.compiled():
        pytest.skip("the compiled engine is not built here")
    from pipeline import _engine

    with pytest.raises(FileNotFoundError, match="make engine"), engine.compiled_build(tmp_path / "missing.so"):
        pass
    with pytest.raises(ValueError, match="in use"), engine.compiled_build(_engine.__file__):
        pass
