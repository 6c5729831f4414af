"""The content-addressed call cache: every LLM and tool call of a run goes through here.

A call is identified by its cache key (DESIGN rule 5). Replay looks the key up in the source
trajectory's lineage first, then in the cache table; a hit returns the stored result bytes
unchanged and spends 0 tokens. Every call records its outcome and the rule that decided it
(rule 6): ``hit``, ``miss:new-input``, ``miss:override``, ``miss:no-entry``, ``miss:ttl-expired``,
``miss:bypass`` (recording), ``bypass:stability``, ``served:side-effect-recorded``,
``dry-run:side-effect-dry-run``, ``miss:side-effect-live``, ``hit:in-flight`` (shared with a
concurrent replay executing the same call).

Determinism flags decide the rules: ``deterministic`` entries never expire; ``time-bound`` entries
older than their ``ttl_s`` are misses (the same rule for any input); ``side-effect`` calls are never
served from the shared cache and never silently re-executed on replay (see
:mod:`rewind.effects` for the modes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from rewind.canonical import sha256_hex
from rewind.context import LineageEntry, NodeScope, PendingWrite, RunContext
from rewind.store.records import CallRecord

DETERMINISM_FLAGS = ("deterministic", "time-bound", "side-effect", "non-deterministic")

_INFLIGHT: dict[str, Future[tuple[bytes, str | None, float | None]]] = {}
_INFLIGHT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Executed:
    """What executing a call live produced: result bytes, tokens spent, latency (ms)."""

    result: bytes
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class CallPolicy:
    """How the cache treats one call.

    Args:
        determinism: one of :data:`DETERMINISM_FLAGS` (``non-deterministic`` marks LLM calls
            sampled at temperature > 0: still cached, shown as such).
        ttl_s: seconds a ``time-bound`` result stays valid (required for, and only for,
            ``time-bound``; ``None`` never becomes a default TTL).
        resources: for ``side-effect`` calls, the resources the call touches (fingerprinted
            before and after, see :mod:`rewind.effects`).
        on_served: called with (request bytes, recorded result bytes) when a side-effecting call
            is served from record (Rewind's artifact tool re-materializes the recorded artifact).
        idempotency_key: the salted key handed to the tool, recorded with its effects.
    """

    determinism: str = "deterministic"
    ttl_s: float | None = None
    resources: Sequence[object] = field(default=())
    on_served: Callable[[bytes, bytes], None] | None = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.determinism not in DETERMINISM_FLAGS:
            raise ValueError(f"determinism must be one of {DETERMINISM_FLAGS}")
        if self.determinism == "time-bound" and (self.ttl_s is None or self.ttl_s < 0):
            raise ValueError("a time-bound call needs ttl_s >= 0 (seconds); there is no default")
        if self.determinism != "time-bound" and self.ttl_s is not None:
            raise ValueError("ttl_s applies only to time-bound calls")


DEFAULT_POLICY = CallPolicy()


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

    Args:
        ctx: the active run context (its ``node`` scope receives the call record).
        kind: ``"llm"`` or ``"tool"``.
        name: model or tool name (shown in the call record).
        key: the call's cache key.
        request: canonical bytes of the request (stored as a blob for inspection).
        execute: runs the call live; called only when the rules say so.
        policy: determinism flag, TTL, resources.
    Returns:
        (result bytes, the call record). On a hit the bytes are exactly the stored ones.
    Raises:
        SideEffectBlocked, EffectPreconditionFailed: see :mod:`rewind.effects`.
    """
    if policy.determinism == "side-effect":
        from rewind.effects import side_effect_call

        return side_effect_call(
            ctx, kind=kind, name=name, key=key, request=request, execute=execute, policy=policy
        )
    scope = ctx.node
    request_hash = sha256_hex(request)
    index = len(scope.calls) if scope is not None else 0
    found, reason = _lookup(ctx, scope, kind, key, policy)
    if found is not None:
        result_hash, produced_at = found
        data = _result_bytes(ctx, scope, key, result_hash)
        record = CallRecord(
            index,
            kind,
            name,
            key,
            request_hash,
            result_hash,
            "hit",
            "hit",
            determinism=policy.determinism,
            produced_at=produced_at,
        )
    elif ctx.read_cache and ctx.write_cache:
        data, record = _single_flight(
            ctx,
            scope,
            index=index,
            kind=kind,
            name=name,
            key=key,
            request=request,
            request_hash=request_hash,
            execute=execute,
            policy=policy,
            reason=reason,
        )
    else:
        outcome = "bypass" if reason == "stability" else "miss"
        data, record = execute_call(
            ctx,
            scope,
            index=index,
            kind=kind,
            name=name,
            key=key,
            request=request,
            request_hash=request_hash,
            execute=execute,
            policy=policy,
            outcome=outcome,
            reason=reason,
            cacheable=ctx.write_cache,
        )
    if scope is not None:
        scope.calls.append(record)
    return data, record


def _single_flight(
    ctx: RunContext,
    scope: NodeScope | None,
    *,
    index: int,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    request_hash: str,
    execute: Callable[[], Executed],
    policy: CallPolicy,
    reason: str,
) -> tuple[bytes, CallRecord]:
    """Execute a missed call once even when concurrent replays (a what-if grid) need it at the
    same moment: the first executes, the others wait and record ``hit:in-flight`` (0 tokens)."""
    with _INFLIGHT_LOCK:
        leader = key not in _INFLIGHT
        if leader:
            _INFLIGHT[key] = Future()
        future = _INFLIGHT[key]
    if leader:
        try:
            data, record = execute_call(
                ctx,
                scope,
                index=index,
                kind=kind,
                name=name,
                key=key,
                request=request,
                request_hash=request_hash,
                execute=execute,
                policy=policy,
                outcome="miss",
                reason=reason,
                cacheable=True,
            )
            future.set_result((data, record.result_hash, record.produced_at))
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with _INFLIGHT_LOCK:
                _INFLIGHT.pop(key, None)
        return data, record
    data, result_hash, produced_at = future.result()
    record = CallRecord(
        index,
        kind,
        name,
        key,
        request_hash,
        result_hash,
        "hit",
        "in-flight",
        determinism=policy.determinism,
        produced_at=produced_at,
    )
    if scope is not None:
        scope.pending[key] = PendingWrite(
            kind,
            key,
            name,
            request_hash,
            request,
            result_hash or "",
            data,
            cacheable=False,
            produced_at=produced_at,
        )
    return data, record


def execute_call(
    ctx: RunContext,
    scope: NodeScope | None,
    *,
    index: int,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    request_hash: str,
    execute: Callable[[], Executed],
    policy: CallPolicy,
    outcome: str,
    reason: str,
    cacheable: bool,
) -> tuple[bytes, CallRecord]:
    """Execute a call live and queue its result (and, if ``cacheable``, its cache entry)."""
    started = time.perf_counter()
    done = execute()
    latency = done.latency_ms or (time.perf_counter() - started) * 1000
    produced_at = ctx.clock()
    result_hash = sha256_hex(done.result)
    record = CallRecord(
        index,
        kind,
        name,
        key,
        request_hash,
        result_hash,
        outcome,
        reason,
        done.prompt_tokens,
        done.completion_tokens,
        latency,
        determinism=policy.determinism,
        produced_at=produced_at,
    )
    if scope is not None:
        scope.pending[key] = PendingWrite(
            kind,
            key,
            name,
            request_hash,
            request,
            result_hash,
            done.result,
            done.prompt_tokens,
            done.completion_tokens,
            cacheable=cacheable,
            produced_at=produced_at,
        )
    return done.result, record


def _result_bytes(ctx: RunContext, scope: NodeScope | None, key: str, result_hash: str) -> bytes:
    pending = (scope.pending.get(key) if scope is not None else None) or ctx.recent.get(key)
    if pending is not None and pending.result_hash == result_hash:
        return pending.result_bytes
    if result_hash in ctx.lineage_blobs:
        return ctx.lineage_blobs[result_hash]
    return ctx.store.get_blob(result_hash)


def _lookup(
    ctx: RunContext, scope: NodeScope | None, kind: str, key: str, policy: CallPolicy
) -> tuple[tuple[str, float | None] | None, str]:
    """((result hash, produced_at) or None, reason for a miss)."""
    pending = (scope.pending.get(key) if scope is not None else None) or (
        ctx.recent.get(key) if ctx.read_cache else None
    )
    if pending is not None and pending.cacheable:
        return (pending.result_hash, pending.produced_at), ""
    if not ctx.read_cache:
        return None, ctx.bypass_reason
    entry: LineageEntry | None = ctx.lineage.get(key)
    if entry is not None:
        found: tuple[str, float | None] = (entry.result_hash, entry.produced_at)
    else:
        cached = ctx.store.llm_cache_get(key) if kind == "llm" else ctx.store.tool_cache_get(key)
        if cached is None:
            return None, _miss_reason(ctx, scope)
        found = (cached.result_hash, cached.created_at)
    if policy.determinism == "time-bound" and policy.ttl_s is not None:
        produced = found[1]
        if produced is None or ctx.clock() - produced > policy.ttl_s:
            return None, "ttl-expired"
    return found, ""


def _miss_reason(ctx: RunContext, scope: NodeScope | None) -> str:
    if scope is not None and scope.param_overrides:
        return "override"
    if not ctx.lineage:
        return "no-entry"
    return "new-input"


__all__ = [
    "DEFAULT_POLICY",
    "DETERMINISM_FLAGS",
    "CallPolicy",
    "Executed",
    "execute_call",
    "through_cache",
]
