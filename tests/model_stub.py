"""A real loopback HTTP server speaking just enough of the OpenAI and Anthropic APIs.

Every answer carries the server's request number, like a sampled model: two identical requests
get different answers, so a test can tell a replayed answer from a fresh one. The server counts
every request it receives (``requests``), which is where tests count model calls — never only
in Rewind's bookkeeping. Used by the capture tests and ``benchmarks/capture_overhead.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewind.llm import ChatClient

STUB_MODEL = "stub-model"
SHUTDOWN_POLL_S = 0.01
"""How often ``serve_forever`` looks for a shutdown request (the stdlib default, 0.5 s, made
every ``with ModelStub()`` block end ~0.5 s after its last request: ~25 s of the whole suite)."""


class ModelStub:
    """``POST /v1/chat/completions`` (JSON or SSE with ``stream``; HTTP 400 when the last
    message is ``"refuse"``), ``/v1/embeddings`` and ``/v1/messages`` (Anthropic, JSON or SSE)
    on ``127.0.0.1`` with a free port.

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:PORT/v1``. ``reply`` may choose
    a chat answer from (last message, request number); the default is ``answer #N to QUESTION``.
    While :attr:`errors` holds HTTP statuses, each chat request takes the first one and is
    answered with it (``{"error": {"message": "status S #N"}}``, ``retry-after-ms: 0``).
    """

    def __init__(self, reply: Callable[[str, int], str] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.errors: list[int] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without this, Nagle's algorithm and
            # delayed ACKs add ~40 ms to every loopback answer.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append(body)
                    stub.paths.append(self.path)
                    stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                    n = len(stub.requests)
                    error = stub.errors.pop(0) if stub.errors else None
                if error is not None and self.path.endswith("/chat/completions"):
                    doc = {"error": {"message": f"status {error} #{n}"}}
                    self._json(doc, status=error, headers={"retry-after-ms": "0"})
                elif self.path.endswith("/chat/completions"):
                    self._chat(body, n)
                elif self.path.endswith("/embeddings"):
                    self._json(
                        {
                            "object": "list",
                            "data": [{"object": "embedding", "index": 0, "embedding": [0.5, n]}],
                            "model": body.get("model"),
                            "usage": {"prompt_tokens": 3, "total_tokens": 3},
                        }
                    )
                elif self.path.endswith("/messages"):
                    self._anthropic(body, n)
                else:
                    self._json({"error": {"message": "not found"}}, status=404)

            def _chat(self, body: dict[str, Any], n: int) -> None:
                question = body["messages"][-1]["content"]
                if question == "refuse":
                    self._json({"error": {"message": f"refused #{n}"}}, status=400)
                    return
                content = reply(question, n) if reply else f"answer #{n} to {question}"
                if not body.get("stream"):
                    self._json(
                        {
                            "id": f"chatcmpl-{n}",
                            "object": "chat.completion",
                            "created": 1_700_000_000 + n,
                            "model": body.get("model"),
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 7,
                                "completion_tokens": len(content.split()),
                                "total_tokens": 7 + len(content.split()),
                            },
                        }
                    )
                    return
                events = []
                for word in content.split(" "):
                    chunk = {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion.chunk",
                        "created": 1_700_000_000 + n,
                        "model": body.get("model"),
                        "choices": [{"index": 0, "delta": {"content": word + " "}}],
                    }
                    events.append(chunk)
                if (body.get("stream_options") or {}).get("include_usage"):
                    # like OpenAI: a last chunk with no choices carries the usage, on request only
                    events.append(
                        {
                            "id": f"chatcmpl-{n}",
                            "object": "chat.completion.chunk",
                            "created": 1_700_000_000 + n,
                            "model": body.get("model"),
                            "choices": [],
                            "usage": {"prompt_tokens": 7, "completion_tokens": len(events)},
                        }
                    )
                self._sse([f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"])

            def _anthropic(self, body: dict[str, Any], n: int) -> None:
                question = body["messages"][-1]["content"]
                text = f"answer #{n} to {question}"
                message = {
                    "id": f"msg_{n}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model"),
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": len(text.split())},
                }
                if not body.get("stream"):
                    self._json(message)
                    return
                start = dict(message, content=[], usage={"input_tokens": 5, "output_tokens": 1})
                events = [
                    ("message_start", {"type": "message_start", "message": start}),
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": text},
                        },
                    ),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": len(text.split())},
                        },
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
                self._sse([f"event: {name}\ndata: {json.dumps(e)}\n\n" for name, e in events])

            def _json(
                self, doc: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("x-request-id", "req-volatile")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events: list[str]) -> None:
                data = "".join(events).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
        )

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def count(self) -> int:
        """Requests received so far."""
        with self._lock:
            return len(self.requests)

    def __enter__(self) -> ModelStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


@contextlib.contextmanager
def stub_and_client(
    reply: Callable[[str, int], str] | None = None,
) -> Iterator[tuple[ModelStub, ChatClient]]:
    """A stub of its own (``reply(question, request number) -> answer``; default: the stub's
    numbered answers) and a ``ChatClient`` for it without retries, closed on exit."""
    from rewind.llm import ChatClient, Endpoint, RetryPolicy

    with ModelStub(reply=reply) as stub:
        client = ChatClient(
            Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL),
            retry=RetryPolicy(attempts=1),
        )
        try:
            yield stub, client
        finally:
            client.close()


def main() -> None:
    """Serve until stdin closes, printing the base URL on the first line (for benchmarks that
    keep the server out of their own process and its GIL)."""
    import sys

    with ModelStub() as stub:
        print(stub.base_url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
