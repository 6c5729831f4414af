"""OpenAI-compatible chat client and the LLM cache key.

Two concerns live here because they must agree on what a request *means*:

* :func:`llm_cache_key` turns a chat request body into a key that covers every parameter that can
  change the answer (with provider defaults filled in) and nothing that cannot (run ids, trace
  ids, timestamps, user tags). Same meaning, same key; any output-affecting change, new key.
* :class:`ChatClient` sends the request with a plain ``httpx`` POST — no provider SDK, because SDKs
  choke on the extra fields local servers add to responses — retries what is worth retrying, and
  keeps the exact response bytes so that a cache hit can return them byte for byte.

The client sends ``temperature`` explicitly even when the caller omitted it: the key treats an
omitted temperature as OpenAI's documented 1.0, but llama-cpp-python and Ollama use 0.8 when it is
omitted. Sending the keyed value makes the key describe what the server really did. ``top_p`` is
sent only when the caller gave it, or when the client is told to (Rewind's own sessions, which may
talk to the embedded llama.cpp server, whose default is 0.95): otherwise the body carries the same
fields an OpenAI SDK would send. What is sent never changes the cache key (it always fills the
provider defaults).
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Protocol, Self, cast, runtime_checkable

import httpx
import tenacity

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None  # type: ignore[assignment]
    _PLAIN_OPTIONS = 0
else:
    # Sorted keys; anything but the exact JSON types refused (a safety net: plain bodies have
    # none), so a body that is not plain after all goes to the canonical encoder.
    _PLAIN_OPTIONS = (
        _orjson.OPT_SORT_KEYS
        | _orjson.OPT_PASSTHROUGH_SUBCLASS
        | _orjson.OPT_PASSTHROUGH_DATACLASS
        | _orjson.OPT_PASSTHROUGH_DATETIME
    )

from rewind.canonical import KeyPrefix, canonical_bytes, key_of, loads
from rewind.errors import EndpointUnavailable, ModelCallError

__all__ = [
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TIMEOUT",
    "PROVIDER_DEFAULTS",
    "VOLATILE_FIELDS",
    "ChatBackend",
    "ChatClient",
    "ChatResponse",
    "Endpoint",
    "RetryPolicy",
    "json_schema_format",
    "llm_cache_key",
    "llm_request_key",
    "normalize_request",
]

# OpenAI's documented default. An omitted temperature is keyed as 1.0 — never 0 — so that a
# request without a temperature cannot share a key (and a cached answer) with a greedy one.
DEFAULT_TEMPERATURE = 1.0

PROVIDER_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "temperature": DEFAULT_TEMPERATURE,
        "top_p": 1.0,
        "n": 1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": None,
        "seed": None,
        "max_tokens": None,
        "response_format": None,
        "tools": None,
        "tool_choice": None,
        "logprobs": False,
        "top_logprobs": None,
    }
)
"""OpenAI chat-completion defaults, filled into every keyed request where a field is absent/None.

Filling them makes ``{}`` and ``{"temperature": 1.0, "top_p": 1.0, ...}`` key the same, which is
what they mean to an OpenAI-compatible server.
"""

# Fields that some tracer or framework injects into request bodies. They are not OpenAI parameters
# (OpenAI rejects unknown top-level fields), so the client never sends them either.
_TELEMETRY_FIELDS = frozenset(
    {"run_id", "trace_id", "span_id", "parent_span_id", "request_id", "timestamp"}
)

VOLATILE_FIELDS: frozenset[str] = frozenset(
    {
        # Real OpenAI parameters that tag, store, bill or route a request without changing the
        # answer. The client forwards them; the key ignores them.
        "user",
        "safety_identifier",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "stream_options",
        *_TELEMETRY_FIELDS,
    }
)
"""Request fields that never enter the LLM cache key.

