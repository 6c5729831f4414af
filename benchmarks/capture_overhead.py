"""HTTP-capture overhead: a model call captured by Rewind (recorded, or served as a hit) versus
the same call without Rewind, against a loopback OpenAI-compatible stub server.

The stub runs in its own process (``python -m tests.model_stub``), so the server's work does not
compete with the measured code for this interpreter's lock. One Burr node sends ``calls``
chat-completion POSTs with a plain ``httpx.Client`` (each body distinct within a round, and new
every round, so recording never hits). Per round, alternating
which side goes first:

- plain: the node runs inside ``Rewind.record`` with HTTP capture uninstalled — the requests go
  to the server exactly as without Rewind (the node is still recorded, its calls are not);
- record: the same node with capture installed — every call is keyed, sent, read, enveloped,
  and committed with the node (call rows, blobs, cache entries);
- hit: an unchanged replay of the recorded run — every call is served from the cache.

and, as the floor any hit must pay, the same ``httpx.Client`` calls with a no-I/O
``httpx.MockTransport`` outside Rewind (``client_ms_per_call``: httpx's own request/response
work, which Rewind neither adds nor can remove).

Each round also records the node once more on each side against an ``httpx.MockTransport``
(no network; the captured side wraps it in ``rewind.capture.Transport``), because on a loaded
machine socket time varies far more than what capture adds.

Figures (last line, JSON), medians over the rounds, per call: ``plain_ms_per_call`` and
``record_ms_per_call`` (time inside the node's loop), ``record_added_ms_per_call`` (whole
``Rewind.record`` with capture minus without, divided by the calls: includes the commit),
``record_added_no_io_ms_per_call`` (the same without network: target ≤ 0.2 ms),
``hit_ms_per_call`` (the loop during the replay), ``hit_added_ms_per_call``
(hit minus the client floor: what Rewind's cache costs a hit; target ≤ 0.2 ms) and
``hit_vs_plain_ratio``. The stub's request count checks that hits sent nothing.

Run: ``.venv/bin/python benchmarks/capture_overhead.py [--quick]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from burr.core import State, action
from burr.core.graph import GraphBuilder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.model_stub, when run as a script

from tests.model_stub import STUB_MODEL  # noqa: E402

from chain import median, spread, timed  # noqa: E402
from rewind import capture  # noqa: E402
from rewind.replay import Pipeline, Rewind  # noqa: E402

TARGET_HIT_MS = 0.2
TARGET_RECORD_ADDED_MS = 0.2

_LOOP_MS: list[float] = []  # telemetry stays out of Burr state (DESIGN rule 1)


def send_all(http: httpx.Client, url: str, calls: int, seed: int) -> list[int]:
    """Send ``calls`` distinct chat requests seeded by ``seed``; the loop's ms go to _LOOP_MS."""
    bodies = [
        json.dumps(
            {
                "model": STUB_MODEL,
                "messages": [{"role": "user", "content": f"q{seed}-{i}"}],
                "temperature": 0,
            }
        ).encode()
        for i in range(calls)
    ]
    headers = {"content-type": "application/json"}
    start = time.perf_counter()
    sizes = [len(http.post(url, content=body, headers=headers).content) for body in bodies]
    _LOOP_MS.append((time.perf_counter() - start) * 1000)
    return sizes


def calls_pipeline(http: httpx.Client, url: str, name: str = "capture-bench") -> Pipeline:
    """One node that sends ``state["calls"]`` distinct requests seeded by ``state["seed"]``."""

    @action(reads=["calls", "seed"], writes=["answers"])
    def ask(state: State) -> State:
        return state.update(answers=send_all(http, url, state["calls"], state["seed"]))

    return Pipeline(name, GraphBuilder().with_actions(ask=ask).build(), "ask")


