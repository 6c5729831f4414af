"""Cost of an unchanged replay per node, with the caches holding ≥ 100,000 rows.

What it does:

1. records the 100-node chain (``benchmarks/chain.py``) with :meth:`Rewind.record`; its own
   100 tool-cache rows come from real tool calls;
2. fills the tool cache up to ``--cache-rows`` rows by inserting extra rows **directly through
   the store's SQLAlchemy engine** in one bulk transaction (``executemany``): each row has a
   random 64-hex key and references two real content-addressed blobs (its canonical JSON
   arguments, ~40 bytes, and a JSON result of 80–600 bytes of words and numbers), so the
   ``tool_cache`` and ``blobs`` indexes have the size they would have after many runs;
3. alternates, ``--replays`` times, one plain-Burr run of the same graph (no persistence, tool
   functions called directly), one plain-Burr run with Burr's ``SQLitePersister`` (WAL,
   ``synchronous=NORMAL``, a fresh app id each time) and one ``Rewind.replay(run_id, at=1)``,
   and checks every replayed node is a cache hit with the parent's output hash and 0 tokens.

Figures (last line, JSON): ``cached_replay_ms_per_node`` = median replay wall time / nodes
(target ≤ 1.0 ms), ``plain_burr_ms_per_node`` and ``burr_sqlite_ms_per_node`` (the baselines),
``replay_added_ms_per_node`` = replay − plain Burr per node (target ≤ 0.2 ms),
``replay_vs_burr_sqlite_ratio`` = replay / Burr + SQLitePersister, ``cache_rows`` (tool + LLM
cache rows).

Run: ``.venv/bin/python benchmarks/replay_overhead.py [--quick] [--profile]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from chain import (
    SEED_STATE,
    burr_sqlite_persister,
    chain_graph,
    chain_pipeline,
    median,
    profile,
    run_plain_burr,
    spread,
    timed,
)
from rewind.canonical import canonical_bytes, key_of
from rewind.replay import Rewind
from rewind.store import Store, schema

TARGET_MS_PER_NODE = 1.0
TARGET_ADDED_MS_PER_NODE = 0.2
WORDS_TEXT = (
    "rain sun fog wind cloud drizzle snow mean max min precipitation temperature seattle week "
    "month year trend warm cold wet dry station daily record average median anomaly summary"
)
WORDS = WORDS_TEXT.split()
FILL_BATCH = 10_000


def _result_blob(rng: random.Random) -> bytes:
    """A realistic tool result: a small JSON object of words and numbers, 80–600 bytes."""
    n = rng.randint(3, 40)
    return canonical_bytes(
        {
            "rows": rng.randint(0, 1461),
            "mean": round(rng.uniform(-5, 35), 3),
            "text": " ".join(rng.choice(WORDS) for _ in range(n)),
            "values": [rng.randint(0, 10_000) for _ in range(rng.randint(1, 12))],
        }
    )


def fill_tool_cache(store: Store, rows: int, seed: int = 7) -> float:
    """Insert ``rows`` tool-cache rows with their argument and result blobs; returns seconds."""
    rng = random.Random(seed)
    started = time.perf_counter()
    now = time.time()
    with store.write() as conn:
        for start in range(0, rows, FILL_BATCH):
            cache_rows: list[dict[str, Any]] = []
            blob_rows: list[dict[str, Any]] = []
            for i in range(start, min(rows, start + FILL_BATCH)):
                args = canonical_bytes({"node": f"x{i:06d}", "value": rng.randint(0, 10**9)})
                result = _result_blob(rng)
                args_hash = hashlib.sha256(args).hexdigest()
                result_hash = hashlib.sha256(result).hexdigest()
                blob_rows.append({"hash": args_hash, "size": len(args), "data": args})
                blob_rows.append({"hash": result_hash, "size": len(result), "data": result})
                cache_rows.append(
                    {
                        "key": key_of("tool/v1", f"filler_{i % 17}", args),
                        "tool": f"filler_{i % 17}",
                        "args_hash": args_hash,
                        "result_hash": result_hash,
                        "created_at": now,
                    }
                )
            conn.execute(insert(schema.blobs).prefix_with("OR IGNORE", dialect="sqlite"), blob_rows)
            conn.execute(insert(schema.tool_cache), cache_rows)
    return time.perf_counter() - started


def check_replay(rw: Rewind, parent_id: str, child_id: str, nodes: int) -> None:
    """Every replayed node must be a cache hit with the parent's hashes and 0 tokens."""
    parent = rw.store.nodes_of(parent_id)
    child = rw.store.nodes_of(child_id)
    run = rw.store.get_run(child_id)
    assert run.status == "completed", f"replay {child_id} {run.status}: {run.error}"
    assert len(child) == nodes, f"replay has {len(child)} nodes, expected {nodes}"
    assert run.tokens == 0, f"replay spent {run.tokens} tokens"
    for p, c in zip(parent, child, strict=True):
        assert c.cache_outcome == "hit", f"node {c.name}: {c.cache_outcome}/{c.cache_reason}"
        assert c.output_hash == p.output_hash, f"node {c.name}: output hash differs"
        assert c.state_hash == p.state_hash, f"node {c.name}: state hash differs"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version for smoke tests")
    parser.add_argument("--nodes", type=int, default=None, help="default 100")
    parser.add_argument("--cache-rows", type=int, default=None, help="default 100,000")
    parser.add_argument("--replays", type=int, default=None, help="timed replays (default 9)")
    parser.add_argument("--profile", action="store_true", help="cProfile one extra replay")
    args = parser.parse_args(argv)
    cache_target = args.cache_rows or (2_000 if args.quick else 100_000)
    replays = args.replays or (1 if args.quick else 9)
    nodes = args.nodes or (30 if args.quick else 100)

    with tempfile.TemporaryDirectory(prefix="rewind-bench-") as tmp:
        rw = Rewind(Path(tmp) / "store")
        pipeline = chain_pipeline(nodes)
        plain_graph = chain_graph(nodes, through_rewind=False)
        parent = rw.record(pipeline, SEED_STATE)
        assert parent.status == "completed", parent.error
        have = rw.store.cache_sizes()["tool_cache"]
        seconds = fill_tool_cache(rw.store, max(0, cache_target - have))
        sizes = rw.store.cache_sizes()
        cache_rows = sizes["tool_cache"] + sizes["llm_cache"]
        print(
            f"recorded {nodes}-node chain {parent.run_id[:12]}; filled tool_cache to "
            f"{sizes['tool_cache']:,} rows (+ llm_cache {sizes['llm_cache']:,}) in {seconds:.1f} s"
        )

        warm = rw.replay(parent.run_id, at=1)  # imports, statement caches, page cache
        check_replay(rw, parent.run_id, warm.run_id, nodes)
        run_plain_burr(plain_graph, "plain-warm")

        persister = burr_sqlite_persister(Path(tmp) / "burr.db")
        run_plain_burr(plain_graph, "burr-warm", persister)
        replay_ms: list[float] = []
        plain_ms: list[float] = []
        burr_ms: list[float] = []
        for r in range(replays):
            order = ("plain", "burr", "replay") if r % 2 == 0 else ("replay", "burr", "plain")
            for which in order:
                if which == "plain":
                    with timed() as t:
                        run_plain_burr(plain_graph, f"plain-{r}")
                    plain_ms.extend(t)
                elif which == "burr":
                    with timed() as t:
                        run_plain_burr(plain_graph, f"burr-{r}", persister)
                    burr_ms.extend(t)
                else:
                    with timed() as t:
                        child = rw.replay(parent.run_id, at=1)
                    replay_ms.extend(t)
                    check_replay(rw, parent.run_id, child.run_id, nodes)
        print(f"plain Burr run ({nodes} nodes, no persistence): {spread(plain_ms)}")
        print(f"Burr + SQLitePersister (WAL, NORMAL):        {spread(burr_ms)}")
        print(f"Rewind unchanged replay ({nodes} nodes, all hits): {spread(replay_ms)}")

        if args.profile:
            print("cProfile of one unchanged replay (cumulative):")
            profile(lambda: rw.replay(parent.run_id, at=1))
        persister.connection.close()
        rw.store.close()

    per_node = median(replay_ms) / nodes
    plain_per_node = median(plain_ms) / nodes
    burr_per_node = median(burr_ms) / nodes
    added = per_node - plain_per_node
    verdict = "meets" if per_node <= TARGET_MS_PER_NODE else "MISSES"
    added_verdict = "meets" if added <= TARGET_ADDED_MS_PER_NODE else "MISSES"
    print(
        f"cached replay: {per_node:.3f} ms/node ({verdict} target ≤ {TARGET_MS_PER_NODE} ms); "
        f"plain Burr: {plain_per_node:.3f} ms/node; cache rows: {cache_rows:,}"
    )
    print(
        f"replay adds {added:.3f} ms/node over plain Burr ({added_verdict} target ≤ "
        f"{TARGET_ADDED_MS_PER_NODE} ms); replay / Burr + SQLitePersister = "
        f"{per_node / burr_per_node:.2f} ({burr_per_node:.3f} ms/node)"
    )
    return {
        "cached_replay_ms_per_node": round(per_node, 4),
        "cached_replay_target_ms_per_node": TARGET_MS_PER_NODE,
        "plain_burr_ms_per_node": round(plain_per_node, 4),
        "burr_sqlite_ms_per_node": round(burr_per_node, 4),
        "replay_added_ms_per_node": round(added, 4),
        "replay_added_target_ms_per_node": TARGET_ADDED_MS_PER_NODE,
        "replay_vs_burr_sqlite_ratio": round(per_node / burr_per_node, 3),
        "cache_rows": cache_rows,
        "nodes": nodes,
        "replays": replays,
    }


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
