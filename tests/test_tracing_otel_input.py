"""Hostile OTLP input: every case goes through the file path (``rewind otel import FILE`` via
Typer's CliRunner) and the HTTP receiver (``POST /api/otlp/v1/traces`` in the real app), and must
end in an import with rejections counted and explained, or a clean refusal (exit 2 / 4xx) that
writes nothing. Never a traceback, never a 5xx, never a span lost without a reason."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from typer.testing import CliRunner

import rewind
from rewind.api import create_app
from rewind.cli import app as cli_app
from rewind.errors import UnknownRun
from rewind.store import Store, open_store
from rewind.tracing.otel import (
    MAX_OTLP_BYTES,
    MAX_OTLP_DEPTH,
    InvalidOtlp,
    OtlpReceiver,
    import_otlp,
    read_otlp_file,
)
from rewind.tracing.store import load_trace

T1, T2 = "1" * 32, "2" * 32
ROOT, A, B, C = "a" * 16, "b" * 16, "c" * 16, "d" * 16
TABLES = ("runs", "nodes", "spans", "blobs", "burr_state", "calls")


def sp(
    tid: str, sid: str, parent: str | None, name: str, start: int = 0, **fields: Any
) -> dict[str, Any]:
    """One OTLP/JSON span; ``start`` in ms after a fixed epoch, 100 ms long."""
    out: dict[str, Any] = {
        "traceId": tid,
        "spanId": sid,
        "name": name,
        "startTimeUnixNano": str(1_700_000_000_000_000_000 + start * 1_000_000),
        "endTimeUnixNano": str(1_700_000_000_000_000_000 + (start + 100) * 1_000_000),
        "attributes": [{"key": "input.value", "value": {"stringValue": name}}],
    }
    if parent:
        out["parentSpanId"] = parent
    return out | fields


def request(*spans: dict[str, Any]) -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}


def counts(store: Store) -> dict[str, int]:
    with store.read() as conn:
        return {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in TABLES}


class Via:
    """Imports through one path and answers (status, body) in a common shape: ``ok`` (imported,
    possibly with rejections) or ``refused`` (bad input, nothing imported)."""

    def __init__(self, path: str, tmp_path: Path) -> None:
        self.path = path
        self.folder = tmp_path / f"store-{path}"
        self.store = open_store(self.folder)
        self.file = tmp_path / f"in-{path}.json"
        self.client = (
            TestClient(
                create_app(self.store, chat_client=None, pipelines={}), base_url="http://127.0.0.1"
            )
            if path == "http"
            else None
        )

    def send(self, body: bytes | dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        if self.client is not None:
            headers.setdefault("Content-Type", "application/json")
            r = self.client.post("/api/otlp/v1/traces", content=raw, headers=headers)
            assert r.status_code < 500, r.text
            return r.status_code, r.json()
        self.file.write_bytes(raw)
        r = CliRunner().invoke(
            cli_app, ["--store", str(self.folder), "otel", "import", str(self.file), "--json"]
        )
        assert r.exception is None or isinstance(r.exception, SystemExit), r.output
        out = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"output": r.output}
        return r.exit_code, out

    def rejected(self, out: dict[str, Any]) -> tuple[int, str]:
        """(rejected span count, all reasons in one string) from either path's answer."""
        if self.path == "http":
            partial = out.get("partialSuccess") or {}
            return partial.get("rejectedSpans", 0), partial.get("errorMessage", "")
        return out["rejected"], "; ".join(out["errors"] + out["notes"])

    def refused(self, status: int, out: dict[str, Any]) -> str:
        """The refusal message (asserting the path's refusal status: 400 / exit 2)."""
        if self.path == "http":
            assert status == 400, out
            return str(out["message"])
        assert status == 2, out
        assert len(out["output"].strip().splitlines()) == 1, out["output"]  # one line
        return str(out["output"])

    def imported_ok(self, status: int) -> bool:
        return status == 200 if self.path == "http" else status in (0, 1)


@pytest.fixture(params=["file", "http"])
def via(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Via]:
    v = Via(request.param, tmp_path)
    yield v
    if v.client is not None:
        v.client.close()
    v.store.close()


