"""``rewind serve`` and ``rewind worker``: the HTTP API with the browser UI, and a task-queue
worker; and ``rewind verify --server`` (:func:`verify_server`).

``serve`` binds loopback by default; any other address needs a token (``--token`` or
``REWIND_TOKEN``) or API users, and every API request then carries one as
``Authorization: Bearer <token>``. The port may be 0: the OS picks a free one, and the printed URL
says which. ``python -m rewind.api serve|verify`` runs these same commands.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Annotated, TextIO

import typer

from rewind.cli.app import (
    StoreOpt,
    check_count,
    store_given,
    store_location,
)
from rewind.cli.render import err_console
from rewind.errors import RewindError


def serve(
    host: Annotated[str, typer.Option(help="Bind address; non-loopback needs --token.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 0,
    token: Annotated[
        str | None, typer.Option(envvar="REWIND_TOKEN", help="Bearer token for every request.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Runs that may execute at once.")] = 2,
    auth: Annotated[
        bool,
        typer.Option(
            "--auth",
            help="Every API request needs a user's token (rewind user add), even on loopback; "
            "on by itself once the store has users.",
        ),
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) and the browser UI at /."""
    check_count("--port", port, low=0, high=65535)
    check_count("--workers", workers)
    run_server(store_location(), host, port, token, workers=workers, require_auth=auth)


def worker(
    queue: Annotated[
        str | None,
        typer.Option(
            envvar="REWIND_QUEUE", help="The task queue's Redis URL (redis://HOST:PORT/0)."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Worker processes: jobs executed at once.")] = 2,
    store: StoreOpt = None,
) -> None:
    """Execute runs and forks from the task queue (a Celery worker over Redis) until stopped.

    Jobs name their store; --store (or $REWIND_STORE) makes every job use this one instead
    (needed for a database URL with a password, which jobs never carry).
    """
    from rewind.jobs.queue import WORKER_STORE_ENV, QueueUnavailable, check_queue, start_worker
    from rewind.store import open_store

    check_count("--concurrency", concurrency)
    if not queue or not queue.strip():
        raise QueueUnavailable(
            "no task queue is configured",
            "pass --queue redis://127.0.0.1:6379/0 or set REWIND_QUEUE",
        )
    check_queue(queue)
    if store_given():
        location = store_location()
        st = open_store(location)  # checks, creates or migrates it before any job arrives
        reaped = st.reap_orphans()
        st.close()
        if reaped:
            err_console.print(f"marked {len(reaped)} run(s) of dead processes interrupted")
        os.environ[WORKER_STORE_ENV] = location
    start_worker(queue, concurrency=concurrency)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one the OS picks).

    The socket is made with protocol ``IPPROTO_TCP`` (not 0): asyncio sets ``TCP_NODELAY`` on
    an accepted connection only when its socket says so, and uvicorn writes a response's
    headers and body in two sends. With Nagle's algorithm on, the body waited for the client's
    delayed ACK of the headers: every small answer of ``rewind serve`` took ~40 ms more
    (45 ms vs 1.9 ms a ``GET /api/runs`` over loopback).

    Raises:
        RewindError: the address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise RewindError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "pick another --port (0 lets the OS choose a free one) or --host",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def server_url(host: str, port: int) -> str:
    """The URL a browser opens for a server bound to ``host:port``."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def run_server(
    store: str,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    workers: int = 2,
    out: TextIO | None = None,
    require_auth: bool = False,
) -> None:
    """``rewind serve``: serve the API and the UI until interrupted (Ctrl-C), then mark runs in
    flight ``interrupted`` and stop the embedded model server if it was started.

    Args:
        store: store folder, ``.db`` file or database URL.
        host: bind address; loopback by default. Any other address requires a token.
        port: TCP port; 0 picks a free one.
        token: bearer token required on every API request (default: ``REWIND_TOKEN``).
        workers: runs that may execute at once.
        out: where to print the URL (default: stdout).
        require_auth: every API request needs a user's token (or ``token``) even on loopback
            (``rewind serve --auth``); a store with users needs them anyway.
    Raises:
        RewindError: a non-loopback host without a token or users, ``require_auth`` without
            users or token, or the address cannot be bound.
    """
    import logging

    import uvicorn

    from rewind.api.app import create_app, is_loopback

    logging.getLogger("burr").setLevel(logging.CRITICAL)  # run errors are on the run rows

    token = token or os.environ.get("REWIND_TOKEN", "").strip() or None
    loopback = is_loopback(host)
    users = _store_has_users(store)
    if require_auth and not token and not users:
        raise RewindError(
            "--auth needs a user, and the store has none",
            "add one first: rewind user add NAME --admin (it prints the user's token)",
        )
    if not loopback and not token and not users:
        raise RewindError(
            f"binding {host} exposes the API beyond this machine, so it needs a token",
            "add users (rewind user add NAME), or pass --token TOKEN or set REWIND_TOKEN "
            "(clients send 'Authorization: Bearer TOKEN')",
        )
    sock = bind_socket(host, port)
    actual_port = sock.getsockname()[1]
    allowed = [*LOOPBACK_NAMES, host] if loopback else None
    app = create_app(
        store, token=token, allowed_hosts=allowed, workers=workers, require_auth=require_auth
    )
    ctx = app.state.rewind
    stream = out or sys.stdout
    url = server_url(host, actual_port)
    print(f"Rewind serving store {ctx.store.root} at {url}", file=stream, flush=True)
    if ctx.interrupted_at_start:
        print(
            f"marked {len(ctx.interrupted_at_start)} run(s) left running as interrupted",
            file=stream,
            flush=True,
        )
    if token or users or require_auth:
        print(
            "API requests need 'Authorization: Bearer <token>' (a user's token from "
            "`rewind user add`, or --token); "
            f"in a browser open {url}#token=<token>",
            file=stream,
            flush=True,
        )
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="on",
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _store_has_users(location: str) -> bool:
    """True when the store at ``location`` has API users (a new store has none)."""
    from rewind.store import open_store
    from rewind.store.users import has_users

    opened = open_store(location)
    try:
        return has_users(opened)
    finally:
        opened.close()


def verify_server(
    *,
    keep: bool = False,
    out: TextIO | None = None,
    store: str | None = None,
    queue: str | None = None,
    objects: str | None = None,
) -> int:
    """Boot a server on a free port — on a fresh store, or on the team's ``store`` (database
    URL), ``queue`` (Redis URL) and ``objects`` (object store URL) — run the demo through the
    HTTP API and prove its claims with the 14 checks (see :mod:`rewind.api.verify_http`).

    Returns:
        0 when all 14 pass, else 1.
    Raises:
        InvalidOverride: ``store`` is not a URL, or ``queue`` is given without ``store``.
    """
    from rewind.api.verify_http import run_server_verification

    return run_server_verification(
        keep=keep, out=out or sys.stdout, store=store, queue=queue, objects=objects
    )
