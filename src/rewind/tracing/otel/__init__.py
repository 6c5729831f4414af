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

from rewind.tracing.otel.export import (
    OtlpJsonFileExporter,
    export_runs,
    export_to_file,
    spans_to_otlp_json,
)
from rewind.tracing.otel.importer import ImportResult, import_otlp
from rewind.tracing.otel.otlp_json import (
    MAX_OTLP_BYTES,
    MAX_OTLP_DEPTH,
    InvalidOtlp,
    OtlpTooLarge,
    SpanRejection,
    load_otlp_json,
    parse_otlp,
    read_otlp_file,
)
from rewind.tracing.otel.receiver import OtlpReceiver

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
