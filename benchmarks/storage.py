"""Bytes on disk: Rewind's content-addressed store versus Burr's SQLitePersister.

The pipeline is a linear chain of 200 nodes over a state of 20 fields of about 5 KB each
(≈100 KB). Node ``i`` rewrites field ``f{i % 20}``: it reads the field's revision and calls the
``bench_rewrite`` tool, which returns a new ≈5 KB value (one of four realistic shapes: prose
notes, weather records, a chat transcript, a markdown table; seeded, so reruns are identical).
So exactly one field changes per step, 200 steps.

- baseline: plain Burr with ``SQLitePersister`` (WAL, ``synchronous=NORMAL``), tool functions
  called directly; it stores the whole state as one JSON document per step;
- subject: :meth:`Rewind.record` into a fresh store. The **whole** Rewind database is counted:
  runs, nodes, calls, edges, the tool cache, blobs (state fields, tool requests/results, node
  inputs/outputs, the initial state) and state rows.

Bytes are the database file plus its ``-wal`` after ``PRAGMA wal_checkpoint(TRUNCATE)`` (with
both connections closed). Figure (last line, JSON): ``storage_ratio`` = Rewind bytes / Burr bytes
(target ≤ 0.10), plus both byte counts and Rewind's bytes per table.

A second figure, for traced chains: peerbench's agent loop (``benchmarks/trace_replay.py``: an
``llm_call`` step to a loopback model stub, then a ``tool_call`` step; 100 steps) recorded with
``Tracer`` into a fresh store: ``trace_bytes`` (every file of the store folder, after the tracer
closed) and its bytes per table/index (peerbench's "stored bytes"; the smallest peer's: 129 KB).

Run: ``.venv/bin/python benchmarks/storage.py [--quick] [--trace-steps N]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from burr.core import State, action, default
from burr.core.graph import Graph, GraphBuilder

from chain import burr_sqlite_persister, run_plain_burr, sqlite_bytes, table_bytes
from rewind.canonical import canonical_bytes
from rewind.replay import Pipeline, Rewind
from rewind.tools import tool

TARGET_RATIO = 0.10
FIELDS = 20
FIELD_BYTES = 5_000
VOCABULARY_TEXT = (
    "the a of and to in is was for on that with as by at from this be are were it an which "
    "rain drizzle fog sun snow wind cloud storm weather station seattle winter spring summer "
    "autumn morning evening night daily weekly monthly annual mean median maximum minimum "
    "temperature precipitation humidity pressure degrees millimetres recorded measured observed "
    "reported analysis trend anomaly increase decrease higher lower warmer colder wetter drier "
    "than previous following average total count share table column row group dataset source "
    "noaa model estimate verify claim number value result summary report draft revision critique "
    "suggests indicates shows confirms contradicts supports because however therefore although "
    "while during after before between across most least several many few each every record"
)
VOCABULARY = VOCABULARY_TEXT.split()
WEATHER = ("rain", "sun", "fog", "drizzle", "snow")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(VOCABULARY) for _ in range(rng.randint(8, 22))]
    if rng.random() < 0.5:
        words.insert(rng.randrange(len(words)), f"{rng.uniform(-10, 40):.1f}")
    return " ".join(words).capitalize() + "."


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2012, 2015)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _item(kind: str, rng: random.Random) -> Any:
    if kind == "notes":
        return " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))
    if kind == "records":
        return {
            "date": _date(rng),
            "precipitation": round(rng.expovariate(0.4), 1),
            "temp_max": round(rng.uniform(-2, 35), 1),
            "temp_min": round(rng.uniform(-8, 20), 1),
            "wind": round(rng.uniform(0, 9), 1),
            "weather": rng.choice(WEATHER),
        }
    if kind == "transcript":
        return {"role": rng.choice(("user", "assistant")), "content": _sentence(rng)}
    row = [rng.choice(WEATHER), f"{rng.uniform(0, 30):.2f}", str(rng.randint(0, 400))]
    return "| " + " | ".join([_date(rng), *row]) + " |"


def field_value(field: str, revision: int) -> dict[str, Any]:
    """A ≈5 KB realistic value for ``field`` at ``revision`` (deterministic)."""
    seed = int.from_bytes(hashlib.sha256(f"{field}:{revision}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    kind = ("notes", "records", "transcript", "table")[int(field[1:]) % 4]
    items: list[Any] = []
    size = 60
    while size < FIELD_BYTES:
        item = _item(kind, rng)
        items.append(item)
        size += len(canonical_bytes(item)) + 1
    return {"kind": kind, "revision": revision, "items": items}


@tool("bench_rewrite")
def bench_rewrite(field: str, revision: int) -> dict[str, Any]:
    """Rewrite one state field: its next revision (≈5 KB of JSON)."""
    return field_value(field, revision)


def initial_state() -> dict[str, Any]:
    """20 fields ``f00``…``f19`` of ≈5 KB each, revision 0."""
    return {f"f{i:02d}": field_value(f"f{i:02d}", 0) for i in range(FIELDS)}


def _rewrite_node(field: str, through_rewind: bool) -> Any:
    call = bench_rewrite if through_rewind else bench_rewrite.fn

    @action(reads=[field], writes=[field])
    def rewrite(state: State) -> State:
        return state.update(**{field: call(field=field, revision=state[field]["revision"] + 1)})

    return rewrite


def rewrite_graph(steps: int, *, through_rewind: bool) -> Graph:
    """Linear chain ``s000 → …``; node i rewrites field ``f{i % 20}``."""
    actions = {
        f"s{i:03d}": _rewrite_node(f"f{i % FIELDS:02d}", through_rewind) for i in range(steps)
    }
    transitions = [(f"s{i:03d}", f"s{i + 1:03d}", default) for i in range(steps - 1)]
    return GraphBuilder().with_actions(**actions).with_transitions(*transitions).build()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version for smoke tests")
    parser.add_argument("--steps", type=int, default=None, help="default 200")
    parser.add_argument("--trace-steps", type=int, default=None, help="default 100")
    args = parser.parse_args(argv)
    traced = trace_bytes(args.trace_steps or (20 if args.quick else 100))
    steps = args.steps or (20 if args.quick else 200)
    state = initial_state()
    state_kb = len(canonical_bytes(state)) / 1000

    with tempfile.TemporaryDirectory(prefix="rewind-bench-") as tmp:
        burr_db = Path(tmp) / "burr.db"
        persister = burr_sqlite_persister(burr_db)
        end = run_plain_burr(
            rewrite_graph(steps, through_rewind=False), "burr-run", persister, state
        )
        persister.connection.close()

        rewind_dir = Path(tmp) / "store"
        rw = Rewind(rewind_dir)
        pipeline = Pipeline(
            name="bench-storage",
            graph=rewrite_graph(steps, through_rewind=True),
            entrypoint="s000",
            halt_after=(f"s{steps - 1:03d}",),
        )
        run = rw.record(pipeline, state)
        assert run.status == "completed", run.error
        final = rw.node_state(rw.store.nodes_of(run.run_id)[-1])
        assert canonical_bytes(final) == canonical_bytes(
            {k: v for k, v in end.get_all().items() if not k.startswith("__")}
        ), "Rewind and Burr ended in different states"
        rw.store.close()

        burr = sqlite_bytes(burr_db)
        rewind_db = rewind_dir / "rewind.db"
        rewind = sqlite_bytes(rewind_db)
        tables = table_bytes(rewind_db)
        burr_tables = table_bytes(burr_db)

    ratio = rewind["files"] / burr["files"]
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"state: {FIELDS} fields, {state_kb:.1f} KB canonical JSON; {steps} steps, 1 field each")
    print(
        f"Burr SQLitePersister: {burr['files'] / 1e6:.2f} MB "
        f"({burr['pages'] / 1e6:.2f} MB in pages, {burr['free'] / 1e3:.0f} KB free)"
    )
    print(
        f"Rewind store:         {rewind['files'] / 1e6:.2f} MB "
        f"({rewind['pages'] / 1e6:.2f} MB in pages, {rewind['free'] / 1e3:.0f} KB free)"
    )
    if tables:
        print("Rewind bytes by table/index: " + ", ".join(f"{k} {v:,}" for k, v in tables.items()))
    if burr_tables:
        print(
            "Burr bytes by table/index:   "
            + ", ".join(f"{k} {v:,}" for k, v in burr_tables.items())
        )
    print(f"storage ratio: {ratio:.3f} ({verdict} target ≤ {TARGET_RATIO})")
    print(
        f"traced chain, {traced['trace_steps']} steps: {traced['trace_bytes']:,} B; "
        + "by table/index: "
        + ", ".join(f"{k} {v:,}" for k, v in traced["tables"].items())
    )
    return {
        "storage_ratio": round(ratio, 4),
        "storage_target_ratio": TARGET_RATIO,
        "rewind_bytes": rewind["files"],
        "burr_bytes": burr["files"],
        # blob rows and the long packed bytes SQLite keeps beside them (migration 0011)
        "rewind_blob_bytes": sum(
            tables.get(k, 0) for k in ("blobs", "blob_data", "sqlite_autoindex_blob_data_1")
        ),
        "steps": steps,
        "fields": FIELDS,
        "trace_bytes": traced["trace_bytes"],
        "trace_steps": traced["trace_steps"],
    }


def trace_bytes(steps: int) -> dict[str, Any]:
    """Record peerbench's agent loop of ``steps`` steps as one trace into a fresh store (the
    model stub in a child process); its bytes on disk and bytes per table/index."""
    with tempfile.TemporaryDirectory(prefix="rewind-trace-bytes-") as tmp:
        record_trace(Path(tmp), steps)
        files = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        tables = table_bytes(Path(tmp) / "rewind.db")
    return {"trace_steps": steps, "trace_bytes": files, "tables": tables}


def record_trace(folder: Path, steps: int) -> None:
    """Record peerbench's agent loop of ``steps`` steps as one trace into the store at
    ``folder`` (the model stub in a child process for the duration)."""
    from rewind.llm import ChatClient, Endpoint, RetryPolicy
    from rewind.tracing import Tracer

    # trace_replay puts the repository root on sys.path (tests.model_stub, run as a script)
    from trace_replay import _TRACED_TOOL, STUB_MODEL, StubProcess, run_agent, traced_llm

    stub = StubProcess()
    try:
        endpoint = Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL)
        client = ChatClient(endpoint, retry=RetryPolicy(attempts=1))
        tracer = Tracer(folder, chat_client=client, raise_on_write_error=True)
        with tracer.trace("bench-trace-bytes"):
            run_agent(traced_llm, _TRACED_TOOL, steps)
        tracer.close()
        client.close()
    finally:
        stub.close()


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
