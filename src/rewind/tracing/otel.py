"""OpenTelemetry: export runs and traces as spans, import OTLP/JSON traces.

**Export** builds real ``opentelemetry-sdk`` spans (a private ``TracerProvider`` whose id generator
hands out the recorded ids, so a trace keeps its 32-hex id and every step its 16-hex span id; the
recorded start and end times) and hands them to any SDK ``SpanExporter``: the OTLP/HTTP exporter
(``opentelemetry-exporter-otlp-proto-http``), :class:`OtlpJsonFileExporter` (OTLP/JSON lines, ids
in hex as the OTLP/JSON encoding requires) or the SDK's in-memory exporter. One root span per
run (the chain), one child span per step/node, nested as recorded. Attributes follow the GenAI
semantic conventions — ``gen_ai.operation.name`` (``chat``, ``execute_tool``),
``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens``,
``gen_ai.response.finish_reasons`` — plus OpenInference's (``openinference.span.kind``,
``input.value``/``output.value``, ``llm.model_name``, ``llm.token_count.*``) so Phoenix-style
viewers show them, and ``rewind.*`` attributes that let :func:`import_otlp` rebuild the exact same
node rows: a Rewind trace exported and imported again has the same input, output and state
hashes. Span names are the step names (not ``"{operation} {model}"``): the step name is what a
reader of a chain trace looks for. A failed step gets status ERROR and an ``exception`` event.

**Import** reads OTLP/JSON (one ``ExportTraceServiceRequest`` object, or one per line as
collectors' file exporters write them; ids in hex or base64) or OTLP protobuf bytes. Each trace
becomes a trace in the store (run id = the trace id in hex): a single root span is the chain and
its descendants the steps in start order; ``llm.*`` (OpenInference) and ``gen_ai.*`` attributes
map to the step's model, tokens and finish reason, ``input.value``/``output.value`` (or the GenAI /
OpenInference message attributes) to its input and output, ``exception`` events to its error. A
trace whose id is already stored is skipped, so re-sending a file is harmless.

Import is bounded and never trusts its input: :data:`MAX_OTLP_BYTES` and :data:`MAX_OTLP_DEPTH`
refuse a request whole (:class:`InvalidOtlp`); a malformed span is rejected alone with the field
at fault (:class:`SpanRejection`) and takes the rest of its trace with it (a trace is imported
whole or not at all); parent cycles are broken deterministically and the span tree is walked
without recursion.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

import rewind
from rewind.canonical import CanonicalError
from rewind.errors import RewindError
from rewind.store import Store
from rewind.tracing.model import (
    ROOT_POSITION,
    STEP_STATUSES,
    STEP_TYPES,
    StepData,
    StepStatus,
    StepView,
    TraceData,
    TraceView,
    as_fields,
    jsonable,
)
from rewind.tracing.otel_calls import (
    calls_of_span,
    entries_of,
    exported_calls,
    exported_calls_attribute,
    indexed_attributes,
)
from rewind.tracing.otel_effects import (
    EFFECTS_ATTRIBUTE,
    effects_attribute,
    effects_from_attribute,
)
from rewind.tracing.store import load_traces, stored_span_ids, trace_exists, write_trace

__all__ = [
    "MAX_OTLP_BYTES",
    "MAX_OTLP_DEPTH",
    "ImportResult",
    "InvalidOtlp",
    "OtlpJsonFileExporter",
    "OtlpReceiver",
    "OtlpTooLarge",
    "SpanRejection",
    "export_runs",
    "export_to_file",
    "import_otlp",
    "load_otlp_json",
    "parse_otlp",
    "read_otlp_file",
    "spans_to_otlp_json",
]

JSON = "application/json"

_OI_KIND = {
    "llm_call": "LLM",
    "retrieval": "RETRIEVER",
    "tool_call": "TOOL",
    "transform": "CHAIN",
    "parse": "CHAIN",
    "validate": "GUARDRAIL",
}


# -- export ------------------------------------------------------------------------------------


class _RecordedIds(IdGenerator):
    """Hands out the recorded trace and span ids in the order spans are started."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_ids: deque[int] = deque()

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_ids.popleft()


def _derived(text: str, hex_chars: int) -> str:
    value = hashlib.sha256(text.encode()).hexdigest()[:hex_chars]
    return value if int(value, 16) else "1".rjust(hex_chars, "0")


def _trace_hex(run_id: str) -> str:
    return run_id.lower() if re.fullmatch(r"[0-9a-fA-F]{32}", run_id) else _derived(run_id, 32)


def _ns(seconds: float | None) -> int:
    return round((seconds or 0.0) * 1e9)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def export_runs(
    store: Store,
    run_ids: Sequence[str],
    exporter: SpanExporter,
    *,
    service_name: str = "rewind",
) -> list[str]:
    """Export runs/traces (full ids or unique prefixes) as OTel spans through ``exporter``, all
    spans in one ``export`` call (one OTLP request).

    Returns:
        the exported trace ids (32 hex), in the order given.
    Raises:
        UnknownRun: an id names no run.
        RewindError: the exporter reported a failure.
    """
    ids = [store.get_run(r).run_id for r in run_ids]
    views = load_traces(store, ids, payloads=True)
    payload = store.get_blobs(
        {
            h
            for v in views
            for s in v.steps
            for c in s.calls
            for h in (c.request_hash, c.result_hash)
            if h
        }
    )
    gen = _RecordedIds()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        id_generator=gen,
        span_limits=SpanLimits(
            max_attribute_length=SpanLimits.UNSET, max_span_attribute_length=SpanLimits.UNSET
        ),
        shutdown_on_exit=False,
    )
    collect = _Collect()
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tracer = provider.get_tracer("rewind.tracing", rewind.__version__)
    out = [_emit(tracer, gen, view, payload) for view in views]
    provider.force_flush()
    if collect.spans:
        result = exporter.export(collect.spans)
        if result is not SpanExportResult.SUCCESS:
            raise RewindError(
                f"the span exporter failed ({type(exporter).__name__}: {result.name})",
                "check the OTLP endpoint (is it reachable, does it accept /v1/traces?)",
            )
    return out


