"""A Rewind app served by real uvicorn on a free 127.0.0.1 port, in a thread of the test process
(for tests that need real HTTP: schemathesis, a real browser)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import httpx
import uvicorn

from rewind.cli.serve import bind_socket


class _Server(uvicorn.Server):
    """uvicorn's server whose main loop also wakes up when :meth:`stop` is called (uvicorn's
    own loop checks ``should_exit`` every 0.1 s: 0.1 s of every teardown). Same ticks
    otherwise (the date header, once a second)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def stop(self) -> None:
        """Ask the server to exit now (from any thread); it then shuts down as uvicorn does."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(wake.set)


class LiveServer:
    """Serve ``app`` (lifespan on) until the ``with`` block ends; ``url`` has no trailing /."""

    def __init__(self, app: Any) -> None:
        sock = bind_socket("127.0.0.1", 0)
        self.port: int = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = _Server(config)
        self._sock = sock
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})

    def __enter__(self) -> LiveServer:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died before it started")
            self._thread.join(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self._thread.join()
        self._sock.close()

    def runs(self) -> list[dict[str, Any]]:
        """Every run the server lists (queued ones included)."""
        body: dict[str, Any] = httpx.get(f"{self.url}/api/runs", trust_env=False).json()
        return list(body["runs"])

    def record(self, pipeline: str, path: str = "/api/runs", body: Any = None) -> dict[str, Any]:
        """POST ``body`` (default: start ``pipeline``) and wait for the run it starts to end."""
        payload = {"pipeline": pipeline} if body is None else body
        r = httpx.post(f"{self.url}{path}", json=payload, trust_env=False)
        assert r.status_code == 202, r.text
        return self.wait_finished(r.json()["run_id"])

    def wait_finished(self, run_id: str, hang_s: float = 120.0) -> dict[str, Any]:
        """The run once it is no longer queued or running (polls the API).

        Raises:
            AssertionError: still unfinished after ``hang_s`` seconds (a hang, not a slow run).
        """
        deadline = time.monotonic() + hang_s
        while time.monotonic() < deadline:
            run: dict[str, Any] = httpx.get(f"{self.url}/api/runs/{run_id}", trust_env=False).json()
            if run["status"] not in ("queued", "running"):
                return run
            time.sleep(0.02)
        raise AssertionError(f"run {run_id} did not finish")
