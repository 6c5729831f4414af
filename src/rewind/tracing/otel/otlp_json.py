"""OTLP/JSON input: bounded reading of ``ExportTraceServiceRequest`` documents into spans, each
malformed span rejected alone with the field at fault; see :mod:`rewind.tracing.otel`."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewind.errors import RewindError

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
    code, message = _status_of(sp)
    parsed_events = _events_of(sp)
    return _Span(
        trace_id=_hex_id(_get(sp, "traceId"), 16, "traceId"),
        span_id=_hex_id(_get(sp, "spanId"), 8, "spanId"),
        parent_id=parent_id,
        name=name or "span",
        start_ns=start,
        end_ns=end,
        attributes=_attrs(_get(sp, "attributes"), "attributes", 0),
        status_code=code,
        status_message=message or "",
        events=parsed_events,
        resource=resource,
    )


def _status_of(sp: Mapping[str, Any]) -> tuple[int, str | None]:
    """A span's (status code 0/1/2, status message); a missing status is UNSET."""
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
    return int(code), _text(_get(status, "message"), "status.message")


def _events_of(sp: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A span's events as ``{"name", "attributes"}``."""
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
    return parsed_events


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
    scalar = _SCALAR_VALUES.get(kind)
    if scalar is not None:
        return scalar(x, where)
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


def _string_value(x: Any, where: str) -> str:
    return _text(x, where, required=True)


def _bool_value(x: Any, where: str) -> bool:
    if not isinstance(x, bool):
        raise _Bad(where, f"is {_kind(x)}, not true or false")
    return x


def _int_value(x: Any, where: str) -> int:
    """An ``intValue``: a 64-bit integer, as a number or a decimal string."""
    if isinstance(x, str) and re.fullmatch(r"-?[0-9]{1,19}", x):
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int) or not -_INT64 <= x < _INT64:
        raise _Bad(where, f"{_shown(x)} not a 64-bit integer")
    return x


def _double_value(x: Any, where: str) -> float:
    """A ``doubleValue``: a number, or its string form (``NaN``, ``Infinity`` included)."""
    if isinstance(x, str) and (x in ("NaN", "Infinity", "-Infinity") or _NUMBER.fullmatch(x)):
        x = float(x)
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _Bad(where, f"{_shown(x)} not a number")
    try:
        return float(x)
    except OverflowError as exc:
        raise _Bad(where, f"{_label(x)} is beyond a 64-bit float") from exc


def _bytes_value(x: Any, where: str) -> str:
    """A ``bytesValue``: kept as its (checked) base64 string, standard or URL-safe."""
    if not isinstance(x, str):
        raise _Bad(where, f"is {_kind(x)}, not a base64 string")
    padded = x.replace("-", "+").replace("_", "/")
    try:
        base64.b64decode(padded + "=" * (-len(padded) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _Bad(where, f"{_label(x)} is not base64") from exc
    return x


_SCALAR_VALUES: dict[str, Callable[[Any, str], Any]] = {
    "stringValue": _string_value,
    "boolValue": _bool_value,
    "intValue": _int_value,
    "doubleValue": _double_value,
    "bytesValue": _bytes_value,
}


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
