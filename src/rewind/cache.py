"""The content-addressed call cache: every LLM and tool call of a run goes through here.

A call is identified by its cache key (DESIGN rule 5). Replay looks the key up in the source
trajectory's lineage first, then in the cache table; a hit returns the stored result bytes
unchanged and spends 0 tokens. Every call records its outcome and the reason (rule 6).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rewind.context import NodeScope, PendingWrite, RunContext
from rewind.store.records import CallRecord


@dataclass(frozen=True)
class Executed:
    """What executing a call live produced: result bytes, tokens spent, latency (ms)."""

    result: bytes
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


def through_cache(
    ctx: RunContext,
    *,
    kind: str,
    name: str,
    key: str,
    request: bytes,
    execute: Callable[[], Executed],
) -> tuple[bytes, CallRecord]:
    """Serve a call from the cache or execute it, recording the call on the current node.

    Args:
        ctx: the active run context (its ``node`` scope receives the call record).
        kind: ``"llm"`` or ``"tool"``.
        name: model or tool name (shown in the call record).
        key: the call's cache key.
        request: canonical bytes of the request (stored as a blob for inspection).
        execute: runs the call live; called only on a miss.
    Returns:
        (result bytes, the call record). On a hit the bytes are exactly the stored ones.
    """
    from rewind.canonical import sha256_hex

    scope = ctx.node
    request_hash = sha256_hex(request)
    result_hash = _lookup(ctx, scope, kind, key)
    index = len(scope.calls) if scope is not None else 0
    if result_hash is not None:
        pending = (scope.pending.get(key) if scope is not None else None) or ctx.recent.get(key)
        if pending is not None:
            data = pending.result_bytes
        elif result_hash in ctx.lineage_blobs:
            data = ctx.lineage_blobs[result_hash]
        else:
            data = ctx.store.get_blob(result_hash)
        record = CallRecord(index, kind, name, key, request_hash, result_hash, "hit", "hit")
    else:
        reason = _miss_reason(ctx, scope)
        started = time.perf_counter()
        done = execute()
        latency = done.latency_ms or (time.perf_counter() - started) * 1000
        data = done.result
        result_hash = sha256_hex(data)
        record = CallRecord(
            index,
            kind,
            name,
            key,
            request_hash,
            result_hash,
            "miss",
            reason,
            done.prompt_tokens,
            done.completion_tokens,
            latency,
        )
        if scope is not None:
            scope.pending[key] = PendingWrite(
                kind,
                key,
                name,
                request_hash,
                request,
                result_hash,
                data,
                done.prompt_tokens,
                done.completion_tokens,
            )
    if scope is not None:
        scope.calls.append(record)
    return data, record


def _lookup(ctx: RunContext, scope: NodeScope | None, kind: str, key: str) -> str | None:
    if scope is not None and key in scope.pending:
        return scope.pending[key].result_hash
    if not ctx.read_cache:
        return None
    if key in ctx.recent:
        return ctx.recent[key].result_hash
    if key in ctx.lineage:
        return ctx.lineage[key]
    entry = ctx.store.llm_cache_get(key) if kind == "llm" else ctx.store.tool_cache_get(key)
    return entry.result_hash if entry else None


def _miss_reason(ctx: RunContext, scope: NodeScope | None) -> str:
    if not ctx.read_cache:
        return "bypass"
    if scope is not None and scope.param_overrides:
        return "override"
    if not ctx.lineage:
        return "no-entry"
    return "new-input"
