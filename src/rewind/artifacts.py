"""Artifacts: files a run publishes, stored under the store's folder and referenced by hash.

DESIGN rule 4: the hash of an artifact is the hash of its bytes; the run-scoped path is recorded
in the ``artifacts`` table, never inside the node's hashed output, so the same bytes published by
a parent and by its replay hash the same.
"""

from __future__ import annotations

from typing import Any

from rewind.context import current
from rewind.errors import RewindError


def publish(name: str, data: bytes) -> dict[str, Any]:
    """Write an artifact of the current run and return its hashable description.

    Args:
        name: a plain file name (``report.md``); never a path.
        data: the artifact's bytes.
    Returns:
        ``{"name": name, "sha256": hex, "bytes": size}`` — no path, no run id.
    Raises:
        RewindError: called outside a Rewind run, or the name is not a plain file name.
    """
    ctx = current()
    if ctx is None:
        raise RewindError("artifacts can only be published inside a Rewind run", "")
    digest, _ = ctx.store.put_artifact(ctx.run_id, name, data)
    return {"name": name, "sha256": digest, "bytes": len(data)}
