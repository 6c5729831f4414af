"""A trace's step spans packed into its root span row (migration 0012).

A traced step's span row is ~160 bytes of which the run id, a 16-hex span id, three floats and
the same attribute names repeat on every row; nobody queries step spans one by one (readers load
a trace's spans by run id). So :func:`pack_steps` keeps them as one zlib-compressed JSON
document of columns in the root row's ``steps`` column (peerbench's 100-step trace: 200 rows,
~38 KB of pages → ~6.5 KB), and :func:`expand` turns a stored row back into the rows it stands
for: the root row itself and exactly the step rows that were packed, every value as written
(JSON keeps ints, strings, None and floats exactly; ``repr`` round-trips a float). A step span
the ``spans`` table would refuse (a NOT NULL column empty) is not packed: the rows are written
as they are, so the database refuses it as before.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from typing import Any

from rewind.store import schema

STEP_COLUMNS = (
    "position",
    "span_id",
    "parent_position",
    "step_type",
    "status",
    "error_type",
    "error_message",
    "attributes_json",
    "started_at",
    "ended_at",
    "duration_ms",
)
"""The columns of a step span row kept in the pack (``run_id`` is the root's; a step row's
``output_hash`` and ``steps`` are always None)."""
PACK_VERSION = 1
ROOT = -1
"""The root span's position (``rewind.tracing.model.ROOT_POSITION``)."""
_REQUIRED = tuple(c.name for c in schema.spans.columns if not c.nullable and c.name in STEP_COLUMNS)


def packable(rows: Iterable[dict[str, Any]]) -> bool:
    """Whether these step span rows can be packed: none misses a value the table requires, and
    no two share a position (the table's key)."""
    rows = list(rows)
    positions = [row.get("position") for row in rows]
    return len(set(positions)) == len(positions) and all(
        row.get(c) is not None for row in rows for c in _REQUIRED
    )


def pack_steps(rows: list[dict[str, Any]]) -> bytes:
    """The ``steps`` bytes of a root span row for these step span rows (any order)."""
    ordered = sorted(rows, key=lambda r: r["position"])
    doc = {"v": PACK_VERSION, "columns": {c: [r.get(c) for r in ordered] for c in STEP_COLUMNS}}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def pack_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The span rows to insert for a trace's span rows (its root among them): the root row
    carrying every step row packed, or — when a step row is not packable, or there is no root
    — the rows as they are (each with ``steps`` None)."""
    root = [r for r in rows if r["position"] == ROOT]
    steps = [r for r in rows if r["position"] != ROOT]
    if len(root) != 1 or not steps or not packable(steps):
        return [r | {"steps": None} for r in rows]
    return [root[0] | {"steps": pack_steps(steps)}]


def unpack_steps(run_id: str, data: bytes) -> list[dict[str, Any]]:
    """The step span rows (column dicts, ``run_id`` set) a ``steps`` value holds.

    Raises:
        ValueError: the bytes are not a pack this Rewind knows (damaged, or a newer format).
    """
    try:
        doc = json.loads(zlib.decompress(bytes(data)))
    except (zlib.error, ValueError) as exc:
        raise ValueError(f"packed step spans of trace {run_id} are damaged: {exc}") from exc
    if doc.get("v") != PACK_VERSION:
        raise ValueError(f"packed step spans of trace {run_id} have unknown version {doc.get('v')}")
    columns = doc["columns"]
    count = len(columns["position"])
    return [
        {"run_id": run_id, **{c: columns[c][i] for c in STEP_COLUMNS}, "output_hash": None}
        for i in range(count)
    ]


def expand(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored span row (a column dict) as the rows it stands for: itself without ``steps``,
    then its packed step rows, if any."""
    packed = row.pop("steps", None)
    if packed is None:
        return [row]
    return [row, *unpack_steps(row["run_id"], packed)]