@contextlib.contextmanager
def stub_process() -> Iterator[str]:
    """Start ``tests.model_stub`` in a child process; yield its base URL; stop it."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.model_stub"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        yield child.stdout.readline().strip()
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)


def _canned(request: httpx.Request) -> httpx.Response:
    """A fixed chat answer, with no network (for MockTransport)."""
    return httpx.Response(200, content=_CANNED, headers={"content-type": "application/json"})


_CANNED = json.dumps(
    {
        "choices": [{"message": {"role": "assistant", "content": "answer"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1},
    }
).encode()
_NO_IO_URL = "http://127.0.0.1:9/v1/chat/completions"


def client_floor_ms(calls: int, seed: int) -> float:
    """ms for ``calls`` posts through httpx's own machinery with no network (MockTransport)."""
    with httpx.Client(transport=httpx.MockTransport(_canned)) as http:
        send_all(http, _NO_IO_URL, calls, seed)
    return _LOOP_MS[-1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version for smoke tests")
    parser.add_argument("--calls", type=int, default=None, help="calls per node (default 200)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7)")
    args = parser.parse_args(argv)
    calls = args.calls or (20 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 7)

    plain_loop: list[float] = []
    record_loop: list[float] = []
    hit_loop: list[float] = []
    plain_run: list[float] = []
    floor_loop: list[float] = []
    record_run: list[float] = []
    no_io: dict[bool, list[float]] = {False: [], True: []}  # whole-record ms, no network
    with (
        stub_process() as base_url,
        httpx.Client() as http,
        tempfile.TemporaryDirectory(prefix="rewind-bench-") as tmp,
    ):
        rw = Rewind(Path(tmp) / "store")
        pipeline = calls_pipeline(http, f"{base_url}/chat/completions")
        capture.ensure_installed()
        # The same two sides with the network taken out (a MockTransport answers at once): on a
        # loaded machine socket time varies far more than what capture adds to a call.
        mock = httpx.Client(transport=httpx.MockTransport(_canned))
        mock_captured = httpx.Client(transport=capture.Transport(httpx.MockTransport(_canned)))
        no_io_pipelines = {
            False: calls_pipeline(mock, _NO_IO_URL, "capture-bench-no-io"),
            True: calls_pipeline(mock_captured, _NO_IO_URL, "capture-bench-no-io-captured"),
        }

        def record_no_io(seed: int, captured: bool) -> None:
            with timed() as t:
                run = rw.record(no_io_pipelines[captured], {"calls": calls, "seed": seed})
            assert run.status == "completed", run.error
            no_io[captured].extend(t)

        def record(seed: int, captured: bool) -> str:
            if captured:
                capture.install()
            else:
                capture.uninstall()
            with timed() as t:
                run = rw.record(pipeline, {"calls": calls, "seed": seed})
            assert run.status == "completed", run.error
            (record_run if captured else plain_run).extend(t)
            (record_loop if captured else plain_loop).append(_LOOP_MS[-1])
            return run.run_id

        record(-1, False)  # warm-up: imports, connections, first store writes
        rw.replay(record(-2, True))  # (capture is installed after a captured record)
        record_no_io(-1, False)
        record_no_io(-2, True)
        del plain_loop[:], record_loop[:], plain_run[:], record_run[:], no_io[False][:]
        del no_io[True][:]

        for r in range(rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            recorded = ""
            for captured in order:
                run_id = record(2 * r + int(captured), captured)
                recorded = run_id if captured else recorded
            for captured in order:
                record_no_io(1000 + 2 * r + int(captured), captured)
            capture.install()
            child = rw.replay(recorded)
            assert child.status == "completed", child.error
            hits = [c.outcome for n in rw.store.nodes_of(child.run_id) for c in n.calls]
            assert hits == ["hit"] * calls, "an unchanged replay sent requests"
            hit_loop.append(_LOOP_MS[-1])
            floor_loop.append(client_floor_ms(calls, 2 * r))
        capture.install()
        mock.close()
        mock_captured.close()
        rw.store.close()

    per = 1.0 / calls
    plain_ms = median(plain_loop) * per
    record_ms = median(record_loop) * per
    hit_ms = median(hit_loop) * per
    floor_ms = median(floor_loop) * per
    hit_added_ms = hit_ms - floor_ms
    added_ms = (median(record_run) - median(plain_run)) * per
    added_no_io_ms = (median(no_io[True]) - median(no_io[False])) * per
    print(f"{calls} calls per node, {rounds} rounds (node loop times):")
    print(f"  without capture: {spread(plain_loop)}")
    print(f"  recording:       {spread(record_loop)}")
    print(f"  cache hits:      {spread(hit_loop)}")
    print(f"  httpx, no I/O:   {spread(floor_loop)}")
    hit_verdict = "meets" if hit_added_ms <= TARGET_HIT_MS else "MISSES"
    add_verdict = "meets" if added_no_io_ms <= TARGET_RECORD_ADDED_MS else "MISSES"
    print(
        f"per call: without {plain_ms:.3f} ms, recording {record_ms:.3f} ms, hit {hit_ms:.3f} ms "
        f"of which httpx itself {floor_ms:.3f} ms: the cache adds {hit_added_ms:.3f} ms "
        f"({hit_verdict} target ≤ {TARGET_HIT_MS} ms); recording adds "
        f"{added_no_io_ms:.3f} ms a call incl. commit with the network taken out "
        f"({add_verdict} target ≤ {TARGET_RECORD_ADDED_MS} ms), {added_ms:.3f} ms against the "
        f"stub (network noise included); hit/without = {hit_ms / plain_ms:.2f}"
    )
    return {
        "plain_ms_per_call": round(plain_ms, 4),
        "record_ms_per_call": round(record_ms, 4),
        "record_added_ms_per_call": round(added_ms, 4),
        "record_added_no_io_ms_per_call": round(added_no_io_ms, 4),
        "hit_ms_per_call": round(hit_ms, 4),
        "client_ms_per_call": round(floor_ms, 4),
        "hit_added_ms_per_call": round(hit_added_ms, 4),
        "hit_vs_plain_ratio": round(hit_ms / plain_ms, 4),
        "target_hit_ms": TARGET_HIT_MS,
        "target_record_added_ms": TARGET_RECORD_ADDED_MS,
        "calls": calls,
        "rounds": rounds,
    }


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
