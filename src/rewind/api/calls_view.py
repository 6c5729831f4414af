"""The prompts and responses of a node's calls, as the HTTP API shows them.

Every call row references two blobs: the canonical request bytes (the keyed meaning of a chat
request, a captured HTTP request ``{method, url, headers, body}``, or a tool's arguments) and the
result bytes (a chat-completions response, a captured response envelope, or a tool's result).
:func:`call_detail` reads both and lays them out for people: an LLM call as messages with roles,
params, tools and response schema, and a response as content, tool calls, finish reason and
usage; a tool call as its arguments and result. Long strings and lists are cut to a bound so a
node page stays small; a cut body says how many bytes the whole has and where to fetch it
(:func:`blob_url`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import suppress
from typing import Any
from urllib.parse import quote

from rewind.capture.exchange import decode_envelope
from rewind.errors import StoreError
from rewind.store import CallRecord, Store

STRING_LIMIT = 4_000
"""Characters of one string kept in a call's detail (the rest is cut with a marker)."""
LIST_LIMIT = 200
"""Items of one list kept in a call's detail."""
_CHAT_FIELDS = ("messages", "tools", "response_format", "tool_choice", "functions")
PAGE = 50
"""Calls laid out in a node's page (``GET .../nodes/{n}``); the calls route pages the rest."""


def blob_url(run_id: str, number: int, index: int, part: str) -> str:
    """The API path serving the whole ``part`` (``request`` or ``response``) blob of a call."""
    return f"/api/runs/{quote(run_id, safe='')}/nodes/{number}/calls/{index}/{part}"


class _Clipper:
    """Cuts long strings and lists of a JSON value, counting whether anything was cut."""

    def __init__(self) -> None:
        self.cut = False

    def clip(self, value: Any) -> Any:
        if isinstance(value, str):
            if len(value) <= STRING_LIMIT:
                return value
            self.cut = True
            return f"{value[:STRING_LIMIT]}… [{len(value) - STRING_LIMIT:,} more characters]"
        if isinstance(value, list):
            kept = [self.clip(v) for v in value[:LIST_LIMIT]]
            if len(value) > LIST_LIMIT:
                self.cut = True
                kept.append(f"… [{len(value) - LIST_LIMIT:,} more items]")
            return kept
        if isinstance(value, dict):
            return {str(k): self.clip(v) for k, v in value.items()}
        return value


