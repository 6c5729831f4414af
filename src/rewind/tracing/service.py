"""The trace service: HTTP routes over the same store as the UI's API (a FastAPI ``APIRouter``).

Include it in the app with ``app.include_router(trace_router(store))``. Routes (all under
``/api``, so the app's bearer token and host checks apply; tag ``traces`` in the OpenAPI spec):

- ``GET  /api/tracing/health`` — the store answers; counts of traces and runs.
- ``POST /api/traces`` — store a trace document (validated: 422 naming the bad field).
- ``GET  /api/traces`` — search by name, status, start-time range, kind; ``limit``/``offset``.
- ``GET  /api/traces/failures`` — failure patterns over the traces matching the filters;
  ``POST`` the same path with ``{"trace_ids": [...]}`` for an explicit set.
- ``GET  /api/traces/{id}`` — one trace (or Burr run read as a trace) with every step.
- ``GET  /api/traces/{id}/inspect?step=NAME`` — findings per step.
- ``GET  /api/traces/{id}/root-cause`` — why it failed.
- ``GET  /api/traces/{id}/compare/{other}`` — step-by-step comparison with similarities.
- ``POST /api/otlp/v1/traces`` — an OTLP/HTTP trace receiver (JSON or protobuf): point an
  exporter's endpoint at ``http://HOST/api/otlp``.

Errors use the app's JSON error shape (404 unknown trace or step, 409 a trace id already stored,
422 invalid request; for OTLP: 400 a body that is not OTLP JSON/protobuf or nests too deeply,
413 a body above ``MAX_OTLP_BYTES``, 415 a content type that is neither JSON nor protobuf).
"""

from __future__ import annotations

import math
import time
import zlib
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from rewind.api import models as m
from rewind.api.models import typed
from rewind.api.schemas import SERVER_ERRORS, error_responses
from rewind.canonical import CanonicalError, canonical_bytes
from rewind.errors import InvalidOverride, UnknownNode, UnknownRun
from rewind.store import Store
from rewind.tracing.correlation import correlate_failures
from rewind.tracing.failures import analyze_failures
from rewind.tracing.inspect import InspectionSettings, compare_traces, inspect_trace
from rewind.tracing.model import (
    StepData,
    StepStatus,
    StepType,
    TraceData,
    as_fields,
    jsonable,
)
from rewind.tracing.otel import MAX_OTLP_BYTES, OtlpReceiver
from rewind.tracing.recorded import ended_as_recorded
from rewind.tracing.replay import ReplaySwitches, replay_trace
from rewind.tracing.rootcause import root_cause
from rewind.tracing.store import (
    count_traces,
    load_trace,
    load_traces,
    parse_time,
    search_runs,
    trace_exists,
    write_trace,
)
from rewind.tracing.tracer import StoppedAtDivergence, new_span_id, new_trace_id

__all__ = ["ErrorIn", "FailuresRequest", "StepIn", "TraceIn", "trace_data_of", "trace_router"]

HexTraceId = Annotated[
    str, Field(pattern=r"^[0-9a-fA-F]{32}$", description="32 hex characters (OTel trace id)")
]
HexSpanId = Annotated[
    str, Field(pattern=r"^[0-9a-fA-F]{16}$", description="16 hex characters (OTel span id)")
]
When = Annotated[
    datetime | float | None,
    Field(description="ISO 8601 date-time or unix seconds"),
]
MAX_STEPS = 10_000
MAX_TOKENS = 2**63 - 1
"""The largest token count a step may carry: the store keeps counts as 64-bit integers."""
LATEST_UNIX_S = 253_402_300_799.0
"""9999-12-31T23:59:59Z, the last instant a ``datetime`` (and so every reader) can show."""


class ErrorIn(BaseModel):
    """An exception: its type and message."""

    model_config = ConfigDict(extra="forbid")
    type: str = Field("Error", min_length=1, max_length=200)
    message: str = Field("", max_length=20_000)


