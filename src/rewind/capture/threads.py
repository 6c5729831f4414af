"""The run context follows work handed to thread pools and asyncio tasks.

asyncio tasks copy contextvars when they are created, so a node's ``asyncio.gather`` tasks see
its run context by themselves; :func:`follow_asyncio_tasks` also gives each task created during
a run its own worker lane, numbered in creation order, so identical requests sent by concurrent
tasks come back to the task that sent them on replay, however the event loop interleaves them
(the order requests reach the transport is not stable: the SDKs await before sending). Threads
do not copy contextvars: :func:`follow_thread_pools` wraps
``concurrent.futures.ThreadPoolExecutor.submit`` (which ``map``, ``asyncio.to_thread``,
``loop.run_in_executor`` and Burr's parallel actions go through) so that, while a run context is
active in the submitting thread, the task runs under :func:`rewind.context.propagate` — in that
context, in its own worker lane. With no active context it submits unchanged. Plain
``threading.Thread`` targets are not touched: wrap them with ``rewind.context.propagate``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rewind.context import current, in_new_lane, propagate

__all__ = [
    "follow_asyncio_tasks",
    "follow_thread_pools",
    "following_thread_pools",
    "stop_following_thread_pools",
]

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


def follow_asyncio_tasks() -> None:
    """Wrap ``asyncio.BaseEventLoop.create_task`` (which ``asyncio.create_task``, ``gather``,
    ``ensure_future`` and task groups go through) so that a task created while a run context is
    active runs in its own worker lane, numbered in creation order (idempotent; process-wide;
    loops that do not derive from ``BaseEventLoop`` keep the shared lane)."""
    with _LOCK:
        create_task = asyncio.BaseEventLoop.__dict__["create_task"]
        if hasattr(create_task, _ORIGINAL):
            return

        @functools.wraps(create_task)
        def create_task_in_lane(
            self: asyncio.BaseEventLoop, coro: Any, *, context: Any = None, **kwargs: Any
        ) -> asyncio.Task[Any]:
            if context is None and current() is not None:
                context = contextvars.copy_context()
                context.run(in_new_lane)
            task: asyncio.Task[Any] = create_task(self, coro, context=context, **kwargs)
            return task

        setattr(create_task_in_lane, _ORIGINAL, create_task)
        asyncio.BaseEventLoop.create_task = create_task_in_lane  # type: ignore[method-assign]
