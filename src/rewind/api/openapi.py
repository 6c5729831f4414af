"""The API's OpenAPI document, written deterministically (the source of the UI's TypeScript types).

``python -m rewind.api.openapi web/openapi.json`` writes the document of :func:`create_app`
(pretty-printed, keys sorted, one newline at the end); ``npm run types`` in ``web/`` runs it and
then ``openapi-typescript`` to generate ``web/src/api-schema.d.ts``. No server is started: the
app is built over a throwaway store and its document read in-process.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["main", "openapi_document", "openapi_text"]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the app (no pipelines, no model client, a throwaway store)."""
    from rewind.api.app import create_app
    from rewind.store import open_store

    with tempfile.TemporaryDirectory(prefix="rewind-openapi-") as tmp:
        store = open_store(Path(tmp) / "store")
        try:
            doc: dict[str, Any] = create_app(store, chat_client=None, pipelines={}).openapi()
        finally:
            store.close()
    return doc


def openapi_text() -> str:
    """:func:`openapi_document` as JSON text: 2-space indent, sorted keys, a final newline."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the document to the path given (``argv[0]``, e.g. ``web/openapi.json``); returns 0.

    Raises:
        SystemExit: no path given (exit status 1, the usage line on standard error).
    """
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-", ""):
        raise SystemExit("usage: python -m rewind.api.openapi OUT.json (e.g. web/openapi.json)")
    Path(args[0]).write_text(openapi_text(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
