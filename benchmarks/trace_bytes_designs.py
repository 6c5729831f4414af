"""What leaner trace formats would store: prototypes measured on a copy of a recorded store.

Not Rewind code: each variant rewrites a copy of a store holding peerbench's 100-step trace
(``storage.record_trace``) into a candidate format with plain SQL, ``VACUUM``s it and counts its
pages, so a design can be sized before its readers are written (issue #13: peerbench's smallest
peer stores 129,020 B). Readers and the guarantees (content addressing, gc, fork/replay/verify)
are NOT prototyped; only the bytes are.

- base: the store as Rewind writes it (vacuumed, to compare like with like);
- A: packed blobs (codec ``p-...``) indexed by an 8-byte hash prefix instead of a full-hash row
  (the full hash checked by hashing the content a prefix finds);
- B: a trace's node and call rows as one zlib document (hashes inside as raw bytes);
- D1: one zlib document per trace with its nodes, calls, cache entries and blob locations,
  each 32-byte hash stored once (a raw list; documents name hashes by index) + 8-byte-prefix
  indexes of blobs and cache keys;
- D2: D1 without the blobs' hashes: a blob's hash is the sha256 of its content, so it is
  recomputed on read (only cache keys, which are not a hash of one stored blob, stay whole).

Run: ``.venv/bin/python benchmarks/trace_bytes_designs.py [--quick] [STORE.db]`` (no store: record
a 100-step trace, 20 with ``--quick``, into a temporary folder first). Figure (last line, JSON):
``smallest_design_vs_peer_ratio`` = the smallest variant's bytes / 129,020, and every variant's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

PEER_BYTES = 129_020
_TRIGGERS = ("nodes_immutable_delete", "nodes_immutable_update", "calls_immutable_update")
_PACKED = "codec LIKE 'p-%'"


def pages(db: Path) -> tuple[int, dict[str, int]]:
    """The page count of ``db`` and the pages of each table/index holding more than one."""
    conn = sqlite3.connect(db)
    try:
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        per = conn.execute("SELECT name, count(*) FROM dbstat GROUP BY name HAVING count(*) > 1")
        return count, dict(per.fetchall())
    finally:
        conn.close()


def variant(source: Path, work: Path, name: str, change: Callable[[Any], None]) -> dict:
    """``change`` applied to a copy of ``source``, vacuumed; its size."""
    db = work / f"{name}.db"
    shutil.copy(source, db)
    conn = sqlite3.connect(db)
    change(conn)
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    count, per = pages(db)
    return {"variant": name, "bytes": count * 1024, "pages": count, "tables": per}


def unchanged(conn: Any) -> None:
    """The store as it is."""


def prefix_index(conn: Any) -> None:
    """A: packed blobs' rows → (8-byte prefix, codec, pack slice) rows."""
    conn.execute(
        "CREATE TABLE blob_index (prefix BLOB, codec TEXT, slice BLOB,"
        " PRIMARY KEY (prefix, slice)) WITHOUT ROWID"
    )
    rows = conn.execute(f"SELECT hash, codec, data FROM blobs WHERE {_PACKED}").fetchall()
    conn.executemany("INSERT INTO blob_index VALUES (?, ?, ?)", [(h[:8], c, d) for h, c, d in rows])
    conn.execute(f"DELETE FROM blobs WHERE {_PACKED}")


def _drop_rows(conn: Any, tables: tuple[str, ...]) -> None:
    for trigger in _TRIGGERS:
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for table in tables:
        conn.execute(f"DELETE FROM {table}")


def _columns(conn: Any, sql: str, args: tuple, encode: Callable[[Any], Any]) -> dict:
    cur = conn.execute(sql, args)
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    return {n: [encode(r[i]) for r in rows] for i, n in enumerate(names) if n != "run_id"}


def trace_rows(conn: Any) -> None:
    """B: each trace's node and call rows → one zlib document (raw hashes inside)."""
    conn.execute("CREATE TABLE trace_rows (run_id TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID")
    hashes: list[bytes] = []

    def encode(value: Any) -> Any:
        if isinstance(value, bytes):
            hashes.append(value)
            return len(hashes) - 1
        return value

    for (run,) in conn.execute("SELECT DISTINCT run_id FROM nodes").fetchall():
        hashes.clear()
        doc = {
            t: _columns(conn, f"SELECT * FROM {t} WHERE run_id = ?", (run,), encode)
            for t in ("nodes", "calls")
        }
        data = json.dumps(doc, separators=(",", ":")).encode() + b"".join(hashes)
        conn.execute("INSERT INTO trace_rows VALUES (?, ?)", (run, zlib.compress(data, 9)))
    _drop_rows(conn, ("nodes", "calls"))


