"""What-if grid: 8 variants of one run, concurrently, against an endpoint that answers slowly.

What it does, each round on fresh stores:

1. starts a tiny OpenAI-compatible HTTP server on 127.0.0.1 (``http.server``, one thread per
   request) that sleeps ``--delay-ms`` and then answers a deterministic chat completion (the
   content is a function of the messages and the temperature; usage is counted in words);
2. records the 5-node pipeline ``draft (llm) → critique (llm) → gist (tool) → review (llm) →
   publish (artifact)``; ``gist`` only keeps whether the draft was sampled "warm" (t ≥ 0.5), so
   variants with different drafts share one ``review`` input;
3. **grid**: :func:`rewind.grid.grid` forks the run at ``draft`` with 8 overrides (temperatures
   0.1 … 0.9, one of them twice, and ``max_tokens`` 48 twice: same answer as the parent) on a
   4-thread pool, and times it;
4. **serial**: on a fresh store, records the same run and runs the same 8 forks one after another
   with :meth:`Rewind.fork`, and times that.

The two sides alternate between rounds (grid first, then serial first…) and every grid variant
must end with the same output hashes as its serial twin; the script fails otherwise.

Figures (last line, JSON): ``grid_vs_serial_ratio`` = median grid wall time / median serial wall
time (target ≤ 0.5); ``llm_calls_vs_distinct_inputs`` = HTTP requests the endpoint received
during the grids / distinct LLM request keys the grids' variants needed that the parent run did
not already hold (must be exactly 1.0: every new input executed once, none twice); context:
``grid_ms``, ``serial_ms``, ``serial_llm_calls_vs_distinct_inputs``, ``delay_ms``, ``variants``,
``workers``.

Run: ``.venv/bin/python benchmarks/grid.py [--quick]``
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from chain import median, spread, timed
from rewind.artifacts import publish as publish_artifact
from rewind.calls import chat
from rewind.context import param
from rewind.grid import grid
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Override, ParamOverride, Pipeline, Rewind
from rewind.tools import tool

TARGET_RATIO = 0.5
MODEL = "bench-grid-model"
QUESTION = "Which month of the year is the wettest in Seattle?"
VARIANTS: list[Override] = [
    ParamOverride("draft", "temperature", 0.1),
    ParamOverride("draft", "temperature", 0.3),
    ParamOverride("draft", "temperature", 0.5),
    ParamOverride("draft", "temperature", 0.7),
    ParamOverride("draft", "temperature", 0.9),
    ParamOverride("draft", "temperature", 0.7),  # the same variant twice
    ParamOverride("draft", "max_tokens", 48),  # a new request with the parent's answer
    ParamOverride("draft", "max_tokens", 48),
]
WORKERS = 4


# -- the endpoint ------------------------------------------------------------------------------


class SlowEndpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 answering after a fixed delay.

    Args:
        delay_s: seconds every ``POST /v1/chat/completions`` sleeps before answering.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.requests = 0
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint._lock:
                    endpoint.requests += 1
                time.sleep(endpoint.delay_s)
                data = json.dumps(endpoint.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                data = json.dumps({"data": [{"id": MODEL}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        """A deterministic completion: content from the messages' digest and the temperature."""
        digest = hashlib.sha256(json.dumps(body["messages"]).encode()).hexdigest()
        content = f"note {digest[:10]} sampled at t={body.get('temperature')}"
        words = len(content.split())
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": words, "total_tokens": 20 + words},
        }

    def count(self) -> int:
        """Requests received so far."""
        with self._lock:
            return self.requests

    def __enter__(self) -> SlowEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the pipeline ------------------------------------------------------------------------------


@tool("bench_grid_gist")
def gist_of(draft: str) -> dict[str, Any]:
    """Keeps only whether the draft was sampled warm (t ≥ 0.5)."""
    match = re.search(r"at t=([0-9.]+)", draft)
    return {"warm": bool(match) and float(match.group(1)) >= 0.5}


def _say(content: str, max_tokens: int) -> str:
    response = chat(
        [{"role": "user", "content": content}],
        temperature=param("temperature", 0.0),
        max_tokens=param("max_tokens", max_tokens),
    )
    return response.content


@action(reads=["question"], writes=["draft"])
def draft(state: State) -> State:
    return state.update(draft=_say(f"Draft an answer: {state['question']}", 64))


@action(reads=["draft"], writes=["critique"])
def critique(state: State) -> State:
    return state.update(critique=_say(f"Critique: {state['draft']}", 64))


@action(reads=["draft"], writes=["gist"])
def gist(state: State) -> State:
    return state.update(gist=gist_of(state["draft"]))


@action(reads=["gist"], writes=["review"])
def review(state: State) -> State:
    tone = "warm" if state["gist"]["warm"] else "cool"
    return state.update(review=_say(f"Review a {tone} draft.", 32))


@action(reads=["draft", "critique", "review"], writes=["report"])
def publish(state: State) -> State:
    text = f"{state['draft']}\n\n{state['critique']}\n\n{state['review']}\n"
    return state.update(report=publish_artifact("report.md", text))


NODES = ("draft", "critique", "gist", "review", "publish")


def pipeline() -> Pipeline:
    """The benchmark's pipeline (a fresh graph each call)."""
    graph = (
        GraphBuilder()
        .with_actions(draft=draft, critique=critique, gist=gist, review=review, publish=publish)
        .with_transitions(*[(a, b, default) for a, b in itertools.pairwise(NODES)])
        .build()
    )
    return Pipeline(name="bench-grid", graph=graph, entrypoint="draft", halt_after=("publish",))


