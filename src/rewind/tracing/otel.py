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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

import rewind
from rewind.errors import RewindError, StoreError
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
from rewind.tracing.otel_effects import (
    EFFECTS_ATTRIBUTE,
    effects_attribute,
    effects_from_attribute,
)
from rewind.tracing.store import load_traces, trace_exists, write_trace

__all__ = [
    "ImportResult",
    "OtlpJsonFileExporter",
    "OtlpReceiver",
    "export_runs",
    "export_to_file",
    "import_otlp",
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
    out = [_emit(tracer, gen, view) for view in views]
    provider.force_flush()
    if collect.spans:
        result = exporter.export(collect.spans)
        if result is not SpanExportResult.SUCCESS:
            raise RewindError(
                f"the span exporter failed ({type(exporter).__name__}: {result.name})",
                "check the OTLP endpoint (is it reachable, does it accept /v1/traces?)",
            )
    return out


def _emit(tracer: Any, gen: _RecordedIds, view: TraceView) -> str:
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
            attributes=_step_attributes(view, s),
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


def _step_attributes(view: TraceView, s: StepView) -> dict[str, Any]:
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


@dataclass
class ImportResult:
    """What an import did: trace ids imported, skipped (already stored), spans read, and
    spans rejected (with why)."""

    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    spans: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON object of the result."""
        return {
            "imported": self.imported,
            "skipped": self.skipped,
            "spans": self.spans,
            "rejected": self.rejected,
            "errors": self.errors,
        }


def read_otlp_file(path: str | Path) -> list[dict[str, Any]]:
    """The request objects of an OTLP/JSON file (one JSON object, or one per line).

    Raises:
        RewindError: the file cannot be read or is not OTLP/JSON.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RewindError(f"cannot read {p}: {exc}", "pass an OTLP/JSON trace file") from exc
    text = text.strip()
    if not text:
        raise RewindError(f"{p} is empty", "pass an OTLP/JSON trace file")
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RewindError(
                    f"{p} line {n} is not JSON: {exc.msg}",
                    "pass an OTLP/JSON file (one ExportTraceServiceRequest, or one per line)",
                ) from exc
    for d in docs:
        if not isinstance(d, dict) or ("resourceSpans" not in d and "resource_spans" not in d):
            raise RewindError(
                f"{p} is not OTLP/JSON: no resourceSpans",
                "export traces with an OTLP/JSON file exporter",
            )
    return docs


def parse_otlp(docs: Iterable[Mapping[str, Any]]) -> list[_Span]:
    """The spans of OTLP/JSON request objects (camelCase or snake_case field names).

    Raises:
        ValueError: a malformed id or field (the message names it).
    """
    spans = []
    for doc in docs:
        for rs in _get(doc, "resourceSpans") or []:
            resource = _attrs(_get(_get(rs, "resource") or {}, "attributes") or [])
            for ss in _get(rs, "scopeSpans") or _get(rs, "instrumentationLibrarySpans") or []:
                for sp in _get(ss, "spans") or []:
                    status = _get(sp, "status") or {}
                    code = _get(status, "code", 0)
                    if isinstance(code, str):
                        code = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, 0)
                    parent = _get(sp, "parentSpanId")
                    spans.append(
                        _Span(
                            trace_id=_hex_id(_get(sp, "traceId"), 16, "traceId"),
                            span_id=_hex_id(_get(sp, "spanId"), 8, "spanId"),
                            parent_id=_hex_id(parent, 8, "parentSpanId") if parent else None,
                            name=str(_get(sp, "name") or "span"),
                            start_ns=int(_get(sp, "startTimeUnixNano") or 0),
                            end_ns=int(_get(sp, "endTimeUnixNano") or 0),
                            attributes=_attrs(_get(sp, "attributes") or []),
                            status_code=int(code or 0),
                            status_message=str(_get(status, "message") or ""),
                            events=[
                                {
                                    "name": _get(e, "name"),
                                    "attributes": _attrs(_get(e, "attributes") or []),
                                }
                                for e in _get(sp, "events") or []
                            ],
                            resource=resource,
                        )
                    )
    return spans


def _get(obj: Mapping[str, Any], camel: str, default: Any = None) -> Any:
    if camel in obj:
        return obj[camel]
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
    return obj.get(snake, default)


