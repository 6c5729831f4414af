"""The run context: what a node's LLM and tool calls need, carried in a contextvar.

Overrides, the cache read policy and the source trajectory's calls (its *lineage*) travel here and
never in Burr state (DESIGN rule 3): an empty ``{"overrides": {}}`` key in state would change every
downstream prompt and silently cold the cache. Telemetry (tokens, latency) also stays here (rule 1).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.store.records import CallRecord

if TYPE_CHECKING:
    from rewind.llm import ChatClient
    from rewind.store import Store

_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "rewind_run_context", default=None
)


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

    @property
    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens spent by the node's calls so far."""
        return (
            sum(c.prompt_tokens for c in self.calls),
            sum(c.completion_tokens for c in self.calls),
        )


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
        lineage_blobs: the lineage's result bytes, fetched in one query when the fork starts.
        effects_mode: how a replay treats side-effecting calls: ``recorded`` (serve the record),
            ``dry-run`` (log, execute nothing) or ``live`` (re-execute after verifying the
            resource's pre-state); see :mod:`rewind.effects`.
        write_cache: False for stability runs: results are recorded on the run but never
            become canonical cache entries.
        bypass_reason: the reason a call that skips cache reads records (``bypass`` when
            recording, ``stability`` in hash-stability mode).
        clock: unix seconds now; injectable so TTL rules can be tested.
        chat_client: the model endpoint's client (None: LLM calls raise).
        fork_node: name of the fork node (its misses are reason ``override`` when it carries one).
    """

    store: Store
    run_id: str
    read_cache: bool = False
    param_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    lineage: dict[str, LineageEntry] = field(default_factory=dict)
    chat_client: ChatClient | None = None
    fork_node: str | None = None
    node: NodeScope | None = None
    on_event: Any = None  # callable(event: str, payload: dict) for progress displays
    lineage_blobs: dict[str, bytes] = field(default_factory=dict)
    recent: dict[str, PendingWrite] = field(default_factory=dict)
    effects_mode: str = "recorded"
    write_cache: bool = True
    bypass_reason: str = "bypass"
    clock: Callable[[], float] = time.time

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
    """Make ``ctx`` the active run context for the duration of the block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


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
