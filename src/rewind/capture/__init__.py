"""Capture without rewriting the user's code: model SDK requests and work in threads.

* HTTP: :func:`install` (done automatically when a Rewind run starts, unless
  ``REWIND_HTTP_CAPTURE=off``) makes every httpx/httpx2-based SDK's model requests go through
  Rewind's call cache while a run is active; :class:`Transport`/:class:`AsyncTransport` do the
  same for one client explicitly. See :mod:`rewind.capture.http` and, for keys and what is
  stored, :mod:`rewind.capture.exchange`.
* Threads: work submitted to a ``ThreadPoolExecutor`` from inside a node belongs to that node
  (:mod:`rewind.capture.threads`); :func:`rewind.context.propagate` does it for other threads.
"""

from __future__ import annotations

import os

from rewind.capture.exchange import (
    DEFAULT_MODEL_PATHS,
    ModelRoutes,
    register_endpoint,
    unregister_endpoint,
)
from rewind.capture.http import (
    AsyncTransport,
    Transport,
    acapture,
    capture,
    install,
    install_sdk_transports,
    installed,
    uninstall,
)
from rewind.capture.threads import follow_asyncio_tasks, follow_thread_pools
from rewind.context import propagate

__all__ = [
    "DEFAULT_MODEL_PATHS",
    "AsyncTransport",
    "ModelRoutes",
    "Transport",
    "acapture",
    "capture",
    "ensure_installed",
    "install",
    "installed",
    "propagate",
    "register_endpoint",
    "uninstall",
    "unregister_endpoint",
]

_OFF = frozenset({"0", "off", "false", "no"})
_ready = False
_capturing = False


def ensure_installed() -> None:
    """What a starting run needs: thread pools follow the run context, and HTTP capture is
    installed unless ``REWIND_HTTP_CAPTURE`` is ``off``/``0``/``false`` (checked on the first
    run of the process). Cheap after the first call."""
    global _ready, _capturing
    if _ready:
        if _capturing:
            install_sdk_transports()  # an SDK with a transport of its own imported since
        return
    follow_thread_pools()
    follow_asyncio_tasks()
    if os.environ.get("REWIND_HTTP_CAPTURE", "").strip().lower() not in _OFF:
        install()
        _capturing = True
    _ready = True
