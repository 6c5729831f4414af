"""No table is written outside ``rewind.store`` (issue 9, point 2).

An AST walk of every module of ``rewind`` outside ``rewind/store/``: none imports SQLAlchemy's
``insert``/``update``/``delete`` (nor a dialect's ``insert``), calls ``.insert()``/``.update()``/
``.delete()`` on a ``schema`` table or on the ``sqlalchemy`` module, or holds SQL text that
writes (``INSERT INTO``, ``UPDATE ... SET``, ``DELETE FROM``, ``REPLACE INTO``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from rewind.store import Store, open_store, schema
from rewind.tracing.model import StepData, TraceData
from rewind.tracing.store import load_trace, write_trace

SRC = Path(__file__).resolve().parents[1] / "src"
STORE = SRC / "rewind" / "store"
_WRITES = {"insert", "update", "delete"}
_SQL_WRITE = re.compile(
    r"\b(INSERT\s+(OR\s+[A-Z]+\s+)?INTO|REPLACE\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b"
)


def _is_schema_table(node: ast.expr) -> bool:
    """``schema.<table>`` or ``schema.metadata.tables[...]``-like expressions."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
        if isinstance(node, ast.Name) and node.id == "schema":
            return True
    return False


def table_writes(source: str) -> list[str]:
    """The table writes in a module's source, one line each (``line: what``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            found += [
                f"{node.lineno}: imports {a.name} from {node.module}"
                for a in node.names
                if a.name in _WRITES
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _WRITES
            and (
                _is_schema_table(node.func.value)
                or (
                    isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("sa", "sqlalchemy")
                )
            )
        ):
            found.append(
                f"{node.lineno}: calls .{node.func.attr}() on {ast.unparse(node.func.value)}"
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _SQL_WRITE.search(node.value)
            if match:
                found.append(f"{node.lineno}: SQL text {match.group(0)!r}")
    return found


def test_no_table_is_written_outside_store() -> None:
    """Every module outside ``rewind/store/`` writes rows only through the store's functions."""
    offenders = {}
    for path in sorted((SRC / "rewind").rglob("*.py")):
        if path.is_relative_to(STORE):
            continue
        writes = table_writes(path.read_text(encoding="utf-8"))
        if writes:
            offenders[str(path.relative_to(SRC))] = writes
    assert offenders == {}, "tables written outside rewind/store/ (move them behind a Store method)"


def test_the_check_sees_each_kind_of_write() -> None:
    """The walk flags the writes this test forbids (so the test above can fail)."""
    samples = {
        "from sqlalchemy import insert": "imports insert",
        "from sqlalchemy.dialects.sqlite import insert as ins": "imports insert",
        "conn.execute(schema.jobs.update().values(state='x'))": "calls .update()",
        "conn.execute(sqlalchemy.delete(t))": "calls .delete()",
        "conn.execute(text('DELETE FROM jobs WHERE job_id = :j'))": "SQL text",
        "conn.exec_driver_sql('INSERT OR IGNORE INTO spans VALUES (?)')": "SQL text",
        "sql = 'UPDATE runs SET status = 1'": "SQL text",
    }
    for source, kind in samples.items():
        writes = table_writes(source)
        assert len(writes) == 1 and kind in writes[0], (source, writes)
    # Reads, prose and list/dict methods are not writes.
    harmless = (
        "from sqlalchemy import select\n"
        "merged.insert(0, key)\n"
        "seen.update(other)\n"
        "'DELETE /runs/{id} deletes a run'\n"
        "conn.execute(select(schema.jobs))\n"
    )
    assert table_writes(harmless) == []


def _trace(trace_id: str, span_id: Any) -> TraceData:
    steps = [
        StepData(0, "retrieve", "retrieval", fields={"retrieve": ["doc"]}, span_id="a" * 16),
        StepData(1, "answer", "llm_call", fields={"answer": "yes"}, span_id=span_id),
    ]
    return TraceData(
        trace_id=trace_id,
        name="qa",
        status="success",
        input={"question": "q"},
        started_at=1_700_000_000.0,
        ended_at=1_700_000_001.0,
        steps=steps,
    )


def _rows_of(store: Store, run_id: str) -> dict[str, int]:
    counts = {}
    with store.read() as conn:
        for table in (schema.runs, schema.nodes, schema.spans):
            query = select(func.count()).select_from(table).where(table.c.run_id == run_id)
            counts[table.name] = conn.execute(query).scalar_one()
        st = schema.burr_state
        query = select(func.count()).select_from(st).where(st.c.app_id == run_id)
        counts[st.name] = conn.execute(query).scalar_one()
    return counts


def test_a_trace_and_its_spans_are_written_in_one_transaction(tmp_path: Path) -> None:
    """Span rows go through Store.write_batch with the trace's other rows: a span row the
    database refuses (the last rows written) leaves nothing of the trace behind."""
    store = open_store(tmp_path / "store")
    try:
        write_trace(store, _trace("1" * 32, "b" * 16))
        # no state rows: both steps completed (their states are their state documents); one
        # span row, the root's, carrying the two step spans (rewind.store.spans)
        assert _rows_of(store, "1" * 32) == {"runs": 1, "nodes": 2, "spans": 1, "burr_state": 0}
        with pytest.raises(IntegrityError):
            write_trace(store, _trace("2" * 32, None))  # spans.span_id is NOT NULL
        assert _rows_of(store, "2" * 32) == {"runs": 0, "nodes": 0, "spans": 0, "burr_state": 0}
        assert load_trace(store, "1" * 32).steps[1].span_id == "b" * 16
    finally:
        store.close()