Why: they change from run to run (ids, timestamps) or only tag/route the call, so keying them
would make every replay a miss — the unchanged-replay promise (100% hits, 0 tokens) needs them
out. ``stream`` is dropped from the key too: streamed or not, the answer is the same.
"""

_FLOAT_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_NEVER_SENT = _TELEMETRY_FIELDS | {"stream", "stream_options"}
_SAMPLING_SENT_EXPLICITLY = ("temperature", "top_p")
_KEY_VERSION = "llm/v1"
_KEY_PREFIX = KeyPrefix(_KEY_VERSION)
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=5.0)
"""Per-attempt timeouts (seconds). Read is long: a small CPU model writes ~40-100 tokens/s."""

HEALTH_TIMEOUT = httpx.Timeout(2.0)
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

JsonSchemaStyle = Literal["openai", "json_object"]

_UNREACHABLE_HINT = (
    "start it, set REWIND_BASE_URL/REWIND_API_KEY/REWIND_MODEL, "
    "or install rewind-replay[local] for the embedded model"
)


def _unreachable_hint(base_url: str) -> str:
    """How to fix an endpoint that cannot be reached: the environment variables when the
    endpoint is the one ``REWIND_BASE_URL`` names or none is set, else the client that was given
    ``base_url`` (a chain's own ``ChatClient(Endpoint(...))``: no variable would change it)."""
    configured = os.environ.get("REWIND_BASE_URL", "").strip().rstrip("/")
    if not configured or configured == base_url:
        return _UNREACHABLE_HINT
    return (
        f"start the server at {base_url}, or build the ChatClient with an Endpoint(base_url=...) "
        f"that runs (REWIND_BASE_URL, {configured}, is not the endpoint this client uses)"
    )


@dataclass(frozen=True)
class Endpoint:
    """Where chat requests go.

    Attributes:
        base_url: the OpenAI-compatible API root, including ``/v1`` (``http://127.0.0.1:PORT/v1``);
            a trailing ``/`` is removed. Never part of a cache key: the embedded server gets a new
            free port on every start, and ``model`` is what identifies the model.
        api_key: sent as ``Authorization: Bearer <key>`` when set; hidden from ``repr``.
        model: the model name sent with (and keyed into) every request that does not name one.
        json_schema_style: how the server wants JSON-schema constrained output. ``"openai"``
            sends ``response_format`` as built by :func:`json_schema_format`; ``"json_object"``
            rewrites it to ``{"type": "json_object", "schema": ...}`` on the wire, the only form
            llama-cpp-python's server honours (it answers HTTP 500 to the OpenAI form).

    Raises:
        ValueError: ``base_url`` is not an ``http(s)://`` URL, ``model`` is empty, or the style is
            unknown.
    """

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    model: str = ""
    json_schema_style: JsonSchemaStyle = "openai"

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("model must be a non-empty model name")
        if self.json_schema_style not in ("openai", "json_object"):
            raise ValueError(f"unknown json_schema_style {self.json_schema_style!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @classmethod
    def from_env(cls) -> Endpoint | None:
        """Build an endpoint from ``REWIND_BASE_URL``, ``REWIND_API_KEY`` and ``REWIND_MODEL``.

        ``REWIND_JSON_SCHEMA_STYLE`` (``openai`` by default, or ``json_object`` for a
        llama-cpp-python server you run yourself) is read too.

        Returns:
            ``None`` when ``REWIND_BASE_URL`` is unset or empty (use the embedded model then).

        Raises:
            EndpointUnavailable: ``REWIND_BASE_URL`` is not an http(s) URL, the style is unknown,
                or ``REWIND_MODEL`` is unset. There is no placeholder model name on purpose: the
                model name is part of every cache key, and a shared placeholder would let two
                different models hit each other's cached answers.
        """
        base_url = os.environ.get("REWIND_BASE_URL", "").strip()
        if not base_url:
            return None
        model = os.environ.get("REWIND_MODEL", "").strip()
        if not model:
            raise EndpointUnavailable(
                "REWIND_BASE_URL is set but REWIND_MODEL is not",
                "set REWIND_MODEL to the model name the endpoint serves (it is part of every "
                "cache key), or unset REWIND_BASE_URL to use the embedded local model",
            )
        api_key = os.environ.get("REWIND_API_KEY", "").strip() or None
        style = os.environ.get("REWIND_JSON_SCHEMA_STYLE", "").strip() or "openai"
        try:
            return cls(
                base_url=base_url,
                api_key=api_key,
                model=model,
                json_schema_style=cast(JsonSchemaStyle, style),
            )
        except ValueError as exc:
            raise EndpointUnavailable(
                f"invalid model endpoint settings: {exc}",
                "set REWIND_BASE_URL like http://127.0.0.1:8080/v1 and REWIND_JSON_SCHEMA_STYLE "
                "to openai or json_object",
            ) from exc


def normalize_request(
    body: Mapping[str, Any], *, default_model: str | None = None
) -> dict[str, Any]:
    """Return the keyed meaning of a chat request body (a new dict; ``body`` is not changed).

    * ``model`` comes from ``default_model`` when the body has none.
    * Every :data:`PROVIDER_DEFAULTS` field that is absent or ``None`` is filled in.
    * ``stop: "x"`` becomes ``["x"]`` (same meaning to every provider).
    * ``temperature``, ``top_p`` and the penalties are made floats, and ``-0.0`` becomes ``0.0``:
      canonical JSON keeps ``0``/``0.0``/``-0.0`` apart, but to a sampler they are all greedy.
    * :data:`VOLATILE_FIELDS` and ``stream`` are dropped.
    * Every other field, known or not (``top_k``, ``min_p``, ``grammar``...), is kept as given:
      an unknown parameter may change the answer, and an extra miss is cheaper than a wrong hit.
    * ``messages`` are kept exactly (no whitespace or Unicode normalization).

    Raises:
        ValueError: the body names no model and ``default_model`` is ``None`` — a key without a
            model would let different models share cached answers.
    """
    request = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS and k != "stream"}
    if request.get("model") is None:
        if default_model is None:
            raise ValueError("the request names no model and no default_model was given")
        request["model"] = default_model
    for name, default in PROVIDER_DEFAULTS.items():
        if request.get(name) is None:
            request[name] = default
    for name in _FLOAT_PARAMS:
        value = request[name]
        if isinstance(value, int | float) and not isinstance(value, bool):
            request[name] = float(value) + 0.0  # + 0.0 turns -0.0 into 0.0
    if isinstance(request["stop"], str):
        request["stop"] = [request["stop"]]
    return request


def llm_cache_key(body: Mapping[str, Any], *, default_model: str | None = None) -> str:
    """Return the cache key (64 hex chars) of a chat request body.

    ``key_of("llm/v1", canonical_bytes(normalize_request(body, default_model=...)))``. Key order,
    volatile fields and omitted defaults never change it; any output-affecting parameter or any
    byte of a message does. The endpoint's base URL is deliberately not part of it.

    Raises:
        ValueError: as :func:`normalize_request`.
        rewind.canonical.CanonicalError: a value cannot be hashed (NaN, bytes, objects...).
    """
    return key_of(
        _KEY_VERSION, canonical_bytes(normalize_request(body, default_model=default_model))
    )


def llm_request_key(
    body: Mapping[str, Any], *, default_model: str | None = None
) -> tuple[str, bytes]:
    """``(cache key, canonical request bytes)`` of a chat request body, the request encoded
    once: the key is :func:`llm_cache_key`'s, the bytes those it hashes.

    Raises:
        ValueError, rewind.canonical.CanonicalError: as :func:`llm_cache_key`.
    """
    request = canonical_bytes(normalize_request(body, default_model=default_model))
    return _KEY_PREFIX.key(request), request


def plain_request_key(
    body: Mapping[str, Any], *, default_model: str | None = None
) -> tuple[str, bytes]:
    """:func:`llm_request_key` of a body of plain JSON, without the canonical encoder's walk
    over every value to check that it may take its fast path.

    Plain means what :func:`rewind.tracing.model.plain_fields` returns: exact ``dict``,
    ``list``, ``str``, ``bool``, ``None`` and ``int`` (at most 63 bits), ASCII ``str`` keys, no
    floats. Normalizing adds only floats this function checks (the sampling parameters) and the
    model name, so the canonical text is what orjson writes with sorted keys, byte for byte
    (tests compare the keys on generated bodies). Anything outside that goes the general way.

    Raises:
        ValueError, rewind.canonical.CanonicalError: as :func:`llm_cache_key`.
    """
    request = normalize_request(body, default_model=default_model)
    if _orjson is not None and type(request["model"]) is str and _positional_floats(request):
        try:
            data = _orjson.dumps(request, option=_PLAIN_OPTIONS)
        except (TypeError, _orjson.JSONEncodeError):
            pass  # a lone surrogate in the model name: the canonical encoder names it
        else:
            return _KEY_PREFIX.key(data), data
    data = canonical_bytes(request)
    return _KEY_PREFIX.key(data), data


def _positional_floats(request: Mapping[str, Any]) -> bool:
    """Whether the normalized sampling parameters that are floats are written by repr() in
    positional notation (zero, or 1e-4 <= |f| < 1e16), as canonical JSON writes them."""
    for name in _FLOAT_PARAMS:
        value = request[name]
        if type(value) is float and not (value == 0.0 or 1e-4 <= abs(value) < 1e16):
            return False
    return True


def json_schema_format(
    name: str, schema: Mapping[str, Any], *, strict: bool = True
) -> dict[str, Any]:
    """Build an OpenAI ``response_format`` that constrains the answer to a JSON schema.

    Returns ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``: the OpenAI
    form, which OpenAI, vLLM, Ollama and llama.cpp's own server accept. It is what gets keyed, so
    a change to the schema is a new key. For llama-cpp-python (the embedded model) the client
    rewrites it on the wire — see :attr:`Endpoint.json_schema_style`.

    Args:
        name: ``[A-Za-z0-9_-]{1,64}``, as OpenAI requires.
        schema: a JSON schema object. OpenAI's strict mode also wants
            ``"additionalProperties": false`` and every property listed in ``required``.
        strict: OpenAI's strict flag (llama.cpp's grammar is always strict).

    Raises:
        ValueError: ``name`` does not match the pattern.
    """
    if not _SCHEMA_NAME.match(name):
        raise ValueError(f"schema name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": dict(schema), "strict": strict},
    }


