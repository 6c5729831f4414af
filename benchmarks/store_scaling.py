"""Does replay cost grow with the store? The replay figures at growing cache and run counts.

What it does, in one store:

1. records the 100-node Burr chain (``benchmarks/chain.py``) with :meth:`Rewind.record`, and a
   100-step traced chain of tool calls (``Tracer.trace``; each step one ``@rewind.tool`` call in
   a ``tool_call`` step, its argument the previous result) — no model server needed;
2. for each size in ``--cache-sizes`` (default 10^3, 10^5, 10^6 cached calls, ascending), fills
   the tool cache up to that many rows **directly through the store's engine** (``executemany``,
   10,000 rows a statement; each row's argument blob unique, its result one of 997 realistic
   result blobs, see :func:`fill_cache_fast`), then times, alternating, ``--replays``
   unchanged replays of each:
   ``Rewind.replay(run_id, at=1)`` (calls served from the parent's lineage) and the traced chain
   again under ``Tracer(read_cache=True)`` (every call looked up by key in the grown cache);
3. then adds ``--runs`` stored runs (default 10^4; run rows with 10 node rows each, bulk
   inserted the same way) and times both again.

Every Burr replay must be all cache hits with the parent's hashes; every traced replay must
return the recorded result and run no tool body. Figures (last line, JSON): per size,
``burr_replay_ms_per_node`` and ``trace_replay_ms_per_step``; the slope of each against
log10(cache rows) (ms per node per tenfold growth; target ≈ 0) and the ratio of the largest to
the smallest size; the same two after the runs were added.

Run: ``.venv/bin/python benchmarks/store_scaling.py [--quick] [--cache-sizes 1000,100000]``
(the default sizes take a few minutes and ~0.5 GB of temporary disk; ``--quick``: 10^3 and
5·10^3 cached calls, 200 runs, the chain of 30 nodes, 1 timed replay).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import insert

import rewind
from chain import SEED_STATE, chain_pipeline, timed
from replay_overhead import FILL_BATCH, _result_blob, check_replay
from rewind.canonical import key_of
from rewind.replay import Rewind
from rewind.store import Store, schema
from rewind.tracing import Tracer, step

TRACE_STEPS = 100
_BODY_RUNS = 0


def _scaling_add(value: int) -> int:
    """The traced chain's tool body (counts its executions)."""
    global _BODY_RUNS
    _BODY_RUNS += 1
    return (value * 31 + 7) % 1_000_003


_TRACED = step("scaling_add", "tool_call")(rewind.tool("scaling_add")(_scaling_add))


def run_trace(tracer: Tracer) -> int:
    """The traced chain: TRACE_STEPS tool calls, each fed the previous result."""
    value = 1
    with tracer.trace("scaling-chain"):
        for _ in range(TRACE_STEPS):
            value = _TRACED(value)
    return value


def fill_cache_fast(store: Store, rows: int, start: int, seed: int = 7) -> float:
    """Insert ``rows`` tool-cache rows numbered from ``start``; returns seconds.

    Like ``replay_overhead.fill_tool_cache`` but cheap enough for 10^6 rows: each row's
    argument blob is unique (canonical JSON written directly, one SHA-256), its result one of
    997 realistic result blobs made once, so the cache table and the blob index grow by one
    row per cached call while the setup stays a few seconds per 10^5 rows."""
    rng = random.Random(seed)
    results = [_result_blob(rng) for _ in range(997)]
    result_rows = [
        {"hash": hashlib.sha256(r).hexdigest(), "size": len(r), "data": r} for r in results
    ]
    started = time.perf_counter()
    now = time.time()
    with store.write() as conn:
        conn.execute(insert(schema.blobs).prefix_with("OR IGNORE", dialect="sqlite"), result_rows)
        for lo in range(start, start + rows, FILL_BATCH):
            blob_rows: list[dict[str, Any]] = []
            cache_rows: list[dict[str, Any]] = []
            for i in range(lo, min(start + rows, lo + FILL_BATCH)):
                args = b'{"node":"x%09d","value":%d}' % (i, i * 7919 % 1_000_003)
                args_hash = hashlib.sha256(args).hexdigest()
                blob_rows.append({"hash": args_hash, "size": len(args), "data": args})
                cache_rows.append(
                    {
                        "key": key_of("tool/v1", f"filler_{i % 17}", args),
                        "tool": f"filler_{i % 17}",
                        "args_hash": args_hash,
                        "result_hash": result_rows[i % 997]["hash"],
                        "created_at": now,
                    }
                )
            conn.execute(insert(schema.blobs).prefix_with("OR IGNORE", dialect="sqlite"), blob_rows)
            conn.execute(insert(schema.tool_cache), cache_rows)
    return time.perf_counter() - started