class StepIn(BaseModel):
    """One step of a trace document. Steps are listed in execution order; a nested step names
    its parent by ``parent_span_id`` (a step listed before it)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    type: StepType = StepType.TRANSFORM
    status: StepStatus = StepStatus.SUCCESS
    span_id: HexSpanId | None = None
    parent_span_id: HexSpanId | None = None
    input: Any = Field(None, description="the step's input (any JSON)")
    output: Any = Field(None, description="the step's output (any JSON)")
    error: ErrorIn | None = None
    start_time: When = None
    end_time: When = None
    duration_ms: float | None = Field(None, ge=0)
    prompt_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    completion_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    model: str | None = Field(None, max_length=200)
    finish_reason: str | None = Field(None, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)
    attributes: dict[str, Any] = Field(default_factory=dict)


class TraceIn(BaseModel):
    """A trace to store: the chain's name, input, output, status and its steps."""

    model_config = ConfigDict(extra="forbid")
    trace_id: HexTraceId | None = Field(None, description="default: a new id")
    name: str = Field(min_length=1, max_length=200, description="the chain's name")
    status: StepStatus | None = Field(
        None, description="default: failed when error is set, else success"
    )
    input: Any = None
    output: Any = None
    error: ErrorIn | None = None
    start_time: When = None
    end_time: When = None
    duration_ms: float | None = Field(None, ge=0)
    attributes: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepIn] = Field(default_factory=list, max_length=MAX_STEPS)

    @model_validator(mode="after")
    def _check(self) -> TraceIn:
        seen: set[str] = set()
        for i, s in enumerate(self.steps):
            if s.parent_span_id is not None and s.parent_span_id.lower() not in seen:
                raise ValueError(
                    f"steps[{i}].parent_span_id {s.parent_span_id} names no step listed before it"
                )
            if s.span_id is not None:
                if s.span_id.lower() in seen:
                    raise ValueError(f"steps[{i}].span_id {s.span_id} is used twice")
                seen.add(s.span_id.lower())
            for field_name in ("input", "output", "params", "attributes"):
                _hashable(getattr(s, field_name), f"steps[{i}].{field_name}")
        _check_times(self, "")
        for i, s in enumerate(self.steps):
            _check_times(s, f"steps[{i}].")
        for field_name in ("input", "output", "attributes"):
            _hashable(getattr(self, field_name), field_name)
        return self


def _check_times(doc: TraceIn | StepIn, where: str) -> None:
    """Times are finite, within 1970..9999, and an end is not before its start."""
    start, end = (
        v.timestamp() if isinstance(v, datetime) else v for v in (doc.start_time, doc.end_time)
    )
    for name, t in (("start_time", start), ("end_time", end)):
        if t is not None and not 0.0 <= t <= LATEST_UNIX_S:
            raise ValueError(f"{where}{name} {t} is not a time between 1970 and 9999")
    if start is not None and end is not None and end < start:
        raise ValueError(f"{where}end_time is before {where}start_time")


def _hashable(value: Any, where: str) -> None:
    try:
        canonical_bytes(value)
    except (CanonicalError, ValueError) as exc:
        reason = str(exc)
        reason = reason if len(reason) <= 200 else reason[:197] + "..."  # paths can be long
        raise ValueError(f"{where} cannot be hashed: {reason}") from exc


