"""Regenerate the third-party OTLP/JSON trace fixtures of this folder (see README.md).

Runs the real ``openai`` SDK, instrumented by one third-party instrumentation library, against
the loopback OpenAI-compatible stub of ``tests/model_stub.py``, and writes the spans the
library produced as one OTLP/JSON ``ExportTraceServiceRequest`` (the SDK's own protobuf encoder,
then protobuf's JSON mapping). Each library needs its own virtualenv::

    python -m venv /tmp/gen && /tmp/gen/bin/pip install openai opentelemetry-sdk \\
        opentelemetry-exporter-otlp-proto-common opentelemetry-instrumentation-openai-v2
    /tmp/gen/bin/python tests/data/otel/generate.py genai tests/data/otel/genai_openai_v2.json

``CONVENTION`` is ``genai`` (opentelemetry-instrumentation-openai-v2),
``openinference`` (openinference-instrumentation-openai) or ``openllmetry``
(opentelemetry-instrumentation-openai from Traceloop's OpenLLMetry).

The chain is two chat calls under one root span the script opens itself (the instrumentations
trace calls, not chains): ``draft`` answers the question, ``polish`` is sent the draft. The root
span carries the chain's input as OpenInference's ``input.value`` (a CHAIN span).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

QUESTION = "Which month is the wettest in Seattle?"


def _instrument(convention: str) -> None:
    if convention == "genai":
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif convention == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif convention == "openllmetry":
        os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    else:
        raise SystemExit(f"unknown convention {convention!r}: genai, openinference, openllmetry")


def main(convention: str, out: str) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from tests.model_stub import ModelStub

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"qa-{convention}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _instrument(convention)
    import openai

    tracer = trace.get_tracer("fixture-chain")
    with ModelStub() as stub:
        client = openai.OpenAI(base_url=stub.base_url, api_key="sk-fixture")
        root_attributes = {
            "openinference.span.kind": "CHAIN",
            "input.value": json.dumps({"question": QUESTION}),
            "input.mime_type": "application/json",
        }
        with tracer.start_as_current_span("qa", attributes=root_attributes) as root:
            draft = client.chat.completions.create(
                model="stub-model",
                messages=[
                    {"role": "system", "content": "Answer in one sentence."},
                    {"role": "user", "content": QUESTION},
                ],
                temperature=0,
                max_tokens=64,
            )
            text = draft.choices[0].message.content or ""
            polished = client.chat.completions.create(
                model="stub-model",
                messages=[{"role": "user", "content": f"Polish: {text}"}],
                temperature=0,
                max_tokens=64,
            )
            answer = polished.choices[0].message.content or ""
            root.set_attribute("output.value", answer)
    provider.force_flush()
    request = encode_spans(exporter.get_finished_spans())
    doc = MessageToDict(request)
    Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: generate.py CONVENTION OUT.json")
    main(sys.argv[1], sys.argv[2])