# -- the reported crashes ----------------------------------------------------------------------


def test_a_span_that_is_its_own_parent_becomes_a_root(via: Via) -> None:
    status, out = via.send(request(sp(T1, A, A, "loop"), sp(T1, B, A, "child", 10)))
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 0 and "cycle" in reasons and A in reasons
    view = load_trace(via.store, T1)
    assert [s.name for s in view.steps] == ["child"] and view.name == "loop"


def test_two_spans_with_one_id_reject_their_trace_only(via: Via) -> None:
    clean = sp(T2, C, None, "clean")
    status, out = via.send(
        request(sp(T1, A, None, "root"), sp(T1, B, A, "x"), sp(T1, B, B, "y"), clean)
    )
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 3  # the two copies of B, and A with them (a trace is whole or absent)
    assert f"span {B} (2 copies) of trace {T1}: spanId is used by 2 different spans" in reasons
    assert "whole or not at all" in reasons
    assert load_trace(via.store, T2).name == "clean"
    with pytest.raises(UnknownRun):
        load_trace(via.store, T1)


def test_identical_copies_of_a_span_collapse_to_one(via: Via) -> None:
    status, out = via.send(request(sp(T1, A, None, "root"), sp(T1, B, A, "x"), sp(T1, B, A, "x")))
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 1 and "identical copy" in reasons
    assert [s.name for s in load_trace(via.store, T1).steps] == ["x"]


def test_a_parent_cycle_is_broken_the_same_way_in_any_order(via: Via, tmp_path: Path) -> None:
    spans = [sp(T1, ROOT, None, "root"), sp(T1, A, B, "a", 20), sp(T1, B, A, "b", 10)]
    status, out = via.send(request(*spans))
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 0 and "cycle" in reasons and f"span {B}" in reasons
    steps = [(s.name, s.parent_position) for s in load_trace(via.store, T1).steps]
    assert len(steps) == 3  # before: both cycle spans silently dropped
    other = open_store(tmp_path / "reversed")
    import_otlp(other, [request(*reversed(spans))])
    assert [(s.name, s.parent_position) for s in load_trace(other, T1).steps] == steps
    assert [n.output_hash for n in other.nodes_of(T1)] == [
        n.output_hash for n in via.store.nodes_of(T1)
    ]
    other.close()


def test_json_nested_3000_deep_is_refused(via: Via) -> None:
    deep = "[" * 3000 + "]" * 3000
    status, out = via.send(('{"resourceSpans": ' + deep + "}").encode())
    assert f"deeper than {MAX_OTLP_DEPTH}" in via.refused(status, out)
    assert counts(via.store)["runs"] == 0


