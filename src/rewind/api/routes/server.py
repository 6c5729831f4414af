"""Server routes: health, settings (the effective configuration, never secrets), the pipelines runs
can be started of.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import APIRouter

import rewind
from rewind.api import access
from rewind.api import models as m
from rewind.api.context import Ctx, ServerContext
from rewind.api.effective import effective_config
from rewind.api.models import typed
from rewind.api.schemas import SERVER_ERRORS, error_responses

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))


@router.get("/health", tags=["server"], **typed(m.Health))
def health(ctx: Ctx) -> dict[str, Any]:
    """Liveness: the store answers; runs in flight."""
    with ctx.store.read() as conn:
        conn.exec_driver_sql("SELECT 1")
    return {
        "status": "ok",
        "version": rewind.__version__,
        "runs_in_flight": len(ctx.manager.active()),
        "reports_in_flight": len(ctx.reports.active()),
        "execution": ctx.manager.execution(),
        "interrupted_at_start": ctx.interrupted_at_start if access.current().admin else [],
        "uptime_s": round(time.time() - ctx.started_at, 1),
    }


@router.get("/settings", tags=["server"], **typed(m.Settings))
def settings(ctx: Ctx) -> dict[str, Any]:
    """Model endpoint, model, temperature default, store location (never secrets), and
    ``effective``: each setting in force with where it came from."""
    out = _settings(ctx)
    out["effective"] = effective_config(out, ctx.store, token_required=ctx.auth_on())
    return out


@router.get("/pipelines", tags=["runs"], **typed(m.PipelineList))
def list_pipelines(ctx: Ctx) -> dict[str, Any]:
    """Pipelines runs can be started of, with their nodes and edges."""
    out = []
    for entry in ctx.pipelines.values():
        p = entry.build()
        out.append(
            {
                "name": entry.name,
                "description": entry.description,
                "inputs": dict(entry.inputs),
                "nodes": p.node_names(),
                "edges": [{"src": s, "dst": d, "condition": c} for s, d, c in p.edges()],
            }
        )
    return {"pipelines": out}


def model_name(client: Any) -> str | None:
    endpoint = getattr(client, "endpoint", None)
    return getattr(endpoint, "model", None)


def _settings(ctx: ServerContext) -> dict[str, Any]:
    from rewind.examples import research
    from rewind.localmodel import DEFAULT_MODEL_ALIAS
    from rewind.session import LazyChatClient

    client = ctx.chat_client
    endpoint = getattr(client, "endpoint", None)
    base_url = getattr(endpoint, "base_url", None)
    env_url = os.environ.get("REWIND_BASE_URL", "").strip()
    if client is None:
        kind, url = "none", None
    elif not isinstance(client, LazyChatClient):
        kind, url = "client", base_url
    elif base_url:
        kind, url = ("configured" if env_url else "embedded"), base_url
    elif env_url:
        kind, url = "configured", env_url
    else:
        kind, url = "embedded", None
    model = model_name(client) or os.environ.get("REWIND_MODEL") or DEFAULT_MODEL_ALIAS
    return {
        "model_endpoint": {
            "kind": kind,
            "base_url": url,
            "description": {
                "embedded": "SmolLM2-135M-Instruct served by llama-cpp-python on a free "
                "127.0.0.1 port, started on the first cache miss",
                "configured": "REWIND_BASE_URL (an OpenAI-compatible endpoint)",
                "none": "no model client: LLM nodes fail",
                "client": "the model client this server was created with",
            }[kind],
            "started": bool(getattr(client, "started", base_url is not None)),
            "api_key_set": bool(os.environ.get("REWIND_API_KEY", "").strip()),
        },
        "model": model,
        "temperature_default": research.DEFAULT_TEMPERATURE,
        "store": {
            "root": str(ctx.store.root),
            "database": ctx.store.engine.url.render_as_string(hide_password=True),
            "dialect": ctx.store.engine.dialect.name,
        },
        "auth": {
            "token_required": ctx.auth_on(),
            "user": access.current().name,
            "admin": access.current().admin,
        },
        "workers": len(ctx.manager._threads),
        "version": rewind.__version__,
        "pipelines": sorted(ctx.pipelines),
    }


# -- static UI ---------------------------------------------------------------------------------