def _emit(tracer: Any, gen: _RecordedIds, view: TraceView, payload: Mapping[str, bytes]) -> str:
    trace_hex = _trace_hex(view.trace_id)
    gen.trace_id = int(trace_hex, 16)
    root_id = view.span_id or _derived(f"{view.trace_id}:root", 16)
    gen.span_ids.append(int(root_id, 16))
    for s in view.steps:
        gen.span_ids.append(int(s.span_id or _derived(f"{view.trace_id}:{s.position}", 16), 16))
    root = tracer.start_span(
        view.name,
        context=Context(),
        kind=SpanKind.INTERNAL,
        attributes=_root_attributes(view),
        start_time=_ns(view.started_at),
    )
    if view.failed:
        _error(root, view.error_type, view.error_message, view.ended_at or view.started_at)
    elif view.status == StepStatus.SUCCESS:
        root.set_status(Status(StatusCode.OK))
    spans: dict[int, Any] = {ROOT_POSITION: root}
    for s in view.steps:
        parent = spans.get(s.parent_position if s.parent_position is not None else -1, root)
        start = s.started_at if s.started_at is not None else view.started_at
        span = tracer.start_span(
            s.name,
            context=set_span_in_context(parent),
            kind=SpanKind.CLIENT if s.step_type in ("llm_call", "tool_call") else SpanKind.INTERNAL,
            attributes=_step_attributes(view, s, payload),
            start_time=_ns(start),
        )
        if s.status == StepStatus.FAILED:
            _error(span, s.error_type, s.error_message, start + s.duration_ms / 1000.0)
        elif s.status == StepStatus.SUCCESS:
            span.set_status(Status(StatusCode.OK))
        spans[s.position] = span
    for s in reversed(view.steps):
        start = s.started_at if s.started_at is not None else view.started_at
        end = s.ended_at if s.ended_at is not None else start + s.duration_ms / 1000.0
        spans[s.position].end(end_time=_ns(end))
    root_end = (
        view.ended_at if view.ended_at is not None else view.started_at + view.duration_ms / 1000
    )
    root.end(end_time=_ns(root_end))
    return trace_hex


def _error(span: Any, error_type: str | None, message: str | None, when: float) -> None:
    text = f"{error_type or 'Error'}: {message or ''}"
    span.set_status(Status(StatusCode.ERROR, text[:500]))
    span.add_event(
        "exception",
        {"exception.type": error_type or "Error", "exception.message": message or ""},
        timestamp=_ns(when),
    )


def _root_attributes(view: TraceView) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "rewind.kind": view.kind,
        "rewind.run_id": view.trace_id,
        "rewind.name": view.name,
        "rewind.status": view.status,
        "rewind.duration_ms": float(view.duration_ms),
        "openinference.span.kind": "CHAIN",
        "input.value": _dumps(view.input),
        "input.mime_type": JSON,
    }
    if view.kind == "trace":
        attrs["output.value"] = _dumps(view.output)
        attrs["output.mime_type"] = JSON
    if view.parent_run_id:
        attrs["rewind.parent_run_id"] = view.parent_run_id
    if view.config.get("chain_ref"):
        attrs["rewind.chain_ref"] = str(view.config["chain_ref"])
    if view.attributes:
        attrs["rewind.attributes"] = _dumps(view.attributes)
    if view.override:
        attrs["rewind.override"] = _dumps(view.override)
    return attrs


