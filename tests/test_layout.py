"""The house rules of docs/architecture.md, read from the source: imports, module sizes, signatures.

* The import graph of the project's modules (every ``import``, at module level, inside
  functions and under ``TYPE_CHECKING``) has no cycle, and its arrows point down the layers of
  docs/architecture.md only: experiments -> agents -> env -> pipeline, executor -> pipeline. So
  pipeline imports nothing of ours, nothing but experiments imports experiments, executor imports
  neither agents nor env. The page's table of layers says the same as :data:`ALLOWED`.
* No module is over 600 lines unless its docstring has a line starting ``Over 600 lines:``.
* Public functions taking more than three parameters take the ones past the third by keyword.
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
POSITIONAL_OK = {
    "executor/runtime.py:TimedStage.forward_one_chunk": "overrides torch's stage method; torch calls it positionally",
    "executor/runtime.py:TimedStage.backward_one_chunk": "overrides torch's stage method; torch calls it positionally",
}


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
