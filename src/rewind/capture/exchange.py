"""What a captured model request means, and how its response is kept: keys and envelopes.

Pure functions over bytes, shared by the sync and async transports (:mod:`rewind.capture.http`).

* The **key** of a request is ``key_of("http/v1", method, endpoint identity + path + query,
  keyed headers, canonical body)``. The endpoint identity is the URL's origin (scheme, host,
  port), or a registered stable name for it (:func:`register_endpoint`: the embedded model's
  file sha256, never the port it got at start-up). The body is the request's JSON in canonical
  form (DESIGN rule 2) minus :data:`VOLATILE_BODY_FIELDS`; auth headers, request ids, user
  agents, timestamps and auth query parameters never enter it. Only the headers in
  :data:`KEYED_HEADERS` do (they select API versions or beta behaviour, so they change answers).
  Because the endpoint is part of the key, an answer recorded from one endpoint is never served
  for another.
* The **envelope** is what the cache stores for a response: canonical JSON with the status, the
  headers that matter to a client (:data:`KEPT_HEADERS`), and the body — as text when it is
  UTF-8 (byte-identical round trip), else base64 — or, for a server-sent-event stream, the list of
  events in arrival order, each with its terminating blank line.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from rewind.canonical import CanonicalError, canonical_bytes, key_of
from rewind.llm import VOLATILE_FIELDS

__all__ = [
    "DEFAULT_MODEL_PATHS",
    "KEPT_HEADERS",
    "KEYED_HEADERS",
    "VOLATILE_BODY_FIELDS",
    "ModelRequest",
    "ModelRoutes",
    "Recorded",
    "decode_envelope",
    "describe_request",
    "encode_envelope",
    "endpoint_identity",
    "register_endpoint",
    "split_events",
    "stored_request",
    "unregister_endpoint",
    "usage_tokens",
]

ENVELOPE_VERSION = "rewind-http/v1"
_KEY_VERSION = "http/v1"

DEFAULT_MODEL_PATHS: tuple[str, ...] = (
    "/chat/completions",  # OpenAI, Azure OpenAI, vLLM, llama.cpp, Ollama, LiteLLM proxy...
    "/completions",
    "/embeddings",
    "/responses",  # OpenAI Responses API
    "/messages",  # Anthropic
    ":generateContent",  # Google Gemini
    ":streamGenerateContent",
)
"""URL path endings that mark a POST as a model request (see :class:`ModelRoutes`)."""

KEYED_HEADERS: frozenset[str] = frozenset({"anthropic-version", "anthropic-beta", "openai-beta"})
"""Request headers that enter the key: they select API versions or beta behaviour."""

KEPT_HEADERS: tuple[str, ...] = (
    "content-type",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
)
"""Response headers a hit returns (what SDKs read); the rest (dates, request ids, rate-limit
counters, content-length/encoding — the body is stored decoded) are volatile or recomputed."""

VOLATILE_BODY_FIELDS: frozenset[str] = VOLATILE_FIELDS - {"stream_options"}
"""Top-level body fields left out of the key (they tag, bill or route a request; see
:data:`rewind.llm.VOLATILE_FIELDS`). ``stream`` and ``stream_options`` stay in: they change the
bytes of the answer (an event stream, usage in the last event)."""

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n")
_AUTH_QUERY = frozenset({"key", "api_key", "api-key", "access_token", "token"})

_IDENTITIES: dict[str, str] = {}
_IDENTITIES_LOCK = threading.Lock()


@dataclass(frozen=True)
class ModelRoutes:
    """Which requests count as model requests (captured); everything else passes through.

    A request is captured when it is a POST, its URL path ends with one of ``paths``, its host is
    in ``hosts`` (any host when ``hosts`` is empty) and its body is JSON.

    Args:
        paths: URL path endings; :data:`DEFAULT_MODEL_PATHS` by default.
        hosts: host names to limit capture to, lower case (``("api.openai.com",)``); empty: any.
    """

    paths: tuple[str, ...] = DEFAULT_MODEL_PATHS
    hosts: tuple[str, ...] = ()

    def matches(self, method: str, host: str, path: str) -> bool:
        """True when a request with this method, host and URL path is a model request."""
        if method != "POST" or (self.hosts and host.lower() not in self.hosts):
            return False
        return path.rstrip("/").endswith(self.paths)


def register_endpoint(base_url: str, identity: str) -> None:
    """Key requests to ``base_url`` (and below it) by ``identity`` instead of the URL's origin.

    Use it for an endpoint whose address changes between runs while its model does not: the
    embedded model server registers ``http://127.0.0.1:<port>/v1`` as
    ``local-model:sha256:<model file sha256>``, so a replay against a server restarted on another
    port still hits, and a different model file never does.

    Args:
        base_url: ``scheme://host:port[/prefix]``; a trailing ``/`` is ignored.
        identity: a stable name (no spaces).
    """
    with _IDENTITIES_LOCK:
        _IDENTITIES[base_url.rstrip("/")] = identity


def unregister_endpoint(base_url: str) -> None:
    """Forget a :func:`register_endpoint` registration (no error when there is none)."""
    with _IDENTITIES_LOCK:
        _IDENTITIES.pop(base_url.rstrip("/"), None)


def endpoint_identity(url: str) -> str:
    """The stable identity of a request URL: registered prefix replaced, query auth removed.

    Args:
        url: the full request URL (``https://api.openai.com/v1/chat/completions?x=1``).
    Returns:
        e.g. ``https://api.openai.com/v1/chat/completions`` or
        ``local-model:sha256:…/chat/completions``; query parameters sorted, auth ones dropped.
    """
    base, _, query = url.partition("?")
    if not query and not _IDENTITIES:  # the common case, on every captured call
        return base
    with _IDENTITIES_LOCK:
        for prefix, identity in _IDENTITIES.items():
            if base == prefix or base.startswith(prefix + "/"):
                base = identity + base[len(prefix) :]
                break
    pairs = sorted(
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() not in _AUTH_QUERY
    )
    return f"{base}?{urlencode(pairs)}" if pairs else base


@dataclass(frozen=True)
class ModelRequest:
    """A captured request as the cache sees it.

    Attributes:
        key: the cache key (64 hex).
        request: canonical bytes of ``{method, url identity, keyed headers, body}`` (stored as a
            blob, for inspection).
        model: the ``model`` the body names (or the URL's last path segment), for the call row.
        sampled: False only when the body asks for temperature 0 or it is an embedding.
    """

    key: str
    request: bytes
    model: str
    sampled: bool


def describe_request(
    method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes
) -> ModelRequest | None:
    """The key and stored form of a model request, or None when its body is not JSON (such a
    request is passed through uncaptured: a multipart upload has random boundaries)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in VOLATILE_BODY_FIELDS}
    keyed = sorted((k.lower(), v) for k, v in headers if k.lower() in KEYED_HEADERS)
    identity = endpoint_identity(url)
    try:
        request = canonical_bytes(
            {"method": method, "url": identity, "headers": keyed, "body": doc}
        )
    except CanonicalError:
        return None  # NaN or similar: not a request Rewind can key exactly
    return _described(request, identity, doc)


def stored_request(request: bytes) -> ModelRequest | None:
    """The :class:`ModelRequest` of a captured request as a call row stores it (the canonical
    ``{method, url, headers, body}`` bytes of :attr:`ModelRequest.request`): its base cache key
    (before a node's occurrence numbering), model and sampling. None for any other request
    (``rewind.chat``'s own request document, a tool's arguments)."""
    try:
        doc = json.loads(request)
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"method", "url", "headers", "body"}:
        return None
    if not isinstance(doc["url"], str):
        return None
    return _described(request, doc["url"], doc["body"])


