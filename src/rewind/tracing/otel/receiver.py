"""The OTLP/HTTP receiver of the trace service; see :mod:`rewind.tracing.otel`."""

from __future__ import annotations

import threading
import time
from typing import Any

from rewind.store import Store
from rewind.tracing.otel.importer import _has_cycle, _whole_trace, import_otlp
from rewind.tracing.otel.otlp_json import (
    MAX_OTLP_BYTES,
    InvalidOtlp,
    OtlpTooLarge,
    SpanRejection,
    _Span,
    load_otlp_json,
    parse_otlp,
)


class OtlpReceiver:
    """Accepts OTLP/HTTP export requests (JSON or protobuf) for the trace service.

    Exporters send spans in batches as they end, so a trace's children usually arrive before
    its root. Spans of a trace whose root (a span without a parent) has not arrived yet wait in
    memory (at most ``max_spans`` spans and about ``max_bytes`` bytes of request body, each for at
    most ``max_age_s`` seconds; past a bound the oldest trace is dropped and counted as
    rejected); when the root arrives (or the
    spans form a parent cycle, which no later span can resolve) the whole trace is imported.
    Spans arriving for a trace already stored are rejected, and so are all spans of a trace one
    of whose spans was malformed (a trace is imported whole or not at all); each is reported in
    the response's ``partialSuccess``.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_spans: int = 50_000,
        max_bytes: int = 256 * 1024 * 1024,
        max_age_s: float = 600.0,
    ) -> None:
        self.store = store
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._waiting: dict[str, tuple[float, list[_Span]]] = {}
        # Bytes of request body each waiting trace arrived in (a request's size shared evenly
        # among its spans): what bounds memory when spans are large.
        self._waiting_bytes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._import_lock = threading.Lock()
        self._spoiled: dict[str, float] = {}  # trace id -> when a span of it was rejected
        self.last_imported: list[str] = []

    def receive_json(self, body: bytes) -> dict[str, Any]:
        """Handle an OTLP/JSON body (at most :data:`MAX_OTLP_BYTES`).

        Returns:
            the ``ExportTraceServiceResponse`` as JSON: ``{}``, or ``partialSuccess`` with the
            rejected span count and the reasons (spans rejected one by one, see
            :func:`import_otlp`; or warnings with ``rejectedSpans`` 0, such as a cycle broken).
        Raises:
            OtlpTooLarge: the body is larger than :data:`MAX_OTLP_BYTES`.
            InvalidOtlp: not UTF-8 JSON, nested deeper than :data:`MAX_OTLP_DEPTH`, or not an
                ``ExportTraceServiceRequest`` (nothing is imported).
        """
        return self._receive([load_otlp_json(body)], len(body))

    def receive_protobuf(self, body: bytes) -> dict[str, Any]:
        """Handle an OTLP protobuf body (at most :data:`MAX_OTLP_BYTES`; protobuf's decoder
        refuses messages nested deeper than 100).

        Raises:
            OtlpTooLarge: the body is larger than :data:`MAX_OTLP_BYTES`.
            InvalidOtlp: the bytes are not an ExportTraceServiceRequest.
        """
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        if len(body) > MAX_OTLP_BYTES:
            raise OtlpTooLarge(
                f"the body is larger than {MAX_OTLP_BYTES} bytes",
                "send the spans in smaller batches",
            )
        try:
            message = ExportTraceServiceRequest.FromString(body)
        except DecodeError as exc:
            raise InvalidOtlp(
                f"the body is not OTLP protobuf: {exc}",
                "send an ExportTraceServiceRequest (application/x-protobuf)",
            ) from exc
        return self._receive([MessageToDict(message, use_integers_for_enums=True)], len(body))

    def _take(self, trace_id: str) -> list[_Span]:
        """Remove a waiting trace (call with the lock held)."""
        self._waiting_bytes.pop(trace_id, None)
        return self._waiting.pop(trace_id)[1]

    def _receive(self, docs: list[dict[str, Any]], size: int) -> dict[str, Any]:
        spans, rejections = parse_otlp(docs)
        share = size // max(1, len(spans)) + 1
        now = time.monotonic()
        rejected = sum(r.spans for r in rejections)
        errors = [str(r) for r in rejections]
        with self._lock:
            rejected += self._expire(now, errors)
            self._spoil(rejections, now)
            rejected += self._hold(spans, rejections, share, now, errors)
            ready = self._ready(spans)
            rejected += self._shed(errors)
        imported: list[str] = []
        notes: list[str] = []
        for group in ready:
            rejected += self._import(group, imported, errors, notes)
        response: dict[str, Any] = {}
        if rejected or notes:
            response["partialSuccess"] = {
                "rejectedSpans": rejected,
                "errorMessage": "; ".join(errors + notes)[:4000],
            }
        self.last_imported = imported
        return response

    def _expire(self, now: float, errors: list[str]) -> int:
        """Drop traces whose root never arrived within ``max_age_s``; the spans dropped
        (call with the lock held)."""
        rejected = 0
        for tid in [t for t, (at, _) in self._waiting.items() if now - at > self.max_age_s]:
            rejected += len(self._take(tid))
            errors.append(f"trace {tid}: its root span never arrived")
        return rejected

    def _spoil(self, rejections: list[SpanRejection], now: float) -> None:
        """Remember the traces a rejected span spoils (call with the lock held).

        A trace is imported whole or not at all: a rejected span spoils its trace, for the
        spans already waiting and for those still to come (remembered ``max_age_s``)."""
        while self._spoiled and now - next(iter(self._spoiled.values())) > self.max_age_s:
            del self._spoiled[next(iter(self._spoiled))]
        for r in rejections:
            if r.trace_id:
                self._spoiled.pop(r.trace_id, None)
                self._spoiled[r.trace_id] = now
        while len(self._spoiled) > self.max_spans:
            del self._spoiled[next(iter(self._spoiled))]

    def _hold(
        self,
        spans: list[_Span],
        rejections: list[SpanRejection],
        share: int,
        now: float,
        errors: list[str],
    ) -> int:
        """Queue the spans of unspoiled traces; reject those of spoiled ones (and what was
        waiting for them). The spans rejected (call with the lock held)."""
        late: dict[str, int] = {}
        for s in spans:
            if s.trace_id in self._spoiled:
                late[s.trace_id] = late.get(s.trace_id, 0) + 1
            else:
                self._waiting.setdefault(s.trace_id, (now, []))[1].append(s)
                held_before = self._waiting_bytes.get(s.trace_id, 0)
                self._waiting_bytes[s.trace_id] = held_before + share
        for r in rejections:
            if r.trace_id and r.trace_id in self._waiting:
                late[r.trace_id] = late.get(r.trace_id, 0) + len(self._take(r.trace_id))
        for tid, n in sorted(late.items()):
            errors.append(str(_whole_trace(tid, n)))
        return sum(late.values())

    def _ready(self, spans: list[_Span]) -> list[list[_Span]]:
        """Take the traces these spans touched that can be imported now: their root arrived
        (a parent cycle never resolves by waiting: imported, and broken, now). Lock held."""
        ready: list[list[_Span]] = []
        for tid in sorted({s.trace_id for s in spans} & self._waiting.keys()):
            group = self._waiting[tid][1]
            if any(s.parent_id is None for s in group) or _has_cycle(group):
                ready.append(self._take(tid))
        return ready

    def _shed(self, errors: list[str]) -> int:
        """Drop the oldest waiting traces while over ``max_spans`` or ``max_bytes``; the spans
        dropped (call with the lock held)."""
        rejected = 0
        waiting = sum(len(g) for _, g in self._waiting.values())
        held = sum(self._waiting_bytes.values())
        while (waiting > self.max_spans or held > self.max_bytes) and self._waiting:
            tid = next(iter(self._waiting))
            held -= self._waiting_bytes.get(tid, 0)
            dropped = len(self._take(tid))
            waiting -= dropped
            rejected += dropped
            errors.append(f"trace {tid}: dropped, too many spans waiting for their root")
        return rejected

    def _import(
        self, group: list[_Span], imported: list[str], errors: list[str], notes: list[str]
    ) -> int:
        """Import one whole trace; the spans rejected (new spans of a stored trace count)."""
        with self._import_lock:  # two requests must not both write one trace
            result = import_otlp(self.store, spans=group)
        imported.extend(result.imported)
        rejected = result.rejected
        errors.extend(result.errors)
        notes.extend(result.notes)
        for tid in result.skipped:  # new spans of a stored trace are already counted
            counted = sum(r.spans for r in result.rejections if r.trace_id == tid)
            rejected += len([s for s in group if s.trace_id == tid]) - counted
            if not counted:
                errors.append(f"trace {tid} is already stored")
        return rejected

    @property
    def waiting(self) -> int:
        """Spans waiting for their trace's root span."""
        with self._lock:
            return sum(len(g) for _, g in self._waiting.values())
