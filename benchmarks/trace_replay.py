"""What a traced chain costs to record and to replay unchanged, against the same loop untraced.

The workload is peerbench's (``../shared/peerbench/workload.py``): step *i* = one LLM call to a
loopback OpenAI-compatible stub (``tests.model_stub``, its own process) whose prompt carries the
previous reply and tool result, then one deterministic tool call. Four sides, alternating in
every round (A B C D, D C B A, ...), medians of the rounds:

* ``baseline``: the loop with a plain :class:`rewind.llm.ChatClient` and the plain tool function;
* ``record``: the same loop inside ``Tracer.trace`` (an ``llm_call`` step around ``rewind.chat``
  and a ``tool_call`` step around an ``@rewind.tool``), written to a fresh store;
* ``replay_cache``: the loop inside ``Tracer(read_cache=True).trace`` (calls looked up by key in
  the store's cache, one query per lookup);
* ``replay_in_place``: the loop inside ``Tracer.replay(recorded_trace_id)`` (the recorded
  trace's calls and blobs loaded once, lookups in memory, written as the recording's child).

Also (``split``): a whole cached replay, from the Tracer's construction to its ``close()``, as
fixed ms per trace plus ms per step (traces of 10 and 100 steps), and the garbage collector's
share.

Every replay must return the recorded digest and reach the stub 0 times (the script fails
otherwise). Also printed: the SQL statements SQLite runs for each side (counted by sqlite3's trace
callback on every connection the store checks out, so statements sent through the driver count
too; BEGIN and COMMIT are statements), the
bytes of the recorded store (after a WAL checkpoint) and the bytes one in-place replay adds,
and the start-up time of ``import rewind`` and ``rewind --help`` against ``python -c pass``.
The last line is the JSON of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.model_stub, when run as a script

from sqlalchemy import event  # noqa: E402
from tests.model_stub import STUB_MODEL, ModelStub  # noqa: E402

import rewind  # noqa: E402
from chain import profile  # noqa: E402
from rewind.llm import ChatClient, Endpoint, RetryPolicy  # noqa: E402
from rewind.tracing import Tracer, chat_step, step  # noqa: E402

_NUMBERS = re.compile(r"\d+")
SYSTEM = "You are a terse arithmetic agent. Reply with four numbers."


def sum_numbers(numbers: list[int]) -> int:
    """The tool body."""
    return int(sum(numbers))


_TRACED_TOOL = step("sum_numbers", "tool_call")(rewind.tool("bench_sum_numbers")(sum_numbers))


def run_agent(llm: Callable[[list[dict[str, str]]], str], tool: Callable[..., int], n: int) -> str:
    """The N-step loop; returns the sha256 of every reply and tool result."""
    digest = hashlib.sha256()
    reply, total = "start", 0
    for i in range(n):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"step {i}: tool result {total}; reply: {reply}"},
        ]
        reply = llm(messages)
        total = tool([int(x) for x in _NUMBERS.findall(reply)][:4])
        digest.update(json.dumps([reply, total]).encode())
    return digest.hexdigest()


def _params() -> dict[str, Any]:
    return {"model": STUB_MODEL, "temperature": 0, "max_tokens": 64}


def plain_llm(client: ChatClient) -> Callable[[list[dict[str, str]]], str]:
    """The LLM hook without Rewind: the same client, no trace."""

    def llm(messages: list[dict[str, str]]) -> str:
        return client.complete({"messages": messages, **_params()}).content

    return llm


def traced_llm(messages: list[dict[str, str]]) -> str:
    """The LLM hook inside a trace: an ``llm_call`` step around ``rewind.chat``."""
    return chat_step("llm", messages, **_params()).content


class Counter:
    """Counts the SQL statements SQLite runs on the connections an engine checks out (the
    driver's trace callback: statements SQLAlchemy executes and those sent to the driver
    directly alike; each row of an executemany counts)."""

    def __init__(self) -> None:
        self.n = 0

    def statement(self, _sql: str) -> None:
        self.n += 1

    def checkout(self, dbapi_connection: Any, *_args: Any) -> None:
        dbapi_connection.set_trace_callback(self.statement)

    def checkin(self, dbapi_connection: Any, *_args: Any) -> None:
        dbapi_connection.set_trace_callback(None)


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` after folding the WAL into the database."""
    db = path / "rewind.db"
    if db.exists():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def startup_s(args: list[str], rounds: int) -> float:
    """Median wall seconds of ``python ARGS`` (this checkout's sources first)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 steps, 1 round")
    parser.add_argument("--profile", action="store_true", help="cProfile one in-place replay")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    n, rounds = (20, 1) if args.quick else (100, 7)
    tmp = Path(tempfile.mkdtemp(prefix="rewind-bench-trace-"))
    try:
        stub = StubProcess()
        try:
            return _measure(stub, tmp, n, rounds, args.profile, args.quick)
        finally:
            stub.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(stub: StubProcess, tmp: Path, n: int, rounds: int, prof: bool, quick: bool) -> int:
    endpoint = Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL)
    client = ChatClient(endpoint, retry=RetryPolicy(attempts=1))
    times: dict[str, list[float]] = {
        k: [] for k in ("baseline", "record", "replay_cache", "replay_in_place")
    }
    statements: dict[str, int] = {}
    source: dict[str, str] = {}
    digests: dict[str, str] = {}

    def timed_trace(side: str, store_dir: Path, open_block: Callable[[Tracer], Any]) -> None:
        tracer = Tracer(store_dir, chat_client=client, read_cache=side == "replay_cache")
        counter = Counter()
        engine = tracer.store.engine
        event.listen(engine, "checkout", counter.checkout)
        event.listen(engine, "checkin", counter.checkin)
        started = time.perf_counter()
        with open_block(tracer) as t:
            digest = run_agent(traced_llm, _TRACED_TOOL, n)
        times[side].append((time.perf_counter() - started) * 1000 / n)
        statements[side] = counter.n
        tracer.close()
        event.remove(engine, "checkout", counter.checkout)
        event.remove(engine, "checkin", counter.checkin)
        if side == "record":
            source[str(store_dir)] = t.trace_id
            digests[str(store_dir)] = digest
        elif digest != digests[str(store_dir)]:
            raise SystemExit(f"{side}: the replay's digest differs from the recording's")

    def baseline() -> None:
        started = time.perf_counter()
        run_agent(plain_llm(client), sum_numbers, n)
        times["baseline"].append((time.perf_counter() - started) * 1000 / n)

    sides: list[tuple[str, Callable[[int], None]]] = [
        ("baseline", lambda r: baseline()),
        ("record", lambda r: timed_trace("record", tmp / f"r{r}", lambda t: t.trace("agent"))),
        (
            "replay_cache",
            lambda r: timed_trace("replay_cache", tmp / f"r{r}", lambda t: t.trace("agent")),
        ),
        (
            "replay_in_place",
            lambda r: timed_trace(
                "replay_in_place", tmp / f"r{r}", lambda t: t.replay(source[str(tmp / f"r{r}")])
            ),
        ),
    ]
    # Warm-up (imports, connections), then the rounds; a round's store is recorded first.
    for r in range(-1, rounds):
        order = sides if r % 2 == 0 else [sides[0], sides[1], *reversed(sides[2:])]
        recorded_bytes = replay_added = 0
        for side, fn in order:
            requests_before = stub.count()
            before_bytes = dir_bytes(tmp / f"r{r}") if side == "replay_in_place" else 0
            fn(r)
            if side.startswith("replay") and stub.count() != requests_before:
                raise SystemExit(f"{side} sent requests to the model")
            if side == "record":
                recorded_bytes = dir_bytes(tmp / f"r{r}")
            elif side == "replay_in_place":
                replay_added = dir_bytes(tmp / f"r{r}") - before_bytes
        if r == -1:
            for k in times:
                times[k].clear()
    med = {k: statistics.median(v) for k, v in times.items()}
    if prof:
        last = tmp / f"r{rounds - 1}"

        def one_replay() -> None:
            tracer = Tracer(last, chat_client=client)
            with tracer.replay(source[str(last)]):
                run_agent(traced_llm, _TRACED_TOOL, n)
            tracer.close()

        profile(one_replay)
    split = split_figures(stub, client, tmp, 1 if quick else 15)
    client.close()
    start_rounds = 1 if quick else 5
    python_s = startup_s(["-c", "pass"], start_rounds)
    import_s = startup_s(["-c", "import rewind"], start_rounds) - python_s
    help_s = startup_s(["-m", "rewind", "--help"], start_rounds) - python_s
    figures = {
        "steps": float(n),
        "baseline_ms_per_step": round(med["baseline"], 4),
        "record_ms_per_step": round(med["record"], 4),
        "record_added_ms_per_step": round(med["record"] - med["baseline"], 4),
        "replay_cache_ms_per_step": round(med["replay_cache"], 4),
        "replay_in_place_ms_per_step": round(med["replay_in_place"], 4),
        "replay_in_place_vs_cache_ratio": round(med["replay_in_place"] / med["replay_cache"], 3),
        "replay_in_place_vs_baseline_ratio": round(med["replay_in_place"] / med["baseline"], 3),
        "record_sql_statements": float(statements["record"]),
        "replay_cache_sql_statements": float(statements["replay_cache"]),
        "replay_in_place_sql_statements": float(statements["replay_in_place"]),
        "recorded_store_bytes": float(recorded_bytes),
        "replay_in_place_added_bytes": float(replay_added),
        "replay_cache_fixed_ms": split["fixed_ms"],
        "replay_cache_per_step_ms": split["per_step_ms"],
        "replay_cache_gc_ms_per_trace": split["gc_ms"],
        "import_rewind_s": round(import_s, 3),
        "cli_help_s": round(help_s, 3),
    }
    print(f"traced chain, {n} steps (LLM call to a loopback stub + tool call), {rounds} rounds")
    for k in ("baseline", "record", "replay_cache", "replay_in_place"):
        print(f"  {k:16} {med[k]:8.3f} ms/step  ({statements.get(k, 0)} SQL statements)")
    print(
        f"  in-place replay / cache replay = {figures['replay_in_place_vs_cache_ratio']}; "
        f"/ untraced loop = {figures['replay_in_place_vs_baseline_ratio']}"
    )
    print(
        f"  a whole cached replay (Tracer built to closed, as peerbench times it) = "
        f"{split['fixed_ms']:.2f} ms per trace + {split['per_step_ms']:.4f} ms per step "
        f"(10 vs 100 steps; {split['gc_ms']:.2f} ms of it the garbage collector's per trace)"
    )
    print(f"  recorded store {recorded_bytes} B; one in-place replay adds {replay_added} B")
    print(
        f"  start-up over `python -c pass`: import rewind {import_s:.3f} s, --help {help_s:.3f} s"
    )
    print(json.dumps(figures))
    return 0


def split_figures(
    stub: StubProcess, client: ChatClient, tmp: Path, rounds: int
) -> dict[str, float]:
    """What a whole cached replay costs per trace and per step: traces of 10 and of 100 steps
    are recorded, then replayed ``rounds`` times each through ``Tracer(read_cache=True)``,
    timed from the Tracer's construction to its ``close()`` (peerbench's unit), after a
    ``gc.collect()`` as peerbench does. Per step = (median at 100 - median at 10) / 90; per
    trace = median at 10 - 10 x per step. Also the garbage collector's median ms per 100-step
    trace (its collections, timed through ``gc.callbacks``)."""
    medians: dict[int, float] = {}
    gc_ms: list[float] = []
    pause = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            pause[0] = time.perf_counter()
        else:
            pause[1] += time.perf_counter() - pause[0]

    for n in (10, 100):
        folder = tmp / f"split{n}"
        recorded = whole_trace(client, folder, n, read_cache=False)
        requests_before = stub.count()
        times = []
        for _ in range(rounds + 1):  # the first is the warm-up
            gc.collect()
            pause[1] = 0.0
            gc.callbacks.append(on_gc)
            started = time.perf_counter()
            try:
                digest = whole_trace(client, folder, n, read_cache=True)
            finally:
                gc.callbacks.remove(on_gc)
            times.append((time.perf_counter() - started) * 1000)
            if n == 100:
                gc_ms.append(pause[1] * 1000)
            if digest != recorded:
                raise SystemExit("a cached replay's digest differs from the recording's")
        if stub.count() != requests_before:
            raise SystemExit("a cached replay sent requests to the model")
        medians[n] = statistics.median(times[1:])
    per_step = (medians[100] - medians[10]) / 90
    return {
        "fixed_ms": round(medians[10] - 10 * per_step, 3),
        "per_step_ms": round(per_step, 4),
        "gc_ms": round(statistics.median(gc_ms[1:]), 3),
    }


def whole_trace(client: ChatClient, folder: Path, n: int, *, read_cache: bool) -> str:
    """One trace of ``n`` steps through a new Tracer, closed at the end; returns the digest."""
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with tracer.trace("agent"):
            return run_agent(traced_llm, _TRACED_TOOL, n)
    finally:
        tracer.close()


def numbers_reply(question: str, n: int) -> str:
    """The stub's answer: four numbers derived from the question (the same question, the same
    answer, like peerbench's stub)."""
    h = hashlib.sha256(question.encode()).digest()
    return "numbers " + " ".join(str(b) for b in h[:4])


def serve() -> None:
    """``--serve``: run the stub in this (child) process; print its base URL; answer each stdin
    line with the number of requests received so far; stop when stdin closes."""
    with ModelStub(reply=numbers_reply) as stub:
        print(stub.base_url, flush=True)
        for _line in sys.stdin:
            print(stub.count, flush=True)


class StubProcess:
    """The stub in a child process, so its work does not share this process's GIL."""

    def __init__(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])),
        )
        assert self.child.stdout is not None
        self.base_url = self.child.stdout.readline().strip()

    def count(self) -> int:
        """Requests the stub received so far."""
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write("count\n")
        self.child.stdin.flush()
        return int(self.child.stdout.readline())

    def close(self) -> None:
        """Stop the child."""
        if self.child.stdin is not None:
            self.child.stdin.close()
        self.child.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
