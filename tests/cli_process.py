"""Run the ``rewind`` command as a user would: a subprocess, this checkout's sources first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_rewind(
    *args: str,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    columns: int = 160,
    timeout: float = 900,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """``python -m rewind ARGS`` with ``PYTHONPATH`` = this checkout's ``src`` and root (an
    editable install of another checkout must not answer instead), ``COLUMNS`` = ``columns``,
    ``REWIND_STORE`` removed unless ``env`` sets it. Output is captured as text."""
    full_env = {k: v for k, v in os.environ.items() if k != "REWIND_STORE"}
    full_env |= {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "COLUMNS": str(columns),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "rewind", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        input=stdin or "",
        timeout=timeout,
        check=False,
        **popen,
    )