def test_nesting_just_past_the_limit_is_refused(via: Via) -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(MAX_OTLP_DEPTH // 4 + 1):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    span = sp(T1, A, None, "deep", attributes=[{"key": "x", "value": value}])
    status, out = via.send(request(span))
    assert f"deeper than {MAX_OTLP_DEPTH}" in via.refused(status, out)
    assert counts(via.store)["runs"] == 0


def test_a_null_double_rejects_its_span_and_keeps_clean_traces(via: Via) -> None:
    bad = sp(T1, A, None, "bad", attributes=[{"key": "x", "value": {"doubleValue": None}}])
    status, out = via.send(request(bad, sp(T2, B, None, "clean")))
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 1
    assert f'span {A} of trace {T1}: attributes["x"].value.doubleValue is null' in reasons
    assert load_trace(via.store, T2).name == "clean"
    if via.path == "file":
        assert status == 1 and out["imported"] == [T2]


# -- an attacker's input ------------------------------------------------------------------------

BAD_SPANS: list[tuple[dict[str, Any], str]] = [
    ({"spanId": "xyz"}, 'spanId "xyz" is neither 16 hex characters nor base64'),
    ({"spanId": "abcd"}, 'spanId "abcd" is 3 bytes, not 8'),
    ({"spanId": "0" * 16}, "spanId is all zeros"),
    ({"spanId": 12}, "spanId is a number, not a hex or base64 string"),
    ({"traceId": ["a"]}, "traceId is an array"),
    ({"parentSpanId": "zz"}, "parentSpanId"),
    ({"name": {"a": 1}}, "name is an object, not a string"),
    ({"name": "\ud800"}, "name holds a lone surrogate"),
    ({"startTimeUnixNano": "soon"}, 'startTimeUnixNano "soon" is not an integer'),
    ({"startTimeUnixNano": "-5"}, "startTimeUnixNano"),
    ({"startTimeUnixNano": -5}, "startTimeUnixNano -5 is outside 0..2**64-1"),
    ({"startTimeUnixNano": 1.5}, "startTimeUnixNano 1.5 is not an integer"),
    ({"endTimeUnixNano": "99999999999999999999"}, "endTimeUnixNano"),
    ({"endTimeUnixNano": "1"}, "endTimeUnixNano 1 is before startTimeUnixNano"),
    ({"attributes": "x=1"}, "attributes is a string, not an array"),
    ({"attributes": [{"value": {"stringValue": "v"}}]}, "attributes[0].key is missing"),
    ({"attributes": [7]}, "attributes[0] is a number"),
    ({"attributes": [{"key": "k", "value": {"intValue": "9" * 40}}]}, "not a 64-bit integer"),
    ({"attributes": [{"key": "k", "value": {"intValue": "1e3"}}]}, "not a 64-bit integer"),
    ({"attributes": [{"key": "k", "value": {"intValue": True}}]}, "not a 64-bit integer"),
    ({"attributes": [{"key": "k", "value": {"boolValue": "false"}}]}, "not true or false"),
    ({"attributes": [{"key": "k", "value": {"doubleValue": "fast"}}]}, "not a number"),
    ({"attributes": [{"key": "k", "value": {"bytesValue": "%%%"}}]}, "is not base64"),
    ({"attributes": [{"key": "k", "value": {"stringValue": 5}}]}, "is a number, not a string"),
    ({"attributes": [{"key": "k", "value": "plain"}]}, "not an AnyValue object"),
    (
        {"attributes": [{"key": "k", "value": {"stringValue": "a", "intValue": "1"}}]},
        "holds stringValue and intValue",
    ),
    ({"attributes": [{"key": "k", "value": {"arrayValue": {"values": "a,b"}}}]}, "not an array"),
    ({"attributes": [{"key": "k", "value": {"arrayValue": [1]}}]}, "not an object with values"),
    (
        {"attributes": [{"key": "k", "value": {"kvlistValue": {"values": [{"key": 1}]}}}]},
        'attributes["k"].value.kvlistValue[0].key is a number',
    ),
    ({"status": "ERROR"}, "status is a string, not an object"),
    ({"status": {"code": 7}}, "status.code 7 is not 0, 1, 2"),
    ({"status": {"code": 2, "message": ["x"]}}, "status.message is an array"),
    ({"events": {"name": "e"}}, "events is an object, not an array"),
    (
        {"events": [{"name": "e", "attributes": [{"key": "k", "value": {"doubleValue": None}}]}]},
        'events[0].attributes["k"].value.doubleValue is null',
    ),
]


@pytest.mark.parametrize(("change", "reason"), BAD_SPANS, ids=[r for _, r in BAD_SPANS])
def test_each_malformed_span_is_rejected_with_its_field(
    change: dict[str, Any], reason: str, tmp_path: Path
) -> None:
    store = open_store(tmp_path / "s")
    good = sp(T2, B, None, "clean")
    result = import_otlp(store, [request(sp(T1, A, None, "bad") | change, good)])
    assert result.imported == [T2] and result.rejected == 1, result.to_json()
    assert reason in result.errors[0], result.errors
    assert result.rejections[0].where == "resourceSpans[0].scopeSpans[0].spans[0]"
    assert counts(store)["runs"] == 1
    store.close()


def test_odd_but_legal_values_import(via: Via) -> None:
    attrs = [
        {
            "key": "mixed",
            "value": {"arrayValue": {"values": [{"intValue": 1}, {"stringValue": "a"}]}},
        },
        {"key": "big", "value": {"intValue": str(2**63 - 1)}},
        {"key": "nan", "value": {"doubleValue": "NaN"}},
        {"key": "bytes", "value": {"bytesValue": base64.b64encode(b"\x00\xff").decode()}},
        {"key": "empty", "value": {}},
        {
            "key": "kv",
            "value": {"kvlistValue": {"values": [{"key": "in", "value": {"boolValue": False}}]}},
        },
    ]
    b64_tid = base64.b64encode(bytes.fromhex(T1)).decode()
    span = sp(b64_tid, A, "0" * 16, "odd", attributes=attrs)
    status, out = via.send(request(span))
    assert via.imported_ok(status) and via.rejected(out)[0] == 0, out
    step = load_trace(via.store, T1, payloads=True).steps[0]
    assert step.attributes["mixed"] == [1, "a"] and step.attributes["big"] == 2**63 - 1
    assert step.attributes["kv"] == {"in": False}


def test_one_trace_across_resources_imports_as_one(via: Via) -> None:
    doc = {
        "resourceSpans": [
            {"scopeSpans": [{"spans": [sp(T1, ROOT, None, "root")]}]},
            {"scopeSpans": [{"spans": [sp(T1, A, ROOT, "remote", 10)]}]},
        ]
    }
    status, out = via.send(doc)
    assert via.imported_ok(status) and via.rejected(out)[0] == 0, out
    assert [s.name for s in load_trace(via.store, T1).steps] == ["remote"]


def test_a_bad_resource_attribute_rejects_its_spans_only(via: Via) -> None:
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"intValue": "x"}}]},
                "scopeSpans": [{"spans": [sp(T1, A, None, "a"), sp(T1, B, A, "b")]}],
            },
            {"scopeSpans": [{"spans": [sp(T2, C, None, "clean")]}]},
        ]
    }
    status, out = via.send(doc)
    assert via.imported_ok(status), out
    rejected, reasons = via.rejected(out)
    assert rejected == 2 and 'resourceSpans[0].resource.attributes["service.name"]' in reasons
    assert load_trace(via.store, T2).name == "clean"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "not JSON"),
        (b"   ", "not JSON"),
        (b"{", "not JSON"),
        (b"[1, 2]", "not"),
        (b'"resourceSpans"', "not"),
        (b'{"resourceSpans": "abc"}', "resourceSpans is a string, not an array"),
        (b'{"resourceSpans": [{"scopeSpans": {}}]}', "resourceSpans[0].scopeSpans is an object"),
        (b'{"resourceSpans": [[]]}', "resourceSpans[0] is an array, not an object"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": 3}]}]}', "spans is a number"),
        (b'{"resourceSpans": [], "x": NaN}', "NaN"),
        (b'{"resourceSpans": [], "x": ' + b"1" * 5000 + b"}", "not JSON"),
        (b'{"resourceSpans": ["\xff\xfe"]}', "not UTF-8"),
    ],
)
def test_unreadable_requests_are_refused_and_write_nothing(
    via: Via, body: bytes, words: str
) -> None:
    status, out = via.send(body)
    if via.path == "file" and body.strip() == b"":
        assert "is empty" in via.refused(status, out)
    else:
        assert words in via.refused(status, out)
    assert counts(via.store) == dict.fromkeys(TABLES, 0)