def _seconds(value: datetime | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if not math.isfinite(value):
        raise InvalidOverride("a time is not a finite number", "send unix seconds or ISO 8601")
    return float(value)


def trace_data_of(doc: TraceIn, *, now: float | None = None) -> TraceData:
    """The trace a validated document describes (ids generated where missing)."""
    started = _seconds(doc.start_time) or (now if now is not None else time.time())
    ended = _seconds(doc.end_time)
    if ended is None and doc.duration_ms is not None:
        ended = started + doc.duration_ms / 1000.0
    steps: list[StepData] = []
    span_ids: dict[str, int] = {}
    for i, s in enumerate(doc.steps):
        span_id = (s.span_id or new_span_id()).lower()
        span_ids[span_id] = i
        parent = span_ids[s.parent_span_id.lower()] if s.parent_span_id else -1
        steps.append(_step_data_of(s, i, span_id, parent, started))
    if ended is None:
        ends = [s.ended_at for s in steps if s.ended_at is not None]
        ended = max(ends) if ends else started
    status = doc.status.value if doc.status else ("failed" if doc.error else "success")
    err_type, err_msg = _error_of(doc.error, "ChainFailed", status == StepStatus.FAILED)
    return TraceData(
        trace_id=(doc.trace_id or new_trace_id()).lower(),
        name=doc.name,
        status=status,
        input=as_fields(doc.input) if doc.input is not None else {},
        output=jsonable(doc.output),
        error_type=err_type,
        error_message=err_msg,
        span_id=new_span_id(),
        started_at=started,
        ended_at=ended,
        duration_ms=doc.duration_ms if doc.duration_ms is not None else (ended - started) * 1000.0,
        attributes=jsonable(doc.attributes),
        config={"source": "api"},
        steps=steps,
    )


def _error_of(
    error: ErrorIn | None, default_type: str, failed: bool
) -> tuple[str | None, str | None]:
    """(error type, message) of a failed trace or step (``default_type`` when it names none);
    (None, None) unless ``failed``."""
    if not failed:
        return None, None
    return (error.type, error.message) if error else (default_type, "")


def _step_data_of(
    s: StepIn, position: int, span_id: str, parent_position: int, trace_started: float
) -> StepData:
    """One posted step as stored (its start defaults to the trace's; its end to start plus
    its duration)."""
    s_start = _seconds(s.start_time) or trace_started
    s_end = _seconds(s.end_time)
    if s.duration_ms is not None:
        duration = s.duration_ms
    else:
        duration = (s_end - s_start) * 1000.0 if s_end is not None else 0.0
    if s_end is None:
        s_end = s_start + duration / 1000.0
    attributes = dict(s.attributes)
    if s.model:
        attributes["model"] = s.model
    if s.finish_reason:
        attributes["finish_reason"] = s.finish_reason
    err_type, err_msg = _error_of(s.error, "StepFailed", s.status == StepStatus.FAILED)
    return StepData(
        position=position,
        name=s.name,
        step_type=s.type.value,
        status=s.status.value,
        inputs=as_fields(s.input) if s.input is not None else {},
        params=jsonable(s.params),
        fields={s.name: jsonable(s.output)} if s.status == StepStatus.SUCCESS else None,
        error_type=err_type,
        error_message=err_msg,
        parent_position=parent_position,
        span_id=span_id,
        started_at=s_start,
        ended_at=s_end,
        duration_ms=float(duration),
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        attributes=jsonable(attributes),
        cache_outcome="none",
        cache_reason="posted",
    )


class FailuresRequest(BaseModel):
    """The traces to analyse: explicit ids, or filters (as the GET route's query)."""

    model_config = ConfigDict(extra="forbid")
    trace_ids: list[str] | None = Field(None, max_length=10_000)
    name: str | None = None
    since: str | float | None = None
    until: str | float | None = None
    kind: Literal["trace", "run", "any"] = "any"
    limit: int = Field(1000, ge=1, le=10_000)
    by: list[Literal["input_length", "step_type", "model", "params"]] = Field(
        default_factory=list,
        description="also give failure rates per group of these dimensions (correlations)",
    )


Kind = Literal["trace", "run", "any"]
_LOOKUP = error_responses(404, 422)
_OTLP: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "ExportTraceServiceResponse, in the request's encoding",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


class TraceReplayRequest(BaseModel):
    """A trace replay: at most one change and the replay switches. No chain reference is taken
    over HTTP (importing and calling a named function is code execution): a trace recorded here
    runs its recorded chain, any other replays its recorded calls."""

    model_config = ConfigDict(extra="forbid")
    change: str | None = Field(
        None, description="input.FIELD=VALUE or STEP.PARAM=VALUE (STEP may be name#k)"
    )
    cached_llm: bool = Field(True, description="serve unchanged model calls from the record")
    cached_tools: bool = Field(True, description="serve unchanged tool calls from the record")
    stop_at_divergence: bool = Field(False, description="stop after the first divergent step")


def _trace(store: Store, trace_id: str, *, payloads: bool = False) -> Any:
    """:func:`load_trace`, with an unknown id said as a trace (the trace views' 404).

    Raises:
        UnknownRun: no stored trace or run has this id or unique prefix.
    """
    try:
        return load_trace(store, trace_id, payloads=payloads)
    except UnknownRun as exc:
        if not exc.message.startswith("unknown run"):
            raise  # an ambiguous prefix: its own message says what to give
        hint = exc.hint.replace("(rewind runs)", "(GET /api/traces lists them)")
        if "characters" not in hint:
            hint = "GET /api/traces lists the stored traces"
        raise UnknownRun(f"unknown trace {trace_id!r}", hint) from exc


def trace_router(
    store: Store, *, settings: InspectionSettings | None = None, chat_client: Any = None
) -> APIRouter:
    """The trace service's routes over ``store`` (see the module doc); ``chat_client`` answers
    the model calls a trace replay misses."""
    r = APIRouter(prefix="/api", tags=["traces"], responses=error_responses(*SERVER_ERRORS, 403))
    receiver = OtlpReceiver(store)
    insp = settings or InspectionSettings()

    @r.get("/tracing/health")
    def tracing_health() -> dict[str, Any]:
        """Liveness of the trace service: the store answers; traces, step spans and runs
        stored; spans waiting for their trace's root span (OTLP receiver)."""
        return {"status": "ok"} | count_traces(store) | {"otlp_waiting_spans": receiver.waiting}

    @r.post("/traces", status_code=201, responses=error_responses(400, 403, 409, 422))
    def store_trace(doc: TraceIn) -> dict[str, Any]:
        """Store a trace document; answers its id, step count and the link to read it back."""
        data = trace_data_of(doc)
        if trace_exists(store, data.trace_id):
            raise HTTPException(409, f"trace {data.trace_id} is already stored")
        write_trace(store, data)
        return {
            "trace_id": data.trace_id,
            "stored": True,
            "steps": len(data.steps),
            "links": {"trace": f"/api/traces/{data.trace_id}"},
        }

    @r.get("/traces", responses=error_responses(400, 422), **typed(m.TracesResponse))
    def search_traces(
        name: Annotated[str | None, Query(description="chain (pipeline) name")] = None,
        status: Annotated[
            Literal["success", "completed", "failed", "running", "interrupted"] | None,
            Query(description="trace status"),
        ] = None,
        since: Annotated[
            str | None, Query(description="start time ≥ (ISO date-time, unix s, or 24h/7d)")
        ] = None,
        until: Annotated[str | None, Query(description="start time ≤ (same forms)")] = None,
        kind: Annotated[Kind, Query(description="trace, run (Burr) or any")] = "any",
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Traces (and runs) matching the filters, newest first, one page at a time."""
        runs, total = search_runs(
            store,
            name=name,
            status=status,
            since=_when(since, "since"),
            until=_when(until, "until"),
            kind=kind,
            limit=limit,
            offset=offset,
        )
        views = load_traces(store, [x.run_id for x in runs])
        nxt = offset + len(views)
        return {
            "traces": [v.summary() for v in views],
            "total": total,
            "limit": limit,
            "offset": offset,
            "next_offset": nxt if nxt < total else None,
        }

    @r.get("/traces/failures", responses=error_responses(400, 422), **typed(m.FailuresResponse))
    def failures(
        name: Annotated[str | None, Query(description="chain (pipeline) name")] = None,
        since: Annotated[str | None, Query(description="start time ≥")] = None,
        until: Annotated[str | None, Query(description="start time ≤")] = None,
        kind: Annotated[Kind, Query()] = "any",
        limit: Annotated[int, Query(ge=1, le=10_000, description="newest traces analysed")] = 1000,
        examples: Annotated[int, Query(ge=1, le=100)] = 5,
        by: Annotated[
            list[Literal["input_length", "step_type", "model", "params"]] | None,
            Query(description="failure rates per group of these dimensions (repeatable)"),
        ] = None,
    ) -> dict[str, Any]:
        """Failure patterns over the matching traces: each pattern with its count, example
        trace ids and a suggested fix; counts add up to the failed traces. With ``by``, also
        ``correlations``: per dimension, each group's count, failures, rate and examples, and
        the groups where failures concentrate."""
        req = FailuresRequest(
            name=name, since=since, until=until, kind=kind, limit=limit, by=by or []
        )
        return _failures(req, examples)

    @r.post(
        "/traces/failures",
        responses=error_responses(400, 403, 404, 422),
        **typed(m.FailuresResponse),
    )
    def failures_of(
        req: FailuresRequest, examples: Annotated[int, Query(ge=1, le=100)] = 5
    ) -> dict[str, Any]:
        """Failure patterns over an explicit set of traces (``trace_ids``) or the filters."""
        return _failures(req, examples)

    def _failures(req: FailuresRequest, examples: int) -> dict[str, Any]:
        if req.trace_ids is not None:
            ids = [store.get_run(t).run_id for t in req.trace_ids]
        else:
            runs, _ = search_runs(
                store,
                name=req.name,
                since=_when(req.since, "since"),
                until=_when(req.until, "until"),
                kind=req.kind,
                limit=req.limit,
            )
            ids = [x.run_id for x in runs]
        views = load_traces(store, ids, payloads=bool(req.by))
        out = analyze_failures(views).to_json(examples)
        if req.by:
            correlations = correlate_failures(views, req.by, examples=examples)
            out["correlations"] = [c.to_json() for c in correlations]
        return out

    @r.post(
        "/traces/{trace_id}/replay",
        responses=error_responses(400, 403, 404, 409, 422, 503),
        **typed(m.TraceReplayResult),
    )
    def replay(trace_id: str, req: TraceReplayRequest) -> dict[str, Any]:
        """Replay a trace (its chain's code, or its recorded calls) with at most one change and
        the replay switches; answers the mode used, whether it stopped at the first divergence,
        whether it ended as the recorded chain did (``ended_as_recorded``: a recorded-calls
        replay of a trace whose chain raised fails with the recorded error), the replay trace
        and its step-by-step diff against the original."""
        switches = ReplaySwitches(req.cached_llm, req.cached_tools, req.stop_at_divergence)
        record = replay_trace(
            store,
            trace_id,
            change=req.change,
            chat_client=chat_client,
            switches=switches,
        )
        assert record.parent_run_id is not None
        a, b = load_trace(store, record.parent_run_id), load_trace(store, record.run_id)
        return {
            "mode": record.config.get("replay_mode"),
            "switches": switches.to_json(),
            "stopped": b.error_type == StoppedAtDivergence.__name__,
            "ended_as_recorded": ended_as_recorded(a, b),
            "trace": b.to_json(),
            "diff": compare_traces(a, b),
        }

    @r.get("/traces/{trace_id}", responses=_LOOKUP, **typed(m.TraceDetail))
    def get_trace(trace_id: str) -> dict[str, Any]:
        """One trace (id or unique prefix) with every step's input, output, status, timing,
        tokens, attributes and hashes. A Burr run reads as a trace too."""
        return _trace(store, trace_id).to_json()

    @r.get("/traces/{trace_id}/inspect", responses=_LOOKUP)
    def inspect(
        trace_id: str,
        step: Annotated[str | None, Query(description="one step: name, name#k or number")] = None,
    ) -> dict[str, Any]:
        """Findings per step (severity, message, suggestion) and a data summary."""
        view = _trace(store, trace_id, payloads=True)
        try:
            return inspect_trace(view, step=step, settings=insp).to_json()
        except LookupError as exc:
            raise UnknownNode(
                str(exc), "see GET /api/traces/{id} for the steps", field="step"
            ) from exc

    @r.get("/traces/{trace_id}/root-cause", responses=_LOOKUP)
    def get_root_cause(trace_id: str) -> dict[str, Any]:
        """Why the trace failed: the failing step, its input, the steps before it, upstream
        causes, suggestions and the command that re-runs it."""
        return root_cause(_trace(store, trace_id, payloads=True), insp).to_json()

    @r.get("/traces/{trace_id}/compare/{other_id}", responses=_LOOKUP, **typed(m.TraceCompare))
    def compare(trace_id: str, other_id: str) -> dict[str, Any]:
        """Step-by-step comparison: equal/changed steps, changed paths, similarities."""
        return compare_traces(_trace(store, trace_id), _trace(store, other_id))

    @r.post(
        "/otlp/v1/traces",
        responses=_OTLP | error_responses(400, 403, 415),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                },
            }
        },
    )
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace receiver (``ExportTraceServiceRequest`` as JSON or protobuf,
        optionally gzip-compressed; at most ``MAX_OTLP_BYTES`` before and after decompression).
        Spans are buffered until their trace's root span arrives, then the trace is imported;
        malformed spans are rejected one by one (``partialSuccess``). 400: not JSON/protobuf,
        nested too deeply, or not a request; 413: too large; 415: another content type."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/x-protobuf", "application/json", ""):
            raise HTTPException(
                415, f"unsupported content type {ctype!r}: send OTLP JSON or protobuf"
            )
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise HTTPException(
                415, f"unsupported content encoding {encoding!r}: send gzip or uncompressed"
            )
        body = await _bounded_body(request)
        if encoding == "gzip":
            body = _gunzip(body)
        if ctype == "application/x-protobuf":
            out = await run_in_threadpool(receiver.receive_protobuf, body)
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTracePartialSuccess,
                ExportTraceServiceResponse,
            )

            partial = out.get("partialSuccess")
            message = ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(
                    rejected_spans=partial["rejectedSpans"], error_message=partial["errorMessage"]
                )
                if partial
                else None
            )
            return Response(message.SerializeToString(), media_type="application/x-protobuf")
        return JSONResponse(await run_in_threadpool(receiver.receive_json, body))

    return r


def _too_large() -> HTTPException:
    return HTTPException(
        413, f"the OTLP body is larger than {MAX_OTLP_BYTES} bytes: send smaller batches"
    )


async def _bounded_body(request: Request) -> bytes:
    """The request body, refused (413) as soon as it passes ``MAX_OTLP_BYTES``: a declared
    ``Content-Length`` is checked before reading, and the stream is counted while read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_OTLP_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_OTLP_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip(body: bytes) -> bytes:
    """A gzip body decompressed, at most ``MAX_OTLP_BYTES`` of output (a small body that
    inflates without end is refused with 413, not decompressed into memory)."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(body, MAX_OTLP_BYTES + 1)
    except zlib.error as exc:
        raise HTTPException(400, f"the body is not gzip data: {exc}") from exc
    if len(out) > MAX_OTLP_BYTES or inflate.unconsumed_tail:
        raise _too_large()
    if not inflate.eof:
        raise HTTPException(400, "the gzip body is truncated")
    return out


def _when(value: str | float | None, field: str) -> float | None:
    try:
        return parse_time(value)
    except Exception as exc:
        raise InvalidOverride(
            str(getattr(exc, "message", exc)), getattr(exc, "hint", ""), field=field
        ) from exc
