"""Start-up: ``import rewind`` and ``rewind --help`` load no heavy library they do not need
(no wall-clock limit: which modules are loaded is what decides start-up time, measured in
``benchmarks/trace_replay.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("burr", "pandas", "sqlalchemy", "httpx", "fastapi", "opentelemetry", "llama_cpp")


def loaded_after(code: str) -> set[str]:
    """Top-level packages of the heavy libraries loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    ).stdout
    modules = json.loads(out.strip().splitlines()[-1])
    return {m.split(".")[0] for m in modules} & set(HEAVY)


def test_import_rewind_loads_no_heavy_library() -> None:
    assert loaded_after("import rewind") == set()


def test_public_names_import_on_first_use() -> None:
    code = (
        "import rewind\n"
        "assert rewind.tool.__module__ == 'rewind.tools'\n"
        "assert rewind.replay.Rewind is rewind.Rewind\n"  # submodules still reachable
        "import rewind.store\n"
        "assert rewind.store.schema.blobs.name == 'blobs'\n"
        "try:\n    rewind.no_such_name\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    assert "burr" in loaded_after(code)  # rewind.Rewind needed Burr, and got it


def test_a_tool_and_the_tracer_records_need_no_database_layer_until_used() -> None:
    assert loaded_after("import rewind\nrewind.tool\nimport rewind.store.records") == set()


def test_cli_help_loads_neither_burr_nor_sqlalchemy() -> None:
    code = (
        "import sys\nsys.argv = ['rewind', '--help']\n"
        "from rewind.cli import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
    )
    assert loaded_after(code) & {"burr", "pandas", "sqlalchemy"} == set()
