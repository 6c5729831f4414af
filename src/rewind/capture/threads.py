"""The run context follows work handed to thread pools.

asyncio tasks copy contextvars when they are created, so a node's ``asyncio.gather`` tasks see
its run context by themselves. Threads do not: :func:`follow_thread_pools` wraps
``concurrent.futures.ThreadPoolExecutor.submit`` (which ``map``, ``asyncio.to_thread``,
``loop.run_in_executor`` and Burr's parallel actions go through) so that, while a run context is
active in the submitting thread, the task runs under :func:`rewind.context.propagate` — in that
context, in its own worker lane. With no active context it submits unchanged. Plain
``threading.Thread`` targets are not touched: wrap them with ``rewind.context.propagate``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rewind.context import current, propagate

__all__ = ["follow_thread_pools", "following_thread_pools", "stop_following_thread_pools"]

_ORIGINAL = "__rewind_original__"
_LOCK = threading.Lock()


def follow_thread_pools() -> None:
    """Wrap ``ThreadPoolExecutor.submit`` so tasks inherit the submitting run context
    (idempotent; process-wide)."""
    with _LOCK:
        submit = ThreadPoolExecutor.__dict__["submit"]
        if hasattr(submit, _ORIGINAL):
            return

        @functools.wraps(submit)
        def submit_in_context(
            self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
        ) -> Future[Any]:
            if current() is not None:
                fn = propagate(fn)
            future: Future[Any] = submit(self, fn, *args, **kwargs)
            return future

        setattr(submit_in_context, _ORIGINAL, submit)
        ThreadPoolExecutor.submit = submit_in_context  # type: ignore[method-assign]


def stop_following_thread_pools() -> None:
    """Restore ``ThreadPoolExecutor.submit`` (idempotent)."""
    with _LOCK:
        original = getattr(ThreadPoolExecutor.__dict__["submit"], _ORIGINAL, None)
        if original is not None:
            ThreadPoolExecutor.submit = original  # type: ignore[method-assign]


def following_thread_pools() -> bool:
    """True when :func:`follow_thread_pools` is in effect."""
    return hasattr(ThreadPoolExecutor.__dict__["submit"], _ORIGINAL)