def _json(data: bytes | None) -> Any:
    """JSON of a blob, or its text when it is not JSON (None when there is no blob)."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def _message(m: Any) -> dict[str, Any]:
    """One chat message: role, content (text, or the parts as given), tool calls, name."""
    if not isinstance(m, Mapping):
        return {"role": "?", "content": m}
    out: dict[str, Any] = {"role": str(m.get("role", "?")), "content": m.get("content")}
    for extra in ("name", "tool_calls", "tool_call_id"):
        if m.get(extra) is not None:
            out[extra] = m[extra]
    return out


def llm_request(doc: Any) -> dict[str, Any]:
    """An LLM request laid out: ``endpoint`` (captured calls), ``messages``, ``params``,
    ``tools``, ``response_schema``. ``doc`` is the parsed request blob."""
    endpoint = None
    if isinstance(doc, Mapping) and "body" in doc and "method" in doc:
        endpoint = f"{doc.get('method')} {doc.get('url')}"
        doc = doc["body"]
    if not isinstance(doc, Mapping):
        return {"endpoint": endpoint, "messages": [], "params": {}, "tools": None, "body": doc}
    messages = doc.get("messages")
    if not isinstance(messages, list):
        messages = []
        if doc.get("system") is not None:
            messages.append({"role": "system", "content": doc["system"]})
        if doc.get("prompt") is not None:
            messages.append({"role": "user", "content": doc["prompt"]})
    elif doc.get("system") is not None:  # Anthropic keeps the system prompt beside the messages
        messages = [{"role": "system", "content": doc["system"]}, *messages]
    return {
        "endpoint": endpoint,
        "messages": [_message(m) for m in messages],
        "params": {
            k: v for k, v in doc.items() if k not in _CHAT_FIELDS and k not in ("system", "prompt")
        },
        "tools": doc.get("tools") or doc.get("functions"),
        "tool_choice": doc.get("tool_choice"),
        "response_schema": doc.get("response_format"),
    }


def _streamed(events: tuple[bytes, ...]) -> Any:
    """Fold server-sent chat-completion chunks into one response document."""
    content: list[str] = []
    finish = None
    usage = None
    for event in events:
        for line in event.decode("utf-8", errors="replace").splitlines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            try:
                chunk = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(chunk, Mapping):
                continue
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    content.append(delta["content"])
                finish = choice.get("finish_reason") or finish
            if chunk.get("type") == "content_block_delta":  # Anthropic
                text = (chunk.get("delta") or {}).get("text")
                if isinstance(text, str):
                    content.append(text)
    return {
        "choices": [{"message": {"content": "".join(content)}, "finish_reason": finish}],
        "usage": usage,
        "streamed_events": len(events),
    }


def llm_response(data: bytes | None) -> dict[str, Any]:
    """An LLM response laid out: ``status`` (captured calls), ``content``, ``tool_calls``,
    ``finish_reason``, ``usage``, ``streamed_events``. ``data`` is the result blob."""
    status, doc = _response_doc(data)
    out: dict[str, Any] = {
        "status": status,
        "content": None,
        "tool_calls": None,
        "finish_reason": None,
        "usage": None,
        "streamed_events": None,
    }
    if not isinstance(doc, Mapping):
        out["content"] = doc
        return out
    out["usage"] = doc.get("usage")
    out["streamed_events"] = doc.get("streamed_events")
    return out | _answer(doc)


def _response_doc(data: bytes | None) -> tuple[int | None, Any]:
    """The HTTP status (captured calls, else None) and the response document of a result blob:
    a captured envelope is opened (a streamed body folded into one document)."""
    doc: Any = _json(data)
    if isinstance(doc, Mapping) and "v" in doc and "status" in doc and data is not None:
        try:
            recorded = decode_envelope(data)
        except (ValueError, KeyError, TypeError):
            return None, doc
        if recorded.events is not None:
            return recorded.status, _streamed(recorded.events)
        return recorded.status, _json(recorded.body)
    return None, doc


def _answer(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``content``, ``tool_calls`` and ``finish_reason`` of a response document (OpenAI chat
    completions, Anthropic messages, an error, or anything else as the content)."""
    out: dict[str, Any] = {}
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        first = choices[0]
        message = first.get("message") or {}
        out["content"] = message.get("content", first.get("text"))
        out["tool_calls"] = message.get("tool_calls")
        out["finish_reason"] = first.get("finish_reason")
    elif isinstance(doc.get("content"), list):  # Anthropic messages
        blocks = doc["content"]
        typed = [b for b in blocks if isinstance(b, Mapping)]
        texts = [b.get("text") for b in typed if b.get("type") == "text"]
        uses = [b for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"]
        out["content"] = "".join(t for t in texts if isinstance(t, str))
        out["tool_calls"] = uses or None
        out["finish_reason"] = doc.get("stop_reason")
    elif "error" in doc and isinstance(doc.get("message"), str):
        # a model call that raised (rewind.call.failure_bytes): its error type and message
        out["content"] = f"{doc['error']}: {doc['message']}"
    elif "error" in doc:
        out["content"] = doc["error"]
    else:
        out["content"] = doc
    return out


def call_detail(
    call: CallRecord, blobs: Mapping[str, bytes], *, run_id: str, number: int
) -> dict[str, Any]:
    """One call with its request and response laid out, bounded.

    Args:
        call: the call row.
        blobs: request/result blob bytes by hash (a missing one shows as null).
        run_id: the run the call belongs to; number: its node's 1-based number (for the URLs of
            the whole blobs).
    Returns:
        the call's row fields plus ``request`` and ``response`` (for an LLM call the layouts of
        :func:`llm_request` / :func:`llm_response`; for a tool call ``{"args": …}`` and
        ``{"result": …}``), and per part ``{part}_bytes``, ``{part}_truncated`` and
        ``{part}_url``.
    """
    request_bytes = blobs.get(call.request_hash)
    result_bytes = blobs.get(call.result_hash) if call.result_hash else None
    out: dict[str, Any] = {
        "index": call.call_index,
        "kind": call.kind,
        "name": call.name,
        "key": call.key,
        "request_hash": call.request_hash,
        "result_hash": call.result_hash,
        "outcome": call.outcome,
        "reason": call.reason,
        "label": call.label,
        "determinism": call.determinism,
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
        "tokens": call.prompt_tokens + call.completion_tokens,
        "latency_ms": round(call.latency_ms, 3),
        "produced_at": call.produced_at,
    }
    if call.kind == "llm":
        request: Any = llm_request(_json(request_bytes))
        response: Any = llm_response(result_bytes)
    else:
        request = {"args": _json(request_bytes)}
        response = {"result": _json(result_bytes)}
    for part, value, data in (
        ("request", request, request_bytes),
        ("response", response, result_bytes),
    ):
        clipper = _Clipper()
        out[part] = clipper.clip(value)
        out[f"{part}_bytes"] = None if data is None else len(data)
        out[f"{part}_truncated"] = clipper.cut
        url = None if data is None else blob_url(run_id, number, call.call_index, part)
        out[f"{part}_url"] = url
    return out


def calls_detail(
    store: Store, run_id: str, number: int, calls: list[CallRecord]
) -> list[dict[str, Any]]:
    """:func:`call_detail` of each of a node's calls, reading their blobs in one query.

    A blob the store lacks (collected by ``rewind gc``) shows as null rather than failing."""
    wanted = [c.request_hash for c in calls] + [c.result_hash for c in calls if c.result_hash]
    try:
        blobs = store.get_blobs(wanted)
    except StoreError:
        blobs = {}
        for digest in dict.fromkeys(wanted):
            with suppress(StoreError):
                blobs.update(store.get_blobs([digest]))
    return [call_detail(c, blobs, run_id=run_id, number=number) for c in calls]
