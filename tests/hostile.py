"""Hostile text and the pipelines, traces and OTLP files that carry it into a store.

``HOSTILE`` holds Rich markup (``[red]`` would re-colour, ``[/x]`` crashes a markup parser), an
erase-screen sequence, an OSC 8 hyperlink, a bell, a carriage return and a right-to-left
override. Rendered inertly it must appear exactly as :data:`SHOWN`; none of :data:`RAW_CONTROLS`
may reach the output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from burr.core import State, action, default
from burr.core.graph import GraphBuilder

import rewind
from rewind.replay import Pipeline
from rewind.tools import tool
from rewind.tracing import Tracer, step

HOSTILE = "h[red]x[/x]\x1b[2J\x1b]8;;u\x07\r\u202eZ"
SHOWN = "h[red]x[/x]\\u001b[2J\\u001b]8;;u\\u0007\\r\\u202eZ"
"""How ``HOSTILE`` must appear on screen: markup literal, every control written as an escape."""
RAW_CONTROLS = ("\x1b[2J", "\x1b]8", "\x07", "\r", "\u202e")
NODE = f"n{HOSTILE}"
"""A node (Burr action) and step name."""


@tool("hostile_tag")
def hostile_tag(text: str) -> str:
    return text + "!"


@action(reads=["x"], writes=["note"])
def _first(state: State) -> State:
    return state.update(note=hostile_tag(f"{state['x']}{rewind.param('tag', 'a')}"))


@action(reads=["note"], writes=["never"])
def _boom(state: State) -> State:
    raise RuntimeError(f"exploded: {HOSTILE}")


pipeline = Pipeline(
    name=f"p{HOSTILE}",
    graph=GraphBuilder()
    .with_actions(**{NODE: _first, "boom": _boom})
    .with_transitions((NODE, "boom", default))
    .build(),
    entrypoint=NODE,
    ref="tests.hostile:pipeline",
)
"""Two nodes: the first (named hostile) writes a hostile state value through a tool and reads a
string param ``tag``; the second raises an error whose message is hostile."""


TRACER = Tracer()


@TRACER.chain(f"c{HOSTILE}")
def chain(question: str, fail: bool = False) -> str:
    """A traced chain: a hostile step name and output; with ``fail``, a hostile error."""
    with step(NODE, "retrieval", input={"q": question}) as s:
        s.set_output(f"{question}{HOSTILE}")
    with step("parse", "parse", input=question):
        if fail:
            raise ValueError(f"bad {HOSTILE}")
    return question


def otlp_file(path: Path, trace_id: str = "5b8aa5a2d2c872e8321cf37308d69df2") -> Path:
    """An OTLP/JSON export whose service, span name, attribute and status message are hostile."""

    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    def span(span_id: str, parent: str | None, name: str, key: str, error: str) -> dict[str, Any]:
        start = 1_700_000_000_000_000_000 + (100_000_000 if parent else 0)
        out: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": f"{name}{HOSTILE}",
            "kind": 1,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 800_000_000),
            "attributes": [attr(key, HOSTILE)],
            "status": {"code": 2, "message": f"{error} {HOSTILE}"},
        }
        if parent:
            out["parentSpanId"] = parent
        return out

    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [attr("service.name", f"s{HOSTILE}")]},
                "scopeSpans": [
                    {
                        "spans": [
                            span("051581bf3cb55c13", None, "root", "input.value", "bad"),
                            span(
                                "151581bf3cb55c14",
                                "051581bf3cb55c13",
                                "child",
                                "output.value",
                                "child failed",
                            ),
                        ]
                    }
                ],
            }
        ]
    }
    path.write_text(json.dumps(body))
    return path
