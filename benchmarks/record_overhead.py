"""Recording overhead: Rewind.record versus plain Burr with its own SQLitePersister.

Both sides run the 100-node chain (``benchmarks/chain.py``) from the same seed state:

- baseline: plain Burr with ``burr.core.persistence.SQLitePersister`` (``journal_mode=WAL`` and
  ``synchronous=NORMAL`` set on its connection), tool functions called directly;
- subject: :meth:`Rewind.record` (tool calls through Rewind's cache wrapper, node rows, calls,
  cache entries, content-addressed state).

Each round runs both once with fresh app ids (a reused app id raises IntegrityError), alternating
which goes first; one untimed warm-up round precedes them. Each round starts from its own seed
value, shared by both sides, so every tool call, field and blob of a round is new: a content-
addressed store gets no free deduplication from an earlier round. Each side keeps one database for
all rounds, so both grow alike. Plain Burr without persistence runs in the same rounds as context.

Figures (last line, JSON): ``record_overhead_ratio`` = median Rewind record time / median
Burr+SQLitePersister time (target ≤ 1.15), the per-node times of the three, and what recording
adds per node: ``record_added_ms_per_node`` over plain Burr (target ≤ 0.25 ms) and
``record_added_vs_burr_sqlite_ms_per_node`` over Burr + SQLitePersister.

Run: ``.venv/bin/python benchmarks/record_overhead.py [--quick] [--profile]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from chain import (
    burr_sqlite_persister,
    chain_graph,
    chain_pipeline,
    median,
    profile,
    run_plain_burr,
    seed_state,
    spread,
    timed,
)
from rewind.replay import Rewind

TARGET_RATIO = 1.15
TARGET_ADDED_MS_PER_NODE = 0.25


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version for smoke tests")
    parser.add_argument("--nodes", type=int, default=None, help="default 100")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 11)")
    parser.add_argument("--profile", action="store_true", help="cProfile one extra record")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 11)
    nodes = args.nodes or (30 if args.quick else 100)

    with tempfile.TemporaryDirectory(prefix="rewind-bench-") as tmp:
        rw = Rewind(Path(tmp) / "store")
        pipeline = chain_pipeline(nodes)
        plain_graph = chain_graph(nodes, through_rewind=False)
        persister = burr_sqlite_persister(Path(tmp) / "burr.db")

        def burr_round(r: int) -> None:
            end = run_plain_burr(plain_graph, f"burr-{r}", persister, seed_state(r))
            assert f"v{nodes - 1:03d}" in end, "baseline did not reach the last node"

        def rewind_round(r: int) -> None:
            run = rw.record(pipeline, seed_state(r), run_id=f"rewind-{r}")
            assert run.status == "completed", run.error

        burr_round(-1)
        rewind_round(-1)
        run_plain_burr(plain_graph, "plain-warm", None, seed_state(-1))

        burr_ms: list[float] = []
        rewind_ms: list[float] = []
        plain_ms: list[float] = []
        for r in range(rounds):
            sides = [("burr", burr_round), ("rewind", rewind_round)]
            if r % 2:
                sides.reverse()
            for which, run_side in sides:
                with timed() as t:
                    run_side(r)
                (burr_ms if which == "burr" else rewind_ms).extend(t)
            with timed() as t:
                run_plain_burr(plain_graph, f"plain-{r}", None, seed_state(r))
            plain_ms.extend(t)
        print(f"plain Burr, no persistence ({nodes} nodes): {spread(plain_ms)}")
        print(f"Burr + SQLitePersister (WAL, NORMAL):      {spread(burr_ms)}")
        print(f"Rewind.record:                             {spread(rewind_ms)}")

        if args.profile:
            print("cProfile of one Rewind.record (cumulative):")
            profile(lambda: rewind_round(rounds))
        persister.connection.close()
        rw.store.close()

    ratio = median(rewind_ms) / median(burr_ms)
    added = (median(rewind_ms) - median(plain_ms)) / nodes
    added_vs_burr = (median(rewind_ms) - median(burr_ms)) / nodes
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    added_verdict = "meets" if added <= TARGET_ADDED_MS_PER_NODE else "MISSES"
    print(
        f"record overhead ratio: {ratio:.2f} ({verdict} target ≤ {TARGET_RATIO}); per node: "
        f"Rewind {median(rewind_ms) / nodes:.3f} ms, Burr+SQLite {median(burr_ms) / nodes:.3f} ms, "
        f"plain Burr {median(plain_ms) / nodes:.3f} ms"
    )
    print(
        f"record adds {added:.3f} ms/node over plain Burr ({added_verdict} target ≤ "
        f"{TARGET_ADDED_MS_PER_NODE} ms), {added_vs_burr:.3f} ms/node over Burr + SQLitePersister"
    )
    return {
        "record_overhead_ratio": round(ratio, 3),
        "record_overhead_target_ratio": TARGET_RATIO,
        "rewind_record_ms_per_node": round(median(rewind_ms) / nodes, 4),
        "burr_sqlite_ms_per_node": round(median(burr_ms) / nodes, 4),
        "plain_burr_ms_per_node": round(median(plain_ms) / nodes, 4),
        "record_added_ms_per_node": round(added, 4),
        "record_added_target_ms_per_node": TARGET_ADDED_MS_PER_NODE,
        "record_added_vs_burr_sqlite_ms_per_node": round(added_vs_burr, 4),
        "nodes": nodes,
        "rounds": rounds,
    }


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
