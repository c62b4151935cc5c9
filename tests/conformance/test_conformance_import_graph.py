"""No import cycles inside ``conformance`` and ``grpo``, and the registry is a leaf.

Edges are every ``import`` statement of a module, wherever it stands (module level, inside a
function, under ``TYPE_CHECKING``): a lazy import still ties two modules together. A package is
not an edge of its submodules (importing ``grpo.loop`` runs ``grpo/__init__`` first, but that
is the package's choice, not a dependency of ``loop``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_files(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """{module: modules of ``package`` it imports}."""
    modules = module_files(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", ["conformance", "grpo"])
def test_no_import_cycles(package: str) -> None:
    graph = import_graph(package)
    assert len(graph) >= 10
    assert cycles(graph) == []


def test_the_detector_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph("conformance")
    assert "conformance.registry" in graph["conformance.checks.ordering"]
    assert "conformance.checks.ordering" in graph["conformance.checks"]


def test_leaves() -> None:
    """The check registry, the options and grpo's config import nothing of their package."""
    assert import_graph("conformance")["conformance.registry"] == set()
    assert import_graph("conformance")["conformance.options"] == set()
    assert import_graph("grpo")["grpo.config"] == set()
    assert "grpo.loop" not in import_graph("grpo")["grpo.checks"]
