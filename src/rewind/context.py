"""The run context: what a node's LLM and tool calls need, carried in a contextvar.

Overrides, the cache read policy and the source trajectory's calls (its *lineage*) travel here and
never in Burr state (DESIGN rule 3): an empty ``{"overrides": {}}`` key in state would change every
downstream prompt and silently cold the cache. Telemetry (tokens, latency) also stays here (rule 1).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from rewind.store.records import CallRecord

if TYPE_CHECKING:
    from rewind.llm import ChatBackend
    from rewind.store import Store

P = ParamSpec("P")
R = TypeVar("R")

_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "rewind_run_context", default=None
)
# The worker lane of the code running now: () for a node's own thread and its asyncio tasks,
# (k,) for the k-th task the node handed to a thread pool, (k, j) for a task that one handed on.
# Identical requests are numbered per lane, so thread scheduling cannot reorder recorded samples.
_LANE: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("rewind_lane", default=())
# True while a cached call executes live: HTTP capture must not record the requests a call makes
# itself (``rewind.chat``'s own POST, a tool's HTTP traffic) a second time.
_EXECUTING: contextvars.ContextVar[bool] = contextvars.ContextVar("rewind_executing", default=False)
_ACTIVE: dict[str, int] = {}  # run id -> number of open activations, in any thread
_ACTIVE_LOCK = threading.Lock()
# This process's id, kept up to date in forked children: os.getpid() is a system call, and
# every tool call asks whether it runs in the run's process.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


@dataclass
class PendingWrite:
    """A cache entry produced during a node, written with the node's row in one transaction."""

    kind: str  # llm | tool
    key: str
    name: str
    request_hash: str
    request_bytes: bytes
    result_hash: str
    result_bytes: bytes
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cacheable: bool = True  # False: keep the result blob but write no cache entry
    produced_at: float | None = None
    origin: str | None = None  # the importing trace's id for an answer seeded by an import


@dataclass(frozen=True)
class LineageEntry:
    """A call the source trajectory made: its result blob, when that result was produced (unix
    s, for TTLs) and where the call was recorded (for its effect fingerprints)."""

    result_hash: str
    produced_at: float | None
    run_id: str
    position: int
    call_index: int