@dataclass(frozen=True)
class ChatResponse:
    """One chat completion as received.

    Attributes:
        raw: the response body bytes exactly as received (after HTTP transfer decoding). A cache
            hit returns these, byte-identical, via :meth:`from_raw`.
        data: ``raw`` parsed (treat as read-only).
        content: ``choices[0].message.content``; ``""`` when it is ``None`` (e.g. tool calls).
        finish_reason: ``choices[0].finish_reason`` (``"stop"``, ``"length"``...), or ``None``.
        prompt_tokens: ``usage.prompt_tokens`` in tokens, 0 when absent.
        completion_tokens: ``usage.completion_tokens`` in tokens, 0 when absent.
        latency_ms: wall time of the attempt that answered, in ms. Telemetry, so it takes no part
            in equality: a rebuilt cached response equals the original.
    """

    raw: bytes
    data: dict[str, Any]
    content: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float = field(default=0.0, compare=False)

    @classmethod
    def from_raw(cls, raw: bytes, latency_ms: float = 0.0) -> ChatResponse:
        """Parse a chat-completion body (also used to rebuild a cached response).

        Raises:
            ModelCallError: ``raw`` is not UTF-8 JSON, not an object, or has no
                ``choices[0].message``.
        """
        try:
            data = loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise ModelCallError(
                f"the model endpoint answered a body that is not JSON: {_snippet(raw)}",
                "check that REWIND_BASE_URL points at an OpenAI-compatible /v1 root",
            ) from exc
        choices = data.get("choices") if isinstance(data, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            raise ModelCallError(
                f"the model endpoint answered without choices[0].message: {_snippet(raw)}",
                "check that the endpoint speaks the OpenAI chat-completions API",
            )
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        finish_reason = first.get("finish_reason")
        # Every field set as __init__ would, without its object.__setattr__ per field (a
        # frozen dataclass's): a cached replay rebuilds one response per LLM call.
        response = object.__new__(cls)
        response.__dict__.update(
            raw=bytes(raw),
            data=data,
            content=_message_text(message.get("content")),
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
            latency_ms=latency_ms,
        )
        return response


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long :class:`ChatClient` retries.

    Retried: HTTP 429, 500, 502, 503, 504, connect errors/timeouts, read timeouts and dropped
    connections. Waits grow ``initial_backoff_s * 2**(n-1)`` up to ``max_backoff_s`` seconds; a
    ``Retry-After`` (seconds or HTTP date) or ``retry-after-ms`` header wins when present, capped
    at ``max_retry_after_s``.

    Attributes:
        attempts: total tries, including the first (>= 1).
        initial_backoff_s: first wait, seconds.
        max_backoff_s: longest computed wait, seconds.
        max_retry_after_s: longest wait a server may ask for, seconds.

    Raises:
        ValueError: ``attempts < 1`` or a negative duration.
    """

    attempts: int = 4
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if min(self.initial_backoff_s, self.max_backoff_s, self.max_retry_after_s) < 0:
            raise ValueError("backoff durations must be >= 0")


_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_RETRY_TRANSPORT_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadTimeout,
    httpx.ReadError,
    httpx.RemoteProtocolError,
)
# llama-cpp-python reports a request that fails validation as HTTP 500 with this message. It will
# fail the same way every time, so it is not retried.
_VALIDATION_500 = re.compile(r"^\d+ validation errors?:")


class _RetryableStatus(Exception):
    def __init__(self, status: int, text: str, retry_after_s: float | None) -> None:
        super().__init__(status, text)
        self.status = status
        self.text = text
        self.retry_after_s = retry_after_s


class NamesModel(Protocol):
    """Anything that names the model requests default to: an :class:`Endpoint`, or
    :class:`rewind.session.ModelName` while no endpoint is open."""

    @property
    def model(self) -> str: ...


@runtime_checkable
class ChatBackend(Protocol):
    """What Rewind needs of a model client (:class:`ChatClient`,
    :class:`rewind.session.LazyChatClient`, :class:`rewind.grid.SharedChatClient`, a test
    stub): the model its keys default to, the LLM cache key of a request, and sending it.

    ``complete`` is called only on a cache miss; it raises :class:`EndpointUnavailable` when
    the endpoint cannot be reached and :class:`ModelCallError` when it refuses the request.
    """

    @property
    def endpoint(self) -> NamesModel: ...

    def cache_key(self, body: Mapping[str, Any]) -> str: ...

    def complete(self, body: Mapping[str, Any]) -> ChatResponse: ...


class ChatClient:
    """Sends chat-completion requests (``POST {base_url}/chat/completions``) to one endpoint.

    Args:
        endpoint: where to send; its ``model`` fills requests that name none.
        timeout: per-attempt timeouts; :data:`DEFAULT_TIMEOUT` when ``None``.
        retry: see :class:`RetryPolicy`.
        transport: an ``httpx`` transport (tests pass ``httpx.MockTransport``).
        send_sampling_defaults: which sampling fields to send with their keyed defaults (1.0)
            when the caller omits them, so the server samples the way the key says: the default
            sends ``temperature`` only (the request otherwise has the fields the SDK would send);
            True sends ``temperature`` and ``top_p`` (for servers whose defaults differ from
            OpenAI's, e.g. llama.cpp); False sends neither (a provider that rejects them); or a
            sequence of these names.

    Proxy environment variables are ignored for loopback endpoints: a stray ``HTTP_PROXY`` would
    otherwise send requests for the embedded server to the proxy. Use as a context manager or
    call :meth:`close`.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: httpx.Timeout | None = None,
        retry: RetryPolicy = RetryPolicy(),  # frozen, so one shared default is safe
        transport: httpx.BaseTransport | None = None,
        send_sampling_defaults: bool | tuple[str, ...] = ("temperature",),
    ) -> None:
        self.endpoint = endpoint
        self.retry = retry
        if send_sampling_defaults is True:
            send_sampling_defaults = _SAMPLING_SENT_EXPLICITLY
        elif send_sampling_defaults is False:
            send_sampling_defaults = ()
        unknown = set(send_sampling_defaults) - set(_SAMPLING_SENT_EXPLICITLY)
        if unknown:
            raise ValueError(
                f"send_sampling_defaults names {sorted(unknown)}; it takes temperature, top_p"
            )
        self._send_sampling_defaults = tuple(send_sampling_defaults)
        headers = {"Accept": "application/json"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self._http = httpx.Client(
            timeout=timeout or DEFAULT_TIMEOUT,
            transport=transport,
            headers=headers,
            trust_env=not _is_loopback(endpoint.base_url),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._http.close()

    def cache_key(self, body: Mapping[str, Any]) -> str:
        """:func:`llm_cache_key` of ``body`` with this endpoint's model as the default model."""
        return llm_cache_key(body, default_model=self.endpoint.model)

    def complete(self, body: Mapping[str, Any]) -> ChatResponse:
        """Send one chat-completion request and return the parsed answer.

        Args:
            body: an OpenAI chat-completions request (``messages``, ``temperature``...). ``model``
                defaults to the endpoint's. ``stream``/``stream_options`` and telemetry fields
                (``run_id``, ``trace_id``...) are not sent: this client never streams.

        Raises:
            EndpointUnavailable: no connection, a dropped connection or a read timeout, still so
                after the retries.
            ModelCallError: HTTP 4xx other than 429 (with the server's error message), any other
                non-retryable status, a retryable status still failing after the retries, or a
                body that is not JSON / has no ``choices``.
            TypeError, ValueError: ``body`` is not JSON-serializable (NaN, bytes...).
        """
        payload = json.dumps(
            self._wire_body(body), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
        url = f"{self.endpoint.base_url}/chat/completions"
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retry.attempts),
            wait=_wait_strategy(self.retry),
            retry=tenacity.retry_if_exception_type((_RetryableStatus, *_RETRY_TRANSPORT_ERRORS)),
            reraise=True,
        )
        try:
            return retrying(self._attempt, url, payload)
        except _RetryableStatus as exc:
            raise ModelCallError(
                f"the model endpoint at {self.endpoint.base_url} answered HTTP {exc.status} "
                f"{self.retry.attempts} times: {exc.text}",
                "the provider is overloaded or rate-limiting; try again later or raise "
                "RetryPolicy.attempts",
            ) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EndpointUnavailable(
                f"cannot reach the model endpoint at {self.endpoint.base_url}",
                _unreachable_hint(self.endpoint.base_url),
            ) from exc
        except httpx.ReadTimeout as exc:
            raise EndpointUnavailable(
                f"the model endpoint at {self.endpoint.base_url} did not answer within "
                f"{self._http.timeout.read} s",
                "lower max_tokens, or pass ChatClient(timeout=httpx.Timeout(...)) with a longer "
                "read timeout",
            ) from exc
        except httpx.TransportError as exc:
            raise EndpointUnavailable(
                f"the connection to the model endpoint at {self.endpoint.base_url} failed: "
                f"{type(exc).__name__}: {exc}",
                _unreachable_hint(self.endpoint.base_url),
            ) from exc

    def health(self) -> bool:
        """Return True when ``GET {base_url}/models`` answers 200 within 2 s. Never raises.

        llama-cpp-python serves ``/models`` behind the same lock as generation, so a busy server
        can look unhealthy here; :meth:`reachable` tells "busy" from "down".
        """
        try:
            response = self._http.get(f"{self.endpoint.base_url}/models", timeout=HEALTH_TIMEOUT)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def reachable(self) -> bool:
        """Return True when an HTTP server answers at the endpoint at all. Never raises.

        Any status (some providers answer 404 on ``/models``) or a read timeout after connecting
        counts as reachable; a refused or timed-out connection does not.
        """
        try:
            self._http.get(f"{self.endpoint.base_url}/models", timeout=HEALTH_TIMEOUT)
        except (httpx.ReadTimeout, httpx.RemoteProtocolError):
            return True
        except httpx.HTTPError:
            return False
        return True

    def _wire_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        wire = {k: v for k, v in body.items() if k not in _NEVER_SENT}
        if wire.get("model") is None:
            wire["model"] = self.endpoint.model
        for name in self._send_sampling_defaults:
            if wire.get(name) is None:
                wire[name] = PROVIDER_DEFAULTS[name]
        response_format = wire.get("response_format")
        if (
            self.endpoint.json_schema_style == "json_object"
            and isinstance(response_format, Mapping)
            and response_format.get("type") == "json_schema"
        ):
            spec = response_format.get("json_schema") or {}
            wire["response_format"] = {"type": "json_object", "schema": spec.get("schema", {})}
        return wire

    def _attempt(self, url: str, payload: bytes) -> ChatResponse:
        started = time.perf_counter()
        response = self._http.post(
            url, content=payload, headers={"Content-Type": "application/json"}
        )
        latency_ms = (time.perf_counter() - started) * 1000.0
        status = response.status_code
        if 200 <= status < 300:
            return ChatResponse.from_raw(response.content, latency_ms)
        text = _error_text(response)
        if status in _RETRY_STATUSES and not (status == 500 and _VALIDATION_500.match(text)):
            raise _RetryableStatus(status, text, _retry_after_s(response))
        raise ModelCallError(
            f"the model endpoint at {self.endpoint.base_url} answered HTTP {status}: {text}",
            _status_hint(status),
        )


def _wait_strategy(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    backoff = tenacity.wait_exponential(
        multiplier=policy.initial_backoff_s, max=policy.max_backoff_s
    )

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _RetryableStatus) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, policy.max_retry_after_s)
        return backoff(state)

    return wait


def _retry_after_s(response: httpx.Response) -> float | None:
    milliseconds = response.headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            value = float(milliseconds) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    header = response.headers.get("retry-after")
    if header is None:
        return None
    try:
        value = float(header)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(header)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = (when - datetime.now(UTC)).total_seconds()
        return max(value, 0.0)
    return value if math.isfinite(value) and value >= 0 else None


def _status_hint(status: int) -> str:
    if status in (401, 403):
        return "check REWIND_API_KEY (the endpoint rejected the credentials)"
    if status == 404:
        return "check REWIND_BASE_URL (it should end with /v1) and REWIND_MODEL"
    if 400 <= status < 500:
        return "the request was rejected; fix the parameter the message names"
    return "the endpoint failed; check its logs"


def _error_text(response: httpx.Response) -> str:
    """The server's error message on one line (at most 300 characters)."""
    text = ""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif isinstance(error, str):
            text = error
        elif data.get("detail") is not None:
            text = str(data["detail"])
        elif data.get("message"):
            text = str(data["message"])
    if not text:
        text = response.text or response.reason_phrase or "(empty body)"
    return _one_line(text)


def _snippet(raw: bytes) -> str:
    return _one_line(raw[:300].decode("utf-8", "replace")) or "(empty body)"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _is_loopback(base_url: str) -> bool:
    return httpx.URL(base_url).host in _LOOPBACK_HOSTS
