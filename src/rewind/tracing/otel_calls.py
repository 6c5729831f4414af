"""Recorded model and tool calls of imported spans: the cache entries an import seeds.

An imported trace can be replayed offline only if each recorded call becomes a cache entry that a
replay finds by the key it computes itself. This module reads the call a span recorded, in the
three common LLM instrumentation conventions:

* **OpenTelemetry GenAI** semantic conventions: ``gen_ai.request.model`` and the
  ``gen_ai.request.*`` parameters; messages as ``gen_ai.input.messages`` /
  ``gen_ai.system_instructions`` / ``gen_ai.output.messages`` (current, parts-based), or as span
  events ``gen_ai.{system,user,assistant,tool}.message`` and ``gen_ai.choice`` (previous), or as
  ``gen_ai.content.prompt``/``gen_ai.content.completion`` events (oldest).
* **OpenInference**: ``llm.model_name``, ``llm.invocation_parameters`` (JSON),
  ``llm.input_messages.N.message.*``, ``llm.output_messages.N.message.*``; TOOL spans.
* **OpenLLMetry** (Traceloop): ``gen_ai.prompt.N.*``, ``gen_ai.completion.N.*``.

**Keys.** A model call is keyed exactly as :func:`rewind.calls.chat` keys it
(:func:`rewind.llm.llm_cache_key`: model + every output-affecting parameter + exact messages,
the endpoint URL deliberately left out), so a replay — of the recorded calls, or of the chain's
code calling ``rewind.calls.chat`` — finds the seeded entry. The endpoint identity of an imported
call is therefore its **model name** (``gen_ai.request.model``, ``llm.model_name`` or the
``model`` invocation parameter); the provider (``gen_ai.system``, ``gen_ai.provider.name``,
``llm.provider``, ``server.address``) is kept on the step as ``provider`` to say where a
re-sent call should go: a replay must be pointed (``REWIND_BASE_URL``/``REWIND_MODEL``) at an
endpoint serving that model. Calls captured at the HTTP layer (``rewind.capture``) are keyed by
the wire body, which spans do not record; they are not seeded.

**Parameters.** The GenAI and OpenLLMetry conventions record a request parameter only when it was
sent, so an absent one is the provider default (which is how the key fills it in). OpenInference
records all sent parameters in ``llm.invocation_parameters``; a span without it cannot say what
was sent, so its call is not replayable. A call is marked not replayable, with the reason, when
its model, input messages or answer are not recorded (message content capture off), or a message
holds parts Rewind cannot rebuild. Nothing is guessed silently.

**Tools.** A tool span (``gen_ai.operation.name = execute_tool``, OpenInference ``TOOL``) becomes
a tool cache entry ``key_of("tool/v1", name, canonical args)`` — the key ``@rewind.tool`` uses —
with the recorded result; its determinism is unknown, so a replay serves it only for the same
arguments. The arguments are ``gen_ai.tool.call.arguments``, OpenInference's
``tool_call.function.arguments`` or ``input.value``; ``tool.parameters`` (the tool's parameter
definition in the OpenInference spec) only when none of those is recorded.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.context import PendingWrite
from rewind.llm import llm_cache_key
from rewind.store.records import CallRecord, stored_name

__all__ = [
    "RecordedCall",
    "calls_of_span",
    "entries_of",
    "exported_calls",
    "exported_calls_attribute",
    "indexed_attributes",
    "response_body",
]

IMPORTED = "imported"
"""The reason on an imported call: it was recorded elsewhere, not made by Rewind."""

_GENAI_PARAMS = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.top_k": "top_k",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.presence_penalty": "presence_penalty",
    "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.choice.count": "n",
    "gen_ai.openai.request.seed": "seed",
}
_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


@dataclass(frozen=True)
class RecordedCall:
    """One call a span recorded.

    Attributes:
        kind: ``"llm"`` or ``"tool"``.
        name: the model or tool name.
        request: the request: a chat-completions body (``model``, ``messages``, parameters) for
            a model call, the arguments object for a tool call.
        response: a chat-completions response body, or the tool's result.
        prompt_tokens, completion_tokens: tokens the recorded call spent.
        problems: why the call cannot be replayed faithfully (empty: it can).
        convention: ``genai``, ``openinference``, ``openllmetry`` or ``rewind``.
        provider: where the call went (``openai``, ``api.openai.com``...), when recorded.
    """

    kind: str
    name: str
    request: Any
    response: Any
    prompt_tokens: int = 0
    completion_tokens: int = 0
    problems: tuple[str, ...] = ()
    convention: str = ""
    provider: str | None = None
    determinism: str = "deterministic"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def replayable(self) -> bool:
        """True when the request and answer are recorded completely."""
        return not self.problems


def calls_of_span(
    attributes: Mapping[str, Any], events: Sequence[Mapping[str, Any]], step_type: str
) -> list[RecordedCall]:
    """The model or tool call a foreign span recorded (at most one), or none.

    Args:
        attributes: the span's attributes (decoded OTLP values).
        events: the span's events (``{"name", "attributes"}``).
        step_type: the step type the import gave the span (``llm_call``, ``tool_call``...).
    Returns:
        ``[call]`` — check ``call.problems`` — or ``[]`` for a span that records no call.
    """
    if step_type == "llm_call":
        return [_model_call(attributes, events)]
    if step_type == "tool_call":
        tool = _tool_call(attributes)
        return [tool] if tool is not None else []
    return []


def response_body(
    model: str,
    content: str | None,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    response_id: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat-completions response body rebuilt from a span's recorded answer (what
    :meth:`rewind.llm.ChatResponse.from_raw` reads: ``choices[0].message``, ``usage``)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": response_id or "",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def entries_of(
    calls: Sequence[RecordedCall], produced_at: float | None
) -> tuple[list[CallRecord], list[PendingWrite]]:
    """The call rows and cache entries of a step's replayable recorded calls.

    Keys: :func:`rewind.llm.llm_cache_key` of the request for a model call, ``key_of("tool/v1",
    name, canonical args)`` for a tool call. Request bytes: canonical JSON of the request as
    recorded (model call) or of the args; result bytes: canonical JSON of the response / result.

    Raises:
        rewind.canonical.CanonicalError: a value cannot be hashed (NaN...).
    """
    records: list[CallRecord] = []
    pending: list[PendingWrite] = []
    for c in calls:
        if not c.replayable:
            continue
        if c.kind == "llm":
            request = canonical_bytes(c.request)  # as sent; the key fills in the defaults
            key = llm_cache_key(c.request)
        else:
            request = canonical_bytes(c.request)
            key = key_of("tool/v1", c.name, request)
        result = canonical_bytes(c.response)
        result_hash = sha256_hex(result)
        records.append(
            CallRecord(
                len(records),
                c.kind,
                stored_name(c.name),
                key,
                sha256_hex(request),
                result_hash,
                "miss",
                IMPORTED,
                c.prompt_tokens,
                c.completion_tokens,
                determinism=c.determinism,
                produced_at=produced_at,
            )
        )
        pending.append(
            PendingWrite(
                c.kind,
                key,
                stored_name(c.name),
                sha256_hex(request),
                request,
                result_hash,
                result,
                c.prompt_tokens,
                c.completion_tokens,
                produced_at=produced_at,
            )
        )
    return records, pending


# -- Rewind's own export ----------------------------------------------------------------------


def exported_calls_attribute(calls: Sequence[CallRecord], blobs: Mapping[str, bytes]) -> str:
    """The ``rewind.calls`` span attribute: a step's calls with their request and response bytes
    (UTF-8 text, or ``{"b64": ...}``), keys and determinism flags, so that an import into an empty
    store seeds the same cache entries and an unchanged replay spends 0 tokens.

    Args:
        calls: the step's call rows.
        blobs: blob bytes by sha256 hex (requests and results of ``calls``); a missing blob leaves
            the call out of the attribute's bytes (``request``/``response`` null).
    """
    out = []
    for c in calls:
        out.append(
            {
                "index": c.call_index,
                "kind": c.kind,
                "name": c.name,
                "key": c.key,
                "outcome": c.outcome,
                "reason": c.reason,
                "determinism": c.determinism,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "latency_ms": c.latency_ms,
                "produced_at": c.produced_at,
                "request": _text(blobs.get(c.request_hash)),
                "response": _text(blobs.get(c.result_hash or "")),
            }
        )
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def exported_calls(value: Any) -> tuple[list[CallRecord], list[PendingWrite]]:
    """Call rows and cache entries from a ``rewind.calls`` attribute (see
    :func:`exported_calls_attribute`). A call without its bytes keeps its row but seeds nothing;
    side-effecting calls never seed the shared cache (DESIGN: a side effect is never served from
    it), only the run's lineage; a ``failed`` call (its bytes are its error's document) keeps
    its row and blob and seeds no entry. Malformed entries are left out; a missing attribute gives
    nothing."""
    items = _json(value) if isinstance(value, str) else None
    records: list[CallRecord] = []
    pending: list[PendingWrite] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or item.get("kind") not in ("llm", "tool"):
            continue
        request, response = _bytes(item.get("request")), _bytes(item.get("response"))
        key, name = item.get("key"), item.get("name")
        if request is None or not isinstance(key, str) or not isinstance(name, str):
            continue
        determinism = str(item.get("determinism") or "deterministic")
        produced = item.get("produced_at")
        produced = float(produced) if isinstance(produced, int | float) else None
        result_hash = sha256_hex(response) if response is not None else None
        records.append(
            CallRecord(
                item["index"] if isinstance(item.get("index"), int) else len(records),
                item["kind"],
                stored_name(name),
                key,
                sha256_hex(request),
                result_hash,
                str(item.get("outcome") or "miss"),
                str(item.get("reason") or IMPORTED),
                _count(item.get("prompt_tokens")),
                _count(item.get("completion_tokens")),
                float(item.get("latency_ms") or 0.0),
                determinism=determinism,
                produced_at=produced,
            )
        )
        if response is not None and result_hash is not None:
            pending.append(
                PendingWrite(
                    item["kind"],
                    key,
                    stored_name(name),
                    sha256_hex(request),
                    request,
                    result_hash,
                    response,
                    _count(item.get("prompt_tokens")),
                    _count(item.get("completion_tokens")),
                    # a side effect served from record, or a failure's document: no answer
                    cacheable=determinism != "side-effect"
                    and item.get("outcome") not in ("served", "failed"),
                    produced_at=produced,
                )
            )
    return records, pending


def _text(data: bytes | None) -> str | dict[str, str] | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode("ascii")}


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, Mapping) and isinstance(value.get("b64"), str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            return None
    return None


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and 0 <= value < 2**63 else 0


# -- model calls -------------------------------------------------------------------------------


def _model_call(a: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> RecordedCall:
    problems: list[str] = []
    convention, messages, output = _messages(a, events, problems)
    params = _request_params(a, convention, problems)
    model = params.pop("model", None) or a.get("gen_ai.request.model") or a.get("llm.model_name")
    if not isinstance(model, str) or not model:
        problems.append("the request's model is not recorded (gen_ai.request.model)")
        model = ""
    if not messages:
        problems.append(
            "the input messages are not recorded (was message content capture on? e.g. "
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)"
        )
    content, finish, tool_calls = output if output is not None else (None, None, None)
    if output is None:
        problems.append("the answer is not recorded (output messages)")
    finish = _finish_reason(a, finish)
    prompt, completion = _usage(a)
    response_model = a.get("gen_ai.response.model") or model
    body = {"model": model, "messages": messages, **params}
    temperature = params.get("temperature", 1.0)
    provider = _provider(a)
    return RecordedCall(
        "llm",
        model,
        body,
        response_body(
            str(response_model),
            content,
            finish if isinstance(finish, str) else None,
            prompt,
            completion,
            response_id=str(a.get("gen_ai.response.id") or "") or None,
            tool_calls=tool_calls,
        ),
        prompt,
        completion,
        tuple(problems),
        convention,
        str(provider) if provider else None,
        "non-deterministic"
        if isinstance(temperature, int | float) and temperature > 0
        else "deterministic",
    )


def _finish_reason(a: Mapping[str, Any], finish: Any) -> Any:
    """The answer's finish reason: from the output message, else the span's attributes."""
    if isinstance(finish, list):
        finish = finish[0] if finish else None
    return finish or _first(a.get("gen_ai.response.finish_reasons")) or a.get("llm.finish_reason")


def _usage(a: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt tokens, completion tokens) under the GenAI names, else OpenInference's."""
    prompt = _tokens(a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
    prompt = prompt or _tokens(a, "llm.token_count.prompt")
    completion = _tokens(a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
    completion = completion or _tokens(a, "llm.token_count.completion")
    return prompt, completion


def _request_params(a: Mapping[str, Any], convention: str, problems: list[str]) -> dict[str, Any]:
    """The request's parameters (``temperature``, ``max_tokens``, ``response_format``...; may
    hold ``model``): OpenInference's invocation parameters, else the GenAI attributes."""
    if convention == "openinference":
        invocation = _json(a.get("llm.invocation_parameters"))
        if isinstance(invocation, dict):
            return {k: v for k, v in invocation.items() if k not in ("messages", "stream")}
        problems.append("llm.invocation_parameters is not recorded (the request's parameters)")
        return {}
    params: dict[str, Any] = {}
    for attr, name in _GENAI_PARAMS.items():
        if a.get(attr) is not None:
            params[name] = a[attr]
    fmt = a.get("gen_ai.openai.request.response_format") or a.get("gen_ai.output.type")
    if fmt in ("json_object", "json"):
        params["response_format"] = {"type": "json_object"}
    elif fmt not in (None, "text"):
        problems.append(f"the response format {fmt!r} is recorded without its schema")
    if any(k.startswith("llm.request.functions.") for k in a):
        problems.append("the tool definitions (llm.request.functions.*) are not replayed")
    return params


def _provider(a: Mapping[str, Any]) -> Any:
    """The model provider as the span names it (``gen_ai.provider.name`` and older names)."""
    return (
        a.get("gen_ai.provider.name")
        or a.get("gen_ai.system")
        or a.get("llm.provider")
        or a.get("llm.system")
        or a.get("server.address")
    )


_Output = tuple[str | None, Any, list[dict[str, Any]] | None]


def _messages(
    a: Mapping[str, Any], events: Sequence[Mapping[str, Any]], problems: list[str]
) -> tuple[str, list[dict[str, Any]], _Output | None]:
    """(convention, request messages, (content, finish reason, tool calls) or None)."""
    if any(k.startswith("llm.input_messages.") for k in a) or "llm.invocation_parameters" in a:
        ins = [_oi_message(m, problems) for m in indexed_attributes(a, "llm.input_messages")]
        outs = [_oi_message(m, problems) for m in indexed_attributes(a, "llm.output_messages")]
        return "openinference", ins, _answer(outs[0]) if outs else None
    if any(k.startswith("gen_ai.prompt.") for k in a):
        return _openllmetry_messages(a)
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        return _genai_messages(a, problems)
    return _event_messages(events)


def _openllmetry_messages(a: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]], _Output | None]:
    """OpenLLMetry's flattened ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``."""
    ins = [_plain_message(m) for m in indexed_attributes(a, "gen_ai.prompt")]
    outs = indexed_attributes(a, "gen_ai.completion")
    if not outs:
        return "openllmetry", ins, None
    first = outs[0]
    answer = _answer(_plain_message(first))
    return "openllmetry", ins, (answer[0], first.get("finish_reason"), answer[2])


