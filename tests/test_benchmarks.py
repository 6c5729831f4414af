"""The benchmark scripts still run and print their figures (``--quick``; no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("script", "figure"),
    [
        ("replay_overhead.py", "cached_replay_ms_per_node"),
        ("record_overhead.py", "record_overhead_ratio"),
        ("storage.py", "storage_ratio"),
        ("grid.py", "grid_vs_serial_ratio"),
        ("capture_overhead.py", "hit_ms_per_call"),
        ("trace_replay.py", "replay_in_place_ms_per_step"),
        ("canonical_hashing.py", "canonical_hash_mb_per_s"),
        ("store_scaling.py", "burr_replay_largest_vs_smallest"),
        ("trace_bytes_designs.py", "smallest_design_vs_peer_ratio"),
    ],
)
def test_benchmark_prints_its_figure(script: str, figure: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        # This checkout's sources first, whatever rewind the interpreter has installed.
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])),
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(figures[figure], float) and figures[figure] > 0
