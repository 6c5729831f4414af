"""Domain modules print nothing: every command and all terminal rendering live in ``rewind.cli``.

Outside the ``rewind.cli`` package, no module imports Rich, Typer or ``rewind.terminal``, calls
``print``, or writes to ``sys.stdout``/``sys.stderr``; domain modules return records and raise
``RewindError``s, and only ``rewind.cli`` (and ``rewind.api``, as HTTP responses) render them.
The exceptions:

- ``rewind.terminal``: the rendering primitives the CLI prints untrusted text through (inert
  markup, visible escapes, the consoles); it is Rich's one door, and prints nothing itself.
- ``rewind.api.verify_http``: ``rewind verify --server``'s report, written to the stream its
  caller passes (the CLI passes stdout). Its checks and its report are still one module there.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "rewind"
RENDERING_MODULES = {"rewind.terminal"}
"""May import Rich (it prints nothing itself)."""
PRINTING_MODULES = {"rewind.api.verify_http"}
"""May call print() (to the stream it is given)."""
UI_LIBRARIES = ("rich", "typer", "click")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(source: str, module: str) -> list[str]:
    """What in ``source`` (module ``module``) prints or renders: ``module:line what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [node.module]
        for name in imported:
            top = name.split(".")[0]
            if top in UI_LIBRARIES and not (top == "rich" and module in RENDERING_MODULES):
                found.append(f"{module}:{node.lineno} imports {name}")
            if name == "rewind.terminal" or (
                name == "rewind" and any(a.name == "terminal" for a in node.names)
            ):
                found.append(f"{module}:{node.lineno} imports rewind.terminal")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
            and module not in PRINTING_MODULES
        ):
            found.append(f"{module}:{node.lineno} calls print()")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in ("stdout", "stderr")
        ):
            found.append(f"{module}:{node.lineno} uses sys.{node.attr}")
    return sorted(found, key=lambda v: int(v.split(":")[1].split()[0]))


def domain_modules() -> list[Path]:
    cli = SRC / "cli"
    return sorted(p for p in SRC.rglob("*.py") if cli not in p.parents)


def test_domain_modules_print_nothing() -> None:
    paths = domain_modules()
    assert len(paths) > 50  # the walk found the package (not an empty folder)
    found = [v for p in paths for v in violations(p.read_text("utf-8"), module_name(p))]
    assert found == [], "move the command or its rendering into rewind.cli:\n" + "\n".join(found)


def test_the_check_catches_each_kind_of_output() -> None:
    source = (
        "import sys\nimport typer\nfrom rich.table import Table\n"
        "print('x')\nsys.stdout.write('y')\nfrom rewind.terminal import inert\n"
    )
    assert violations(source, "rewind.example") == [
        "rewind.example:2 imports typer",
        "rewind.example:3 imports rich.table",
        "rewind.example:4 calls print()",
        "rewind.example:5 uses sys.stdout",
        "rewind.example:6 imports rewind.terminal",
    ]
    assert violations("from rich.console import Console\n", "rewind.terminal") == []
    assert violations("print('x', file=out)\n", "rewind.api.verify_http") == []


def test_the_cli_package_holds_every_command() -> None:
    """Every ``rewind`` command is defined in a ``rewind.cli`` module."""
    from typer.main import get_command

    from rewind.cli import app

    group = get_command(app)
    modules = set()

    def walk(command: object) -> None:
        callback = getattr(command, "callback", None)
        if callback is not None:
            modules.add(callback.__module__)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(group)
    assert "rewind.cli.runs" in modules and "rewind.cli.traces" in modules
    assert all(m.startswith("rewind.cli.") for m in modules), sorted(modules)