@dataclass
class NodeScope:
    """Accumulates what one node execution does: params read, calls made, pending cache writes."""

    name: str
    position: int
    started_at: float
    started_perf: float
    param_overrides: dict[str, Any]
    input_overrides: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
    pending: dict[str, PendingWrite] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    occurrences: dict[tuple[tuple[int, ...], str], int] = field(default_factory=dict)
    submits: dict[tuple[int, ...], int] = field(default_factory=dict)
    spawned: dict[tuple[int, ...], int] = field(default_factory=dict)
    sub_calls: list[CallRecord] = field(default_factory=list)
    """Calls made by the sub-runs this node spawned (they are recorded on the sub-runs; the
    node's cache outcome and tokens include them)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _next_index: int = 0

    @classmethod
    def fresh(
        cls,
        name: str,
        position: int,
        started_at: float,
        started_perf: float,
        param_overrides: dict[str, Any],
    ) -> NodeScope:
        """``NodeScope(name, position, started_at, started_perf, param_overrides)``: every
        field set as ``__init__`` sets it, without running the generated ``__init__`` and its
        default factories one by one (a traced step opens one scope)."""
        scope = object.__new__(cls)
        scope.__dict__.update(
            name=name,
            position=position,
            started_at=started_at,
            started_perf=started_perf,
            param_overrides=param_overrides,
            input_overrides={},
            params={},
            calls=[],
            pending={},
            effects=[],
            occurrences={},
            submits={},
            spawned={},
            sub_calls=[],
            lock=threading.Lock(),
            _next_index=0,
        )
        return scope

    def reserve_index(self) -> int:
        """The next call index of this node (0, 1, …); safe from worker threads."""
        with self.lock:
            index = self._next_index
            self._next_index += 1
            return index

    def add_call(self, record: CallRecord) -> None:
        """Append a finished call's record; safe from worker threads."""
        with self.lock:
            self.calls.append(record)

    def occurrence(self, lane: tuple[int, ...], key: str) -> int:
        """How many times this lane of the node sent ``key`` before (0 for the first time)."""
        with self.lock:
            n = self.occurrences.get((lane, key), 0)
            self.occurrences[(lane, key)] = n + 1
            return n

    def next_lane(self, parent: tuple[int, ...]) -> tuple[int, ...]:
        """A new worker lane under ``parent``: the node's k-th hand-off from that lane."""
        with self.lock:
            k = self.submits.get(parent, 0)
            self.submits[parent] = k + 1
        return (*parent, k)

    def spawn_key(self, lane: tuple[int, ...]) -> str:
        """The key of the next Burr sub-application this node builds in worker ``lane``: the
        lane, then the order of the build in that lane (``"2.0"``: the first app built by the
        node's third thread-pool task; ``"1"``: the second built on the node's own thread).
        Stable across replays, whatever the thread scheduling."""
        with self.lock:
            n = self.spawned.get(lane, 0)
            self.spawned[lane] = n + 1
        return ".".join(str(part) for part in (*lane, n))

    @property
    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens spent by the node's calls so far, its sub-runs' included."""
        prompt = completion = 0
        for calls in (self.calls, self.sub_calls):
            for c in calls:
                prompt += c.prompt_tokens
                completion += c.completion_tokens
        return prompt, completion


@dataclass
class RunContext:
    """Everything a run's calls need.

    Args:
        store: where cache entries and blobs live.
        run_id: the run being executed.
        read_cache: False when recording a new run (calls execute live, reason ``bypass``);
            True when replaying a fork.
        param_overrides: ``{node: {param: value}}`` (the one change a fork carries).
        input_overrides: ``{node: {input: value}}``: Burr runtime inputs a fork changes.
        lineage: ``{cache key: result blob hash}`` of the calls the source trajectory made; a
            replay serves these first, so an unchanged replay returns exactly the parent's results
            even if the cache holds a newer entry for the same key.
        lineage_blobs: result bytes by hash: the lineage's, fetched in one query when the fork
            starts, and those the run was served from the cache since (read once).
        lineage_at: ``{(node position, cache key): entry}`` over the same calls; served before
            ``lineage`` so each execution of a looped node gets its own recorded answer.
        effects_mode: how a replay treats side-effecting calls: ``recorded`` (serve the record),
            ``dry-run`` (log, execute nothing) or ``live`` (re-execute after verifying the
            resource's pre-state); see :mod:`rewind.effects`.
        lineage_slots: ``{(node position, call index): entry}`` of the side-effecting calls the
            source trajectory executed: a ``live`` call verifies the pre-state recorded at its
            slot, whatever its arguments.
        restore_mode: ``refuse`` or ``replace``: what a ``live`` restore does with data the
            pinned snapshot does not hold (:data:`rewind.effects.RESTORE_MODES`).
        write_cache: False for stability runs: results are recorded on the run but never
            become canonical cache entries.
        cached_kinds: the call kinds a replay may serve from the cache (``llm``, ``tool``); a
            kind left out executes live, reason ``bypass`` (the replay switches "use cached LLM
            answers" and "use cached tool results").
        bypass_reason: the reason a call that skips cache reads records (``bypass`` when
            recording, ``stability`` in hash-stability mode).
        clock: unix seconds now; injectable so TTL rules can be tested.
        chat_client: the model endpoint's client (None: LLM calls raise).
        fork_node: name of the fork node (its misses are reason ``override`` when it carries one).
        failed_at: position → name of the replayed trace's steps that failed. A call made at
            such a position, in a step of that name, that the source did not record there (it
            raised) is executed again, reason ``source-failed``, never served another step's
            result for the same key: an agent that retried a failing tool must meet the failure
            again on replay. A step of another name there (the chain was edited) is looked up
            as usual.
        failed_calls: ``(position, cache key)`` → the replayed trace's model calls that raised
            there (``failed`` call rows, their failure document as ``result_hash``): a replay
            that reads the cache raises that failure again, sending nothing.
    """

    store: Store
    run_id: str
    read_cache: bool = False
    param_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    lineage: dict[str, LineageEntry] = field(default_factory=dict)
    chat_client: ChatBackend | None = None
    fork_node: str | None = None
    node: NodeScope | None = None
    on_event: Any = None  # callable(event: str, payload: dict) for progress displays
    lineage_blobs: dict[str, bytes] = field(default_factory=dict)
    lineage_at: dict[tuple[int, str], LineageEntry] = field(default_factory=dict)
    failed_at: dict[int, str] = field(default_factory=dict)
    failed_calls: dict[tuple[int, str], LineageEntry] = field(default_factory=dict)
    recent: dict[str, PendingWrite] = field(default_factory=dict)
    effects_mode: str = "recorded"
    lineage_slots: dict[tuple[int, int], LineageEntry] = field(default_factory=dict)
    restore_mode: str = "refuse"
    write_cache: bool = True
    bypass_reason: str = "bypass"
    cached_kinds: frozenset[str] = frozenset({"llm", "tool"})
    clock: Callable[[], float] = time.time
    pid: int = field(default_factory=os.getpid)
    """The process the run executes in: a forked child inherits the context but nothing it
    records comes back (see :func:`in_child_process`)."""

    outside_node: Callable[[str, str, bytes], contextlib.AbstractContextManager[Any]] | None = None
    """For a traced chain: ``fn(kind, name, request)``, a context manager (yielding the step)
    that runs a call made outside any step as a ``tool_call``/``llm_call`` step of its own, so
    the call is stored and served on replay like any other. None elsewhere."""

    find_source: Callable[[str, str], dict[tuple[str, str], Any] | None] | None = None
    """For a cached trace not yet linked to a source: ``fn(kind, key)``, called once at the
    first cache lookup; it returns the entries to use as :attr:`prefetched` (and may fill
    :attr:`lineage_blobs`) from the recorded trace that made that call
    (:mod:`rewind.tracing.tracer_source`)."""
    prefetched: dict[tuple[str, str], Any] | None = None
    """Cache entries read ahead, by ``(kind, key)``: what the cache table held for them when
    they were read (a key not listed is looked up in the store)."""

    served: dict[str, tuple[bytes, bytes]] | None = None
    """For a traced chain: the request and result bytes of each call served from the cache, by
    key (None elsewhere: nothing kept). A replay whose source left the store while it ran is
    written in full with them (:meth:`rewind.tracing.tracer.Trace.finish`)."""

    def in_child_process(self) -> bool:
        """Whether the calling code runs in a child process forked from the run's process
        (``multiprocessing`` with ``fork``, ``os.fork``): a call made there cannot be recorded."""
        return _PID[0] != self.pid

    def remember(self, scope: NodeScope) -> None:
        """Keep a finished node's new cache entries visible to later nodes of this run until
        the recorder's batch is committed."""
        self.recent.update(scope.pending)

    def begin_node(self, name: str, position: int) -> NodeScope:
        """Open the scope of one node execution."""
        self.node = NodeScope(
            name=name,
            position=position,
            started_at=time.time(),
            started_perf=time.perf_counter(),
            param_overrides=dict(self.param_overrides.get(name, {})),
            input_overrides=dict(self.input_overrides.get(name, {})),
        )
        return self.node

    def emit(self, event: str, **payload: Any) -> None:
        """Send a progress event to the listener, never raising into the run."""
        if self.on_event is not None:
            # A progress display must never break a run.
            with contextlib.suppress(Exception):
                self.on_event(event, payload)


def current() -> RunContext | None:
    """The active run context of this thread/task, or None outside a Rewind run."""
    return _CURRENT.get()


@contextmanager
def activate(ctx: RunContext) -> Iterator[RunContext]:
    """Make ``ctx`` the active run context for the duration of the block.

    The context follows asyncio tasks by itself (they copy contextvars) and follows work handed
    to a ``concurrent.futures.ThreadPoolExecutor`` because the first activation installs
    :func:`rewind.capture.threads.follow_thread_pools`; model requests of httpx-based SDKs are
    captured once :func:`rewind.capture.install` ran (also done here unless
    ``REWIND_HTTP_CAPTURE=off``).
    """
    from rewind.capture import ensure_installed

    ensure_installed()
    with _ACTIVE_LOCK:
        _ACTIVE[ctx.run_id] = _ACTIVE.get(ctx.run_id, 0) + 1
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
        with _ACTIVE_LOCK:
            left = _ACTIVE.pop(ctx.run_id, 1) - 1
            if left > 0:
                _ACTIVE[ctx.run_id] = left


def enter(ctx: RunContext) -> contextvars.Token[RunContext | None]:
    """Make ``ctx`` the run context of the running code until :func:`leave` (a sub-run's
    recorder does this around each step of its Burr sub-application, in that step's thread)."""
    return _CURRENT.set(ctx)


def leave(token: contextvars.Token[RunContext | None]) -> None:
    """Undo :func:`enter`."""
    _CURRENT.reset(token)


def active_runs() -> list[str]:
    """Ids of the runs active in this process right now, in any thread (sorted)."""
    with _ACTIVE_LOCK:
        return sorted(_ACTIVE)


def current_lane() -> tuple[int, ...]:
    """The worker lane of the running code (``()`` on the node's own thread)."""
    return _LANE.get()


def executing() -> bool:
    """True while a cached call executes live (its own HTTP requests are not captured again)."""
    return _EXECUTING.get()


@contextmanager
def executing_call() -> Iterator[None]:
    """Mark the block as the live execution of one cached call."""
    token = _EXECUTING.set(True)
    try:
        yield
    finally:
        _EXECUTING.reset(token)


def propagate(fn: Callable[P, R]) -> Callable[P, R]:
    """Return ``fn`` bound to the current run context, to be called in another thread.

    Calls ``fn`` makes there (LLM, tool, captured HTTP) belong to the current node: recorded,
    counted and replayed. The returned function runs in a copy of the context taken now and in
    a new worker lane numbered in hand-off order, so identical requests sent from different
    threads are numbered per lane and an unchanged replay returns each thread its own recorded
    answers whatever the scheduling. Work submitted to a ``ThreadPoolExecutor`` during a run is
    propagated this way automatically (one lane per ``submit``); use this for
    ``threading.Thread(target=propagate(work))`` and other kinds of pools, once per task.
    Outside a run it returns ``fn`` unchanged.

    Args:
        fn: any callable.
    Returns:
        a callable with the same signature and result.
    """
    ctx = current()
    if ctx is None or getattr(fn, "__rewind_propagated__", False):
        return fn
    parent = _LANE.get()
    lane = ctx.node.next_lane(parent) if ctx.node is not None else parent
    snapshot = contextvars.copy_context()

    @functools.wraps(fn)
    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        # A Context can be entered by one thread at a time: run each call in its own copy.
        return snapshot.copy().run(_in_lane, lane, fn, *args, **kwargs)

    bound.__rewind_propagated__ = True  # type: ignore[attr-defined]
    return bound


def in_new_lane() -> None:
    """Move the running context to a new worker lane of the current node, numbered in hand-off
    order under the current lane (called inside a context copied for a new asyncio task)."""
    ctx = current()
    if ctx is not None and ctx.node is not None:
        _LANE.set(ctx.node.next_lane(_LANE.get()))


def _in_lane(lane: tuple[int, ...], fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    _LANE.set(lane)
    return fn(*args, **kwargs)


def param(name: str, default: Any) -> Any:
    """A node parameter: the fork's override for the current node if it has one, else ``default``.

    Call it inside a Burr action. The value used is recorded on the node row (and enters the node's
    input hash), which is how ``rewind fork --set node.param=…`` knows the node has that param.
    Outside a Rewind run it returns ``default``.

    Args:
        name: the param's name, e.g. ``"group_by"``.
        default: its value when no override applies; must be JSON-like.
    """
    ctx = current()
    if ctx is None or ctx.node is None:
        return default
    scope = ctx.node
    value = scope.param_overrides.get(name, default)
    scope.params[name] = value
    return value