# -- one side of a round -----------------------------------------------------------------------


@contextmanager
def session(endpoint: SlowEndpoint) -> Iterator[Rewind]:
    """A Rewind on a fresh temporary store talking to ``endpoint``."""
    folder = Path(tempfile.mkdtemp(prefix="rewind-bench-grid-"))
    client = ChatClient(
        Endpoint(base_url=endpoint.base_url, model=MODEL), retry=RetryPolicy(attempts=1)
    )
    rw = Rewind(folder / "store", chat_client=client)
    try:
        yield rw
    finally:
        rw.store.close()
        client.close()
        shutil.rmtree(folder, ignore_errors=True)


def new_llm_keys(rw: Rewind, parent_id: str, run_ids: list[str]) -> set[str]:
    """LLM cache keys the variants' executed nodes used that the parent's nodes did not."""
    parent = {c.key for n in rw.store.nodes_of(parent_id) for c in n.calls if c.kind == "llm"}
    keys = {
        c.key
        for rid in run_ids
        for n in rw.store.nodes_of(rid)
        if not n.inherited
        for c in n.calls
        if c.kind == "llm"
    }
    return keys - parent


def run_grid(endpoint: SlowEndpoint) -> dict[str, Any]:
    """Record, then time the grid; returns wall ms, requests, distinct new keys, hashes."""
    with session(endpoint) as rw:
        parent = rw.record(pipeline(), {"question": QUESTION})
        assert parent.status == "completed", parent.error
        before = endpoint.count()
        with timed() as t:
            report = grid(rw, parent.run_id, at="draft", overrides=VARIANTS, max_workers=WORKERS)
        requests = endpoint.count() - before
        ids = [v.run.run_id for v in report.variants if v.run is not None]
        failed = [v.label for v in report.variants if v.status != "completed"]
        if failed:
            sys.exit(f"grid variants failed: {failed}")
        return {
            "ms": t[0],
            "requests": requests,
            "distinct": len(new_llm_keys(rw, parent.run_id, ids)),
            "hashes": [[n.output_hash for n in rw.store.nodes_of(i)] for i in ids],
            "changed_artifact": sum(bool(v.changes_artifact) for v in report.variants),
        }


def run_serial(endpoint: SlowEndpoint) -> dict[str, Any]:
    """Record, then time the same forks one after another."""
    with session(endpoint) as rw:
        parent = rw.record(pipeline(), {"question": QUESTION})
        assert parent.status == "completed", parent.error
        before = endpoint.count()
        ids = []
        with timed() as t:
            for override in VARIANTS:
                child = rw.fork(parent.run_id, at="draft", override=override, effects="live")
                if child.status != "completed":
                    sys.exit(f"serial fork failed: {child.error}")
                ids.append(child.run_id)
        requests = endpoint.count() - before
        return {
            "ms": t[0],
            "requests": requests,
            "distinct": len(new_llm_keys(rw, parent.run_id, ids)),
            "hashes": [[n.output_hash for n in rw.store.nodes_of(i)] for i in ids],
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter delay")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (each: grid + serial)")
    ap.add_argument("--delay-ms", type=float, default=None, help="endpoint delay per request")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    delay_ms = args.delay_ms or (20.0 if args.quick else 200.0)

    grid_ms: list[float] = []
    serial_ms: list[float] = []
    grid_requests = grid_distinct = serial_requests = serial_distinct = 0
    with SlowEndpoint(delay_ms / 1000) as endpoint:
        for r in range(rounds):
            order = (run_grid, run_serial) if r % 2 == 0 else (run_serial, run_grid)
            results = {fn.__name__: fn(endpoint) for fn in order}
            g, s = results["run_grid"], results["run_serial"]
            if g["hashes"] != s["hashes"]:
                sys.exit("a grid variant's output hashes differ from its serial twin's")
            grid_ms.append(g["ms"])
            serial_ms.append(s["ms"])
            grid_requests += g["requests"]
            grid_distinct += g["distinct"]
            serial_requests += s["requests"]
            serial_distinct += s["distinct"]
            print(
                f"round {r + 1}: grid {g['ms']:.0f} ms ({g['requests']} requests for "
                f"{g['distinct']} new inputs, {g['changed_artifact']} variants change the "
                f"artifact) · serial {s['ms']:.0f} ms ({s['requests']} requests)"
            )

    ratio = median(grid_ms) / median(serial_ms)
    calls_ratio = grid_requests / grid_distinct
    print(f"endpoint delay {delay_ms:.0f} ms · {len(VARIANTS)} variants · {WORKERS} workers")
    print(f"grid:   {spread(grid_ms)}")
    print(f"serial: {spread(serial_ms)}")
    verdict = "ok" if ratio <= TARGET_RATIO else "ABOVE TARGET"
    print(f"grid_vs_serial_ratio {ratio:.3f} (target ≤ {TARGET_RATIO}: {verdict})")
    verdict = "ok" if calls_ratio == 1.0 else "NOT 1.0"
    print(f"llm_calls_vs_distinct_inputs {calls_ratio:.3f} (must be 1.0: {verdict})")
    print(
        json.dumps(
            {
                "grid_vs_serial_ratio": round(ratio, 4),
                "llm_calls_vs_distinct_inputs": calls_ratio,
                "serial_llm_calls_vs_distinct_inputs": serial_requests / serial_distinct,
                "grid_ms": round(median(grid_ms), 1),
                "serial_ms": round(median(serial_ms), 1),
                "delay_ms": delay_ms,
                "variants": len(VARIANTS),
                "workers": WORKERS,
                "rounds": rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
