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
