"""Artifact routes: the files a run published, and one file's bytes (looked up by its recorded
name, never used as a path; hash-checked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from rewind.api import models as m
from rewind.api.context import Ctx
from rewind.api.models import typed
from rewind.api.schemas import LOOKUP_ERRORS, SERVER_ERRORS, error_responses, response_header
from rewind.canonical import sha256_hex
from rewind.errors import StoreError, UnknownNode
from rewind.store import Store

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))

_ARTIFACT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the artifact's bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "X-Content-SHA256": response_header("sha256 of the bytes sent"),
            "X-Recorded-SHA256": response_header(
                "sha256 the run recorded (differs: the file changed since)"
            ),
        },
    }
}


@router.get(
    "/runs/{run_id}/artifacts", tags=["artifacts"], responses=LOOKUP_ERRORS, **typed(m.ArtifactList)
)
def list_artifacts(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """Files the run published (name, sha256, size, download URL)."""
    run = ctx.resolve(run_id)
    return {
        "run_id": run.run_id,
        "artifacts": [artifact_json(run.run_id, a) for a in ctx.store.artifacts_of(run.run_id)],
    }


@router.get(
    "/runs/{run_id}/artifacts/{name}",
    tags=["artifacts"],
    response_class=Response,
    responses=_ARTIFACT | LOOKUP_ERRORS | error_responses(500),
)
def download_artifact(ctx: Ctx, run_id: str, name: str) -> FileResponse:
    """Download an artifact by name, looked up in the run's artifact records (the name is
    never used as a path)."""
    run = ctx.resolve(run_id)
    found = next((a for a in ctx.store.artifacts_of(run.run_id) if a["name"] == name), None)
    if found is None:
        raise UnknownNode(
            f"run {run.run_id[:12]} has no artifact {name!r}",
            "list them with GET /api/runs/{id}/artifacts",
            field="name",
        )
    path = Path(found["path"]).resolve()
    root = ctx.store.root.resolve()
    if not path.is_relative_to(root):
        raise StoreError(f"artifact {name!r} is missing from the store folder", "")
    if path.is_file():
        data = path.read_bytes()
    elif ctx.store.objects is not None:  # published by a worker elsewhere: the object's copy
        data = _artifact_object(ctx.store, run.run_id, found)
    else:
        raise StoreError(f"artifact {name!r} is missing from the store folder", "")
    actual = sha256_hex(data)
    headers = {
        "X-Content-SHA256": actual,
        "X-Recorded-SHA256": found["sha256"],
        "Content-Disposition": f'attachment; filename="{found["name"]}"',
    }
    if actual != found["sha256"]:
        # The file changed after the run wrote it: never vouch for it with the old hash.
        headers["Warning"] = '199 rewind "artifact differs from what the run recorded"'
    return Response(data, media_type="application/octet-stream", headers=headers)


def _artifact_object(store: Store, run_id: str, found: dict[str, Any]) -> bytes:
    """An artifact's bytes from the object store's copy (hash-verified).

    Raises:
        StoreError: the object is missing, unreadable or does not match the recorded sha256.
    """
    from rewind.store.objects import artifact_key

    objects = store.objects
    assert objects is not None
    ref = f"{objects.url}/{artifact_key(run_id, found['name'])}"
    return objects.get_object(ref, found["sha256"])


def artifact_json(run_id: str, a: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": a["name"],
        "sha256": a["sha256"],
        "size": a["size"],
        "url": f"/api/runs/{run_id}/artifacts/{a['name']}",
    }