def test_a_body_above_the_size_limit_is_refused(via: Via, tmp_path: Path) -> None:
    filler = {"key": "pad", "value": {"stringValue": "x" * (MAX_OTLP_BYTES + 10)}}
    body = json.dumps(request(sp(T1, A, None, "big", attributes=[filler]))).encode()
    status, out = via.send(body)
    if via.path == "http":
        assert status == 413 and str(MAX_OTLP_BYTES) in out["message"]
    else:
        assert status == 2 and f"larger than {MAX_OTLP_BYTES} bytes" in out["output"]
    assert counts(via.store)["runs"] == 0


def test_the_receiver_refuses_a_gzip_bomb_and_other_encodings(tmp_path: Path) -> None:
    v = Via("http", tmp_path)
    bomb = gzip.compress(b" " * (MAX_OTLP_BYTES + 1))
    assert len(bomb) < MAX_OTLP_BYTES // 100
    status, out = v.send(bomb, **{"Content-Encoding": "gzip"})
    assert status == 413 and "larger than" in out["message"]
    zipped = gzip.compress(json.dumps(request(sp(T1, A, None, "z"))).encode())
    assert v.send(zipped, **{"Content-Encoding": "gzip"})[0] == 200
    assert load_trace(v.store, T1).name == "z"
    assert v.send(b"{}", **{"Content-Encoding": "br"})[0] == 415
    assert v.send(b"not gzip", **{"Content-Encoding": "gzip"})[0] == 400
    assert v.client is not None
    v.client.close()
    v.store.close()


