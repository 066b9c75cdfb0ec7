"""The house rules of docs/architecture.md, read from the source: imports, module sizes, signatures.

* The import graph of the project's modules (every ``import``, at module level, inside
  functions and under ``TYPE_CHECKING``) has no cycle, and its arrows point down the layers of
  docs/architecture.md only: experiments -> agents -> env -> pipeline, executor -> pipeline. So
  pipeline imports nothing of ours, nothing but experiments imports experiments, executor imports
  neither agents nor env. The page's table of layers says the same as :data:`ALLOWED`.
* No module is over 600 lines unless its docstring has a line starting ``Over 600 lines:``.
* No two modules share a file name (``__init__.py`` aside), except a command module
  ``experiments/commands/X.py``, the command line of the ``X`` it runs.
* Public functions taking more than three parameters take the ones past the third by keyword.
* No module reads, sets or imports a private name (``_name``) of another module of ours, nor
  imports a private module from outside its package (:func:`private_reads`); the few known
  exceptions are listed with their reasons in :data:`PRIVATE_OK`, which may not go stale.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "env", "agents", "executor", "experiments")
#: Package -> the packages of ours it may import (docs/architecture.md, "Direction of imports").
ALLOWED = {
    "pipeline": {"pipeline"},
    "env": {"env", "pipeline"},
    "agents": {"agents", "env", "pipeline"},
    "executor": {"executor", "pipeline"},
    "experiments": set(PACKAGES),
}
MAX_LINES = 600
#: "path:qualified name" -> why it keeps more than three positional parameters.
POSITIONAL_OK = dict.fromkeys(
    ["executor/pipeline_executor.py:TimedStage.forward_one_chunk",
     "executor/pipeline_executor.py:TimedStage.backward_one_chunk"],
    "overrides torch's stage method; torch calls it positionally")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module that ``name`` (a module, or a name inside one) lives in; None if not ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(_resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                found.update(_resolve(f"{base}.{alias.name}") for alias in node.names)
        graph[module] = {m for m in found if m is not None and m != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_checks_see_what_they_check() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "agents.registry" in graph
    assert "agents.rl.searchers" in graph["agents.registry"]  # lazy imports inside functions count
    assert "pipeline.plan" in graph["experiments.tracking"]  # so do TYPE_CHECKING imports
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_down_the_layers() -> None:
    wrong = [f"{module} imports {target}" for module, targets in sorted(import_graph().items())
             for target in sorted(targets) if target.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert wrong == [], "against docs/architecture.md's direction of imports:\n" + "\n".join(wrong)


def test_the_architecture_page_states_these_rules() -> None:
    """docs/architecture.md's table of layers: the last column is what :data:`ALLOWED` allows."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    stated = {}
    for package, allowed in re.findall(r"^\| `(\w+)/` \|[^|]*\| ([^|]*) \|$", text, flags=re.M):
        names = set(re.findall(r"`(\w+)`", allowed))
        stated[package] = set(PACKAGES) if allowed.strip() == "everything" else names | {package}
    assert {p: stated.get(p) for p in PACKAGES} == ALLOWED


