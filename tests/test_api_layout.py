"""The layout of ``rewind.api`` (issue 9): no import cycle between its modules, and no function
more complex than radon's rank C (cyclomatic complexity ≤ 20)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from radon.complexity import cc_rank, cc_visit

API = Path(__file__).resolve().parent.parent / "src" / "rewind" / "api"


def _module_name(path: Path) -> str:
    parts = path.relative_to(API.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, known: set[str]) -> set[str]:
    """The ``rewind.api`` modules ``path`` imports at run time (lazy imports in functions
    included, ``TYPE_CHECKING`` imports not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in known:  # `from rewind.api import access`: the submodule
                    out.add(submodule)
                elif node.module in known:
                    out.add(node.module)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the ``rewind.api`` modules it imports."""
    files = {_module_name(p): p for p in API.rglob("*.py")}
    return {name: _imports(path, set(files)) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_api_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph()
    assert "rewind.api.routes.forks" in graph["rewind.api.app"]
    cycle = find_cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_api_function_ranks_above_c() -> None:
    ranked = [
        f"{path.relative_to(API)}:{block.lineno} {block.fullname} {cc_rank(block.complexity)} "
        f"({block.complexity})"
        for path in sorted(API.rglob("*.py"))
        for block in cc_visit(path.read_text(encoding="utf-8"))
        if cc_rank(block.complexity) not in ("A", "B", "C")
    ]
    assert ranked == [], "simplify (radon cc ≤ 20): " + "; ".join(ranked)


# The third-party libraries the entry modules import (FastAPI, SQLAlchemy, Burr with pandas and
# numpy, ...): imported once, never Rewind, by the process each import check is forked from.
PRELOAD = ("fastapi", "starlette", "sse_starlette", "sqlalchemy", "sqlalchemy.dialects.sqlite",
           "burr.core", "burr.tracking.base", "pydantic", "httpx", "anyio", "uvicorn", "orjson",
           "psutil", "tenacity", "rich.console", "opentelemetry.sdk.trace")  # fmt: skip

# Reads module names, one a line; for each forks a child that imports it, and answers a JSON
# line: the child's exit status and the traceback it printed (empty when it imported).
_FORK_SERVER = r"""
import importlib, json, os, sys, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m == "rewind" or m.startswith("rewind."))
print(json.dumps({"rewind_loaded": loaded}), flush=True)
for line in sys.stdin:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            importlib.import_module(line.strip())
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as out:
        text = out.read().decode()
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status, "stderr": text}), flush=True)
"""


@pytest.fixture(scope="module")
def fresh_importer() -> Iterator[Callable[[str], tuple[int, str]]]:
    """``import_first(module)`` → (exit status, traceback): ``module`` imported in a process
    forked from a fresh interpreter that holds :data:`PRELOAD` and no Rewind module yet.

    A plain ``python -c "import module"`` per module spent ~1.5 s each on the libraries; which
    Rewind module is imported first, and so any cycle through ``rewind.api``'s own imports, is
    the same in the fork."""
    server = subprocess.Popen(
        [sys.executable, "-c", _FORK_SERVER, *PRELOAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(API.parent.parent)},
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        hello = json.loads(server.stdout.readline())
        assert hello["rewind_loaded"] == [], hello  # the preloaded libraries import no Rewind

        def import_first(module: str) -> tuple[int, str]:
            server.stdin.write(module + "\n")
            server.stdin.flush()
            answer = json.loads(server.stdout.readline())
            return answer["status"], answer["stderr"]

        yield import_first
    finally:
        server.stdin.close()
        server.terminate()  # not an interpreter shutdown with pandas and numpy loaded: ~0.5 s
        server.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "rewind.tracing.service",
        "rewind.api.models",
        "rewind.api.reports",
        "rewind.api.manage",
        "rewind.api.context",
        "rewind.api.routes.forks",
    ],
)
def test_each_entry_module_imports_first(
    module: str, fresh_importer: Callable[[str], tuple[int, str]]
) -> None:
    """Imported first in a fresh interpreter (as another package or a worker may), the module
    loads: no cycle through the ``rewind.api`` package's own imports."""
    status, stderr = fresh_importer(module)
    assert status == 0, stderr[-2000:]
