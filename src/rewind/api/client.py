"""A small client of Rewind's HTTP API, as a user of the API would write it.

Used by ``rewind verify --server`` and by the tests; it follows a run's server-sent events until
``run_finished`` and falls back to polling the graph if the stream breaks.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import httpx

from rewind.errors import RewindError


class ApiError(RewindError):
    """The API answered with an error (``status`` is the HTTP status, ``body`` its JSON)."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)
        hint = body.get("hint", "") if isinstance(body, dict) else ""
        super().__init__(f"HTTP {status}: {message}", hint or "")
        self.status = status
        self.body = body


class ApiClient:
    """Talks to one Rewind server.

    Args:
        base_url: ``http://127.0.0.1:PORT``.
        token: bearer token when the server requires one.
        timeout: seconds per request (event streams wait longer between pings).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60.0) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, trust_env=False
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; raise :class:`ApiError` unless it succeeded."""
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            raise ApiError(response.status_code, body)
        return response

    def get(self, path: str, **params: Any) -> Any:
        """GET a JSON resource."""
        return self.request("GET", path, params=params or None).json()

    def post(self, path: str, body: Any = None) -> Any:
        """POST JSON and return the JSON answer."""
        return self.request("POST", path, json=body).json()

    def download(self, path: str) -> bytes:
        """GET raw bytes (an artifact)."""
        return self.request("GET", path).content

    # -- runs ---------------------------------------------------------------------------------
    def start_run(self, pipeline: str = "research", **inputs: Any) -> str:
        """Start a run; returns its id at once."""
        return str(self.post("/api/runs", {"pipeline": pipeline, **inputs})["run_id"])

    def fork(
        self,
        run_id: str,
        at: str | int,
        override: dict[str, Any] | None = None,
        effects: str = "recorded",
    ) -> str:
        """Fork a finished run; returns the fork's id at once."""
        body = {"at": at, "override": override, "effects": effects}
        return str(self.post(f"/api/runs/{run_id}/fork", body)["run_id"])

    def replay(self, run_id: str, at: str | int = 1, effects: str = "recorded") -> str:
        """Unchanged replay of a finished run; returns its id at once."""
        body = {"at": at, "effects": effects}
        return str(self.post(f"/api/runs/{run_id}/replay", body)["run_id"])

    def wait(self, run_id: str, timeout: float = 1800.0) -> dict[str, Any]:
        """Follow the run's events until it finishes; return the finished run.

        Falls back to polling ``/api/runs/{id}`` if the event stream fails.

        Raises:
            TimeoutError: the run did not finish within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with contextlib.suppress(httpx.HTTPError, ValueError):
            self._follow(run_id, deadline)
        while time.monotonic() < deadline:
            run: dict[str, Any] = self.get(f"/api/runs/{run_id}")
            if run["status"] not in ("queued", "running"):
                return run
            time.sleep(0.25)
        raise TimeoutError(f"run {run_id} did not finish within {timeout:.0f} s")

    def events(self, run_id: str, deadline: float | None = None) -> list[dict[str, Any]]:
        """Every event of the run's stream up to and including ``run_finished``."""
        return self._follow(run_id, deadline or time.monotonic() + 1800.0)

    def _follow(self, run_id: str, deadline: float) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        timeout = httpx.Timeout(10.0, read=60.0)
        with self.http.stream("GET", f"/api/runs/{run_id}/events", timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError(response.status_code, response.json())
            event, data = "", []
            for line in response.iter_lines():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} did not finish in time")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    item = json.loads("\n".join(data))
                    item.setdefault("event", event)
                    seen.append(item)
                    event, data = "", []
                    if item["event"] == "run_finished":
                        return seen
        return seen
