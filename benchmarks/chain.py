"""What the benchmarks share: the synthetic chain pipeline, timing and on-disk measurement.

The chain is a linear Burr graph ``n000 → n001 → … → n099``. Node ``i`` reads the field node
``i-1`` wrote (``seed`` for the first), calls the ``bench_step`` tool with two small arguments
derived from it, and writes one small field ``v{i:03d}``. The same graph comes in two flavours:
through Rewind's tool cache (the :class:`rewind.tools.Tool` wrapper) or calling the tool's plain
function directly, which is what the plain-Burr baselines run.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from burr.core import ApplicationBuilder, State, action, default
from burr.core.graph import Graph, GraphBuilder
from burr.core.persistence import SQLitePersister

from rewind.replay import Pipeline
from rewind.tools import tool


def seed_state(value: int = 1) -> dict[str, Any]:
    """Initial state of the chain; a different ``value`` makes every tool call and field new."""
    return {"seed": {"node": "seed", "value": value, "label": f"seed:{value}"}}


SEED_STATE = seed_state()


@tool("bench_step")
def bench_step(node: str, value: int) -> dict[str, Any]:
    """A cheap deterministic tool: mixes ``value`` and names the node (≈50 bytes of JSON)."""
    mixed = (value * 2_654_435_761 + len(node)) % 1_000_003
    return {"node": node, "value": mixed, "label": f"{node}:{mixed % 97}"}


def node_name(i: int) -> str:
    """Name of the i-th node (0-based): ``n000``."""
    return f"n{i:03d}"


def field_name(i: int) -> str:
    """Field the i-th node writes: ``v000``."""
    return f"v{i:03d}"


def _chain_node(i: int, call: Callable[..., dict[str, Any]]) -> Callable[..., State]:
    src = "seed" if i == 0 else field_name(i - 1)
    dst = field_name(i)
    name = node_name(i)

    @action(reads=[src], writes=[dst])
    def step(state: State) -> State:
        return state.update(**{dst: call(node=name, value=state[src]["value"])})

    return step


def chain_graph(nodes: int, *, through_rewind: bool) -> Graph:
    """The linear chain of ``nodes`` tool nodes.

    Args:
        nodes: how many nodes (≥ 1).
        through_rewind: call the tool through Rewind's cache wrapper (True) or its plain
            function (False, the plain-Burr baseline).
    """
    call = bench_step if through_rewind else bench_step.fn
    actions = {node_name(i): _chain_node(i, call) for i in range(nodes)}
    transitions = [(node_name(i), node_name(i + 1), default) for i in range(nodes - 1)]
    return GraphBuilder().with_actions(**actions).with_transitions(*transitions).build()


def chain_pipeline(nodes: int) -> Pipeline:
    """The chain as a Rewind pipeline (tool calls through the cache)."""
    return Pipeline(
        name=f"bench-chain-{nodes}",
        graph=chain_graph(nodes, through_rewind=True),
        entrypoint=node_name(0),
        halt_after=(node_name(nodes - 1),),
    )


def run_plain_burr(
    graph: Graph,
    app_id: str,
    persister: SQLitePersister | None = None,
    state: dict[str, Any] | None = None,
) -> State:
    """Run a linear graph under plain Burr from its first to its last node; returns the end state.

    Args:
        graph: a linear chain (its first action is the entrypoint, its last the halt point).
        app_id: Burr app id (must be new when ``persister`` is given).
        persister: optional Burr state persister.
        state: initial state (default: :data:`SEED_STATE`).
    """
    builder = (
        ApplicationBuilder()
        .with_graph(graph)
        .with_identifiers(app_id=app_id)
        .with_state(**(state if state is not None else SEED_STATE))
        .with_entrypoint(graph.actions[0].name)
    )
    if persister is not None:
        builder = builder.with_state_persister(persister)
    _, _, end = builder.build().run(halt_after=[graph.actions[-1].name])
    return end


def burr_sqlite_persister(db_path: Path) -> SQLitePersister:
    """Burr's own SQLitePersister with WAL and ``synchronous=NORMAL`` set on its connection."""
    persister = SQLitePersister.from_values(str(db_path))
    persister.connection.execute("PRAGMA journal_mode=WAL")
    persister.connection.execute("PRAGMA synchronous=NORMAL")
    persister.initialize()
    return persister


@contextmanager
def timed() -> Iterator[list[float]]:
    """Measure the block's wall time in ms (appended to the yielded list); GC collected before."""
    gc.collect()
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append((time.perf_counter() - start) * 1000)


def median(values: list[float]) -> float:
    """Median of a non-empty list."""
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """``min/median/max`` of timings in ms, for the human-readable lines."""
    return f"min {min(values):.1f} / median {median(values):.1f} / max {max(values):.1f} ms"


def sqlite_bytes(db_path: Path) -> dict[str, int]:
    """Bytes a SQLite database occupies after ``PRAGMA wal_checkpoint(TRUNCATE)``.

    Returns:
        ``files``: the database file plus its ``-wal`` (empty after the checkpoint);
        ``pages``: ``page_count * page_size``; ``free``: bytes of free-list pages.
    """
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        conn.close()
    wal = Path(f"{db_path}-wal")
    files = os.path.getsize(db_path) + (os.path.getsize(wal) if wal.exists() else 0)
    return {"files": files, "pages": pages * page_size, "free": free * page_size}


def profile(fn: Callable[[], Any], *, top: int = 25) -> None:
    """Run ``fn`` once under cProfile and print the ``top`` functions by cumulative time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(fn)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    site = str(Path(pstats.__file__).parent)
    for line in out.getvalue().splitlines():
        if line.strip():
            print("  " + line.replace(site, "<stdlib>"))


def table_bytes(db_path: Path) -> dict[str, int]:
    """Bytes per table and index (SQLite's ``dbstat``), largest first; {} if unavailable."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        ).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    return {name: int(size) for name, size in rows}