def test_content_types_the_receiver_does_not_speak(tmp_path: Path) -> None:
    v = Via("http", tmp_path)
    body = json.dumps(request(sp(T1, A, None, "x"))).encode()
    assert v.send(body, **{"Content-Type": "text/plain"})[0] == 415
    assert v.send(body, **{"Content-Type": "application/x-protobuf"})[0] == 400  # JSON as proto
    assert v.send(b"\x0a\x02\x0a\x00", **{"Content-Type": "application/json"})[0] == 400
    assert counts(v.store)["runs"] == 0
    assert v.client is not None
    v.client.close()
    v.store.close()


def test_a_long_chain_of_spans_builds_without_recursion(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    ids = [f"{i + 1:016x}" for i in range(1500)]
    spans = [sp(T1, ids[0], None, "root")] + [
        sp(T1, ids[i], ids[i - 1], f"s{i}", i) for i in range(1, len(ids))
    ]
    result = import_otlp(store, [request(*spans)])
    assert result.imported == [T1] and result.rejected == 0
    view = load_trace(store, T1)
    assert len(view.steps) == 1499 and view.steps[-1].parent_position == 1497
    store.close()


def test_deep_json_inside_a_string_attribute_is_kept_as_the_string(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    deep = "[" * 5000 + "]" * 5000
    span = sp(T1, A, None, "x", attributes=[{"key": "input.value", "value": {"stringValue": deep}}])
    result = import_otlp(store, [request(span, sp(T1, B, A, "y"))])
    assert result.imported == [T1], result.to_json()
    store.close()


def test_the_receiver_rejects_the_rest_of_a_spoiled_trace(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    receiver = OtlpReceiver(store)
    first = receiver.receive_json(json.dumps(request(sp(T1, A, ROOT, "child"))).encode())
    assert first == {} and receiver.waiting == 1
    bad = sp(T1, B, ROOT, "bad", attributes=[{"key": "k", "value": {"doubleValue": None}}])
    out = receiver.receive_json(json.dumps(request(bad)).encode())
    assert out["partialSuccess"]["rejectedSpans"] == 2 and receiver.waiting == 0
    late = receiver.receive_json(json.dumps(request(sp(T1, ROOT, None, "root"))).encode())
    assert late["partialSuccess"]["rejectedSpans"] == 1 and receiver.last_imported == []
    assert counts(store)["runs"] == 0
    store.close()


def test_a_cycle_without_a_root_does_not_wait_in_the_receiver(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    receiver = OtlpReceiver(store)
    out = receiver.receive_json(json.dumps(request(sp(T1, A, B, "a"), sp(T1, B, A, "b"))).encode())
    assert (
        out["partialSuccess"]["rejectedSpans"] == 0
        and "cycle" in out["partialSuccess"]["errorMessage"]
    )
    assert receiver.waiting == 0 and receiver.last_imported == [T1]
    store.close()


def test_a_file_path_that_never_ends_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    with pytest.raises(InvalidOtlp, match="larger than"):
        read_otlp_file("/dev/zero")
    with pytest.raises(InvalidOtlp, match="cannot read"):
        read_otlp_file(tmp_path)


# -- property: any JSON value --------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)
TRACE_IDS = st.text("0123456789abcdef", min_size=32, max_size=32) | st.sampled_from(
    ["", "zz", "AAAAAAAAAAAAAAAAAAAAAA==", "0" * 32]
)
SPAN_IDS = st.sampled_from([A, B, C, ROOT, "", "0" * 16, "AAAAAAAAAAA=", "q"])


def _anything(base: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return base | JSON_VALUES


ANY_VALUES = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "stringValue": _anything(st.text()),
            "intValue": _anything(st.integers(-(2**64), 2**64).map(str)),
            "doubleValue": _anything(st.sampled_from(["NaN", "1.5", "-Infinity"])),
            "boolValue": _anything(st.booleans()),
            "bytesValue": _anything(st.sampled_from(["AA==", "__", "x"])),
        },
    ),
    lambda inner: (
        st.fixed_dictionaries(
            {"arrayValue": st.fixed_dictionaries({"values": st.lists(inner, max_size=3)})}
        )
        | st.fixed_dictionaries(
            {
                "kvlistValue": st.fixed_dictionaries(
                    {
                        "values": st.lists(
                            st.fixed_dictionaries(
                                {"key": _anything(st.text(max_size=5)), "value": inner}
                            ),
                            max_size=3,
                        )
                    }
                )
            }
        )
    ),
    max_leaves=8,
)
ATTRIBUTE = st.fixed_dictionaries(
    {
        "key": _anything(
            st.sampled_from(
                [
                    "input.value",
                    "rewind.node",
                    "rewind.position",
                    "llm.token_count.prompt",
                    "rewind.duration_ms",
                    "input.mime_type",
                    "rewind.attributes",
                    "gen_ai.usage.input_tokens",
                ]
            )
        ),
        "value": _anything(ANY_VALUES),
    }
)
SPAN = st.fixed_dictionaries(
    {"traceId": _anything(TRACE_IDS), "spanId": _anything(SPAN_IDS)},
    optional={
        "parentSpanId": _anything(SPAN_IDS),
        "name": _anything(st.text(max_size=8)),
        "startTimeUnixNano": _anything(st.integers(-1, 2**65).map(str)),
        "endTimeUnixNano": _anything(st.integers(-1, 2**65)),
        "attributes": _anything(st.lists(ATTRIBUTE, max_size=4)),
        "status": _anything(
            st.fixed_dictionaries(
                {}, optional={"code": _anything(st.integers(0, 3)), "message": JSON_VALUES}
            )
        ),
        "events": _anything(
            st.lists(
                st.fixed_dictionaries(
                    {"name": JSON_VALUES, "attributes": _anything(st.lists(ATTRIBUTE, max_size=2))}
                ),
                max_size=2,
            )
        ),
    },
)
REQUESTS = JSON_VALUES | st.builds(
    lambda spans: request(*spans), st.lists(_anything(SPAN), max_size=6)
)


def test_any_json_imports_or_raises_the_import_error(tmp_path: Path) -> None:
    """For any JSON value (and any OTLP-shaped request with garbage in any field), the importer
    either imports (every span read is imported, skipped or counted rejected) or raises
    InvalidOtlp having written nothing; the HTTP receiver answers 200 or 400, never 5xx."""
    store = open_store(tmp_path / "s")
    client = TestClient(
        create_app(store, chat_client=None, pipelines={}), base_url="http://127.0.0.1"
    )

    @given(REQUESTS)
    def check(doc: Any) -> None:
        before = counts(store)
        try:
            result = import_otlp(store, [doc])
        except InvalidOtlp:
            assert counts(store) == before
        else:
            assert result.rejected == sum(r.spans for r in result.rejections)
            assert result.rejected <= result.spans
            if not result.imported and not result.skipped:  # nothing stored: all accounted
                assert result.rejected == result.spans and counts(store) == before
            for tid in result.imported:
                assert load_trace(store, tid).trace_id == tid
        r = client.post(
            "/api/otlp/v1/traces",
            content=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code in (200, 400), r.text

    check()
    client.close()
    store.close()


@settings(max_examples=40)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=6
    ),  # (parent index or none, start)
    st.randoms(use_true_random=False),
    st.text("0123456789abcdef", min_size=32, max_size=32).filter(lambda t: int(t, 16) > 0),
)
def test_cycles_break_the_same_way_in_any_input_order(
    links: list[tuple[int, int]], rnd: Any, tid: str
) -> None:
    """Any parent graph over unique span ids (self-parents, cycles, orphans) imports with every
    span, and the stored trace does not depend on the order the spans arrive in."""
    ids = [f"{i + 1:016x}" for i in range(len(links))]
    spans = [
        sp(tid, ids[i], ids[p] if p < len(ids) else None, f"s{i}", start)
        for i, (p, start) in enumerate(links)
    ]
    shuffled = list(spans)
    rnd.shuffle(shuffled)
    seen = []
    for order in (spans, shuffled):
        with tempfile.TemporaryDirectory() as folder:
            store = open_store(Path(folder) / "s")
            result = import_otlp(store, [request(*order)])
            assert result.imported == [tid] and result.rejected == 0
            view = load_trace(store, tid)
            assert set(ids) <= {s.span_id for s in view.steps} | {view.span_id}
            seen.append(
                [(s.name, s.parent_position, s.span_id) for s in view.steps]
                + [(n.output_hash, n.state_hash) for n in store.nodes_of(tid)]
            )
            store.close()
    assert seen[0] == seen[1]


def test_an_oversized_chunked_body_is_cut_off_while_read(tmp_path: Path) -> None:
    v = Via("http", tmp_path)
    chunk = b" " * (1 << 20)

    def body() -> Iterator[bytes]:  # no Content-Length: only counting the stream can stop it
        for _ in range(MAX_OTLP_BYTES // len(chunk) + 2):
            yield chunk

    assert v.client is not None
    r = v.client.post(
        "/api/otlp/v1/traces", content=body(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413 and "larger than" in r.json()["message"]
    v.client.close()
    v.store.close()


def test_the_console_script_refuses_a_deep_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"resourceSpans": ' + "[" * 3000 + "]" * 3000 + "}")
    folder = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-m", "rewind.cli", "--store", str(folder), "otel", "import", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"COLUMNS": "400", "PYTHONPATH": str(Path(rewind.__file__).parents[1])},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"deeper than {MAX_OTLP_DEPTH} levels" in lines[0]
    assert "Traceback" not in proc.stderr and not folder.exists()


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"steps": [{"name": "a", "prompt_tokens": 10**30}]}, "steps.0.prompt_tokens"),
        ({"steps": [{"name": "a", "start_time": 1e300}]}, "steps[0].start_time 1e+300 is not"),
        ({"start_time": -5.0}, "start_time -5.0 is not a time"),
        ({"steps": [{"name": "a", "start_time": 10.0, "end_time": 5.0}]}, "steps[0].end_time is"),
        ({"start_time": "2024-05-01T12:00:00Z", "end_time": "2024-05-01T11:00:00Z"}, "end_time"),
        ({"input": json.loads("[" * 500 + "]" * 500)}, "input cannot be hashed"),
    ],
)
def test_trace_documents_with_impossible_values_are_refused(
    doc: dict[str, Any], words: str, tmp_path: Path
) -> None:
    """``POST /api/traces`` (same router as the receiver): values the store cannot keep or a
    reader cannot show are a 422 naming the field, never a 500 or a stored nonsense trace."""
    v = Via("http", tmp_path)
    assert v.client is not None
    r = v.client.post("/api/traces", json={"name": "x"} | doc)
    assert r.status_code == 422 and words in r.json()["message"], r.text
    assert len(r.json()["message"]) < 400
    assert counts(v.store)["runs"] == 0
    v.client.close()
    v.store.close()


