"""Artifacts: files a run publishes, stored under the store's folder and referenced by hash.

DESIGN rule 4: the hash of an artifact is the hash of its bytes; the run-scoped path is recorded
in the ``artifacts`` table, never inside the node's hashed output, so the same bytes published by
a parent and by its replay hash the same.

Publishing is a side effect whose resource is the run's artifact folder: the call is recorded with
pre/post fingerprints of that folder, so ``rewind audit`` can tell whether the folder still holds
what the run wrote. On a replay in ``recorded`` mode the call is not re-executed; Rewind
materializes the recorded bytes into the replay's own folder (its verdict is ``not-re-executed``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rewind.context import current
from rewind.effects import FileTree
from rewind.errors import RewindError

ARTIFACT_TOOL = "rewind.publish"


def artifact_dir(run_id: str) -> Path:
    """The artifact folder of a run of the current store (run-scoped: never hashed)."""
    ctx = current()
    if ctx is None:
        raise RewindError("artifacts can only be published inside a Rewind run", "")
    return ctx.store.root / "artifacts" / run_id


def _resources(name: str, content: str) -> list[FileTree]:
    ctx = current()
    return [] if ctx is None else [FileTree(artifact_dir(ctx.run_id))]


def _materialize(request: bytes, result: bytes) -> None:
    ctx = current()
    if ctx is None:
        return
    args = json.loads(request)
    ctx.store.put_artifact(ctx.run_id, args["name"], args["content"].encode("utf-8"))


def _write(name: str, content: str) -> dict[str, Any]:
    ctx = current()
    if ctx is None:
        raise RewindError("artifacts can only be published inside a Rewind run", "")
    data = content.encode("utf-8")
    digest, _ = ctx.store.put_artifact(ctx.run_id, name, data)
    return {"name": name, "sha256": digest, "bytes": len(data)}


def _tool() -> Any:
    from rewind.tools import tool

    return tool(
        ARTIFACT_TOOL,
        determinism="side-effect",
        resources=_resources,
        on_served=_materialize,
    )(_write)


_publish_tool = _tool()


def publish(name: str, content: str) -> dict[str, Any]:
    """Write a text artifact of the current run and return its hashable description.

    A side-effecting call (resource: the run's artifact folder), recorded with pre/post
    fingerprints of that folder.

    Args:
        name: a plain file name (``report.md``); never a path.
        content: the artifact's text (stored as UTF-8 bytes).
    Returns:
        ``{"name": name, "sha256": hex of the bytes, "bytes": size}`` — no path, no run id.
    Raises:
        RewindError: called outside a Rewind run, or the name is not a plain file name.
    """
    if current() is None:
        raise RewindError("artifacts can only be published inside a Rewind run", "")
    result: dict[str, Any] = _publish_tool(name, content)
    return result
