"""OpenTelemetry export: runs and traces as real SDK spans, handed to any ``SpanExporter``
(OTLP/HTTP, :class:`OtlpJsonFileExporter`, in-memory); see :mod:`rewind.tracing.otel`."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

import rewind
from rewind.errors import RewindError
from rewind.store import Store
from rewind.tracing.model import (
    ROOT_POSITION,
    StepStatus,
    StepView,
    TraceView,
)
from rewind.tracing.otel_calls import (
    exported_calls_attribute,
)
from rewind.tracing.otel_effects import (
    EFFECTS_ATTRIBUTE,
    effects_attribute,
)
from rewind.tracing.store import load_traces

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