def test_spans_waiting_for_their_root_are_bounded_in_bytes(tmp_path: Path) -> None:
    """Orphan spans with large attributes cannot pile up in memory: past ``max_bytes`` the
    oldest waiting trace is dropped and its spans counted as rejected."""
    store = open_store(tmp_path / "s")
    receiver = OtlpReceiver(store, max_bytes=250_000)
    pad = [{"key": "pad", "value": {"stringValue": "x" * 100_000}}]
    answers = [
        receiver.receive_json(
            json.dumps(request(sp(tid, A, ROOT, "orphan", attributes=pad))).encode()
        )
        for tid in (T1, T2, "3" * 32)
    ]
    assert answers[:2] == [{}, {}]
    assert answers[2]["partialSuccess"]["rejectedSpans"] == 1
    assert f"trace {T1}: dropped" in answers[2]["partialSuccess"]["errorMessage"]
    assert receiver.waiting == 2
    store.close()


def test_otel_import_prints_each_rejection_and_exits_by_outcome(tmp_path: Path) -> None:
    """Text output: one line per rejected span naming span and field; exit 1 when the rest was
    imported, 2 when nothing could be, 0 when all was."""
    bad = sp(T1, A, None, "bad", attributes=[{"key": "x", "value": {"doubleValue": None}}])
    folder = tmp_path / "store"
    cases = [
        (request(bad, sp(T2, B, None, "clean")), 1),
        (request(sp("3" * 32, A, None, "bad", endTimeUnixNano="1")), 2),
        (request(sp("4" * 32, A, None, "fine")), 0),
    ]
    for n, (doc, code) in enumerate(cases):
        path = tmp_path / f"{n}.json"
        path.write_text(json.dumps(doc))
        r = CliRunner().invoke(cli_app, ["--store", str(folder), "otel", "import", str(path)])
        assert r.exit_code == code, r.output
        rejected = [line for line in r.stdout.splitlines() if line.startswith("rejected:")]
        assert len(rejected) == (0 if code == 0 else 1), r.stdout
    again = CliRunner().invoke(
        cli_app, ["--store", str(tmp_path / "again"), "otel", "import", str(tmp_path / "0.json")]
    )
    text = " ".join(again.stdout.split())  # the console may wrap a long line
    assert f'span {A} of trace {T1}: attributes["x"].value.doubleValue is null' in text


