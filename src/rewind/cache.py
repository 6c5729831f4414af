"""The content-addressed call cache: every LLM and tool call of a run goes through here.

A call is identified by its cache key (DESIGN rule 5). Replay looks the key up in the source
trajectory's lineage first, then in the cache table; a hit returns the stored result bytes
unchanged and spends 0 tokens. Every call records its outcome and the rule that decided it
(rule 6): ``hit``, ``miss:new-input``, ``miss:override``, ``miss:no-entry``, ``miss:ttl-expired``,
``miss:bypass`` (recording), ``miss:source-failed`` (the replayed trace's step raised
there), ``bypass:stability``, ``served:side-effect-recorded``,
``dry-run:side-effect-dry-run``, ``miss:side-effect-live``, ``hit:in-flight`` (shared with a
concurrent replay executing the same call), ``failed:raised`` (a model call the endpoint dropped
or refused: its error is kept as the call's result, :mod:`rewind.call`) and ``failed:replayed``
(a replay raised that recorded error again at the same node position and key: nothing sent).

Determinism flags decide the rules: ``deterministic`` entries never expire; ``time-bound`` entries
older than their ``ttl_s`` are misses (the same rule for any input), and so are those dated after
the run's clock (:func:`within_ttl`); ``side-effect`` calls are never
served from the shared cache and never silently re-executed on replay (see
:mod:`rewind.effects` for the modes).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from rewind.call import (
    DEFAULT_POLICY,
    DETERMINISM_FLAGS,
    Call,
    CallPolicy,
    Executed,
    aexecute_call,
    execute_call,
    failure_of,
)
from rewind.canonical import key_of
from rewind.context import LineageEntry, NodeScope, RunContext, current, current_lane
from rewind.effects import side_effect_call
from rewind.store.records import NAME_RULE, CallRecord, storable_name

_INFLIGHT: dict[tuple[int, str], Future[tuple[bytes, str | None, float | None]]] = {}
_INFLIGHT_LOCK = threading.Lock()
_INFLIGHT_MAX = 10_000
# store object -> a number no other store object of this process ever gets: flights are keyed
# by it, not by id(store), which CPython gives again to a store made after one was freed (a
# flight left by the old store would then serve the new one's misses). Under _INFLIGHT_LOCK.
_STORE_NUMBERS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_NEXT_NUMBER = itertools.count(1)


def _store_number(store: object) -> int:
    """The flight number of ``store`` (see ``_STORE_NUMBERS``); the caller holds the lock."""
    number = _STORE_NUMBERS.get(store)
    if number is None:
        number = _STORE_NUMBERS[store] = next(_NEXT_NUMBER)
    return number


def release_flights(store: object, keys: Iterable[str]) -> None:
    """Forget finished in-flight calls once their cache rows are committed (the recorder calls
    this after each flush, a trace when it is written); until then a concurrent replay still
    shares their result. ``keys`` is iterated only when the store ever had a flight."""
    with _INFLIGHT_LOCK:
        number = _STORE_NUMBERS.get(store)
        if number is None:  # this store never had a flight
            return
        for key in keys:
            future = _INFLIGHT.get((number, key))
            if future is not None and future.done():
                del _INFLIGHT[(number, key)]


def through_cache(
    ctx: RunContext,
    *,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    execute: Callable[[], Executed],
    policy: CallPolicy = DEFAULT_POLICY,
) -> tuple[bytes, CallRecord]:
    """Serve a call from the cache or execute it, recording the call on the current node.

    The k-th identical LLM (or time-bound tool) call of one node lane is its own sample: its
    key is :func:`occurrence_key` of ``key``, so a node that sends one request three times gets
    three live answers when recording and the three recorded answers, in order, on replay.
    Deterministic tools share one entry (the same arguments give the same result by declaration).

    Args:
        ctx: the active run context (its ``node`` scope receives the call record).
        kind, name, key, request, execute, policy: see :class:`Call`.
    Returns:
        (result bytes, the call record). On a hit the bytes are exactly the stored ones.
    Raises:
        SideEffectBlocked, EffectPreconditionFailed: see :mod:`rewind.effects`.
        ValueError: a ``name`` no store backend keeps in its call rows, before the call is sent
            (:func:`rewind.store.records.storable_name`).
    """
    if not storable_name(name):
        raise _unstorable_name(kind, name)
    scope = ctx.node
    if scope is None and ctx.outside_node is not None:
        # A call in a traced chain's own body: recorded as a step of its own, not lost.
        with _own_step(ctx, kind, name, request) as (inner, done):
            args = {"kind": kind, "name": name, "key": key, "request": request}
            return done(through_cache(inner, execute=execute, policy=policy, **args))
    call = _new_call(scope, kind, name, key, request, execute, policy)
    if policy.determinism == "side-effect":
        data, record = side_effect_call(ctx, call)
        return data, record
    found, reason = _lookup(ctx, scope, kind, call.key, policy)
    if found is not None:
        data, record = _hit(ctx, scope, call, found, reason)
    elif ctx.read_cache and ctx.write_cache:
        data, record = _single_flight(ctx, scope, call, reason)
    else:
        outcome = "bypass" if reason == "stability" else "miss"
        data, record = execute_call(ctx, scope, call, outcome, reason, cacheable=ctx.write_cache)
    if scope is not None:
        scope.add_call(record)
    return data, record


async def athrough_cache(
    ctx: RunContext,
    *,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    aexecute: Callable[[], Awaitable[Executed]],
    policy: CallPolicy = DEFAULT_POLICY,
) -> tuple[bytes, CallRecord]:
    """The async twin of :func:`through_cache`: ``aexecute`` is awaited on a miss.

    Lookups read the store synchronously (a local index query). Side-effecting calls are not
    supported here (``@rewind.tool`` is synchronous).

    Raises:
        ValueError: ``policy`` is ``side-effect``, or ``name`` is not storable (as
            :func:`through_cache`).
    """
    if policy.determinism == "side-effect":
        raise ValueError("side-effecting calls go through the synchronous through_cache")
    if not storable_name(name):
        raise _unstorable_name(kind, name)
    scope = ctx.node
    if scope is None and ctx.outside_node is not None:
        with _own_step(ctx, kind, name, request) as (inner, done):
            args = {"kind": kind, "name": name, "key": key, "request": request}
            return done(await athrough_cache(inner, aexecute=aexecute, policy=policy, **args))
    call = _new_call(scope, kind, name, key, request, _no_sync_execute, policy)
    found, reason = _lookup(ctx, scope, kind, call.key, policy)
    if found is not None:
        data, record = _hit(ctx, scope, call, found, reason)
    elif ctx.read_cache and ctx.write_cache:
        data, record = await _asingle_flight(ctx, scope, call, reason, aexecute)
    else:
        outcome = "bypass" if reason == "stability" else "miss"
        data, record = await aexecute_call(
            ctx, scope, call, aexecute, outcome, reason, cacheable=ctx.write_cache
        )
    if scope is not None:
        scope.add_call(record)
    return data, record


def _unstorable_name(kind: str, name: str) -> ValueError:
    """The error for a call whose model or tool name no backend keeps: PostgreSQL refused its
    row at the run's write (NUL, over 200 characters), no backend a lone surrogate, and the run
    was lost after its calls were paid for."""
    what = "model" if kind == "llm" else kind
    return ValueError(f"a {what} needs a name {NAME_RULE}, not {name!r:.80}")


@contextmanager
def _own_step(
    ctx: RunContext, kind: str, name: str, request: bytes
) -> Iterator[tuple[RunContext, Callable[[tuple[bytes, CallRecord]], tuple[bytes, CallRecord]]]]:
    """The step of its own a call outside any step runs in (a traced chain's body): yields the
    step's run context and ``done(result)``, which sets the step's output and returns
    ``result``."""
    assert ctx.outside_node is not None
    with ctx.outside_node(kind, name, request) as step:
        inner = current()
        assert inner is not None and inner.node is not None

        def done(result: tuple[bytes, CallRecord]) -> tuple[bytes, CallRecord]:
            step.set_output(call_output(kind, result[0]))
            return result

        yield inner, done


def call_output(kind: str, data: bytes) -> Any:
    """What a call returned, as a step's output: a tool's decoded result, an LLM answer's text
    (the raw JSON when it is not a chat completion)."""
    try:
        value = json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")
    if kind == "llm" and isinstance(value, dict):
        choices = value.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict) and "content" in message:
                return message["content"]
    return value


def occurrence_key(key: str, lane: tuple[int, ...], occurrence: int) -> str:
    """The cache key of the ``occurrence``-th (0-based) identical call in a node's worker lane.

    The first call on the node's own thread keeps ``key`` (so existing cache entries stay
    valid); every other one gets ``key_of("occurrence/v1", key, lane, occurrence)``.
    """
    if not lane and occurrence == 0:
        return key
    return key_of("occurrence/v1", key, ".".join(map(str, lane)), str(occurrence))


def _new_call(
    scope: NodeScope | None,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    execute: Callable[[], Executed],
    policy: CallPolicy,
) -> Call:
    if scope is None:
        return Call.of(kind, name, key, request, execute, policy, 0)
    sampled = kind == "llm" or policy.determinism == "time-bound"
    if sampled:
        lane = current_lane()
        key = occurrence_key(key, lane, scope.occurrence(lane, key))
    return Call.of(kind, name, key, request, execute, policy, scope.reserve_index())


def _no_sync_execute() -> Executed:
    raise RuntimeError("an async call is executed by athrough_cache")


def _hit(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    found: tuple[str, float | None],
    reason: str = "",
) -> tuple[bytes, CallRecord]:
    """Serve ``found`` (result hash, produced_at). ``reason`` ``failed``: it is the source's
    recorded failure of this call, raised again (recorded ``failed:replayed``, nothing sent)."""
    result_hash, produced_at = found
    data = _result_bytes(ctx, scope, call.key, result_hash)
    if reason:
        if scope is not None:
            scope.add_call(call.record(result_hash, "failed", "replayed", produced_at=produced_at))
        raise _replayed(failure_of(data))
    if ctx.served is not None:  # a traced chain: kept in case its source leaves the store
        ctx.served[call.key] = (call.request, data)
    return data, call.record(result_hash, "hit", "hit", produced_at=produced_at)


def _replayed(exc: Exception) -> Exception:
    """``exc`` (a recorded :data:`rewind.call.CALL_FAILURES`) with a note saying that it was
    replayed, not met now: its message and hint are the recording's ("cannot reach the model
    endpoint ... start it"), kept as they were so that the replayed step fails with the same
    error text as its source; the note (PEP 678, shown with the traceback) tells a user whose
    endpoint answers now why the call still fails and how to send it."""
    exc.add_note(
        "rewind: replayed from the record: this model call failed so when the source trace was "
        "recorded, and nothing was sent now. To send it again, replay without cached LLM "
        "answers: Tracer.replay(..., switches=ReplaySwitches(cached_llm=False)), "
        "replay-trace --no-cached-llm, a trace of Tracer(read_cache=False); a Burr run: "
        "rewind stability (fork with cache_mode='stability')."
    )
    return exc


def _single_flight(
    ctx: RunContext, scope: NodeScope | None, call: Call, reason: str
) -> tuple[bytes, CallRecord]:
    """Execute a missed call once even when concurrent replays (a what-if grid) need it at the
    same moment: the first executes, the others wait and record ``hit:in-flight`` (0 tokens)."""
    flight, future, leader = _join_flight(ctx, call)
    if not leader:
        return _follow(scope, call, future.result())
    late = _landed_meanwhile(ctx, scope, call, flight, future)
    if late is not None:
        return late
    try:
        data, record = execute_call(ctx, scope, call, "miss", reason, cacheable=True)
    except BaseException as exc:
        _fail_flight(flight, future, exc)
        raise
    _land_flight(ctx, scope, call, future, data, record)
    return data, record


async def _asingle_flight(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    reason: str,
    aexecute: Callable[[], Awaitable[Executed]],
) -> tuple[bytes, CallRecord]:
    """The async twin of :func:`_single_flight` (followers await the leader's future)."""
    flight, future, leader = _join_flight(ctx, call)
    if not leader:
        return _follow(scope, call, await asyncio.wrap_future(future))
    late = _landed_meanwhile(ctx, scope, call, flight, future)
    if late is not None:
        return late
    try:
        data, record = await aexecute_call(
            ctx, scope, call, aexecute, "miss", reason, cacheable=True
        )
    except BaseException as exc:
        _fail_flight(flight, future, exc)
        raise
    _land_flight(ctx, scope, call, future, data, record)
    return data, record


_Flight = Future[tuple[bytes, str | None, float | None]]


def _join_flight(ctx: RunContext, call: Call) -> tuple[tuple[int, str], _Flight, bool]:
    with _INFLIGHT_LOCK:
        flight = (_store_number(ctx.store), call.key)
        leader = flight not in _INFLIGHT
        if leader:
            if len(_INFLIGHT) > _INFLIGHT_MAX:
                for k in [k for k, f in _INFLIGHT.items() if f.done()]:
                    del _INFLIGHT[k]
            _INFLIGHT[flight] = Future()
        return flight, _INFLIGHT[flight], leader


def _landed_meanwhile(
    ctx: RunContext, scope: NodeScope | None, call: Call, flight: tuple[int, str], future: _Flight
) -> tuple[bytes, CallRecord] | None:
    """A new leader looks once more: another run may have executed the call and committed it
    (then released its flight) between this run's cache lookup and its joining the flight."""
    found, _ = _lookup(ctx, scope, call.kind, call.key, call.policy)
    if found is None:
        return None
    data, record = _hit(ctx, scope, call, found)
    future.set_result((data, record.result_hash, record.produced_at))
    with _INFLIGHT_LOCK:
        _INFLIGHT.pop(flight, None)
    return data, record


def _fail_flight(flight: tuple[int, str], future: _Flight, exc: BaseException) -> None:
    future.set_exception(exc)
    with _INFLIGHT_LOCK:
        _INFLIGHT.pop(flight, None)


def _land_flight(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    future: _Flight,
    data: bytes,
    record: CallRecord,
) -> None:
    future.set_result((data, record.result_hash, record.produced_at))
    if scope is None:  # nothing will commit it later: forget it now
        release_flights(ctx.store, [call.key])
    # Otherwise the entry stays until the recorder (or the trace) commits the cache row and
    # releases it, so a replay that misses in between shares this result instead of executing
    # the call again.


def _follow(
    scope: NodeScope | None, call: Call, shared: tuple[bytes, str | None, float | None]
) -> tuple[bytes, CallRecord]:
    data, result_hash, produced_at = shared
    if scope is not None:
        scope.pending[call.key] = call.pending(
            result_hash or "", data, cacheable=False, produced_at=produced_at
        )
    return data, call.record(result_hash, "hit", "in-flight", produced_at=produced_at)


def _result_bytes(ctx: RunContext, scope: NodeScope | None, key: str, result_hash: str) -> bytes:
    pending = (scope.pending.get(key) if scope is not None else None) or ctx.recent.get(key)
    if pending is not None and pending.result_hash == result_hash:
        return pending.result_bytes
    data = ctx.lineage_blobs.get(result_hash)
    if data is None:
        # Kept by hash: the step that made the call reads its answer again when it ends.
        data = ctx.lineage_blobs[result_hash] = ctx.store.get_blob(result_hash)
    return data


def _lookup(
    ctx: RunContext, scope: NodeScope | None, kind: str, key: str, policy: CallPolicy
) -> tuple[tuple[str, float | None] | None, str]:
    """((result hash, produced_at) or None, reason for a miss). A found result with the reason
    ``failed`` is the source's recorded failure of this call (:func:`_source_raised`)."""
    raised = _source_raised(ctx, scope, kind, key)
    if raised is not None:
        return raised
    pending = (scope.pending.get(key) if scope is not None else None) or (
        ctx.recent.get(key) if ctx.read_cache else None
    )
    if pending is not None and pending.cacheable:
        return (pending.result_hash, pending.produced_at), ""
    if not ctx.read_cache:
        return None, ctx.bypass_reason
    if kind not in ctx.cached_kinds:
        return None, "bypass"
    entry: LineageEntry | None = None
    if scope is not None and ctx.lineage_at:
        entry = ctx.lineage_at.get((scope.position, key))
    if entry is None:
        entry = ctx.lineage.get(key)
    if entry is not None:
        found: tuple[str, float | None] = (entry.result_hash, entry.produced_at)
    else:
        cached = _cache_entry(ctx, kind, key)
        if cached is None or cached.origin is not None:
            # An answer seeded by a trace import serves that trace's replays only, and those
            # find it in their lineage above: never another run (a crafted trace file must not
            # plant answers for requests others will send).
            return None, _miss_reason(ctx, scope)
        found = (cached.result_hash, cached.created_at)
    ttl_s = policy.ttl_s if policy.determinism == "time-bound" else None
    if ttl_s is not None and not within_ttl(found[1], ttl_s, ctx.clock()):
        return None, "ttl-expired"
    return found, ""


def within_ttl(produced_at: float | None, ttl_s: float, now: float) -> bool:
    """Whether a time-bound result produced at ``produced_at`` (unix seconds; None: unknown)
    may still be served at ``now`` (unix seconds, the run's clock) under a TTL of ``ttl_s``
    seconds: its age ``now - produced_at`` is known and at most ``ttl_s`` (an age equal to the
    TTL is not older).

    A result dated after ``now`` was produced by a clock running ahead of this one (another
    machine's, or a ``Tracer(clock=...)``/``Rewind`` test clock): its age is unknown, so it is
    not served (a negative age used to count as fresh, so such an entry was served for as long
    as the clock that wrote it was ahead, plus the TTL). Deterministic entries have no TTL and
    never come here. This is the one place TTL freshness is decided (Burr nodes and traced
    steps, from the lineage or the cache table alike)."""
    if produced_at is None:
        return False
    age = now - produced_at
    return 0.0 <= age <= ttl_s


def _source_raised(
    ctx: RunContext, scope: NodeScope | None, kind: str, key: str
) -> tuple[tuple[str, float | None] | None, str] | None:
    """What :func:`_lookup` answers for a call that raised in the replayed trace, else None.

    The source recorded the call at this node's position as ``failed`` (a model call the
    endpoint dropped or refused, :data:`rewind.call.CALL_FAILURES`): its failure document and
    the reason ``failed``, so the replay raises that failure again and sends nothing, even when
    the endpoint would answer now (the failure is what was recorded; fork or override the step
    to try again live). Otherwise, when the source's step at this position, of this node's
    name, failed and recorded no call with ``key`` there (a tool that raised, or a recording
    made before failed calls were kept): None and ``source-failed``, so the call is executed
    again rather than served another step's result for the same key. A step of another name at
    that position is another step (the chain was edited): its calls are looked up as usual. At
    a cached trace's first lookup, finds its source first (which fills
    :attr:`RunContext.failed_at` and :attr:`RunContext.failed_calls`)."""
    if ctx.find_source is not None and kind in ctx.cached_kinds:
        _read_source(ctx, kind, key)
    if scope is None or not (ctx.failed_at or ctx.failed_calls):
        return None
    where = (scope.position, key)
    recorded = ctx.failed_calls.get(where)
    if recorded is not None and ctx.read_cache and kind in ctx.cached_kinds:
        return (recorded.result_hash, recorded.produced_at), "failed"
    if ctx.failed_at.get(scope.position) == scope.name and where not in ctx.lineage_at:
        return None, "source-failed"
    return None


def _cache_entry(ctx: RunContext, kind: str, key: str) -> Any:
    """The cache table's entry for a key (a :class:`rewind.store.store.CacheEntry`) or None:
    from the entries read ahead when the run has them (the first lookup of a cached trace
    reads its source's, see :mod:`rewind.tracing.tracer_source`), else from the store."""
    if ctx.prefetched is not None:
        entry = ctx.prefetched.get((kind, key))
        if entry is not None:
            return entry
    return ctx.store.llm_cache_get(key) if kind == "llm" else ctx.store.tool_cache_get(key)


def _read_source(ctx: RunContext, kind: str, key: str) -> None:
    """At a cached trace's first lookup: find the recorded trace it replays (the finder also
    fills :attr:`RunContext.lineage_at` with that trace's calls, served first by position)."""
    finder = ctx.find_source
    if finder is not None:
        ctx.find_source = None  # this copy of the run context; the finder clears the trace's
        ctx.prefetched = finder(kind, key)


def _miss_reason(ctx: RunContext, scope: NodeScope | None) -> str:
    if scope is not None and (scope.param_overrides or scope.input_overrides):
        return "override"
    if not ctx.lineage:
        return "no-entry"
    return "new-input"


__all__ = [
    "DEFAULT_POLICY",
    "DETERMINISM_FLAGS",
    "Call",
    "CallPolicy",
    "Executed",
    "aexecute_call",
    "athrough_cache",
    "execute_call",
    "occurrence_key",
    "through_cache",
    "within_ttl",
]