def _step_attributes(view: TraceView, s: StepView, payload: Mapping[str, bytes]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "rewind.node": s.name,
        "rewind.position": s.position,
        "rewind.step.type": s.step_type,
        "rewind.step.status": s.status,
        "rewind.cache.outcome": s.cache_outcome,
        "rewind.cache.reason": s.cache_reason,
        "rewind.determinism": s.determinism,
        "rewind.duration_ms": float(s.duration_ms),
        "rewind.input_hash": s.input_hash,
        "openinference.span.kind": _OI_KIND.get(s.step_type, "CHAIN"),
        "input.value": _dumps(s.input_doc),
        "input.mime_type": JSON,
    }
    if s.output_hash:
        attrs["rewind.output_hash"] = s.output_hash
        attrs["output.value"] = _dumps(s.output_fields)
        attrs["output.mime_type"] = JSON
    if s.state_hash:
        attrs["rewind.state_hash"] = s.state_hash
    effects = effects_attribute(s.calls, s.effects)
    if effects is not None:
        attrs[EFFECTS_ATTRIBUTE] = effects
    if s.attributes:
        attrs["rewind.attributes"] = _dumps(s.attributes)
    if s.calls:
        attrs["rewind.calls"] = exported_calls_attribute(s.calls, payload)
    model = s.model
    tokens = s.prompt_tokens or s.completion_tokens
    if s.step_type == "llm_call" or model:
        attrs["gen_ai.operation.name"] = "chat"
        if model:
            attrs["gen_ai.request.model"] = model
            attrs["llm.model_name"] = model
        finish = s.attributes.get("finish_reason")
        if isinstance(finish, str):
            attrs["gen_ai.response.finish_reasons"] = [finish]
    elif s.step_type == "tool_call":
        attrs["gen_ai.operation.name"] = "execute_tool"
        attrs["gen_ai.tool.name"] = str(s.attributes.get("tool") or s.name)
    if s.step_type == "llm_call" or tokens:
        attrs["gen_ai.usage.input_tokens"] = s.prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = s.completion_tokens
        attrs["llm.token_count.prompt"] = s.prompt_tokens
        attrs["llm.token_count.completion"] = s.completion_tokens
        attrs["llm.token_count.total"] = s.tokens
    return attrs


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """SDK spans as one OTLP/JSON ``ExportTraceServiceRequest`` (ids in hex, enums as ints)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    return _ids_to_hex(message)


def _ids_to_hex(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str) and v:
                out[k] = base64.b64decode(v).hex()
            else:
                out[k] = _ids_to_hex(v)
        return out
    if isinstance(value, list):
        return [_ids_to_hex(v) for v in value]
    return value


class OtlpJsonFileExporter(SpanExporter):
    """An SDK span exporter appending one OTLP/JSON ``ExportTraceServiceRequest`` per line to a
    file (the OpenTelemetry Collector file exporter's format)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans as one JSON line."""
        line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"), ensure_ascii=False)
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            self.batches += 1
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Writes are synchronous: always flushed."""
        return True


class _Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def export_to_file(
    store: Store, run_ids: Sequence[str], path: str | Path, *, service_name: str = "rewind"
) -> list[str]:
    """Export runs/traces to an OTLP/JSON file (one request object, written atomically).

    Returns:
        the exported trace ids.
    """
    collect = _Collect()
    ids = export_runs(store, run_ids, collect, service_name=service_name)
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(
        json.dumps(spans_to_otlp_json(collect.spans), ensure_ascii=False) + "\n", encoding="utf-8"
    )
    tmp.replace(target)
    return ids


# -- import ------------------------------------------------------------------------------------

MAX_OTLP_BYTES = 20 * 1024 * 1024
"""The largest OTLP body or file read (bytes, 20 MiB): the OpenTelemetry Collector's default
``max_request_body_size`` for OTLP/HTTP, so anything a collector forwards fits."""

MAX_OTLP_DEPTH = 128
"""The deepest JSON nesting (objects and arrays) an OTLP/JSON request may have, and the deepest
attribute value (``kvlistValue``/``arrayValue`` levels) a span may have. A normal span's values sit
about 13 levels deep; protobuf's decoder stops at 100 nested messages, about the same attribute
depth. Deeper input is refused before any recursive step can exhaust the stack."""


class InvalidOtlp(RewindError):
    """OTLP input that cannot be read at all: not JSON, not an ``ExportTraceServiceRequest``,
    nested too deeply, or a container (``resourceSpans``, ``scopeSpans``, ``spans``) of the
    wrong type. ``field`` names where (``resourceSpans[0].scopeSpans``) when one place is at
    fault. Nothing is imported. (A malformed *span* is not this error: it is rejected alone.)"""

    def __init__(self, message: str, hint: str = "", *, field: str | None = None) -> None:
        super().__init__(message, hint or _OTLP_HINT, field=field)


class OtlpTooLarge(InvalidOtlp):
    """The OTLP body or file is larger than :data:`MAX_OTLP_BYTES`."""


_OTLP_HINT = "send OTLP/JSON: one ExportTraceServiceRequest object (or one per line in a file)"


@dataclass
class _Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    events: list[dict[str, Any]]
    resource: dict[str, Any]


@dataclass(frozen=True)
class SpanRejection:
    """Spans not imported, and why.

    Attributes:
        reason: what is wrong, naming the field (``attributes["x"].value.doubleValue is null,
            not a number``).
        trace_id: the span's trace id (32 hex) when it could be read, else None.
        span_id: the span's id (16 hex) when it could be read, else None.
        where: the span's place in the request (``resourceSpans[0].scopeSpans[0].spans[3]``),
            empty when the reason concerns a whole trace.
        spans: how many spans this rejection covers (a whole trace that cannot be stored: all).
    """

    reason: str
    trace_id: str | None = None
    span_id: str | None = None
    where: str = ""
    spans: int = 1

    def __str__(self) -> str:
        if self.span_id:
            who = f"span {self.span_id}" + (f" ({self.spans} copies)" if self.spans > 1 else "")
        elif self.where:
            who = f"span at {self.where}"
        else:
            who = f"{self.spans} span(s)"
        if self.trace_id:
            who += f" of trace {self.trace_id}"
        return f"{who}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        """JSON object of the rejection."""
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "where": self.where,
            "spans": self.spans,
            "reason": self.reason,
        }


@dataclass
class ImportResult:
    """What an import did.

    Attributes:
        imported: trace ids (32 hex) written, oldest first.
        skipped: trace ids already stored (nothing written for them).
        spans: spans read (accepted and rejected).
        rejected: spans not imported (the sum of ``rejections[i].spans``).
        rejections: each rejected span (or unstorable trace) with its reason.
        notes: repairs made without losing a span (a parent cycle broken).
        errors: ``rejections`` as one line each (kept for callers reading strings).
    """

    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    spans: int = 0
    rejected: int = 0
    rejections: list[SpanRejection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """One line per rejection."""
        return [str(r) for r in self.rejections]

    def reject(self, rejection: SpanRejection) -> None:
        """Count a rejection."""
        self.rejections.append(rejection)
        self.rejected += rejection.spans

    def to_json(self) -> dict[str, Any]:
        """JSON object of the result."""
        return {
            "imported": self.imported,
            "skipped": self.skipped,
            "spans": self.spans,
            "rejected": self.rejected,
            "errors": self.errors,
            "rejections": [r.to_json() for r in self.rejections],
            "notes": self.notes,
        }


def read_otlp_file(path: str | Path) -> list[dict[str, Any]]:
    """The request objects of an OTLP/JSON file (one JSON object, or one per line).

    At most :data:`MAX_OTLP_BYTES` bytes are read (a device or pipe is not read without end).

    Raises:
        InvalidOtlp: the file cannot be read, is empty, is not UTF-8 JSON, nests deeper than
            :data:`MAX_OTLP_DEPTH`, or holds something other than request objects.
        OtlpTooLarge: the file is larger than :data:`MAX_OTLP_BYTES`.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_OTLP_BYTES + 1)
    except OSError as exc:
        raise InvalidOtlp(
            f"cannot read {p}: {exc.strerror or exc}", "pass an OTLP/JSON trace file"
        ) from exc
    if len(raw) > MAX_OTLP_BYTES:
        raise OtlpTooLarge(
            f"{p} is larger than {MAX_OTLP_BYTES} bytes (the OTLP import limit)",
            "split it into several files (one ExportTraceServiceRequest per line is fine)",
        )
    try:
        text = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        raise InvalidOtlp(
            f"{p} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})",
            "OTLP/JSON is UTF-8: export the traces again with an OTLP/JSON file exporter",
        ) from exc
    if not text:
        raise InvalidOtlp(f"{p} is empty", "pass an OTLP/JSON trace file")
    try:
        docs = [_load_json(text, str(p))]
    except InvalidOtlp as whole:
        cause = whole.__cause__
        if not isinstance(cause, json.JSONDecodeError) or cause.msg != "Extra data":
            raise
        docs = [
            _load_json(line, f"{p} line {n}")
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    for n, d in enumerate(docs, 1):
        where = f"{p} line {n}" if len(docs) > 1 else str(p)
        if not isinstance(d, dict) or ("resourceSpans" not in d and "resource_spans" not in d):
            raise InvalidOtlp(
                f"{where} is not OTLP/JSON: no resourceSpans",
                "export traces with an OTLP/JSON file exporter",
            )
    return docs


def load_otlp_json(body: bytes) -> dict[str, Any]:
    """One OTLP/JSON request object from an HTTP body.

    Raises:
        OtlpTooLarge: more than :data:`MAX_OTLP_BYTES` bytes.
        InvalidOtlp: not UTF-8 JSON, nested deeper than :data:`MAX_OTLP_DEPTH`, or not an object.
    """
    if len(body) > MAX_OTLP_BYTES:
        raise OtlpTooLarge(
            f"the body is larger than {MAX_OTLP_BYTES} bytes", "send the spans in smaller batches"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidOtlp(
            f"the body is not UTF-8 (byte {body[exc.start]:#04x} at offset {exc.start})"
        ) from exc
    doc = _load_json(text, "the body")
    if not isinstance(doc, dict):
        raise InvalidOtlp(f"the body is {_kind(doc)}, not an ExportTraceServiceRequest object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _load_json(text: str, where: str) -> Any:
    """Parse JSON; refuse NaN/Infinity literals and nesting deeper than MAX_OTLP_DEPTH."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError as exc:
        raise _too_deep(where) from exc
    except json.JSONDecodeError as exc:
        raise InvalidOtlp(
            f"{where} is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except ValueError as exc:  # a NaN literal, or an integer of more than 4,300 digits
        raise InvalidOtlp(f"{where} is not JSON OTLP can carry: {exc}") from exc
    if _deeper_than(doc, MAX_OTLP_DEPTH):
        raise _too_deep(where)
    return doc


def _too_deep(where: str) -> InvalidOtlp:
    return InvalidOtlp(
        f"{where} nests deeper than {MAX_OTLP_DEPTH} levels (the OTLP import limit)",
        "flatten deeply nested attribute values before exporting them",
    )


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class _Bad(Exception):
    """A malformed field inside one span (or one resource): ``field`` then ``reason``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}".strip())
        self.field = field
        self.reason = reason

    def under(self, prefix: str) -> str:
        """The message with the field placed under ``prefix``."""
        return f"{prefix}.{self.field} {self.reason}" if self.field else f"{prefix} {self.reason}"


# bool before number: bool subclasses int.
_JSON_KINDS: tuple[tuple[Any, str], ...] = (
    (bool, "a boolean"),
    (int | float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (Mapping, "an object"),
)


def _kind(value: Any) -> str:
    """The JSON type of a value, for a message (``is null``, ``is an array``)."""
    if value is None:
        return "null"
    return next((k for t, k in _JSON_KINDS if isinstance(value, t)), f"a {type(value).__name__}")


def _label(value: Any) -> str:
    """A short, one-line rendering of a hostile value for a message."""
    text = json.dumps(value, ensure_ascii=True, default=str) if not isinstance(value, str) else ""
    text = text or json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _shown(value: Any) -> str:
    """``"x" is`` for a wrong string or number, ``is null,`` for a wrong type: a message's
    start that names the value where that helps."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return f"{_label(value)} is"
    return f"is {_kind(value)},"


def parse_otlp(docs: Iterable[Any]) -> tuple[list[_Span], list[SpanRejection]]:
    """The spans of OTLP/JSON request objects (camelCase or snake_case field names; ids in hex
    or base64), and the spans rejected one by one with the field at fault.

    A span is rejected when a field it carries is malformed: an id that is not 16/8 bytes of hex
    or base64 (or all zeros), a time that is not a non-negative integer of nanoseconds (or an end
    before the start), a name or status of the wrong type, an attribute without a string key or
    whose value is not an ``AnyValue`` (``doubleValue: null``, ``intValue`` beyond int64, a
    ``bytesValue`` that is not base64, two values in one, nesting deeper than
    :data:`MAX_OTLP_DEPTH`). A resource attribute that is malformed rejects that resource's spans.

    Raises:
        InvalidOtlp: a request or container (``resourceSpans``, ``scopeSpans``, ``spans``) is
            not of its type; the message names it.
    """
    spans: list[_Span] = []
    rejections: list[SpanRejection] = []
    docs = list(docs)
    for n, doc in enumerate(docs):
        top = f"request {n + 1}: " if len(docs) > 1 else ""
        if not isinstance(doc, Mapping):
            raise InvalidOtlp(f"{top}{_kind(doc)} is not an ExportTraceServiceRequest object")
        for i, rs in enumerate(_container(doc, "resourceSpans", top, "")):
            path = f"resourceSpans[{i}]"
            if not isinstance(rs, Mapping):
                raise InvalidOtlp(f"{top}{path} is {_kind(rs)}, not an object", field=path)
            entries: list[tuple[str, Any]] = []
            scopes = _container(rs, "scopeSpans", top, path) or _container(
                rs, "instrumentationLibrarySpans", top, path
            )
            for j, ss in enumerate(scopes):
                spath = f"{path}.scopeSpans[{j}]"
                if not isinstance(ss, Mapping):
                    raise InvalidOtlp(f"{top}{spath} is {_kind(ss)}, not an object", field=spath)
                for k, sp in enumerate(_container(ss, "spans", top, spath)):
                    entries.append((f"{top}{spath}.spans[{k}]", sp))
            try:
                resource = _resource(_get(rs, "resource"))
            except _Bad as bad:
                for where, sp in entries:
                    rejections.append(_rejection(sp, where, bad.under(f"{path}.resource")))
                continue
            for where, sp in entries:
                try:
                    spans.append(_span_of(sp, resource))
                except _Bad as bad:
                    rejections.append(_rejection(sp, where, str(bad)))
    return spans, rejections


def _container(obj: Mapping[str, Any], camel: str, top: str, path: str) -> list[Any]:
    value = _get(obj, camel)
    if value is None:
        return []
    if not isinstance(value, list):
        where = f"{path}.{camel}" if path else camel
        raise InvalidOtlp(f"{top}{where} is {_kind(value)}, not an array", field=where)
    return value


def _resource(resource: Any) -> dict[str, Any]:
    if resource is None:
        return {}
    if not isinstance(resource, Mapping):
        raise _Bad("", f"is {_kind(resource)}, not an object")
    return _attrs(_get(resource, "attributes"), "attributes", 0)


def _rejection(sp: Any, where: str, reason: str) -> SpanRejection:
    """The rejection of one span, with its ids when they can be read."""
    ids: dict[str, str | None] = {"traceId": None, "spanId": None}
    if isinstance(sp, Mapping):
        for key, nbytes in (("traceId", 16), ("spanId", 8)):
            with contextlib.suppress(_Bad):
                ids[key] = _hex_id(_get(sp, key), nbytes, key)
    return SpanRejection(reason, ids["traceId"], ids["spanId"], where)


def _get(obj: Mapping[str, Any], camel: str, default: Any = None) -> Any:
    if camel in obj:
        return obj[camel]
    return obj.get(_snake(camel), default)


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_UINT64 = (1 << 64) - 1
_INT64 = 1 << 63


def _span_of(sp: Any, resource: dict[str, Any]) -> _Span:
    """One span object, checked field by field (raises _Bad naming the field)."""
    if not isinstance(sp, Mapping):
        raise _Bad("", f"is {_kind(sp)}, not a span object")
    parent = _get(sp, "parentSpanId")
    parent_id = _hex_id(parent, 8, "parentSpanId", zero_ok=True) if parent else None
    if parent_id is not None and not int(parent_id, 16):
        parent_id = None  # some exporters send zeros for "no parent"
    name = _text(_get(sp, "name"), "name")
    start = _nanos(_get(sp, "startTimeUnixNano"), "startTimeUnixNano")
    end = _nanos(_get(sp, "endTimeUnixNano"), "endTimeUnixNano")
    if end and end < start:
        raise _Bad("endTimeUnixNano", f"{end} is before startTimeUnixNano {start}")
    status = _get(sp, "status")
    if status is None:
        status = {}
    if not isinstance(status, Mapping):
        raise _Bad("status", f"is {_kind(status)}, not an object")
    code = _get(status, "code", 0)
    if isinstance(code, str) and code in _STATUS_CODES:
        code = _STATUS_CODES[code]
    if code is None:
        code = 0
    if isinstance(code, bool) or code not in (0, 1, 2):
        raise _Bad("status.code", f"{_label(code)} is not 0, 1, 2 or a STATUS_CODE_* name")
    message = _text(_get(status, "message"), "status.message")
    events = _get(sp, "events")
    if events is not None and not isinstance(events, list):
        raise _Bad("events", f"is {_kind(events)}, not an array")
    parsed_events = []
    for i, e in enumerate(events or []):
        if not isinstance(e, Mapping):
            raise _Bad(f"events[{i}]", f"is {_kind(e)}, not an object")
        event_name = _text(_get(e, "name"), f"events[{i}].name")
        parsed_events.append(
            {
                "name": event_name,
                "attributes": _attrs(_get(e, "attributes"), f"events[{i}].attributes", 0),
            }
        )
    return _Span(
        trace_id=_hex_id(_get(sp, "traceId"), 16, "traceId"),
        span_id=_hex_id(_get(sp, "spanId"), 8, "spanId"),
        parent_id=parent_id,
        name=name or "span",
        start_ns=start,
        end_ns=end,
        attributes=_attrs(_get(sp, "attributes"), "attributes", 0),
        status_code=int(code),
        status_message=message or "",
        events=parsed_events,
        resource=resource,
    )


def _text(value: Any, name: str, *, required: bool = False) -> Any:
    """A string field: a string of Unicode text (no lone surrogate, which UTF-8 cannot carry
    and the store cannot write), or None when absent and not ``required``."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _Bad(name, "is missing" if value is None else f"is {_kind(value)}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = f"\\u{ord(value[exc.start]):04x}"
        raise _Bad(name, f"holds a lone surrogate {bad} at {exc.start}, not text") from exc
    return value


def _hex_id(value: Any, nbytes: int, name: str, *, zero_ok: bool = False) -> str:
    """An id as lower-case hex: ``nbytes`` of hex or base64. All zeros is no id (OTLP): an
    error unless ``zero_ok``."""
    if value is None or value == "":
        raise _Bad(name, "is missing")
    if not isinstance(value, str):
        raise _Bad(name, f"is {_kind(value)}, not a hex or base64 string")
    if re.fullmatch(rf"[0-9a-fA-F]{{{nbytes * 2}}}", value):
        out = value.lower()
    else:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Bad(
                name, f"{_label(value)} is neither {nbytes * 2} hex characters nor base64"
            ) from exc
        if len(raw) != nbytes:
            raise _Bad(name, f"{_label(value)} is {len(raw)} bytes, not {nbytes}")
        out = raw.hex()
    if not zero_ok and not int(out, 16):
        raise _Bad(name, "is all zeros (an invalid id)")
    return out


def _nanos(value: Any, name: str) -> int:
    """A ``fixed64`` time: an integer or a decimal string, 0 ≤ t < 2**64 (ns since the epoch)."""
    if value is None:
        return 0
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,20}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(name, f"{_label(value)} is not an integer number of nanoseconds")
    if not 0 <= value <= _UINT64:
        raise _Bad(name, f"{_label(value)} is outside 0..2**64-1 nanoseconds")
    return value


_VALUE_KINDS = (
    "stringValue",
    "boolValue",
    "intValue",
    "doubleValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
)
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _any(value: Any, path: str, depth: int) -> Any:
    """An ``AnyValue`` as a plain value (raises _Bad naming ``path`` and the kind)."""
    if depth > MAX_OTLP_DEPTH:
        raise _Bad(path, f"nests deeper than {MAX_OTLP_DEPTH} levels")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _Bad(path, f"is {_kind(value)}, not an AnyValue object")
    present = [k for k in _VALUE_KINDS if k in value or _snake(k) in value]
    if not present:
        return None  # an empty AnyValue is a legal "no value"
    if len(present) > 1:
        raise _Bad(path, f"holds {' and '.join(present)}: an AnyValue holds one")
    kind = present[0]
    x = _get(value, kind)
    where = f"{path}.{kind}"
    if kind == "stringValue":
        return _text(x, where, required=True)
    if kind == "boolValue":
        if not isinstance(x, bool):
            raise _Bad(where, f"is {_kind(x)}, not true or false")
        return x
    if kind == "intValue":
        if isinstance(x, str) and re.fullmatch(r"-?[0-9]{1,19}", x):
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int) or not -_INT64 <= x < _INT64:
            raise _Bad(where, f"{_shown(x)} not a 64-bit integer")
        return x
    if kind == "doubleValue":
        if isinstance(x, str) and (x in ("NaN", "Infinity", "-Infinity") or _NUMBER.fullmatch(x)):
            x = float(x)
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise _Bad(where, f"{_shown(x)} not a number")
        try:
            return float(x)
        except OverflowError as exc:
            raise _Bad(where, f"{_label(x)} is beyond a 64-bit float") from exc
    if kind == "bytesValue":
        if not isinstance(x, str):
            raise _Bad(where, f"is {_kind(x)}, not a base64 string")
        padded = x.replace("-", "+").replace("_", "/")
        try:
            base64.b64decode(padded + "=" * (-len(padded) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Bad(where, f"{_label(x)} is not base64") from exc
        return x
    if x is None:
        x = {}
    if not isinstance(x, Mapping):
        raise _Bad(where, f"is {_kind(x)}, not an object with values")
    values = _get(x, "values")
    if values is None:
        values = []
    if not isinstance(values, list):
        raise _Bad(f"{where}.values", f"is {_kind(values)}, not an array")
    if kind == "arrayValue":
        return [_any(v, f"{where}.values[{i}]", depth + 1) for i, v in enumerate(values)]
    return _attrs(values, f"{where}", depth + 1)


def _attrs(items: Any, path: str, depth: int) -> dict[str, Any]:
    """A ``KeyValue`` array as a dict (a repeated key: the last value wins, as in the SDKs)."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise _Bad(path, f"is {_kind(items)}, not an array of key/value objects")
    out: dict[str, Any] = {}
    for i, kv in enumerate(items):
        if not isinstance(kv, Mapping):
            raise _Bad(f"{path}[{i}]", f"is {_kind(kv)}, not a key/value object")
        key = _text(kv.get("key"), f"{path}[{i}].key", required=True)
        out[key] = _any(kv.get("value"), f"{path}[{_label(key)}].value", depth + 1)
    return out


def import_otlp(
    store: Store,
    docs: Iterable[Any] | None = None,
    *,
    spans: list[_Span] | None = None,
    rejections: Sequence[SpanRejection] = (),
) -> ImportResult:
    """Import OTLP/JSON request objects (or already parsed spans) into the store.

    Malformed spans are rejected one by one (:func:`parse_otlp`), each with its reason, and a
    trace is imported whole or not at all: the other spans of a trace with a rejected span are
    rejected with it (counted, one reason for them). Identical copies of a span collapse to
    one; differing spans sharing a span id reject their trace (no one of them is the span). A
    parent cycle (a span its own parent, A → B → A) is broken at its earliest span (start time,
    then span id: the same whatever the input order), which becomes a root; ``notes`` says so.
    Each trace is written in one transaction: a trace that cannot be stored is rejected whole
    and leaves nothing behind. A trace id already stored is skipped.

    Args:
        store: the store written to.
        docs: ``ExportTraceServiceRequest`` objects (parsed JSON).
        spans: spans already parsed (instead of ``docs``), with ``rejections`` from the parse.
    Returns:
        the imported and skipped trace ids, the span count, and every rejection with its reason.
    Raises:
        InvalidOtlp: a request or container is not of its type (nothing is imported).
    """
    if spans is None:
        spans, parsed_rejections = parse_otlp(docs or [])
        rejections = [*rejections, *parsed_rejections]
    result = ImportResult(spans=len(spans) + sum(r.spans for r in rejections))
    for r in rejections:
        result.reject(r)
    by_trace: dict[str, list[_Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    spoiled = {r.trace_id for r in rejections if r.trace_id}
    tidy: dict[str, list[_Span]] = {}
    for trace_id, group in by_trace.items():
        if trace_id in spoiled:
            result.reject(_whole_trace(trace_id, len(group)))
            continue
        kept, conflicted = _unique_spans(trace_id, group, result)
        if conflicted:
            if kept:
                result.reject(_whole_trace(trace_id, len(kept)))
            continue
        tidy[trace_id] = _break_cycles(trace_id, kept, result.notes)
    # Oldest first, so a replay imported with its parent can point at it.
    ordered = sorted(tidy.items(), key=lambda kv: (min(s.start_ns for s in kv[1]), kv[0]))
    for trace_id, group in ordered:
        if trace_exists(store, trace_id):
            result.skipped.append(trace_id)
            unseen = {s.span_id for s in group} - stored_span_ids(store, trace_id)
            if unseen:  # never dropped silently: a stored trace is immutable, so say so
                result.reject(
                    SpanRejection(
                        f"trace {trace_id} is already stored without these spans (a stored "
                        "trace is never changed); import all spans of a trace together, "
                        "e.g. `rewind otel import part1.json part2.json`",
                        trace_id,
                        spans=len(unseen),
                    )
                )
            continue
        try:
            write_trace(store, _without_overwrites(store, trace_from_spans(store, trace_id, group)))
        except (RewindError, CanonicalError, ValueError, TypeError, OverflowError) as exc:
            reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            result.reject(
                SpanRejection(f"the trace cannot be stored: {reason}", trace_id, spans=len(group))
            )
            continue
        result.imported.append(trace_id)
    return result


def _without_overwrites(store: Store, data: TraceData) -> TraceData:
    """``data`` with the cache entries whose key the store already holds kept on the trace only
    (its lineage): an imported answer never replaces one recorded or imported before. The
    others are marked with the trace as their origin: they serve this trace's replays only."""
    for s in data.steps:
        s.pending = [
            replace(pw, cacheable=False)
            if pw.cacheable
            and (store.llm_cache_get if pw.kind == "llm" else store.tool_cache_get)(pw.key)
            is not None
            else replace(pw, origin=data.trace_id)
            for pw in s.pending
        ]
    return data


def _whole_trace(trace_id: str, spans: int) -> SpanRejection:
    return SpanRejection(
        "not imported: another span of its trace was rejected (a trace is imported whole or "
        "not at all)",
        trace_id,
        spans=spans,
    )


def _unique_spans(
    trace_id: str, spans: list[_Span], result: ImportResult
) -> tuple[list[_Span], bool]:
    """One span per span id: identical copies collapse to one (the extra copies are counted
    rejected), differing copies are all rejected (a child could not tell which is its parent)
    and left out of the list returned."""
    by_id: dict[str, list[_Span]] = {}
    for s in spans:
        by_id.setdefault(s.span_id, []).append(s)
    kept = []
    conflicted = False
    for span_id, copies in by_id.items():
        first = copies[0]
        if len(copies) == 1:
            kept.append(first)
        elif all(c == first for c in copies[1:]):
            kept.append(first)
            for _ in copies[1:]:
                result.reject(SpanRejection("an identical copy was sent twice", trace_id, span_id))
        else:
            conflicted = True
            result.reject(
                SpanRejection(
                    f"spanId is used by {len(copies)} different spans of the trace",
                    trace_id,
                    span_id,
                    spans=len(copies),
                )
            )
    return kept, conflicted


def _break_cycles(trace_id: str, spans: list[_Span], notes: list[str] | None = None) -> list[_Span]:
    """The spans with every parent cycle (a span its own parent, A → B → A, ...) broken: the
    cycle's earliest span (start time, then span id) loses its parent and becomes a root.
    Span ids must be unique. Returns new span objects where a parent changed."""
    parent = {s.span_id: s.parent_id for s in spans}
    by_id = {s.span_id: s for s in spans}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cut: set[str] = set()
    for start in sorted(parent):
        path: list[str] = []
        node: str | None = start
        while node is not None and node in parent and node not in state:
            state[node] = 1
            path.append(node)
            node = parent[node]
        if node is not None and state.get(node) == 1:
            cycle = path[path.index(node) :]
            head = min(cycle, key=lambda sid: (by_id[sid].start_ns, sid))
            cut.add(head)
            if notes is not None:
                ring = " → ".join([*cycle[cycle.index(head) :], *cycle[: cycle.index(head)], head])
                notes.append(
                    f"trace {trace_id}: the parent links {ring} form a cycle; span {head} "
                    "(the earliest) was made a root"
                )
        for sid in path:
            state[sid] = 2
    if not cut:
        return spans
    return [replace(s, parent_id=None) if s.span_id in cut else s for s in spans]


def _has_cycle(spans: list[_Span]) -> bool:
    """True when following parent links from some span comes back to a span already seen."""
    parent = {s.span_id: s.parent_id for s in spans}
    done: set[str] = set()
    for start in parent:
        path: set[str] = set()
        node: str | None = start
        while node is not None and node in parent and node not in done:
            if node in path:
                return True
            path.add(node)
            node = parent[node]
        done |= path
    return False


def _by_start(spans: list[_Span]) -> list[_Span]:
    return sorted(
        spans,
        key=lambda s: (
            s.attributes.get("rewind.position", 1 << 60)
            if isinstance(s.attributes.get("rewind.position"), int)
            else 1 << 60,
            s.start_ns,
            s.span_id,
        ),
    )


def trace_from_spans(store: Store | None, trace_id: str, spans: list[_Span]) -> TraceData:
    """Build the trace of one trace id's spans (see the module doc for the mapping).

    Span ids should be unique (:func:`import_otlp` drops copies first); a later copy of an id is
    ignored here. A parent cycle is broken as :func:`import_otlp` does. The span tree is walked
    without recursion, so a chain of any length builds.

    Raises:
        ValueError: ``spans`` is empty.
    """
    if not spans:
        raise ValueError(f"trace {trace_id} has no spans")
    spans = _break_cycles(trace_id, list({s.span_id: s for s in reversed(spans)}.values()))
    ids = {s.span_id for s in spans}
    roots = _by_start([s for s in spans if s.parent_id is None or s.parent_id not in ids])
    children: dict[str, list[_Span]] = {}
    for s in spans:
        if s.parent_id in ids:
            children.setdefault(s.parent_id, []).append(s)
    root: _Span | None = roots[0] if len(roots) == 1 else None
    ordered: list[tuple[_Span, str | None]] = []

    def walk(top: _Span, top_parent: str | None) -> None:
        stack = [(top, top_parent)]
        while stack:
            node, parent = stack.pop()
            ordered.append((node, parent))
            kids = _by_start(children.get(node.span_id, []))
            stack.extend((c, node.span_id) for c in reversed(kids))

    if root is not None and (children.get(root.span_id) or "rewind.kind" in root.attributes):
        for c in _by_start(children.get(root.span_id, [])):
            walk(c, None)
    else:
        for r in roots:
            walk(r, None)
    head = root or roots[0]
    positions = {s.span_id: i for i, (s, _) in enumerate(ordered)}
    steps = [
        _step(i, s, positions.get(parent, ROOT_POSITION) if parent else ROOT_POSITION)
        for i, (s, parent) in enumerate(ordered)
    ]
    ra = head.attributes
    status = ra.get("rewind.status")
    if not isinstance(status, str) or status not in STEP_STATUSES:
        status = (
            "failed"
            if head.status_code == 2
            or (root is None and any(s.status == StepStatus.FAILED for s in steps))
            else "success"
        )
    err_type, err_msg = _exception(head) if status == "failed" else (None, None)
    started = min(s.start_ns for s in spans) / 1e9 if root is None else head.start_ns / 1e9
    ended = max(s.end_ns for s in spans) / 1e9 if root is None else head.end_ns / 1e9
    chain_input = _json_value(ra.get("input.value"), ra.get("input.mime_type"))
    config: dict[str, Any] = {"source": "otlp"}
    service = head.resource.get("service.name")
    if service:
        config["service.name"] = service
    if ra.get("rewind.chain_ref"):
        config["chain_ref"] = ra["rewind.chain_ref"]
    parent_run = ra.get("rewind.parent_run_id")
    if parent_run and (store is None or not trace_exists(store, str(parent_run))):
        parent_run = None
    override = _json_value(ra.get("rewind.override"), JSON) if ra.get("rewind.override") else None
    return TraceData(
        trace_id=trace_id,
        name=str(ra.get("rewind.name") or head.name)[:200],
        status=status,
        input=as_fields(chain_input) if chain_input is not None else {},
        output=jsonable(_json_value(ra.get("output.value"), ra.get("output.mime_type"))),
        error_type=err_type,
        error_message=err_msg,
        span_id=head.span_id if root is not None else _derived(f"{trace_id}:root", 16),
        started_at=started,
        ended_at=ended,
        duration_ms=_number(ra, "rewind.duration_ms", (ended - started) * 1000.0),
        attributes=_extra(ra, root_span=True),
        config=config,
        parent_run_id=str(parent_run) if parent_run else None,
        fork_node=steps[0].name if parent_run and steps else None,
        fork_position=0 if parent_run else None,
        override=jsonable(override) if isinstance(override, dict) else None,
        steps=steps,
    )


def _json_value(value: Any, mime: Any) -> Any:
    """A string attribute holding JSON, decoded; kept as the string when it is not JSON, holds
    NaN/Infinity, or nests deeper than MAX_OTLP_DEPTH (the string is the faithful record)."""
    if not isinstance(value, str):
        return value
    if mime == JSON or (mime is None and value[:1] in ("{", "[", '"')):
        try:
            decoded = json.loads(value, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return value
        return value if _deeper_than(decoded, MAX_OTLP_DEPTH) else decoded
    return value


def _fields_of(value: Any) -> dict[str, Any]:
    """A node document's ``inputs``/``reads``/``params``: a dict as plain JSON (NaN tagged, as
    :func:`jsonable` does), nothing as ``{}``, anything else wrapped by :func:`as_fields`."""
    if value is None:
        return {}
    return as_fields(value)


def _exception(span: _Span) -> tuple[str | None, str | None]:
    for e in span.events:
        if e.get("name") == "exception":
            a = e.get("attributes") or {}
            return str(a.get("exception.type") or "Error"), str(a.get("exception.message") or "")
    error_type = span.attributes.get("error.type")
    message = span.status_message
    if message and re.match(r"^[A-Za-z_][\w.]*: ", message):
        t, _, m = message.partition(": ")
        return str(error_type or t), m
    return str(error_type or "Error"), message


def _foreign_type(a: Mapping[str, Any]) -> str:
    kind = str(a.get("openinference.span.kind") or "").upper()
    op = str(a.get("gen_ai.operation.name") or "").lower()
    if kind == "LLM" or op in ("chat", "text_completion", "completion", "generate_content"):
        return "llm_call"
    if kind in ("RETRIEVER", "RERANKER") or op == "retrieval":
        return "retrieval"
    if kind == "TOOL" or op == "execute_tool":
        return "tool_call"
    if kind in ("GUARDRAIL", "EVALUATOR"):
        return "validate"
    if a.get("gen_ai.request.model") or a.get("llm.model_name"):
        return "llm_call"
    return "transform"


def _flattened(a: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.0.message.role`` / ``prefix.0.role`` style attributes as a list of dicts."""
    return indexed_attributes(a, prefix, strip=("message.", "document."))


def _foreign_io(a: Mapping[str, Any], step_type: str) -> tuple[Any, Any]:
    inp = _json_value(a.get("input.value"), a.get("input.mime_type"))
    out = _json_value(a.get("output.value"), a.get("output.mime_type"))
    if inp is None:
        for key in ("gen_ai.input.messages", "gen_ai.prompt"):
            if isinstance(a.get(key), str):
                inp = {"messages": _json_value(a[key], JSON)}
                break
        else:
            msgs = _flattened(a, "llm.input_messages") or _flattened(a, "gen_ai.prompt")
            if msgs:
                inp = {"messages": msgs}
    if out is None:
        for key in ("gen_ai.output.messages", "gen_ai.completion"):
            if isinstance(a.get(key), str):
                out = _message_content(_json_value(a[key], JSON))
                break
        else:
            msgs = _flattened(a, "llm.output_messages") or _flattened(a, "gen_ai.completion")
            if msgs:
                out = _message_content(msgs)
            elif step_type == "retrieval":
                docs = _flattened(a, "retrieval.documents")
                if docs:
                    out = docs
    return inp, out


def _message_content(messages: Any) -> Any:
    if isinstance(messages, list) and messages and isinstance(messages[0], Mapping):
        first = messages[0]
        if isinstance(first.get("content"), str):
            return first["content"]
        parts = first.get("parts")
        if isinstance(parts, list):
            return "".join(str(p.get("content", "")) for p in parts if isinstance(p, Mapping))
    return messages


_BULKY = re.compile(
    r"^(input\.value|output\.value|input\.mime_type|output\.mime_type|llm\.input_messages\..*|"
    r"llm\.output_messages\..*|gen_ai\.input\.messages|gen_ai\.output\.messages|"
    r"gen_ai\.prompt.*|gen_ai\.completion.*|retrieval\.documents\..*|rewind\..*)$"
)


def _extra(a: Mapping[str, Any], *, root_span: bool = False) -> dict[str, Any]:
    if "rewind.attributes" in a:
        value = _json_value(a["rewind.attributes"], JSON)
        return value if isinstance(value, dict) else {}
    if root_span and "rewind.kind" in a:
        return {}
    return jsonable({k: v for k, v in a.items() if not _BULKY.match(k)})


def _first_int(a: Mapping[str, Any], *keys: str) -> int:
    """The first of ``keys`` holding a count (a finite number in 0..2**63-1), else 0."""
    for k in keys:
        v = a.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < _INT64:
            return int(v)
    return 0


def _number(a: Mapping[str, Any], key: str, default: float) -> float:
    """``a[key]`` when it is a finite, non-negative number (a duration in ms), else ``default``."""
    v = a.get(key)
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf:
        return float(v)
    return float(default)


def _step(position: int, s: _Span, parent_position: int) -> StepData:
    a = s.attributes
    start, end = s.start_ns / 1e9, s.end_ns / 1e9
    duration = _number(a, "rewind.duration_ms", max(0.0, (s.end_ns - s.start_ns) / 1e6))
    if "rewind.node" in a:  # exported by Rewind: rebuild the exact node documents
        doc = _json_value(a.get("input.value"), JSON)
        doc = doc if isinstance(doc, dict) else {}
        inputs, reads, params = (_fields_of(doc.get(k)) for k in ("inputs", "reads", "params"))
        fields = _json_value(a.get("output.value"), JSON) if "output.value" in a else None
        status = str(a.get("rewind.step.status") or "success")
        step_type = str(a.get("rewind.step.type") or "transform")
        if step_type not in STEP_TYPES:
            step_type = "transform"
        err = _exception(s) if status == StepStatus.FAILED else (None, None)
        calls, pending = exported_calls(a.get("rewind.calls"))
        return StepData(
            position=position,
            name=str(a["rewind.node"])[:200],
            step_type=step_type,
            status=status if status in STEP_STATUSES else "success",
            inputs=inputs,
            reads=reads,
            params=params,
            fields=jsonable(fields) if isinstance(fields, dict) else None,
            error_type=err[0],
            error_message=err[1],
            parent_position=parent_position,
            span_id=s.span_id,
            started_at=start,
            ended_at=end,
            duration_ms=duration,
            prompt_tokens=_first_int(a, "gen_ai.usage.input_tokens"),
            completion_tokens=_first_int(a, "gen_ai.usage.output_tokens"),
            attributes=_extra(a) if "rewind.attributes" in a else {},
            calls=calls,
            pending=pending,
            cache_outcome=str(a.get("rewind.cache.outcome") or "none"),
            cache_reason=str(a.get("rewind.cache.reason") or "imported"),
            effects=effects_from_attribute(a.get(EFFECTS_ATTRIBUTE)),
            determinism=str(a.get("rewind.determinism") or "") or None,
        )
    step_type = _foreign_type(a)
    failed = s.status_code == 2
    inp, out = _foreign_io(a, step_type)
    attributes = _extra(a)
    model = (
        a.get("gen_ai.request.model") or a.get("gen_ai.response.model") or a.get("llm.model_name")
    )
    if model:
        attributes["model"] = str(model)
    finish = a.get("gen_ai.response.finish_reasons") or a.get("llm.finish_reason")
    if isinstance(finish, list) and finish:
        attributes["finish_reason"] = str(finish[0])
    elif isinstance(finish, str):
        attributes["finish_reason"] = finish
    if step_type == "retrieval" and isinstance(out, list):
        scores = [d.get("score") for d in out if isinstance(d, Mapping)]
        if scores and all(isinstance(x, int | float) for x in scores):
            attributes["scores"] = scores
    err = _exception(s) if failed else (None, None)
    name = str(a.get("gen_ai.tool.name") or s.name) if step_type == "tool_call" else s.name
    recorded = [] if failed else calls_of_span(a, s.events, step_type)
    problems = [p for c in recorded for p in c.problems]
    if problems:
        attributes["replayable"] = False
        attributes["not_replayable"] = "; ".join(problems)
    providers = [c.provider for c in recorded if c.provider]
    if providers:
        attributes["provider"] = providers[0]
    calls, pending = entries_of(recorded, start)
    return StepData(
        position=position,
        name=name[:200],
        step_type=step_type,
        status="failed" if failed else "success",
        inputs=as_fields(inp) if inp is not None else {},
        fields=None if failed else {name[:200]: jsonable(out)},
        error_type=err[0],
        error_message=err[1],
        parent_position=parent_position,
        span_id=s.span_id,
        started_at=start,
        ended_at=end,
        duration_ms=duration,
        prompt_tokens=_first_int(
            a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"
        ),
        completion_tokens=_first_int(
            a,
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.completion_tokens",
            "llm.token_count.completion",
        ),
        attributes=attributes,
        calls=calls,
        pending=pending,
        cache_outcome="none",
        cache_reason="imported",
    )


# -- the OTLP/HTTP receiver --------------------------------------------------------------------


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
        ready: list[list[_Span]] = []
        rejected = sum(r.spans for r in rejections)
        errors = [str(r) for r in rejections]
        with self._lock:
            for tid in [t for t, (at, _) in self._waiting.items() if now - at > self.max_age_s]:
                rejected += len(self._take(tid))
                errors.append(f"trace {tid}: its root span never arrived")
            # A trace is imported whole or not at all: a rejected span spoils its trace, for
            # the spans already waiting and for those still to come (remembered max_age_s).
            while self._spoiled and now - next(iter(self._spoiled.values())) > self.max_age_s:
                del self._spoiled[next(iter(self._spoiled))]
            for r in rejections:
                if r.trace_id:
                    self._spoiled.pop(r.trace_id, None)
                    self._spoiled[r.trace_id] = now
            while len(self._spoiled) > self.max_spans:
                del self._spoiled[next(iter(self._spoiled))]
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
                rejected += n
                errors.append(str(_whole_trace(tid, n)))
            for tid in sorted({s.trace_id for s in spans} & self._waiting.keys()):
                group = self._waiting[tid][1]
                # A parent cycle never resolves by waiting: import (and break) it now.
                if any(s.parent_id is None for s in group) or _has_cycle(group):
                    ready.append(self._take(tid))
            waiting = sum(len(g) for _, g in self._waiting.values())
            held = sum(self._waiting_bytes.values())
            while (waiting > self.max_spans or held > self.max_bytes) and self._waiting:
                tid = next(iter(self._waiting))
                held -= self._waiting_bytes.get(tid, 0)
                dropped = len(self._take(tid))
                waiting -= dropped
                rejected += dropped
                errors.append(f"trace {tid}: dropped, too many spans waiting for their root")
        imported: list[str] = []
        notes: list[str] = []
        for group in ready:
            with self._import_lock:  # two requests must not both write one trace
                result = import_otlp(self.store, spans=group)
            imported.extend(result.imported)
            rejected += result.rejected
            errors.extend(result.errors)
            notes.extend(result.notes)
            for tid in result.skipped:  # new spans of a stored trace are already counted
                counted = sum(r.spans for r in result.rejections if r.trace_id == tid)
                rejected += len([s for s in group if s.trace_id == tid]) - counted
                if not counted:
                    errors.append(f"trace {tid} is already stored")
        response: dict[str, Any] = {}
        if rejected or notes:
            response["partialSuccess"] = {
                "rejectedSpans": rejected,
                "errorMessage": "; ".join(errors + notes)[:4000],
            }
        self.last_imported = imported
        return response

    @property
    def waiting(self) -> int:
        """Spans waiting for their trace's root span."""
        with self._lock:
            return sum(len(g) for _, g in self._waiting.values())