def per_trace(conn: Any, *, blob_hashes: bool) -> None:
    """D1 (``blob_hashes``) / D2: one document per trace; prefix indexes of blobs and keys."""
    blobs = conn.execute(f"SELECT hash, codec, data FROM blobs WHERE {_PACKED} ORDER BY hash")
    blob_rows = blobs.fetchall()
    slot = {h: i for i, (h, _c, _d) in enumerate(blob_rows)}
    keys: dict[bytes, int] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, bytes) and len(value) == 32:
            return slot[value] if value in slot else -1 - keys.setdefault(value, len(keys))
        return value

    for table in ("blob_index", "cache_index"):
        conn.execute(
            f"CREATE TABLE {table} (prefix BLOB, trace INTEGER, slot INTEGER,"
            " PRIMARY KEY (prefix, trace, slot)) WITHOUT ROWID"
        )
    conn.execute(
        "CREATE TABLE trace_docs (run_id TEXT PRIMARY KEY, data BLOB, digests BLOB) WITHOUT ROWID"
    )
    runs = conn.execute("SELECT DISTINCT run_id FROM nodes").fetchall()
    for trace, (run,) in enumerate(runs):
        doc: dict[str, Any] = {
            t: _columns(conn, f"SELECT * FROM {t} WHERE run_id = ?", (run,), encode)
            for t in ("nodes", "calls")
        }
        for t in ("llm_cache", "tool_cache"):  # one trace in the store: every entry is its own
            doc[t] = _columns(conn, f"SELECT * FROM {t}", (), encode)
        doc["blobs"] = [(c, d.hex()) for _h, c, d in blob_rows]
        digests = b"".join(sorted(keys, key=keys.__getitem__))
        if blob_hashes:
            digests += b"".join(h for h, _c, _d in blob_rows)
        data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 9)
        conn.execute("INSERT INTO trace_docs VALUES (?, ?, ?)", (run, data, digests))
        index = [(h[:8], trace, i) for h, i in slot.items()]
        conn.executemany("INSERT INTO blob_index VALUES (?, ?, ?)", index)
        index = [(k[:8], trace, i) for k, i in keys.items()]
        conn.executemany("INSERT INTO cache_index VALUES (?, ?, ?)", index)
    _drop_rows(conn, ("nodes", "calls", "llm_cache", "tool_cache"))
    conn.execute(f"DELETE FROM blobs WHERE {_PACKED}")


def measure(source: Path, work: Path) -> list[dict]:
    """Every variant's size (see the module doc)."""
    return [
        variant(source, work, "base", unchanged),
        variant(source, work, "A-prefix-index", prefix_index),
        variant(source, work, "B-trace-rows", trace_rows),
        variant(source, work, "A+B", lambda c: (prefix_index(c), trace_rows(c))),
        variant(source, work, "D1-hashes-once", lambda c: per_trace(c, blob_hashes=True)),
        variant(source, work, "D2-blob-hashes-derived", lambda c: per_trace(c, blob_hashes=False)),
    ]


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", help="a rewind.db holding a trace (default: record)")
    parser.add_argument("--quick", action="store_true", help="record 20 steps, not 100")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rewind-designs-") as tmp:
        work = Path(tmp)
        if args.store:
            source = Path(args.store)
        else:
            from storage import record_trace

            record_trace(work / "store", 20 if args.quick else 100)
            source = work / "store" / "rewind.db"
        written = pages(source)[0] * 1024
        print(f"as written: {written:,} B (smallest peer: {PEER_BYTES:,} B)")
        results = measure(source, work)
    for r in results:
        mark = "≤ peer" if r["bytes"] <= PEER_BYTES else "> peer"
        print(f"{r['variant']:>24}: {r['bytes']:>9,} B {mark}  {r['tables']}")
    smallest = min(r["bytes"] for r in results)
    return {
        "smallest_design_vs_peer_ratio": round(smallest / PEER_BYTES, 4),
        "written_bytes": written,
        "variants": {r["variant"]: r["bytes"] for r in results},
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