def test_spans_of_one_trace_split_across_files_import_together(tmp_path: Path) -> None:
    """An exporter that flushed one trace into two files: both files in one command give the
    whole trace; the second file imported on its own later is refused, never dropped silently."""
    part1 = tmp_path / "part1.json"
    part2 = tmp_path / "part2.json"
    part1.write_text(json.dumps(request(sp(T1, ROOT, None, "chain"), sp(T1, A, ROOT, "a", 10))))
    part2.write_text(json.dumps(request(sp(T1, B, ROOT, "b", 20), sp(T1, C, ROOT, "c", 30))))

    together = tmp_path / "together"
    r = CliRunner().invoke(
        cli_app, ["--store", str(together), "otel", "import", str(part1), str(part2), "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["imported"] == [T1]
    store = open_store(together)
    assert len(load_trace(store, T1).steps) == 3
    store.close()

    apart = tmp_path / "apart"
    first = CliRunner().invoke(cli_app, ["--store", str(apart), "otel", "import", str(part1)])
    assert first.exit_code == 0, first.output

    def rows() -> dict[str, int]:
        s = open_store(apart)
        try:
            return counts(s)
        finally:
            s.close()

    before = rows()
    second = CliRunner().invoke(
        cli_app, ["--store", str(apart), "otel", "import", str(part2), "--json"]
    )
    assert second.exit_code == 2, second.output  # nothing imported, spans refused
    out = json.loads(second.stdout)
    assert out["rejected"] == 2 and out["skipped"] == [T1]
    assert "already stored without these spans" in out["errors"][0]
    assert "part1.json part2.json" in out["errors"][0]
    assert rows() == before
    resent = CliRunner().invoke(cli_app, ["--store", str(apart), "otel", "import", str(part1)])
    assert resent.exit_code == 0, resent.output  # re-sending the same file stays harmless


def test_the_receiver_refuses_new_spans_of_a_stored_trace_once(tmp_path: Path) -> None:
    """Over HTTP, a late batch for a stored trace counts each of its spans rejected once."""
    v = Via("http", tmp_path)
    try:
        status, _ = v.send(request(sp(T1, ROOT, None, "chain"), sp(T1, A, ROOT, "a", 10)))
        assert status == 200
        status, out = v.send(request(sp(T1, B, ROOT, "b", 20), sp(T1, ROOT, None, "chain")))
        assert status == 200
        n, reasons = v.rejected(out)
        assert n == 2, out
        assert "already stored without these spans" in reasons
    finally:
        assert v.client is not None
        v.client.close()
        v.store.close()
