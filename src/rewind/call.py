"""One call as the cache sees it, and executing it live.

The lower module under :mod:`rewind.cache` (the lookup rules) and :mod:`rewind.effects` (the
side-effect modes): a :class:`Call` with its :class:`CallPolicy`, what executing it produced
(:class:`Executed`), and :func:`execute_call`, which runs it and queues its result on the node's
scope. Nothing here decides whether a call is served or executed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from rewind.canonical import canonical_bytes, loads, sha256_hex
from rewind.context import NodeScope, PendingWrite, RunContext, executing_call
from rewind.errors import (
    EndpointUnavailable,
    ModelCallError,
    ModelErrorStatus,
    ModelTransportError,
)
from rewind.store.records import CallRecord, storable_text

Determinism = Literal["deterministic", "time-bound", "side-effect", "non-deterministic"]
"""How a call's result may be reused (see :mod:`rewind.cache`); stored as this string."""

CallOutcome = Literal["hit", "miss", "bypass", "served", "dry-run", "failed"]
"""A call record's cache outcome (its reason says which rule decided it); stored as this string.
``failed`` is a model call that raised (:data:`CALL_FAILURES`): reason ``raised`` when it was
sent, ``replayed`` when a replay raised the source's recorded failure again (nothing sent); its
``result_hash`` names the failure's document (:func:`failure_bytes`), never an answer."""

CALL_FAILURES: tuple[type[Exception], ...] = (
    EndpointUnavailable,
    ModelCallError,
    ModelErrorStatus,
    ModelTransportError,
)
"""The errors of a model call that are recorded as a ``failed`` call row (the endpoint dropped,
timed out or refused the request; a captured SDK request answered with an error status or
whose connection failed, :class:`~rewind.errors.ModelErrorStatus` and
:class:`~rewind.errors.ModelTransportError`): a replay raises them again instead of sending the
request. Other errors (a body that is not JSON...) raise before anything is sent and are not
recorded."""

_FAILURE_TYPES: dict[str, type[Exception]] = {t.__name__: t for t in CALL_FAILURES}

CALL_FAILURE_NAMES = frozenset(_FAILURE_TYPES)
"""The type names of :data:`CALL_FAILURES`, as a failed node's ``cache_reason`` and a failed
span's ``error_type`` hold them."""

SDK_FAILURE_NAMES = frozenset(
    {
        # openai, anthropic: the errors their clients raise for the statuses and connection
        # failures rewind.capture records as failed calls (rewind.capture.exchange.Recorded.failed)
        "APIConnectionError",
        "APIError",
        "APIStatusError",
        "APITimeoutError",
        "AuthenticationError",
        "ConflictError",
        "DeadlineExceededError",
        "GatewayTimeoutError",
        "InternalServerError",
        "OverloadedError",
        "PermissionDeniedError",
        "RateLimitError",
        "RequestTimeoutError",
        "RetryableError",
        "ServiceUnavailableError",
        # litellm
        "BadGatewayError",
        "Timeout",
        # httpx used directly (raise_for_status), and its transport errors
        "HTTPStatusError",
        "TransportError",
        "TimeoutException",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "NetworkError",
        "ConnectError",
        "ReadError",
        "WriteError",
        "CloseError",
        "RemoteProtocolError",
        "ProxyError",
    }
)
"""Type names of the errors model SDKs raise out of a failed request: a node or trace that
raised one of them after a ``failed`` call of its own raised out of that failure
(:func:`raised_out_of_a_call`)."""


def raised_out_of_a_call(error_type: str | None, has_failed_call: bool) -> bool:
    """Whether a node or trace that failed with an error of type ``error_type`` (its name) did
    so because a model call failed: a :data:`CALL_FAILURE_NAMES` error, or an SDK's error
    (:data:`SDK_FAILURE_NAMES`) raised by a node that holds a ``failed`` call
    (``has_failed_call``): a request captured from the SDK that the provider answered 429 or
    dropped. A replay then sends its failed calls again, whatever was answered after them (a
    ``finally`` that asked the model), instead of replaying the failure at every fork once the
    endpoint answers (:func:`rewind.replay._recovered`, :mod:`rewind.tracing.tracer`)."""
    if error_type in CALL_FAILURE_NAMES:
        return True
    return has_failed_call and error_type in SDK_FAILURE_NAMES


_NOT_SENT = "_rewind_not_sent"

_new = object.__new__

DETERMINISM_FLAGS: tuple[Determinism, ...] = get_args(Determinism)
"""The determinism flags a call may declare (see :mod:`rewind.cache`)."""


@dataclass(frozen=True)
class Executed:
    """What executing a call live produced: result bytes, tokens spent, latency (ms), and
    whether the result may become a shared cache entry."""

    result: bytes
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    cacheable: bool = True
    """False keeps the result on the run (an unchanged replay serves it from lineage) but writes
    no shared cache entry: e.g. an HTTP error status, which must not answer other runs."""


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

    determinism: Determinism = "deterministic"
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