def _genai_messages(
    a: Mapping[str, Any], problems: list[str]
) -> tuple[str, list[dict[str, Any]], _Output | None]:
    """The GenAI conventions' JSON ``gen_ai.input.messages`` / ``gen_ai.output.messages``."""
    ins = []
    system = _json(a.get("gen_ai.system_instructions"))
    if isinstance(system, list) and system:
        ins.append({"role": "system", "content": _parts_text(system, problems)})
    for m in _json(a.get("gen_ai.input.messages")) or []:
        ins.append(_parts_message(m, problems))
    outs = _json(a.get("gen_ai.output.messages")) or []
    if outs and isinstance(outs[0], Mapping):
        msg = _parts_message(outs[0], problems)
        return "genai", ins, (msg.get("content"), outs[0].get("finish_reason"), None)
    return "genai", ins, None


def _event_messages(
    events: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]], _Output | None]:
    """The older GenAI conventions: messages and the choice as span events."""
    ins: list[dict[str, Any]] = []
    output: _Output | None = None
    for e in events:
        name, ea = e.get("name"), e.get("attributes") or {}
        if name in _EVENT_ROLES:
            ins.append(_event_message(name, ea))
        elif name == "gen_ai.choice" and output is None:
            body = _json(ea.get("gen_ai.event.content")) or dict(ea)
            message = body.get("message") if isinstance(body.get("message"), Mapping) else {}
            output = (message.get("content"), body.get("finish_reason"), message.get("tool_calls"))
        elif name == "gen_ai.content.prompt":
            prompt = _json(ea.get("gen_ai.prompt"))
            ins = [dict(m) for m in prompt] if isinstance(prompt, list) else ins
        elif name == "gen_ai.content.completion":
            done = _json(ea.get("gen_ai.completion"))
            if isinstance(done, list) and done and isinstance(done[0], Mapping):
                output = (done[0].get("content"), None, None)
    return "genai", ins, output


