"""The built browser UI: ``/`` (the page shell, no data), ``/assets``, ``/favicon.svg``; a page
saying how to build it when it is missing."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "install_static"]

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

_NOT_BUILT = """<!doctype html><meta charset="utf-8"><title>Rewind</title>
<body style="font-family:sans-serif;max-width:40rem;margin:3rem auto">
<h1>Rewind</h1><p>The API is up (<a href="/openapi.json">/openapi.json</a>), but the browser UI
has not been built. Build it with:</p><pre>cd web &amp;&amp; npm ci &amp;&amp; npm run build</pre>
</body>"""


def install_static(app: FastAPI, static_dir: Path) -> None:
    index = static_dir / "index.html"
    assets = static_dir / "assets"
    if assets.is_dir():
        app.mount("/assets", StaticFiles(directory=assets), name="assets")

    @app.get("/", include_in_schema=False)
    def ui() -> Response:
        if not index.is_file():
            return HTMLResponse(_NOT_BUILT)
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.svg", include_in_schema=False)
    def favicon() -> Response:
        icon = static_dir / "favicon.svg"
        if not icon.is_file():
            raise StarletteHTTPException(404, "no favicon")
        return FileResponse(icon)
