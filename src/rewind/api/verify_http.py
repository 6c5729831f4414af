"""``rewind verify --server``: the 14 demo checks, through the HTTP API only.

A server is booted as a separate process (``python -m rewind.api serve --port 0``) on a fresh
store and an OS-assigned port. The demo is driven as an API user would: start the run, follow its
events, read node 3's param, fork with it changed, replay unchanged, diff, download artifacts.
Every fact a check needs comes from an HTTP answer; check 13 also reads the bundled CSV (as a user
with the dataset would), and check 14 stops the server and replays on a new server process over
the reopened store.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from rewind.api.client import ApiClient
from rewind.errors import RewindError
from rewind.examples import weather
from rewind.verify import Check, _recompute, _resolve

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_URL = re.compile(r"at (http://\S+)")
FORK_NUMBER = 3
FORK_NODE = "analyse"
ARTIFACT = "report.md"


class ServerProcess:
    """``python -m rewind.api serve`` on a free loopback port, as a child process.

    Args:
        store: the store folder.
        startup_timeout: seconds to wait for the URL line.
    """

    def __init__(
        self, store: str, startup_timeout: float = 60.0, setup: TeamSetup | None = None
    ) -> None:
        self.store = store
        self.startup_timeout = startup_timeout
        self.setup = setup
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: list[str] = []

    def __enter__(self) -> ServerProcess:
        argv = [sys.executable, "-m", "rewind.api", "serve", "--port", "0"]
        cwd = None
        if self.setup is None:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env.pop("REWIND_TOKEN", None)
            argv += ["--store", self.store]
        else:  # the store URL travels in the environment: a password never shows in `ps`
            env = self.setup.environment()
            cwd = self.setup.workdir
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
        )
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line.rstrip())
                m = _URL.search(line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(self.startup_timeout) or not self.url:
            self.__exit__()
            raise RewindError(
                "the API server did not start: " + " | ".join(self.output[-5:]),
                "run python -m rewind.api serve by hand to see why",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class ServerDemo:
    """What the demo produced, as read through the API."""

    parent: dict[str, Any]
    fork: dict[str, Any]
    replay: dict[str, Any]
    parent_nodes_before: list[dict[str, Any]]
    override: dict[str, Any]


def run_demo_over_http(api: ApiClient, say: Callable[[str], Any]) -> ServerDemo:
    """Record → fork at node 3 with ``group_by`` changed → unchanged replay from node 3.

    Raises:
        RewindError: the recorded run did not complete.
    """
    say("record (the model answers 4 prompts; takes a minute)")
    parent_id = api.start_run("research")
    parent = api.wait(parent_id)
    if parent["status"] != "completed":
        raise RewindError(f"recording the demo failed: {parent.get('error')}", "")
    before = api.get(f"/api/runs/{parent_id}/nodes")["nodes"]
    node = api.get(f"/api/runs/{parent_id}/nodes/{FORK_NUMBER}")["node"]
    used = node["params"].get("group_by")
    override = {
        "kind": "param",
        "node": FORK_NODE,
        "param": "group_by",
        "value": "month" if used == "season" else "season",
    }
    say(f"fork at node {FORK_NUMBER} with {FORK_NODE}.group_by={override['value']!r}")
    # The report changes, so its publish must really run (the demo forks the same way).
    fork = api.wait(api.fork(parent_id, FORK_NUMBER, override, effects="live"))
    say(f"unchanged replay from node {FORK_NUMBER}")
    replay = api.wait(api.replay(parent_id, FORK_NUMBER))
    return ServerDemo(parent, fork, replay, before, override)


def run_http_checks(
    api: ApiClient, demo: ServerDemo, fresh: Callable[[], ApiClient]
) -> list[Check]:
    """The 14 checks of :mod:`rewind.verify`, each re-derived from HTTP answers.

    Args:
        api: client of the server that ran the demo.
        demo: what :func:`run_demo_over_http` returned.
        fresh: stops that server and returns a client of a new server process on the same
            store (check 14).
    """
    pid, fid, rid = demo.parent["run_id"], demo.fork["run_id"], demo.replay["run_id"]
    pn = api.get(f"/api/runs/{pid}/nodes")["nodes"]
    fn = api.get(f"/api/runs/{fid}/nodes")["nodes"]
    rn = api.get(f"/api/runs/{rid}/nodes")["nodes"]
    k = FORK_NUMBER - 1
    checks: list[Check] = []

    def output(run_id: str, number: int) -> dict[str, Any]:
        out: dict[str, Any] = api.get(f"/api/runs/{run_id}/nodes/{number}/output")["output"]
        return out

    def artifact(run_id: str) -> bytes:
        return api.download(f"/api/runs/{run_id}/artifacts/{ARTIFACT}")

    def add(claim: str, fn_: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = fn_()
        except Exception as exc:  # a check that crashes is a failed check, with the reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        checks.append(Check(len(checks) + 1, claim, ok, detail))

    def c1() -> tuple[bool, str]:
        hashed = sum(
            1 for n in pn if _HEX64.match(n["input_hash"]) and _HEX64.match(n["output_hash"] or "")
        )
        return len(pn) == 8 and hashed == 8, f"{len(pn)} nodes, {hashed} with input+output sha256"

    def c2() -> tuple[bool, str]:
        data = artifact(pid)
        recorded = output(pid, len(pn))["report"]["sha256"]
        on_disk = hashlib.sha256(data).hexdigest()
        return on_disk == recorded, f"downloaded {on_disk[:12]} vs recorded {recorded[:12]}"

    def c3() -> tuple[bool, str]:
        llm = [n for n in pn if any(c["kind"] == "llm" for c in n["calls"])]
        llm_sum = sum(n["tokens"] for n in llm)
        run = api.get(f"/api/runs/{pid}")
        ok = run["tokens"] > 0 and run["tokens"] == llm_sum and len(llm) == 4
        return ok, f"run {run['tokens']} tokens = {llm_sum} over {len(llm)} LLM nodes"

    def c4() -> tuple[bool, str]:
        inherited = [n for n in fn[:k] if n["status"] == "inherited"]
        same = all(
            a["output_hash"] == b["output_hash"] for a, b in zip(pn[:k], fn[:k], strict=True)
        )
        spent = sum(n["tokens"] for n in fn[:k])
        ok = len(inherited) == k and same and spent == 0
        return ok, f"{len(inherited)}/{k} inherited, hashes equal={same}, tokens {spent}"

    def c5() -> tuple[bool, str]:
        executed = [n for n in fn if not n["inherited"]]
        first = executed[0]
        ok = len(executed) >= 3 and first["position"] == k and first["name"] == pn[k]["name"]
        return ok, f"{len(executed)} nodes executed from #{first['number']} {first['name']}"

    def c6() -> tuple[bool, str]:
        d = api.get("/api/diff", a=pid, b=fid)
        idx = d["first_divergence"]
        if idx is None:
            return False, "no divergence found"
        row = d["nodes"][idx]
        a_out, b_out = output(pid, FORK_NUMBER), output(fid, FORK_NUMBER)
        paths = [c["path"] for c in row["changes"]]
        exact = all(
            _resolve(a_out, c["old_path"] or c["path"], c["old"])
            and _resolve(b_out, c["path"], c["new"])
            for c in row["changes"]
            if c["kind"] in ("changed", "type_changed")
        )
        ok = row["a"]["position"] == k and bool(paths) and exact
        shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3})" if len(paths) > 3 else "")
        return ok, f"first divergence #{row['a']['position'] + 1} {row['name']}: {shown}"

    def c7() -> tuple[bool, str]:
        a = hashlib.sha256(artifact(pid)).hexdigest()
        b = hashlib.sha256(artifact(fid)).hexdigest()
        return a != b, f"parent {a[:12]} vs fork {b[:12]}"

    def c8() -> tuple[bool, str]:
        executed = [n for n in rn if not n["inherited"]]
        calls = [c for n in executed for c in n["calls"]]
        hits = [c for c in calls if c["outcome"] == "hit"]
        # A side-effecting call (publish) is served from its record: nothing runs, 0 tokens.
        served = [c for c in calls if c["outcome"] == "served"]
        node_hits = [n for n in executed if n["cache_outcome"] == "hit"]
        ok = (
            bool(executed)
            and len(node_hits) == len(executed)
            and len(hits) + len(served) == len(calls)
            and all(c["determinism"] == "side-effect" for c in served)
        )
        return ok, (
            f"{len(node_hits)}/{len(executed)} nodes hit; {len(hits)} calls hit, "
            f"{len(served)} side effect served from record"
        )

    def c9() -> tuple[bool, str]:
        run = api.get(f"/api/runs/{rid}")
        return run["tokens"] == 0, f"{run['tokens']} tokens"

    def c10() -> tuple[bool, str]:
        pairs = list(zip(pn, rn, strict=False))
        equal = sum(
            1 for a, b in pairs if a["output_hash"] == b["output_hash"] and a["name"] == b["name"]
        )
        return len(rn) == len(pn) and equal == len(pn), f"{equal}/{len(pn)} output hashes equal"

    def c11() -> tuple[bool, str]:
        a, b = artifact(pid), artifact(rid)
        return a == b, f"{len(a)} vs {len(b)} bytes, identical={a == b}"

    def c12() -> tuple[bool, str]:
        now = api.get(f"/api/runs/{pid}/nodes")["nodes"]
        run = api.get(f"/api/runs/{pid}")
        same = now == demo.parent_nodes_before
        ok = (
            same
            and run["status"] == demo.parent["status"]
            and run["tokens"] == demo.parent["tokens"]
        )
        return ok, f"{len(now)} rows identical={same} after {len(run['children'])} forks"

    def c13() -> tuple[bool, str]:
        outs = {n["name"]: output(pid, n["number"]) for n in pn}
        analysis, check, prose = (
            outs["analyse"]["analysis"],
            outs["verify"]["check"],
            outs["compose"]["prose"],
        )
        state = api.get(f"/api/runs/{pid}/nodes/1/state")["state"]
        expected = _recompute(weather.load_table(state["csv_path"]), analysis)
        table = {row["group"]: row for row in analysis["table"]}
        decimals = int(analysis.get("decimals", 2))
        tolerance = 0.6 * 10**-decimals
        bad = [
            g
            for g, v in expected.items()
            if g not in table or abs(table[g]["value"] - v) > tolerance
        ]
        report = artifact(pid).decode("utf-8")
        in_report = all(f"{row['value']:.{decimals}f}" in report for row in analysis["table"])
        numbers = weather.numbers_in_text(prose)
        listed = {u["text"] for u in check["unsupported_numbers"]}
        supported = {s["text"] for s in check["supported_numbers"]}
        unclassified = [n["text"] for n in numbers if n["text"] not in listed | supported]
        ok = (
            not bad
            and len(expected) == len(table)
            and in_report
            and check["table_matches"]
            and not unclassified
            and check["numbers_checked"] == len(numbers)
            and all(u in report for u in listed)
        )
        return ok, (
            f"{len(table)} groups, {len(bad)} mismatches vs pandas; prose numbers {len(numbers)}: "
            f"{len(listed)} unsupported listed ({', '.join(sorted(listed)[:4]) or 'none'})"
        )

    def c14() -> tuple[bool, str]:
        api2 = fresh()
        run = api2.wait(api2.replay(pid, FORK_NUMBER))
        nodes = [
            n for n in api2.get(f"/api/runs/{run['run_id']}/nodes")["nodes"] if not n["inherited"]
        ]
        hits = sum(1 for n in nodes if n["cache_outcome"] == "hit")
        ok = hits == len(nodes) == len(pn) - k and run["tokens"] == 0
        return ok, f"new server process: {hits}/{len(nodes)} hits, {run['tokens']} tokens"

    for claim, fn_ in [
        ("parent records all 8 nodes with input and output sha256", c1),
        ("artifact download's sha256 equals the recorded publish hash", c2),
        ("parent tokens > 0 and equal the sum over its LLM nodes", c3),
        ("fork at node 3 inherits nodes 1-2 (not executed, equal hashes)", c4),
        ("fork executes from node 3 on (>= 3 nodes)", c5),
        ("diff: first divergence is node 3, naming the exact changed field paths", c6),
        ("forked artifact hash differs from the parent's", c7),
        ("unchanged replay from node 3 is 100% cache hits", c8),
        ("unchanged replay spends 0 tokens", c9),
        ("unchanged replay: every node output hash equals the parent's", c10),
        ("unchanged replay artifact is byte-identical to the parent's", c11),
        ("parent rows and hashes unchanged after both forks", c12),
        ("artifact table agrees with the CSV; every unsupported prose number listed", c13),
        (
            "unchanged replay on a new server process over the reopened store: 100% hits, 0 tokens",
            c14,
        ),
    ]:
        add(claim, fn_)
    return checks


@dataclass
class TeamSetup:
    """The team services ``rewind verify --server`` runs against (each None: not used).

    Args:
        store: a database URL (``postgresql+psycopg://user:password@host/db``), or None for a
            fresh SQLite folder.
        queue: the task queue's Redis URL; jobs then execute on ``rewind worker`` processes.
        objects: the object store URL (``s3://bucket/prefix``); large blobs and artifact copies
            go there. S3 endpoint and credentials come from the usual ``AWS_*`` and
            ``FSSPEC_S3_ENDPOINT_URL`` variables, as for the server.
        workdir: the folder the server (and a worker started by verify) run in: a URL store
            writes its local artifact files below ``./.rewind`` there.
    """

    store: str | None = None
    queue: str | None = None
    objects: str | None = None
    workdir: str = ""

    @property
    def is_team(self) -> bool:
        """True when any team service is configured."""
        return bool(self.store or self.queue or self.objects)

    def environment(self) -> dict[str, str]:
        """The environment of a server or worker process of this setup (no ``REWIND_TOKEN``:
        the process must not adopt the caller's token as its own)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("REWIND_TOKEN", None)
        for name, value in (
            ("REWIND_STORE", self.store),
            ("REWIND_QUEUE", self.queue),
            ("REWIND_OBJECTS", self.objects),
        ):
            if value:
                env[name] = value
            else:
                env.pop(name, None)
        return env

    def describe(self) -> str:
        """One line naming the services, with credentials hidden."""
        from rewind.jobs.queue import safe_url

        parts = [f"store {safe_url(self.store)}" if self.store else "fresh SQLite store"]
        parts.append(f"queue {safe_url(self.queue)}" if self.queue else "jobs on server threads")
        if self.objects:
            parts.append(f"objects {safe_url(self.objects)}")
        return ", ".join(parts)


def check_team_setup(store: str | None, queue: str | None, objects: str | None) -> None:
    """Reject a setup verify cannot run against, before anything starts.

    Raises:
        InvalidOverride: ``store`` is not a database URL, or a queue is given without one (a
            team worker would run the jobs against its own store, not verify's fresh one).
    """
    from rewind.errors import InvalidOverride

    if store is not None and "://" not in store:
        raise InvalidOverride(
            f"verify --server --store takes a database URL, not {store!r}",
            "pass --store postgresql+psycopg://USER:PASSWORD@HOST/DB, or leave it out for a "
            "fresh SQLite store",
        )
    if queue and not store:
        raise InvalidOverride(
            "verify --server --queue needs the team's database --store (workers run jobs "
            "against the store they were started with, not a fresh one)",
            "pass --store postgresql+psycopg://… too (or set REWIND_STORE), or unset REWIND_QUEUE",
        )


PING_TIMEOUT_S = 1.0
"""Seconds a worker has to answer verify's ping (Celery's own ``celery inspect ping`` default).
A ping collects replies until this much silence: with no worker it always lasts this long."""
PING_SETTLE_S = 0.5
"""Seconds the other workers have to answer once the first one did (they reply in
milliseconds on one network; the count is only reported)."""
READY_PROBE_S = 0.25
"""Seconds one readiness probe waits for the worker verify started: a ping sent before the
worker listens is lost, so a short probe, repeated, notices the worker soon after it listens."""


def queue_workers(
    queue: str, timeout: float = PING_TIMEOUT_S, settle: float = PING_SETTLE_S
) -> list[str]:
    """Names of the Celery workers answering a ping on the queue ``queue`` (may be empty).

    Args:
        queue: the broker URL.
        timeout: seconds to wait for a first answer (no answer: ``[]`` after this long).
        settle: seconds to wait for the others once one answered (0: return the first one).
    Raises:
        QueueUnavailable: the broker cannot be reached.
    """
    from rewind.jobs.queue import QueueUnavailable, celery_app, check_queue, safe_url

    check_queue(queue)
    control = celery_app(queue).control
    try:
        # ``limit=1``: return at the first answer, not after ``timeout`` (a ping without a
        # limit collects replies until ``timeout`` of silence, however soon they answered).
        replies = control.ping(timeout=timeout, limit=1) or []
        if replies and settle > 0:
            replies += control.ping(timeout=settle) or []
    except Exception as exc:  # the broker went away during the ping (redis ConnectionError)
        raise QueueUnavailable(
            f"cannot reach the task queue at {safe_url(queue)}: {exc}",
            "start Redis (redis-server) or fix --queue / REWIND_QUEUE",
        ) from exc
    return sorted({name for reply in replies for name in reply})


@contextlib.contextmanager
def verification_worker(setup: TeamSetup, say: Callable[[str], Any]) -> Iterator[None]:
    """Make sure a ``rewind worker`` consumes ``setup.queue`` during the verification: use the
    ones already running, else start one (stopped again on exit) and wait until it answers.

    Raises:
        RewindError: the worker verify started exited or did not answer within 120 s.
    """
    assert setup.queue is not None
    running = queue_workers(setup.queue)
    if running:
        say(f"{len(running)} rewind worker(s) consume the queue: {', '.join(running)}")
        yield
        return
    log = open(os.path.join(setup.workdir, "worker.log"), "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewind", "worker", "--concurrency", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=setup.environment(),
        cwd=setup.workdir,
    )
    say(f"no rewind worker consumes the queue; started one for this verification (pid {proc.pid})")
    try:
        deadline = time.monotonic() + 120
        while not queue_workers(setup.queue, timeout=READY_PROBE_S, settle=0):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                with open(log.name) as f:
                    tail = " | ".join(f.read().strip().splitlines()[-3:])
                raise RewindError(
                    f"the rewind worker verify started did not come up: {tail}",
                    "run `rewind worker` by hand with the same REWIND_STORE and REWIND_QUEUE",
                )
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        say(f"stopped the rewind worker verify started (pid {proc.pid})")


@contextlib.contextmanager
def _servers(
    folder: str, setup: TeamSetup | None = None
) -> Iterator[tuple[ApiClient, Callable[[], ApiClient]]]:
    # A user's token, for a team store with users (a fresh store's server requires none).
    token = (os.environ.get("REWIND_TOKEN", "").strip() or None) if setup and setup.store else None
    stack = contextlib.ExitStack()
    first = stack.enter_context(ServerProcess(folder, setup=setup))
    api = stack.enter_context(ApiClient(first.url, token=token))
    state: dict[str, Any] = {"first": first, "api": api}

    def fresh() -> ApiClient:
        state["api"].close()
        state["first"].__exit__()
        second = stack.enter_context(ServerProcess(folder, setup=setup))
        client = stack.enter_context(ApiClient(second.url, token=token))
        state["api"], state["first"] = client, second
        return client

    try:
        yield api, fresh
    finally:
        stack.close()


def run_server_verification(
    *,
    keep: bool = False,
    out: TextIO,
    store: str | None = None,
    queue: str | None = None,
    objects: str | None = None,
) -> int:
    """Boot a server, drive the demo through the API, print the 14 checks; 0 if all pass.

    Args:
        keep: keep the temporary folder (the fresh store, or a team setup's work folder).
        out: where the progress and the checks are printed.
        store: a database URL to run against (None: a fresh SQLite store). Runs recorded in a
            team store stay there (runs are immutable); verify removes only its temporary
            folder and the processes it started.
        queue: a Redis URL: jobs execute on ``rewind worker`` processes (verify starts one
            when none answers). Needs ``store``.
        objects: an object store URL for large blobs and artifact copies.
    Raises:
        InvalidOverride: a setup :func:`check_team_setup` rejects (nothing started).
    """
    check_team_setup(store, queue, objects)
    folder = tempfile.mkdtemp(prefix="rewind-verify-server-")
    started = time.perf_counter()
    setup = TeamSetup(store, queue, objects, workdir=folder)

    def say(text: str) -> None:
        print(f"  {text}…", file=out, flush=True)

    if setup.is_team:
        print(f"verify --server: {setup.describe()}", file=out, flush=True)
    else:
        print(f"verify --server: fresh store {folder}", file=out, flush=True)
    demo: ServerDemo | None = None
    try:
        with contextlib.ExitStack() as stack:
            if queue:
                stack.enter_context(verification_worker(setup, say))
            api, fresh = stack.enter_context(
                _servers(store or folder, setup if setup.is_team else None)
            )
            print(f"  server at {api.http.base_url}", file=out, flush=True)
            if queue:
                execution = api.get("/api/health")["execution"]
                mode = f"{execution.get('mode')} {execution.get('queue', '')}"
                say(f"server executes jobs on: {mode.strip()}")
            demo = run_demo_over_http(api, say)
            checks = run_http_checks(api, demo, fresh)
    except RewindError as exc:
        print(f"error: {exc.message}" + (f" — {exc.hint}" if exc.hint else ""), file=out)
        return 1
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    width = max(len(c.claim) for c in checks)
    for c in checks:
        verdict = "PASS" if c.passed else "FAIL"
        print(f"{c.number:>3} {c.claim:<{width}}  {verdict}  {c.detail}", file=out)
    passed = sum(c.passed for c in checks)
    print(
        f"{passed}/{len(checks)} checks passed over HTTP ({time.perf_counter() - started:.0f} s)",
        file=out,
        flush=True,
    )
    if store and demo is not None:
        ids = [demo.parent["run_id"], demo.fork["run_id"], demo.replay["run_id"]]
        print(
            f"runs {', '.join(i[:12] for i in ids)} (and check 14's replay) stay in the store: "
            "runs are immutable; `rewind gc` expires them like any other",
            file=out,
        )
    if keep:
        print(f"{'work folder' if store else 'store'} kept at {folder}", file=out)
    return 0 if passed == len(checks) else 1
