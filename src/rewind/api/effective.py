"""The effective configuration of a server, as Settings shows it: each setting's value in force
and where it came from (an environment variable, the server's options, or the default).

Secrets are never shown: an API key or token is reported only as set or not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rewind.store import Store
from rewind.store.store import OBJECTS_ENV
from rewind.store.users import has_users


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _row(name: str, value: Any, source: str, note: str = "") -> dict[str, Any]:
    return {"name": name, "value": value, "source": source, "note": note}


def effective_config(
    settings: Mapping[str, Any], store: Store, *, token_required: bool
) -> list[dict[str, Any]]:
    """Each setting in force as ``{"name", "value", "source", "note"}``.

    Args:
        settings: the server's settings document (``GET /api/settings`` without this list).
        store: the server's store (its database, object storage and users).
        token_required: whether API requests need a bearer token now.
    Returns:
        rows in display order; ``source`` is an environment variable name, ``"server"`` (an
        option the server was started with) or ``"default"``.
    """
    endpoint = settings["model_endpoint"]
    kind = endpoint["kind"]
    endpoint_source = {
        "configured": "REWIND_BASE_URL",
        "embedded": "default",
        "client": "server",
        "none": "server",
    }[kind]
    model_source = "default"
    if _env("REWIND_MODEL"):
        model_source = "REWIND_MODEL"
    elif kind == "client":
        model_source = "server"
    capture = _env("REWIND_HTTP_CAPTURE").lower()
    schema_style = _env("REWIND_JSON_SCHEMA_STYLE")
    objects = store.objects
    users = has_users(store)
    if users:
        auth = "users: each request needs the bearer token of a user (rewind user add)"
    elif token_required:
        auth = "server token: each request needs the token the server was started with"
    else:
        auth = "none: loopback only, no token"
    auth_source = "users" if users else "server" if token_required else "default"
    return [
        _row("model endpoint", endpoint["base_url"] or endpoint["description"], endpoint_source),
        _row("model", settings["model"], model_source),
        _row(
            "model API key",
            "set (not shown)" if endpoint["api_key_set"] else "not set",
            "REWIND_API_KEY" if endpoint["api_key_set"] else "default",
        ),
        _row(
            "JSON schema style",
            schema_style or "openai",
            "REWIND_JSON_SCHEMA_STYLE" if schema_style else "default",
            "how response_format schemas are sent to the endpoint",
        ),
        _row(
            "SDK HTTP capture",
            "off" if capture in ("off", "0", "false", "no") else "on",
            "REWIND_HTTP_CAPTURE" if capture else "default",
            "model calls of httpx-based SDKs go through the cache",
        ),
        _row("store folder", settings["store"]["root"], "server"),
        _row("database", settings["store"]["database"], "server", settings["store"]["dialect"]),
        _row(
            "object storage",
            objects.url if objects is not None else "none: blobs stay in the database",
            OBJECTS_ENV if _env(OBJECTS_ENV) else "server" if objects is not None else "default",
            f"blobs of {store.offload_min_bytes:,} bytes or more" if objects is not None else "",
        ),
        _row("authentication", auth, auth_source),
        _row("workers", settings["workers"], "server", "runs that may execute at once"),
    ]