@pytest.mark.parametrize("package", [*PACKAGES, "tests"])
def test_no_module_over_600_lines_without_a_reason(package: str) -> None:
    long = []
    for path in sorted((ROOT / package).rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        doc = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and not any(line.startswith("Over 600 lines:") for line in doc.splitlines()):
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == [], ("split these, or say why not in a docstring line starting 'Over 600 lines:':\n"
                        + "\n".join(long))


def _public_functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    (not child.name.startswith("_") or child.name == "__init__"):
                out.append((prefix + child.name, child))

    visit(tree, "")
    return out


@pytest.mark.parametrize("package", ["pipeline", "env", "agents", "executor", "experiments"])
def test_public_functions_take_keywords_past_the_third(package: str) -> None:
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name, fn in _public_functions(ast.parse(path.read_text())):
            a = fn.args
            positional = [x.arg for x in a.posonlyargs + a.args if x.arg not in ("self", "cls")]
            key = f"{path.relative_to(ROOT)}:{name}"
            if len(positional) + len(a.kwonlyargs) > 3 and len(positional) > 3 and key not in POSITIONAL_OK:
                wrong.append(f"{key}({', '.join(positional)})")
    assert wrong == [], "make the parameters past the third keyword-only (add `*,`):\n" + "\n".join(wrong)



# ---------------------------------------------------------------------- one name, one module

#: Folder whose modules may share a name with another module: ``experiments/commands/X.py`` is the
#: command line of the ``X`` it runs (``commands/replay.py`` runs ``executor/replay.py``).
COMMANDS = "experiments/commands"


def shared_names(paths: list[str]) -> dict[str, list[str]]:
    """File name -> the paths (relative, ``/``-separated) of two or more modules that share it,
    ``__init__.py`` and the modules of :data:`COMMANDS` aside."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(paths):
        folder, _, name = path.rpartition("/")
        if name != "__init__.py" and folder != COMMANDS:
            by_name.setdefault(name, []).append(path)
    return {name: found for name, found in by_name.items() if len(found) > 1}


def test_the_name_check_sees_what_it_checks() -> None:
    assert shared_names(["a/exact.py", "b/c/exact.py", "a/__init__.py", "b/__init__.py",
                         f"{COMMANDS}/replay.py", "executor/replay.py", "a/one.py"]) == {
        "exact.py": ["a/exact.py", "b/c/exact.py"]}


def test_no_two_modules_share_a_name() -> None:
    """A name says what a module does, once: two modules named alike (say ``exact.py`` for a
    searcher and for the solver it calls) send a reader to the wrong file."""
    paths = [path.relative_to(ROOT).as_posix() for path in MODULES.values()]
    shared = shared_names(paths)
    assert shared == {}, ("rename one of each (a name that says what it does; only "
                          f"{COMMANDS}/X.py may share X's name):\n"
                          + "\n".join(f"{name}: {', '.join(found)}" for name, found in shared.items()))


# ---------------------------------------------------------------------- private names stay home

#: ``"module: access"`` -> why it may read a private name of another module (see
#: :func:`private_reads`). An entry that no longer occurs fails the test: delete it.
PRIVATE_OK = {
    **dict.fromkeys(
        ["experiments.cli: parser._actions", "experiments.cli: command._actions",
         "experiments.commands.train: parser._actions", "experiments.gen_docs: parser._actions"],
        "argparse's ArgumentParser._actions, not ours (argparse lists a parser's arguments nowhere public); "
        "seen because agents/vec_adapter.py has an _actions too"),
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


def _binds(tree: ast.Module) -> set[str]:
    """The private names a module binds: its functions, classes, variables and imported names (at
    any depth) and the attributes it sets on ``self`` / ``cls``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    return {name for name in names if _is_private(name)}


def private_reads(modules: dict[str, Path], *, root: Path = ROOT) -> list[tuple[str, int, str]]:
    """``(module, line, access)`` for each place a module of ``modules`` reaches a private name
    (one leading underscore) of another of them:

    * ``from x import _name`` where ``x`` is another module of ours;
    * importing a private module (``pipeline._native``, a compiled ``pipeline._engine`` under
      ``root``) from outside the package it sits in (inside, it is the package's own);
    * ``obj._name`` (read, set or deleted) and ``getattr/hasattr/setattr/delattr(obj, "_name")``
      where ``obj`` is not ``self``, ``cls`` or ``super()``, ``_name`` is bound by another module of
      ours (:func:`_binds`) and not by this one.

    Types are not inferred: a third-party private that shares its name with one of ours is
    reported (allow it in :data:`PRIVATE_OK`, saying whose it is), and a private of another module
    that this module also binds under the same name is not."""
    trees = {module: ast.parse(path.read_text(), str(path)) for module, path in modules.items()}
    binds = {module: _binds(tree) for module, tree in trees.items()}
    ours = set().union(*binds.values())

    def is_module(dotted: str) -> bool:
        if dotted in modules:
            return True
        parent, _, name = dotted.rpartition(".")
        folder = root.joinpath(*parent.split("."))
        return bool(parent) and ((folder / name).is_dir() or any(folder.glob(f"{name}.*.so")))

    def resolve(name: str) -> str | None:
        while name and not is_module(name):
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for module, tree in trees.items():
        package = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
        mine = binds[module]

        def add(node: ast.AST, access: str, module: str = module) -> None:
            found.append((module, node.lineno, access))

        def private_module(node: ast.AST, target: str | None, module: str = module) -> None:
            parts = (target or "").split(".")
            for i, part in enumerate(parts[1:], 1):
                home = ".".join(parts[:i])
                if _is_private(part) and module != home and not module.startswith(home + "."):
                    add(node, f"import {target}")
                    return

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    private_module(node, resolve(alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if is_module(full):
                        private_module(node, full)
                        continue
                    target = resolve(base)
                    private_module(node, target)
                    if target is not None and target != module and _is_private(alias.name):
                        add(node, f"from {base} import {alias.name}")
            else:
                if isinstance(node, ast.Attribute):
                    obj, name = node.value, node.attr
                    access = f"{ast.unparse(obj)}.{name}"
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 and \
                        isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    obj, name = node.args[0], node.args[1].value
                    access = f"{node.func.id}({ast.unparse(obj)}, {name!r})"
                else:
                    continue
                if not _is_private(name) or name in mine or name not in ours:
                    continue
                if isinstance(obj, ast.Name) and obj.id in ("self", "cls") or \
                        isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super":
                    continue
                add(node, access)
    return sorted(found)


def test_the_private_check_sees_what_it_checks(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "_hidden = 1\nclass A:\n    def __init__(self):\n        self._state = 0\n"
                    "    def _step(self):\n        return self._state\n",
        "pkg/_inner.py": "x = 1\n",
        "pkg/_native.cpython-311-x86_64-linux-gnu.so": "",
        "pkg/b.py": "from pkg import _inner, _native\nfrom pkg.a import A\nclass B(A):\n"
                    "    def _step(self):\n        return super()._step() + self._state\n"
                    "def peek(a, b):\n    return b._step(), a.__dict__, a._unknown\n",
        "other/__init__.py": "",
        "other/c.py": "from pkg.a import _hidden\nimport pkg._inner\nfrom pkg import _inner as inner\n"
                      "def peek(a):\n    a._state = 1\n    return a._step(), getattr(a, '_state', None)\n"
                      "from pkg import _native\n",
    }
    modules = {}
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if name.endswith(".py"):
            modules[name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")] = path
    assert private_reads(modules, root=tmp_path) == [
        ("other.c", 1, "from pkg.a import _hidden"),
        ("other.c", 2, "import pkg._inner"),
        ("other.c", 3, "import pkg._inner"),
        ("other.c", 5, "a._state"),
        ("other.c", 6, "a._step"),
        ("other.c", 6, "getattr(a, '_state')"),
        ("other.c", 7, "import pkg._native"),
    ]  # pkg.b's own _step, super() and self, dunders and privates of no module of ours pass


def test_no_module_reads_another_modules_privates() -> None:
    found = private_reads(MODULES)
    new = [f"{module}:{line}: {access}" for module, line, access in found if f"{module}: {access}" not in PRIVATE_OK]
    assert new == [], ("these read a private name of another module: add a public function, method or "
                       "property there (or, for a third-party private, a PRIVATE_OK entry saying whose):\n"
                       + "\n".join(new))
    stale = sorted(set(PRIVATE_OK) - {f"{module}: {access}" for module, _, access in found})
    assert stale == [], "PRIVATE_OK entries that no longer occur: delete them:\n" + "\n".join(stale)


def test_every_measured_slow_test_exists() -> None:
    """Each node id of tests/slow_tests.txt names a test function in its file (a renamed or deleted
    test leaves a stale line, which this catches)."""
    from tests.conftest import measured_slow_tests

    stale = []
    for node in sorted(measured_slow_tests()):
        path, _, name = node.partition("::")
        func = name.split("[", 1)[0]
        file = ROOT / path
        if not file.is_file() or not re.search(rf"^def {re.escape(func)}\(", file.read_text(), re.MULTILINE):
            stale.append(node)
    assert stale == [], f"stale lines in tests/slow_tests.txt (delete them): {stale}"