@dataclass(frozen=True)
class Call:
    """One LLM or tool call as the cache sees it.

    Args:
        kind: ``"llm"`` or ``"tool"``.
        name: model or tool name (shown in the call record).
        key: the call's cache key.
        request: canonical bytes of the request (stored as a blob for inspection).
        execute: runs the call live; called only when the rules say so.
        policy: determinism flag, TTL, resources.
        index: the call's position among its node's calls.
    """

    kind: str
    name: str
    key: str
    request: bytes
    execute: Callable[[], Executed]
    policy: CallPolicy
    index: int = 0

    @classmethod
    def of(
        cls,
        kind: str,
        name: str,
        key: str,
        request: bytes,
        execute: Callable[[], Executed],
        policy: CallPolicy,
        index: int,
    ) -> Call:
        """``Call(kind, name, key, request, execute, policy, index)`` with every field set as
        the frozen dataclass's ``__init__`` sets it, without its ``object.__setattr__`` per
        field: the cache builds one per call."""
        call = _new(cls)
        call.__dict__.update(
            kind=kind,
            name=name,
            key=key,
            request=request,
            execute=execute,
            policy=policy,
            index=index,
        )
        return call

    @property
    def request_hash(self) -> str:
        """sha256 hex of the request bytes."""
        return sha256_hex(self.request)

    def record(
        self,
        result_hash: str | None,
        outcome: CallOutcome,
        reason: str,
        *,
        produced_at: float | None,
        done: Executed | None = None,
        latency_ms: float = 0.0,
    ) -> CallRecord:
        """The call's record with an outcome and the rule's reason (tokens from ``done``)."""
        # Every field set as the frozen dataclass's __init__ would, without its
        # object.__setattr__ per field (as CallRecord.from_row): one record per call.
        record = _new(CallRecord)
        record.__dict__.update(
            call_index=self.index,
            kind=self.kind,
            name=self.name,
            key=self.key,
            request_hash=self.request_hash,
            result_hash=result_hash,
            outcome=outcome,
            reason=reason,
            prompt_tokens=done.prompt_tokens if done else 0,
            completion_tokens=done.completion_tokens if done else 0,
            latency_ms=latency_ms,
            determinism=self.policy.determinism,
            produced_at=produced_at,
        )
        return record

    def pending(
        self,
        result_hash: str,
        data: bytes,
        *,
        cacheable: bool,
        produced_at: float | None,
        done: Executed | None = None,
    ) -> PendingWrite:
        """The write that keeps this call's result (and, if ``cacheable``, its cache entry)."""
        return PendingWrite(
            self.kind,
            self.key,
            self.name,
            self.request_hash,
            self.request,
            result_hash,
            data,
            done.prompt_tokens if done else 0,
            done.completion_tokens if done else 0,
            cacheable=cacheable,
            produced_at=produced_at,
        )


def execute_call(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    outcome: CallOutcome,
    reason: str,
    *,
    cacheable: bool,
    pending_key: str | None = None,
) -> tuple[bytes, CallRecord]:
    """Execute a call live and queue its result (and, if ``cacheable`` and the result says it
    may be cached, its cache entry) on the node's scope under ``pending_key`` (default: the
    cache key). HTTP requests the call makes itself are not captured again.

    Raises:
        whatever ``call.execute`` raises. A model call's :data:`CALL_FAILURES` are first
        recorded on the node as a ``failed:raised`` call (its failure document kept, no cache
        entry), so that a replay raises the same failure there without sending anything."""
    started = time.perf_counter()
    try:
        with executing_call():
            done = call.execute()
    except CALL_FAILURES as exc:
        _raised(ctx, scope, call, exc, started)
        raise
    return _executed(ctx, scope, call, done, started, outcome, reason, cacheable, pending_key)


async def aexecute_call(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    aexecute: Callable[[], Awaitable[Executed]],
    outcome: CallOutcome,
    reason: str,
    *,
    cacheable: bool,
) -> tuple[bytes, CallRecord]:
    """The async twin of :func:`execute_call`: awaits ``aexecute`` instead of ``call.execute``."""
    started = time.perf_counter()
    try:
        with executing_call():
            done = await aexecute()
    except CALL_FAILURES as exc:
        _raised(ctx, scope, call, exc, started)
        raise
    return _executed(ctx, scope, call, done, started, outcome, reason, cacheable, None)