def _hex_id(value: Any, nbytes: int, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} is missing")
    if re.fullmatch(rf"[0-9a-fA-F]{{{nbytes * 2}}}", value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{name} {value!r} is neither hex nor base64") from exc
    if len(raw) != nbytes:
        raise ValueError(f"{name} {value!r} is not {nbytes} bytes")
    return raw.hex()


def _any(value: Mapping[str, Any]) -> Any:
    if not isinstance(value, Mapping):
        return value
    for key in ("stringValue", "string_value"):
        if key in value:
            return value[key]
    for key in ("boolValue", "bool_value"):
        if key in value:
            return bool(value[key])
    for key in ("intValue", "int_value"):
        if key in value:
            return int(value[key])
    for key in ("doubleValue", "double_value"):
        if key in value:
            return float(value[key])
    for key in ("arrayValue", "array_value"):
        if key in value:
            return [_any(v) for v in (value[key] or {}).get("values", [])]
    for key in ("kvlistValue", "kvlist_value"):
        if key in value:
            return _attrs((value[key] or {}).get("values", []))
    for key in ("bytesValue", "bytes_value"):
        if key in value:
            return value[key]
    return None


def _attrs(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {str(kv.get("key")): _any(kv.get("value") or {}) for kv in items if "key" in kv}


def import_otlp(
    store: Store,
    docs: Iterable[Mapping[str, Any]] | None = None,
    *,
    spans: list[_Span] | None = None,
) -> ImportResult:
    """Import OTLP/JSON request objects (or already parsed spans) into the store.

    Raises:
        RewindError: malformed OTLP (the message names the field).
    """
    if spans is None:
        try:
            spans = parse_otlp(docs or [])
        except (ValueError, TypeError, AttributeError) as exc:
            raise RewindError(f"malformed OTLP trace data: {exc}", "") from exc
    result = ImportResult(spans=len(spans))
    by_trace: dict[str, list[_Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    # Oldest first, so a replay imported with its parent can point at it.
    ordered = sorted(by_trace.items(), key=lambda kv: min(s.start_ns for s in kv[1]))
    for trace_id, group in ordered:
        if trace_exists(store, trace_id):
            result.skipped.append(trace_id)
            continue
        try:
            write_trace(store, trace_from_spans(store, trace_id, group))
        except StoreError as exc:
            result.errors.append(f"{trace_id}: {exc.message}")
            result.rejected += len(group)
            continue
        result.imported.append(trace_id)
    return result


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
    """Build the trace of one trace id's spans (see the module doc for the mapping)."""
    ids = {s.span_id for s in spans}
    roots = _by_start([s for s in spans if s.parent_id is None or s.parent_id not in ids])
    children: dict[str, list[_Span]] = {}
    for s in spans:
        if s.parent_id in ids:
            children.setdefault(s.parent_id, []).append(s)
    root: _Span | None = roots[0] if len(roots) == 1 else None
    ordered: list[tuple[_Span, str | None]] = []

    def walk(node: _Span, parent: str | None) -> None:
        ordered.append((node, parent))
        for c in _by_start(children.get(node.span_id, [])):
            walk(c, node.span_id)

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
    if status not in STEP_STATUSES:
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
        duration_ms=float(ra.get("rewind.duration_ms") or (ended - started) * 1000.0),
        attributes=_extra(ra, root_span=True),
        config=config,
        parent_run_id=str(parent_run) if parent_run else None,
        fork_node=steps[0].name if parent_run and steps else None,
        fork_position=0 if parent_run else None,
        override=override if isinstance(override, dict) else None,
        steps=steps,
    )


def _json_value(value: Any, mime: Any) -> Any:
    if not isinstance(value, str):
        return value
    if mime == JSON or (mime is None and value[:1] in ("{", "[", '"')):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


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
    items: dict[int, dict[str, Any]] = {}
    pat = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.(?:message\.|document\.)?(.+)$")
    for k, v in a.items():
        m = pat.match(k)
        if m:
            items.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return [items[i] for i in sorted(items)]


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
    for k in keys:
        v = a.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return int(v)
    return 0


def _step(position: int, s: _Span, parent_position: int) -> StepData:
    a = s.attributes
    start, end = s.start_ns / 1e9, s.end_ns / 1e9
    duration = float(a.get("rewind.duration_ms") or max(0.0, (s.end_ns - s.start_ns) / 1e6))
    if "rewind.node" in a:  # exported by Rewind: rebuild the exact node documents
        doc = _json_value(a.get("input.value"), JSON)
        doc = doc if isinstance(doc, dict) else {}
        fields = _json_value(a.get("output.value"), JSON) if "output.value" in a else None
        status = str(a.get("rewind.step.status") or "success")
        step_type = str(a.get("rewind.step.type") or "transform")
        if step_type not in STEP_TYPES:
            step_type = "transform"
        err = _exception(s) if status == StepStatus.FAILED else (None, None)
        return StepData(
            position=position,
            name=str(a["rewind.node"])[:200],
            step_type=step_type,
            status=status if status in STEP_STATUSES else "success",
            inputs=doc.get("inputs") or {},
            reads=doc.get("reads") or {},
            params=doc.get("params") or {},
            fields=fields if isinstance(fields, dict) else None,
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
            cache_outcome=str(a.get("rewind.cache.outcome") or "none"),
            cache_reason=str(a.get("rewind.cache.reason") or "imported"),
            effects=effects_from_attribute(a.get(EFFECTS_ATTRIBUTE)),
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
        cache_outcome="none",
        cache_reason="imported",
    )


# -- the OTLP/HTTP receiver --------------------------------------------------------------------


class OtlpReceiver:
    """Accepts OTLP/HTTP export requests (JSON or protobuf) for the trace service.

    Exporters send spans in batches as they end, so a trace's children usually arrive before
    its root. Spans of a trace whose root (a span without a parent) has not arrived yet wait in
    memory (at most ``max_spans`` spans, ``max_age_s`` seconds); when the root arrives the whole
    trace is imported. Spans arriving for a trace already stored are rejected (reported in the
    response's ``partialSuccess``).
    """

    def __init__(self, store: Store, *, max_spans: int = 50_000, max_age_s: float = 600.0) -> None:
        self.store = store
        self.max_spans = max_spans
        self.max_age_s = max_age_s
        self._waiting: dict[str, tuple[float, list[_Span]]] = {}
        self._lock = threading.Lock()
        self.last_imported: list[str] = []

    def receive_json(self, body: bytes) -> dict[str, Any]:
        """Handle an OTLP/JSON body.

        Raises:
            RewindError: not JSON or not OTLP.
        """
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RewindError(f"the body is not JSON: {exc}", "send OTLP/JSON") from exc
        if not isinstance(doc, dict):
            raise RewindError("the body is not an ExportTraceServiceRequest", "send OTLP/JSON")
        return self._receive([doc])

    def receive_protobuf(self, body: bytes) -> dict[str, Any]:
        """Handle an OTLP protobuf body.

        Raises:
            RewindError: the bytes are not an ExportTraceServiceRequest.
        """
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        try:
            message = ExportTraceServiceRequest.FromString(body)
        except DecodeError as exc:
            raise RewindError(f"the body is not OTLP protobuf: {exc}", "") from exc
        return self._receive([MessageToDict(message, use_integers_for_enums=True)])

    def _receive(self, docs: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            spans = parse_otlp(docs)
        except (ValueError, TypeError, AttributeError) as exc:
            raise RewindError(f"malformed OTLP trace data: {exc}", "") from exc
        now = time.monotonic()
        ready: list[list[_Span]] = []
        rejected, errors = 0, []
        with self._lock:
            for tid in [t for t, (at, _) in self._waiting.items() if now - at > self.max_age_s]:
                rejected += len(self._waiting.pop(tid)[1])
                errors.append(f"trace {tid}: its root span never arrived")
            for s in spans:
                self._waiting.setdefault(s.trace_id, (now, []))[1].append(s)
            for tid in {s.trace_id for s in spans}:
                if any(s.parent_id is None for s in self._waiting[tid][1]):
                    ready.append(self._waiting.pop(tid)[1])
            waiting = sum(len(g) for _, g in self._waiting.values())
            while waiting > self.max_spans and self._waiting:
                tid = next(iter(self._waiting))
                dropped = len(self._waiting.pop(tid)[1])
                waiting -= dropped
                rejected += dropped
                errors.append(f"trace {tid}: dropped, too many spans waiting for their root")
        imported: list[str] = []
        for group in ready:
            result = import_otlp(self.store, spans=group)
            imported.extend(result.imported)
            rejected += result.rejected
            errors.extend(result.errors)
            for tid in result.skipped:
                rejected += len([s for s in group if s.trace_id == tid])
                errors.append(f"trace {tid} is already stored")
        response: dict[str, Any] = {}
        if rejected:
            response["partialSuccess"] = {
                "rejectedSpans": rejected,
                "errorMessage": "; ".join(errors)[:1000],
            }
        self.last_imported = imported
        return response

    @property
    def waiting(self) -> int:
        """Spans waiting for their trace's root span."""
        with self._lock:
            return sum(len(g) for _, g in self._waiting.values())