def _described(request: bytes, identity: str, doc: Any) -> ModelRequest:
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, str) or not model:
        model = identity.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    temperature = doc.get("temperature") if isinstance(doc, dict) else None
    sampled = not (identity.split("?")[0].endswith("/embeddings") or temperature == 0)
    return ModelRequest(key_of(_KEY_VERSION, request), request, model, sampled)


@dataclass(frozen=True)
class Recorded:
    """A response as recorded: status, kept headers, and either the body or the SSE events."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    events: tuple[bytes, ...] | None = None

    @property
    def ok(self) -> bool:
        """2xx: only successful answers become shared cache entries."""
        return 200 <= self.status < 300

    @property
    def failed(self) -> bool:
        """An error status the endpoint may answer differently to the same request later: 401
        and 403 (credentials are not part of the cache key), 408, 409, 425, 429 and 5xx (what
        SDKs retry). Such a response is recorded as a failed model call (``failed:raised``): a
        replay hands it to the SDK again only where the recording got an answer after it (the
        SDK's retry, a node that caught it and asked again), and sends the request otherwise,
        so a run recorded while the provider was rate-limiting or down goes on once it answers.
        Other error statuses (400, 404, 422...) are the endpoint's answer to this request (a
        context too long, an unknown model): recorded and replayed as answers on their run
        (never shared cache entries, :attr:`ok`)."""
        return self.status in _FAILED_STATUSES or self.status >= 500


_FAILED_STATUSES = frozenset({401, 403, 408, 409, 425, 429})


def split_events(data: bytes) -> tuple[bytes, ...]:
    """Split a server-sent-event stream into events, each ending with its blank line.

    ``\\r\\n`` and ``\\n`` line ends are both understood; the bytes are kept as sent, so joining
    the events gives ``data`` back exactly.
    """
    events: list[bytes] = []
    start = 0
    for end in _EVENT_END.finditer(data):
        events.append(data[start : end.end()])
        start = end.end()
    if start < len(data):
        events.append(data[start:])
    return tuple(events)


def recorded_from(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> Recorded:
    """Build a :class:`Recorded` from a live response (``body`` already decoded)."""
    kept = tuple((k.lower(), v) for k, v in headers if k.lower() in KEPT_HEADERS)
    content_type = next((v for k, v in kept if k == "content-type"), "")
    if content_type.split(";")[0].strip().lower() == "text/event-stream":
        return Recorded(status, kept, events=split_events(body))
    return Recorded(status, kept, body=body)


def encode_envelope(recorded: Recorded) -> bytes:
    """The JSON bytes the cache stores for a response: keys sorted, no spaces, UTF-8.

    The envelope holds only strings, ints and lists of them, for which ``json.dumps`` with
    sorted keys writes exactly what RFC 8785 does (same escapes) — at C speed, on the record
    path of every captured call.
    """
    doc: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "status": recorded.status,
        "headers": [list(h) for h in recorded.headers],
    }
    if recorded.events is not None:
        doc["events"] = [_text_or_b64(e) for e in recorded.events]
    else:
        doc["body"] = _text_or_b64(recorded.body)
    return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def decode_envelope(data: bytes) -> Recorded:
    """Rebuild a :class:`Recorded` from :func:`encode_envelope`'s bytes.

    Raises:
        ValueError: the bytes are not an envelope of this version.
    """
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("v") != ENVELOPE_VERSION:
        raise ValueError("not a recorded HTTP response")
    headers = tuple((str(k), str(v)) for k, v in doc["headers"])
    if "events" in doc:
        return Recorded(doc["status"], headers, events=tuple(_bytes(e) for e in doc["events"]))
    return Recorded(doc["status"], headers, body=_bytes(doc["body"]))


def usage_tokens(recorded: Recorded) -> tuple[int, int]:
    """(prompt, completion) tokens the response reports, 0 when it reports none.

    Read from ``usage`` (OpenAI chat/completions/embeddings: ``prompt_tokens``/
    ``completion_tokens``; OpenAI Responses and Anthropic: ``input_tokens``/``output_tokens``),
    Anthropic's ``message.usage`` (stream start) and Gemini's ``usageMetadata``. For a stream the
    largest value any event reports wins: providers report running totals.
    """
    docs: list[Any] = []
    if recorded.events is None:
        docs.append(_json_or_none(recorded.body))
    else:
        for event in recorded.events:
            for line in event.splitlines():
                if line.startswith(b"data:"):
                    docs.append(_json_or_none(line[5:].strip()))
    prompt = completion = 0
    for doc in docs:
        for usage in _usages(doc):
            prompt = max(prompt, _count(usage, "prompt_tokens", "input_tokens", "promptTokenCount"))
            completion = max(
                completion,
                _count(usage, "completion_tokens", "output_tokens", "candidatesTokenCount"),
            )
    return prompt, completion


def _usages(doc: Any) -> list[Mapping[str, Any]]:
    if not isinstance(doc, dict):
        return []
    found = []
    for holder in (doc, doc.get("message"), doc.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            found.append(holder["usage"])
    if isinstance(doc.get("usageMetadata"), dict):
        found.append(doc["usageMetadata"])
    return found


def _count(usage: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _text_or_b64(data: bytes) -> str | dict[str, str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _bytes(value: str | dict[str, str]) -> bytes:
    if isinstance(value, dict):
        return base64.b64decode(value["base64"])
    return value.encode("utf-8")