def fill_runs(store: Store, runs: int, nodes_per_run: int = 10) -> float:
    """Insert ``runs`` completed run rows with ``nodes_per_run`` node rows each; returns s."""
    started = time.perf_counter()
    now = time.time()
    batch = 1_000
    with store.write() as conn:
        for start in range(0, runs, batch):
            run_rows: list[dict[str, Any]] = []
            node_rows: list[dict[str, Any]] = []
            for i in range(start, min(runs, start + batch)):
                run_id = uuid.UUID(int=i + 1).hex
                run_rows.append(
                    {
                        "run_id": run_id,
                        "pipeline": f"filler_{i % 13}",
                        "status": "completed",
                        "created_at": now - runs + i,
                        "finished_at": now - runs + i + 0.5,
                    }
                )
                for p in range(nodes_per_run):
                    digest = f"{i:032x}{p:032x}"
                    node_rows.append(
                        {
                            "run_id": run_id,
                            "position": p,
                            "name": f"n{p:03d}",
                            "sequence_id": p,
                            "src_app_id": run_id,
                            "src_sequence_id": p,
                            "inherited": False,
                            "input_hash": digest,
                            "output_hash": digest,
                            "state_hash": digest,
                            "cache_outcome": "miss",
                            "started_at": now,
                        }
                    )
            conn.execute(insert(schema.runs), run_rows)
            conn.execute(insert(schema.nodes), node_rows)
    return time.perf_counter() - started


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y against x."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def measure(
    rw: Rewind, parent_id: str, nodes: int, folder: Path, expected: int, replays: int
) -> tuple[float, float]:
    """(median Burr replay ms/node, median traced cached replay ms/step), alternating."""
    burr_ms: list[float] = []
    trace_ms: list[float] = []
    for r in range(replays + 1):  # the first round warms caches and is not counted
        sides = ["burr", "trace"] if r % 2 == 0 else ["trace", "burr"]
        for side in sides:
            if side == "burr":
                with timed() as t:
                    child = rw.replay(parent_id, at=1)
                check_replay(rw, parent_id, child.run_id, nodes)
                if r:
                    burr_ms.extend(t)
            else:
                before = _BODY_RUNS
                tracer = Tracer(folder, read_cache=True, raise_on_write_error=True)
                try:
                    with timed() as t:
                        got = run_trace(tracer)
                finally:
                    tracer.close()
                assert got == expected and before == _BODY_RUNS, "traced replay ran live"
                if r:
                    trace_ms.extend(t)
    return statistics.median(burr_ms) / nodes, statistics.median(trace_ms) / TRACE_STEPS


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="10^3 and 5*10^3 rows, 200 runs, 30 nodes, 1 replay"
    )
    parser.add_argument("--cache-sizes", default=None, help="comma-separated cache row counts")
    parser.add_argument("--runs", type=int, default=None, help="stored runs to add (10^4)")
    parser.add_argument("--replays", type=int, default=None, help="timed replays per size (5)")
    parser.add_argument("--nodes", type=int, default=None, help="default 100")
    args = parser.parse_args(argv)
    default_sizes = "1000,5000" if args.quick else "1000,100000,1000000"
    sizes = sorted(int(s) for s in (args.cache_sizes or default_sizes).split(","))
    runs = args.runs if args.runs is not None else (200 if args.quick else 10_000)
    replays = args.replays or (1 if args.quick else 5)
    nodes = args.nodes or (30 if args.quick else 100)

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rewind-bench-") as tmp:
        folder = Path(tmp) / "store"
        rw = Rewind(folder)
        parent = rw.record(chain_pipeline(nodes), SEED_STATE)
        assert parent.status == "completed", parent.error
        tracer = Tracer(folder, raise_on_write_error=True)
        try:
            expected = run_trace(tracer)
        finally:
            tracer.close()
        for size in sizes:
            have = sum(rw.store.cache_sizes().values())
            seconds = fill_cache_fast(rw.store, max(0, size - have), start=have)
            cached = sum(rw.store.cache_sizes().values())
            burr, trace = measure(rw, parent.run_id, nodes, folder, expected, replays)
            rows.append({"cache_rows": cached, "burr": burr, "trace": trace})
            print(
                f"{cached:>9,} cached calls (filled in {seconds:5.1f} s): Burr replay "
                f"{burr:.3f} ms/node, traced cached replay {trace:.3f} ms/step"
            )
        seconds = fill_runs(rw.store, runs)
        stored = len(rw.store.list_runs(limit=10**9, include_sub_runs=True))
        burr_runs, trace_runs = measure(rw, parent.run_id, nodes, folder, expected, replays)
        print(
            f"+{runs:,} runs ({stored:,} stored, filled in {seconds:.1f} s): Burr replay "
            f"{burr_runs:.3f} ms/node, traced cached replay {trace_runs:.3f} ms/step"
        )
        rw.store.close()

    points = [(math.log10(r["cache_rows"]), r) for r in rows]
    burr_slope = slope([(x, r["burr"]) for x, r in points])
    trace_slope = slope([(x, r["trace"]) for x, r in points])
    first, last = rows[0], rows[-1]
    print(
        f"slope per tenfold cache growth: Burr replay {burr_slope:+.4f} ms/node, traced "
        f"{trace_slope:+.4f} ms/step; largest/smallest: Burr {last['burr'] / first['burr']:.2f}, "
        f"traced {last['trace'] / first['trace']:.2f}"
    )
    return {
        "sizes": [
            {
                "cache_rows": r["cache_rows"],
                "burr_replay_ms_per_node": round(r["burr"], 4),
                "trace_replay_ms_per_step": round(r["trace"], 4),
            }
            for r in rows
        ],
        "burr_replay_slope_ms_per_decade": round(burr_slope, 4),
        "trace_replay_slope_ms_per_decade": round(trace_slope, 4),
        "burr_replay_largest_vs_smallest": round(last["burr"] / first["burr"], 3),
        "trace_replay_largest_vs_smallest": round(last["trace"] / first["trace"], 3),
        "stored_runs": stored,
        "burr_replay_ms_per_node_with_runs": round(burr_runs, 4),
        "trace_replay_ms_per_step_with_runs": round(trace_runs, 4),
        "burr_replay_runs_vs_smallest": round(burr_runs / first["burr"], 3),
        "trace_replay_runs_vs_smallest": round(trace_runs / first["trace"], 3),
        "replays": replays,
    }


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