def _event_message(name: str, ea: Mapping[str, Any]) -> dict[str, Any]:
    """One ``gen_ai.{system,user,assistant,tool}.message`` event as a chat message."""
    body = _json(ea.get("gen_ai.event.content")) or {k: v for k, v in ea.items()}
    msg = {"role": body.get("role") or _EVENT_ROLES[name], "content": body.get("content")}
    if body.get("tool_calls"):
        msg["tool_calls"] = body["tool_calls"]
    if body.get("id") and name == "gen_ai.tool.message":
        msg["tool_call_id"] = body["id"]
    return msg


def indexed_attributes(
    a: Mapping[str, Any], prefix: str, *, strip: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """``prefix.N.rest`` attributes as one dict per N (in N order), keys ``rest`` (minus a
    leading ``strip`` part such as ``message.``): how the conventions flatten message lists."""
    items: dict[int, dict[str, Any]] = {}
    skip = f"(?:{'|'.join(re.escape(x) for x in strip)})?" if strip else ""
    pat = re.compile(rf"^{re.escape(prefix)}\.([0-9]{{1,9}})\.{skip}(.+)$")
    for k, v in a.items():
        m = pat.match(k)
        if m:
            items.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return [items[i] for i in sorted(items)]


def _oi_message(flat: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    inner = {k.removeprefix("message."): v for k, v in flat.items()}
    msg: dict[str, Any] = {"role": inner.get("role")}
    if "content" in inner:
        msg["content"] = inner["content"]
    else:
        parts = indexed_attributes(inner, "contents")
        texts = [p.get("message_content.text") for p in parts]
        if any(t is None for t in texts):
            problems.append("a message holds non-text content (images...) not recorded whole")
        msg["content"] = "".join(t or "" for t in texts) if parts else None
    calls = indexed_attributes(inner, "tool_calls")
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.get("tool_call.id"),
                "type": "function",
                "function": {
                    "name": c.get("tool_call.function.name"),
                    "arguments": c.get("tool_call.function.arguments"),
                },
            }
            for c in calls
        ]
    if inner.get("tool_call_id"):
        msg["tool_call_id"] = inner["tool_call_id"]
    if inner.get("name"):
        msg["name"] = inner["name"]
    return msg