def _executed(
    ctx: RunContext,
    scope: NodeScope | None,
    call: Call,
    done: Executed,
    started: float,
    outcome: CallOutcome,
    reason: str,
    cacheable: bool,
    pending_key: str | None,
) -> tuple[bytes, CallRecord]:
    latency = done.latency_ms or (time.perf_counter() - started) * 1000
    produced_at = ctx.clock()
    result_hash = sha256_hex(done.result)
    record = call.record(
        result_hash, outcome, reason, produced_at=produced_at, done=done, latency_ms=latency
    )
    if scope is not None:
        scope.pending[pending_key or call.key] = call.pending(
            result_hash,
            done.result,
            cacheable=cacheable and done.cacheable,
            produced_at=produced_at,
            done=done,
        )
    return done.result, record


def _raised(
    ctx: RunContext, scope: NodeScope | None, call: Call, exc: Exception, started: float
) -> None:
    """Record a model call that raised one of :data:`CALL_FAILURES` on its node: a
    ``failed:raised`` call row whose result is the failure's document, kept with the node's
    rows (never a cache entry, never served as an answer). Not when the run has no model
    endpoint (``ctx.chat_client`` None) unless the request was an SDK's, captured
    (:class:`~rewind.errors.ModelErrorStatus`, :class:`~rewind.errors.ModelTransportError`),
    nor when ``exc`` was marked
    :func:`not_sent` (the client could not open its endpoint): nothing was sent, the error is
    the run's set-up."""
    if scope is None or call.kind != "llm":
        return
    if ctx.chat_client is None and not isinstance(exc, _CAPTURED):
        return
    if getattr(exc, _NOT_SENT, False):
        return
    data = failure_bytes(exc)
    digest = sha256_hex(data)
    produced_at = ctx.clock()
    latency = (time.perf_counter() - started) * 1000
    scope.pending[call.key] = call.pending(digest, data, cacheable=False, produced_at=produced_at)
    scope.add_call(
        call.record(digest, "failed", "raised", produced_at=produced_at, latency_ms=latency)
    )


_CAPTURED = (ModelErrorStatus, ModelTransportError)


def not_sent(exc: Exception) -> Exception:
    """Mark ``exc`` (one of :data:`CALL_FAILURES`) as raised before the request was sent (a
    client that opens its endpoint at the first call could not: the embedded model is not
    installed or did not start) and return it: the call is not recorded as ``failed``, since
    no endpoint met the request, and a replay would otherwise raise that set-up error again
    after it was fixed (as for a run with no endpoint)."""
    setattr(exc, _NOT_SENT, True)
    return exc


def failure_bytes(exc: Exception) -> bytes:
    """The document a ``failed`` call row's ``result_hash`` names: canonical JSON
    ``{"error": type name, "message": ..., "hint": ...}`` of one of :data:`CALL_FAILURES`; a
    :class:`~rewind.errors.ModelErrorStatus` adds ``"response"``, the recorded response's
    envelope as a JSON object (:func:`rewind.capture.exchange.encode_envelope`); a
    :class:`~rewind.errors.ModelTransportError` adds ``"transport_error"``, the httpx exception's
    class name."""
    message = storable_text(str(getattr(exc, "message", exc)))
    hint = storable_text(str(getattr(exc, "hint", "")))
    doc: dict[str, Any] = {"error": type(exc).__name__, "hint": hint, "message": message}
    if isinstance(exc, ModelErrorStatus):
        doc["response"] = loads(exc.response)
    elif isinstance(exc, ModelTransportError):
        doc["transport_error"] = exc.transport_error
    return canonical_bytes(doc)


def failure_of(data: bytes) -> Exception:
    """The exception a ``failed`` call row recorded (:func:`failure_bytes`), made again: the
    same type (one of :data:`CALL_FAILURES`), message and hint. A document that is not one
    (a damaged or crafted store) gives a :class:`~rewind.errors.ModelCallError` saying so."""
    try:
        doc = loads(data)
        cls = _FAILURE_TYPES[doc["error"]]
        message, hint = str(doc["message"]), str(doc.get("hint", ""))
        if cls is ModelErrorStatus:
            response = json.dumps(doc["response"], ensure_ascii=False, separators=(",", ":"))
            return ModelErrorStatus(message, hint, response=response.encode())
        if cls is ModelTransportError:
            return ModelTransportError(message, hint, transport_error=str(doc["transport_error"]))
        return cls(message, hint)
    except (ValueError, KeyError, TypeError):
        return ModelCallError(
            "the recorded failure of this model call cannot be read",
            "replay without the cache, or fork at this step",
        )


__all__ = [
    "CALL_FAILURES",
    "CALL_FAILURE_NAMES",
    "DEFAULT_POLICY",
    "DETERMINISM_FLAGS",
    "SDK_FAILURE_NAMES",
    "Call",
    "CallOutcome",
    "CallPolicy",
    "Determinism",
    "Executed",
    "aexecute_call",
    "execute_call",
    "failure_bytes",
    "failure_of",
    "not_sent",
    "raised_out_of_a_call",
]
