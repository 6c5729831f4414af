"""No import cycles among rewind's modules (issue 9, point 7).

The graph is built from each module's module-level imports (an AST walk: imports inside
functions run late and do not count, nor do ``if TYPE_CHECKING:`` imports, which never run). A
cycle is any strongly connected component of more than one module, or a module importing itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Known cycles another branch is breaking; the integrator removes each entry once it lands.
# (api/app.py <-> api/reports.py is not one at module level: app.py imports reports inside
# create_app; helper t14's branch removes that deferred import.)
KNOWN_CYCLES: set[frozenset[str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "rewind").rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: module body, and inside top-level
    ``if``/``try``/``with`` blocks (never a function or class body, never ``if TYPE_CHECKING``)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                pending.extend(node.body)
            pending.extend(node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
        elif isinstance(node, ast.With):
            pending.extend(node.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]):
    """The rewind modules one import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.append(sub)  # ``from pkg import submodule``
        elif base in known:
            out.append(base)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the rewind modules its module-level imports load."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in _top_level_imports(tree):
            edges.update(_targets(node, name, path.name == "__init__.py", known))
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (or a self-import), Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself can fail: a two-module cycle and a self-import are reported."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"d"}}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b"], ["d"]]


def test_the_graph_sees_module_level_imports_only() -> None:
    graph = import_graph()
    assert "rewind.canonical" in graph["rewind.cache"]
    assert "rewind.effects" in graph["rewind.cache"]  # module level since the cycle was broken
    assert "rewind.cache" not in graph["rewind.effects"]


def test_no_import_cycles_among_rewind_modules() -> None:
    found = [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES]
    if found:
        pytest.fail(
            "import cycles among rewind modules (move the shared part into a lower module): "
            + "; ".join(" <-> ".join(sorted(c)) for c in found)
        )