def _plain_message(flat: Mapping[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": flat.get("role"), "content": flat.get("content")}
    calls = indexed_attributes(flat, "tool_calls")
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c.get("name"), "arguments": c.get("arguments")},
            }
            for c in calls
        ]
    if flat.get("tool_call_id"):
        msg["tool_call_id"] = flat["tool_call_id"]
    return msg


def _parts_message(m: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(m, Mapping):
        problems.append("a recorded message is not an object")
        return {}
    return {"role": m.get("role"), "content": _parts_text(m.get("parts") or [], problems)}


def _parts_text(parts: Any, problems: list[str]) -> str | None:
    texts = []
    for p in parts if isinstance(parts, list) else []:
        if isinstance(p, Mapping) and p.get("type") == "text":
            texts.append(str(p.get("content", "")))
        else:
            kind = p.get("type") if isinstance(p, Mapping) else type(p).__name__
            problems.append(f"a message part of type {kind!r} cannot be rebuilt as sent")
    return "".join(texts) if texts else None


def _answer(msg: Mapping[str, Any]) -> _Output:
    return msg.get("content"), msg.get("finish_reason"), msg.get("tool_calls")


# -- tool calls --------------------------------------------------------------------------------


def _tool_call(a: Mapping[str, Any]) -> RecordedCall | None:
    name = a.get("gen_ai.tool.name") or a.get("tool.name")
    if not isinstance(name, str) or not name:
        return None
    problems = []
    # OpenInference's spec makes ``tool.parameters`` the tool's parameter *definition* (some
    # instrumentations write the call's arguments there, others the schema): read it only when
    # nothing else records the arguments, or every call of a tool would share one cache key.
    args = None
    for k in (
        "gen_ai.tool.call.arguments",
        "tool_call.function.arguments",
        "input.value",
        "tool.parameters",
    ):
        if a.get(k) is not None:
            args = _json(a[k])
            break
    result = a.get("gen_ai.tool.call.result")
    result = _json(result) if result is not None else _json(a.get("output.value"))
    if args is None:
        problems.append("the tool's arguments are not recorded")
    if result is None:
        problems.append("the tool's result is not recorded")
    return RecordedCall(
        "tool",
        name,
        args if isinstance(args, dict) else {"input": args},
        result,
        problems=tuple(problems),
        convention="openinference" if "tool.name" in a else "genai",
    )


# -- values ------------------------------------------------------------------------------------


def _json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list | tuple) and value else value


def _tokens(a: Mapping[str, Any], *keys: str) -> int:
    for k in keys:
        v = a.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 2**63:
            return int(v)
    return 0
