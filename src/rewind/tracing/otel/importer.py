"""OTLP import: spans grouped by trace become stored traces (a root chain and its steps);
see :mod:`rewind.tracing.otel`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rewind.canonical import CanonicalError
from rewind.errors import RewindError
from rewind.store import Store
from rewind.store.records import stored_name
from rewind.tracing.model import (
    ROOT_POSITION,
    STEP_STATUSES,
    STEP_TYPES,
    StepData,
    StepStatus,
    TraceData,
    as_fields,
    jsonable,
)
from rewind.tracing.otel.export import JSON, _derived
from rewind.tracing.otel.otlp_json import (
    _INT64,
    MAX_OTLP_DEPTH,
    SpanRejection,
    _deeper_than,
    _no_constant,
    _Span,
    parse_otlp,
)
from rewind.tracing.otel_calls import (
    calls_of_span,
    entries_of,
    exported_calls,
    indexed_attributes,
)
from rewind.tracing.otel_effects import (
    EFFECTS_ATTRIBUTE,
    effects_from_attribute,
)
from rewind.tracing.store import stored_span_ids, trace_exists, write_trace


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
    roots, ordered = _span_order(spans)
    root: _Span | None = roots[0] if len(roots) == 1 else None
    head = root or roots[0]
    positions = {s.span_id: i for i, (s, _) in enumerate(ordered)}
    steps = [
        _step(i, s, positions.get(parent, ROOT_POSITION) if parent else ROOT_POSITION)
        for i, (s, parent) in enumerate(ordered)
    ]
    ra = head.attributes
    status = _trace_status(ra, head, root is None, steps)
    err_type, err_msg = _exception(head) if status == "failed" else (None, None)
    if root is None:
        started = min(s.start_ns for s in spans) / 1e9
        ended = max(s.end_ns for s in spans) / 1e9
    else:
        started, ended = head.start_ns / 1e9, head.end_ns / 1e9
    chain_input = _json_value(ra.get("input.value"), ra.get("input.mime_type"))
    return TraceData(
        trace_id=trace_id,
        name=stored_name(str(ra.get("rewind.name") or head.name)),
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
        config=_trace_config(head),
        **_fork_fields(store, ra, steps),
        steps=steps,
    )


def _span_order(spans: list[_Span]) -> tuple[list[_Span], list[tuple[_Span, str | None]]]:
    """(the trace's roots by start, every step span with its parent span id in step order).

    A single root that has children (or says it is a Rewind chain) is the chain itself, not a
    step: its children are the top steps. Otherwise every root is a top step."""
    ids = {s.span_id for s in spans}
    roots = _by_start([s for s in spans if s.parent_id is None or s.parent_id not in ids])
    children: dict[str, list[_Span]] = {}
    for s in spans:
        if s.parent_id in ids:
            children.setdefault(s.parent_id, []).append(s)
    root: _Span | None = roots[0] if len(roots) == 1 else None
    if root is not None and (children.get(root.span_id) or "rewind.kind" in root.attributes):
        tops = _by_start(children.get(root.span_id, []))
    else:
        tops = roots
    ordered: list[tuple[_Span, str | None]] = []
    for top in tops:
        stack: list[tuple[_Span, str | None]] = [(top, None)]
        while stack:
            node, parent = stack.pop()
            ordered.append((node, parent))
            kids = _by_start(children.get(node.span_id, []))
            stack.extend((c, node.span_id) for c in reversed(kids))
    return roots, ordered


def _trace_status(ra: Mapping[str, Any], head: _Span, rootless: bool, steps: list[StepData]) -> str:
    """The recorded ``rewind.status``; else failed when the head span failed (or, without a
    single root, when any step did)."""
    status = ra.get("rewind.status")
    if isinstance(status, str) and status in STEP_STATUSES:
        return status
    if head.status_code == 2 or (rootless and any(s.status == StepStatus.FAILED for s in steps)):
        return "failed"
    return "success"


def _fork_fields(
    store: Store | None, ra: Mapping[str, Any], steps: list[StepData]
) -> dict[str, Any]:
    """A fork's parent run, fork node/position and override, when its parent trace is stored
    (else none: the trace imports as a run of its own)."""
    parent_run = ra.get("rewind.parent_run_id")
    if not parent_run or store is None or not trace_exists(store, str(parent_run)):
        parent_run = None
    raw = ra.get("rewind.override")
    override = _json_value(raw, JSON) if raw else None
    return {
        "parent_run_id": str(parent_run) if parent_run else None,
        "fork_node": steps[0].name if parent_run and steps else None,
        "fork_position": 0 if parent_run else None,
        "override": jsonable(override) if isinstance(override, dict) else None,
    }


def _trace_config(head: _Span) -> dict[str, Any]:
    """The trace's config: its source, the exporting service and the chain reference."""
    ra = head.attributes
    config: dict[str, Any] = {"source": "otlp"}
    service = head.resource.get("service.name")
    if service:
        config["service.name"] = service
    if ra.get("rewind.chain_ref"):
        config["chain_ref"] = ra["rewind.chain_ref"]
    return config


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
    if step_type == "tool_call":
        return _tool_io(a, inp, out)
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


def _tool_io(a: Mapping[str, Any], inp: Any, out: Any) -> tuple[Any, Any]:
    """A tool span's input and output: OpenInference's ``input.value``/``output.value`` when
    recorded (``inp``, ``out``), else GenAI's ``gen_ai.tool.call.arguments``/``.result``."""
    if inp is None:
        inp = _json_value(a.get("gen_ai.tool.call.arguments"), None)
    if out is None:
        out = _json_value(a.get("gen_ai.tool.call.result"), None)
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
    """The step of one span: rebuilt exactly when Rewind exported it, mapped otherwise."""
    if "rewind.node" in s.attributes:  # exported by Rewind: rebuild the exact node documents
        return _rewind_step(position, s, parent_position)
    return _foreign_step(position, s, parent_position)


def _span_times(s: _Span) -> tuple[float, float, float]:
    """(start, end in epoch seconds, duration in ms: the recorded one, else end - start)."""
    duration = _number(s.attributes, "rewind.duration_ms", max(0.0, (s.end_ns - s.start_ns) / 1e6))
    return s.start_ns / 1e9, s.end_ns / 1e9, duration


def _rewind_step(position: int, s: _Span, parent_position: int) -> StepData:
    """A step Rewind exported, from its ``rewind.*`` attributes (the same node documents)."""
    a = s.attributes
    start, end, duration = _span_times(s)
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
        name=stored_name(str(a["rewind.node"])),
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


def _foreign_attributes(a: Mapping[str, Any], step_type: str, out: Any) -> dict[str, Any]:
    """A foreign span's step attributes: its extra attributes plus model, finish reason and
    (for a retrieval) the documents' scores."""
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
    return attributes


def _foreign_step(position: int, s: _Span, parent_position: int) -> StepData:
    """A step from another tracer's span (GenAI / OpenInference attributes)."""
    a = s.attributes
    start, end, duration = _span_times(s)
    step_type = _foreign_type(a)
    failed = s.status_code == 2
    inp, out = _foreign_io(a, step_type)
    attributes = _foreign_attributes(a, step_type, out)
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
        name=stored_name(name),
        step_type=step_type,
        status="failed" if failed else "success",
        inputs=as_fields(inp) if inp is not None else {},
        fields=None if failed else {stored_name(name): jsonable(out)},
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
