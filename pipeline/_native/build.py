"""Build the compiled planning engine in place: ``python -m pipeline._native.build``.

Compiles ``engine.cpp`` with the machine's C++ compiler (``$CXX``, default ``g++``) against
pybind11's headers into ``pipeline/_engine<ext-suffix>``, next to the Python reference it mirrors.
Nothing is downloaded. Without a compiler (or pybind11) it explains what is missing and exits 0
unless ``--strict``: the toolkit then runs on the pure-Python engine (see docs/engine.md).
Rebuilds only when the source is newer than the library, unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "engine.cpp"
#: Every file the build reads (engine.cpp includes the headers beside it).
SOURCES = (SOURCE, HERE / "env_core.hpp", HERE / "env_table.hpp", HERE / "env_start.hpp")
#: -ffp-contract=off: no fused multiply-add, so every sum rounds exactly as in the Python reference.
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden", "-ffp-contract=off"]


def target_path() -> Path:
    """Where the built module goes: ``pipeline/_engine.cpython-311-x86_64-linux-gnu.so`` or alike."""
    return HERE.parent / f"_engine{sysconfig.get_config_var('EXT_SUFFIX')}"


def build(*, force: bool = False, verbose: bool = False) -> tuple[bool, str]:
    """Compile the engine; (built or up to date, message)."""
    target = target_path()
    if not force and target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in SOURCES):
        return True, f"compiled engine up to date: {target.name}"
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return False, (f"no C++ compiler ({cxx!r} not found): the pure-Python engine will be used (slower). "
                       "Install one (e.g. 'apt-get install g++') and run 'make engine' to build the compiled one.")
    try:
        import pybind11
    except ImportError:
        return False, ("pybind11 is not installed: the pure-Python engine will be used. "
                       "Run 'pip install -r requirements.txt' and 'make engine'.")
    includes = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    tmp = target.with_suffix(".tmp")
    cmd = [cxx, *FLAGS, *includes, str(SOURCE), "-o", str(tmp)]
    if verbose:
        print(shlex.join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return False, (f"compiling the engine failed (exit {proc.returncode}); the pure-Python engine will be "
                       f"used. Compiler output:\n{proc.stderr.strip()[-4000:]}")
    tmp.replace(target)
    return True, f"built the compiled engine: {target.relative_to(HERE.parent.parent)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the engine cannot be built")
    parser.add_argument("--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args(argv)
    ok, message = build(force=args.force, verbose=args.verbose)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    raise SystemExit(main())
