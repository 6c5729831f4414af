"""HTTP-layer capture: model requests of any httpx-based SDK go through Rewind's call cache.

While a run context is active (:mod:`rewind.context`), a request that :class:`ModelRoutes` calls a
model request is keyed (:func:`rewind.capture.exchange.describe_request`) and served through
:func:`rewind.cache.through_cache` — the same cache, lineage, single flight and node bookkeeping
as ``rewind.chat`` — as an ``llm`` call: a hit returns the recorded status, kept headers and body
bytes (or the same server-sent events in the same order) and counts 0 tokens; a miss sends the
request, reads the whole response, records it and returns it rebuilt from the record, so a live
call and its replay hand the SDK the same thing. Tokens come from the response's ``usage``.
A response whose status the endpoint may answer otherwise later (a 429, a 503:
:attr:`Recorded.failed <rewind.capture.exchange.Recorded.failed>`) is recorded as a failed model
call (``failed:raised``): a replay hands it to the SDK again only where the recording got an
answer after it, and sends the request otherwise (:mod:`rewind.cache`'s rule for failures).
So is a request whose connection failed (refused, timed out, dropped): a replay raises the
same httpx error to the SDK there, whose retry then meets its recorded answer.
Outside a run, inside a call that is already being cached (``rewind.chat``'s own POST, a tool's
traffic), and for every other request, the transport passes the request through untouched.

Two ways in, both for ``httpx`` and for its fork ``httpx2`` (used by openai>=3 and anthropic>=2):

* :func:`install` wraps ``HTTPTransport.handle_request`` and
  ``AsyncHTTPTransport.handle_async_request`` of each library — the default transport of every
  client those SDKs build (``OpenAI()``, ``AsyncOpenAI()``, the module-level ``openai`` client,
  ``anthropic.Anthropic()``, LiteLLM's sync path, instructor on top of them), whenever the
  client was created — and of LiteLLM's own httpx transport for async calls
  (``LiteLLMAiohttpTransport``), once LiteLLM is loaded. :func:`uninstall` restores them.
* :class:`Transport` / :class:`AsyncTransport` wrap any transport explicitly:
  ``OpenAI(http_client=openai.DefaultHttpxClient(transport=rewind.capture.Transport()))``.

Streams are read to the end before the SDK sees the first event while a call is recorded (a
truncated stream is never cached); on a hit the events arrive at once.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import sys
import threading
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import httpx

from rewind.cache import CallPolicy, Executed, athrough_cache, through_cache
from rewind.capture.exchange import (
    ModelRequest,
    ModelRoutes,
    Recorded,
    decode_envelope,
    describe_request,
    encode_envelope,
    recorded_from,
    usage_tokens,
)
from rewind.context import active_runs, current, executing
from rewind.errors import ModelErrorStatus, ModelTransportError
from rewind.store.records import storable_text

__all__ = [
    "AsyncTransport",
    "Transport",
    "acapture",
    "call_of",
    "capture",
    "install",
    "installed",
    "uninstall",
]

_HTTP_LIBRARIES = ("httpx", "httpx2")
# httpx transports SDKs ship that are not httpx's own (module, class): wrapped like httpx's once
# their module is loaded. LiteLLM sends async calls through aiohttp behind this httpx transport.
_SDK_ASYNC_TRANSPORTS = (
    ("litellm.llms.custom_httpx.aiohttp_transport", "LiteLLMAiohttpTransport"),
)
_ORIGINAL = "__rewind_original__"
_ROUTES = ModelRoutes()
_INSTALL_LOCK = threading.Lock()

_SAMPLED = CallPolicy("non-deterministic")
_GREEDY = CallPolicy()

logger = logging.getLogger(__name__)
_WARNED: set[str] = set()  # runs already told about an uncaptured request (once each)


# -- the capture itself ------------------------------------------------------------------------


def capture(request: Any, send: Callable[[Any], Any], routes: ModelRoutes = _ROUTES) -> Any:
    """Send ``request`` through the current run's cache when it is a model request.

    Args:
        request: an ``httpx.Request`` (or ``httpx2.Request``).
        send: sends it for real and returns the response (the wrapped transport).
        routes: which requests are model requests.
    Returns:
        the response: rebuilt from the record for a captured request, else ``send``'s.
    Raises:
        whatever ``send`` raises (nothing is recorded then); RewindError subclasses from the
        cache (see :func:`rewind.cache.through_cache`).
    """
    ctx = current()
    if ctx is None or executing() or not _matches(routes, request):
        _warn_if_context_lost(ctx, request, routes)
        return send(request)
    described = _describe(request, request.read())
    if described is None:
        return send(request)
    live: list[Recorded] = []
    dropped: list[Exception] = []
    connection_failed = _connection_failures(request)

    def execute() -> Executed:
        try:
            response = send(request)
            try:
                body = response.read()
            finally:
                response.close()
        except connection_failed as exc:
            dropped.append(exc)
            raise _transport_failure(exc) from exc
        live.append(recorded_from(response.status_code, response.headers.multi_items(), body))
        return _executed(live[0])

    try:
        data, _ = through_cache(ctx, execute=execute, **call_of(described))
    except ModelErrorStatus as exc:  # recorded now, or replayed: the SDK gets the response
        return _response(request, decode_envelope(exc.response))
    except ModelTransportError as exc:  # the SDK gets the transport's own error
        raise (dropped[0] if dropped else _replayed_transport_error(request, exc)) from None
    return _response(request, live[0] if live else decode_envelope(data))


async def acapture(
    request: Any, send: Callable[[Any], Awaitable[Any]], routes: ModelRoutes = _ROUTES
) -> Any:
    """The async twin of :func:`capture` (``send`` is awaited)."""
    ctx = current()
    if ctx is None or executing() or not _matches(routes, request):
        _warn_if_context_lost(ctx, request, routes)
        return await send(request)
    described = _describe(request, await request.aread())
    if described is None:
        return await send(request)
    live: list[Recorded] = []
    dropped: list[Exception] = []
    connection_failed = _connection_failures(request)

    async def aexecute() -> Executed:
        try:
            response = await send(request)
            try:
                body = await response.aread()
            finally:
                await response.aclose()
        except connection_failed as exc:
            dropped.append(exc)
            raise _transport_failure(exc) from exc
        live.append(recorded_from(response.status_code, response.headers.multi_items(), body))
        return _executed(live[0])

    try:
        data, _ = await athrough_cache(ctx, aexecute=aexecute, **call_of(described))
    except ModelErrorStatus as exc:
        return _response(request, decode_envelope(exc.response))
    except ModelTransportError as exc:
        raise (dropped[0] if dropped else _replayed_transport_error(request, exc)) from None
    return _response(request, live[0] if live else decode_envelope(data))


def _warn_if_context_lost(ctx: Any, request: Any, routes: ModelRoutes) -> None:
    """A model request sent outside any run context while a run is active (a plain
    ``threading.Thread``) escapes the record: its node looks call-free and every replay sends it
    again. Say so on stderr instead of letting it pass silently."""
    if ctx is not None:
        return
    runs = active_runs()
    if runs and runs[0] not in _WARNED and _matches(routes, request):
        _WARNED.add(runs[0])
        logger.warning(
            "warning: a model request to %s was sent outside the run context while run %s is "
            "active, so it is not recorded and every replay will send it again — start the "
            "thread with target=rewind.context.propagate(fn) or use a "
            "concurrent.futures.ThreadPoolExecutor",
            _where(request.url),
            runs[0][:12],
        )


def _where(url: Any) -> str:
    """``scheme://host[:port]/path`` of a URL: no user info, no query (they may hold keys)."""
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


def _matches(routes: ModelRoutes, request: Any) -> bool:
    url = request.url
    return routes.matches(request.method, url.host, url.path)


def _describe(request: Any, body: bytes) -> ModelRequest | None:
    return describe_request(request.method, str(request.url), request.headers.multi_items(), body)


def call_of(described: ModelRequest) -> dict[str, Any]:
    """The cache's view of a model request, as keyword arguments of
    :func:`rewind.cache.through_cache` (``kind``, ``name``, ``key``, ``request``, ``policy``): an
    ``llm`` call named by its model; sampled unless it asks for temperature 0 or is an
    embedding."""
    return {
        "kind": "llm",
        "name": described.model,
        "key": described.key,
        "request": described.request,
        "policy": _SAMPLED if described.sampled else _GREEDY,
    }


def _executed(recorded: Recorded) -> Executed:
    """What a sent request produced, for the cache.

    Raises:
        ModelErrorStatus: the response is :attr:`Recorded.failed` (a 429, a 503...): the cache
            records the call as ``failed:raised`` and :func:`capture` returns the response."""
    if recorded.failed:
        raise ModelErrorStatus(
            f"the model endpoint answered HTTP {recorded.status}{_error_message(recorded)}",
            "the SDK raised its own error for this response; fork at this step once the "
            "endpoint answers",
            response=encode_envelope(recorded),
        )
    prompt, completion = usage_tokens(recorded)
    return Executed(encode_envelope(recorded), prompt, completion, cacheable=recorded.ok)


def _connection_failures(request: Any) -> tuple[type[Exception], ...]:
    """The request's library's errors of a connection that failed once the request was on its
    way (could not connect, timed out, dropped, a proxy refused: of httpx or httpx2), which
    :func:`capture` records as failed model calls. A client's own protocol errors
    (``LocalProtocolError``, ``UnsupportedProtocol``) are bugs of the request: not caught."""
    library = _library_of(request)
    return (
        library.TimeoutException,
        library.NetworkError,
        library.RemoteProtocolError,
        library.ProxyError,
    )


def _transport_failure(exc: Exception) -> ModelTransportError:
    """``exc`` (a connection failure, :func:`_connection_failures`) as the cache records it."""
    name = type(exc).__name__
    return ModelTransportError(
        f"the model request failed: {name}: {exc!s:.200}",
        "the SDK raised its own error for it; fork at this step once the endpoint answers",
        transport_error=name,
    )


def _replayed_transport_error(request: Any, exc: ModelTransportError) -> Exception:
    """The httpx (or httpx2) error a recorded connection failure was, made again for the SDK
    (its class by name, ``TransportError`` for a name the library does not have), with the
    note :mod:`rewind.cache` added saying it was replayed."""
    library = _library_of(request)
    cls = getattr(library, exc.transport_error, None)
    if not (isinstance(cls, type) and issubclass(cls, library.TransportError)):
        cls = library.TransportError
    error: Exception = cls(exc.message, request=request)
    for note in getattr(exc, "__notes__", ()):
        error.add_note(note)
    return error


def _error_message(recorded: Recorded) -> str:
    """``": <the body's error message>"`` (OpenAI/Anthropic ``{"error": {"message"}}``), or
    ``""`` when the body has none."""
    try:
        doc = json.loads(recorded.body)
    except (ValueError, RecursionError):  # not JSON, or nested past what json reads
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not (isinstance(message, str) and message):
        return ""
    return f": {storable_text(message[:200])}"  # a lone surrogate escaped: the document hashes


def _response(request: Any, recorded: Recorded) -> Any:
    """A response of the request's own library (httpx or httpx2) built from the record."""
    library = _library_of(request)
    headers = list(recorded.headers)
    if recorded.events is None:
        return library.Response(
            recorded.status, headers=headers, content=recorded.body, request=request
        )
    stream = _event_stream_class(library)(recorded.events)
    return library.Response(recorded.status, headers=headers, stream=stream, request=request)


def _library_of(request: Any) -> ModuleType:
    return sys.modules[type(request).__module__.partition(".")[0]]


@functools.cache
def _event_stream_class(library: ModuleType) -> type:
    """A byte stream of the library's kind that yields the recorded events one by one."""

    class RecordedEvents(library.SyncByteStream, library.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, events: tuple[bytes, ...]) -> None:
            self._events = events

        def __iter__(self) -> Any:
            yield from self._events

        async def __aiter__(self) -> Any:
            for event in self._events:
                yield event

    return RecordedEvents


# -- explicit transports -----------------------------------------------------------------------


class Transport(httpx.BaseTransport):
    """A sync transport that captures model requests and passes everything else through.

    ``OpenAI(http_client=openai.DefaultHttpxClient(transport=rewind.capture.Transport()))``,
    or ``httpx.Client(transport=...)`` / ``httpx2.Client(transport=...)`` for other SDKs. It
    works without :func:`install`.

    Args:
        wrapped: the transport that really sends. When None, the ``HTTPTransport`` of the
            library the first request comes from (httpx or httpx2), created on first use.
        routes: which requests are model requests (:class:`ModelRoutes` defaults).
    """

    def __init__(
        self, wrapped: httpx.BaseTransport | None = None, *, routes: ModelRoutes | None = None
    ) -> None:
        self.wrapped = wrapped
        self.routes = routes or ModelRoutes()
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Capture the request when a run is active and it is a model request; else send it."""
        if self.wrapped is None:
            with self._lock:
                if self.wrapped is None:
                    self.wrapped = _library_of(request).HTTPTransport()
        response: httpx.Response = capture(request, self.wrapped.handle_request, self.routes)
        return response

    def close(self) -> None:
        """Close the wrapped transport."""
        if self.wrapped is not None:
            self.wrapped.close()


class AsyncTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`Transport`, for ``AsyncOpenAI(http_client=...)`` and
    ``httpx.AsyncClient`` / ``httpx2.AsyncClient``.

    Args:
        wrapped: the transport that really sends. When None, the ``AsyncHTTPTransport`` of the
            library the first request comes from, created on first use.
        routes: which requests are model requests.
    """

    def __init__(
        self,
        wrapped: httpx.AsyncBaseTransport | None = None,
        *,
        routes: ModelRoutes | None = None,
    ) -> None:
        self.wrapped = wrapped
        self.routes = routes or ModelRoutes()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Capture the request when a run is active and it is a model request; else send it."""
        if self.wrapped is None:  # one event loop: no other task runs between check and set
            self.wrapped = _library_of(request).AsyncHTTPTransport()
        response: httpx.Response = await acapture(
            request, self.wrapped.handle_async_request, self.routes
        )
        return response

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        if self.wrapped is not None:
            await self.wrapped.aclose()


# -- process-wide installation -----------------------------------------------------------------


def install(routes: ModelRoutes | None = None) -> None:
    """Capture model requests of every httpx/httpx2 client in this process (idempotent).

    Wraps ``HTTPTransport.handle_request`` and ``AsyncHTTPTransport.handle_async_request`` of
    ``httpx`` and, when installed, ``httpx2``: the default transports every SDK client gets,
    including clients created before this call. Requests still pass through untouched outside a
    Rewind run. LiteLLM's own httpx transport for async calls (``LiteLLMAiohttpTransport``,
    aiohttp underneath) is wrapped the same way once LiteLLM is loaded
    (:func:`install_sdk_transports`). Not covered: clients built on other transports
    (``httpx.MockTransport``, a transport of your own) or non-httpx SDKs such as
    ``requests``/``aiohttp``; wrap those in :class:`Transport`/:class:`AsyncTransport` or use
    ``rewind.chat``.

    Args:
        routes: which requests are model requests (replaces the previous setting when given).
    """
    global _ROUTES
    with _INSTALL_LOCK:
        if routes is not None:
            _ROUTES = routes
        for library in _libraries():
            _wrap(library.HTTPTransport, "handle_request", _sync_wrapper)
            _wrap(library.AsyncHTTPTransport, "handle_async_request", _async_wrapper)
        _wrap_sdk_transports()


def install_sdk_transports() -> None:
    """Wrap the httpx transports of SDKs loaded since :func:`install` (LiteLLM's aiohttp
    transport for async calls); cheap when there is nothing new. A run calls this as it starts
    while capture is installed."""
    with _INSTALL_LOCK:
        _wrap_sdk_transports()


def _wrap_sdk_transports() -> None:
    for module_name, cls_name in _SDK_ASYNC_TRANSPORTS:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if isinstance(cls, type):
            _wrap(cls, "handle_async_request", _async_wrapper)


def uninstall() -> None:
    """Restore the libraries' own transport methods (idempotent)."""
    with _INSTALL_LOCK:
        for name in _HTTP_LIBRARIES:
            library = sys.modules.get(name)
            if library is None:
                continue
            for cls, method in (
                (library.HTTPTransport, "handle_request"),
                (library.AsyncHTTPTransport, "handle_async_request"),
            ):
                original = getattr(cls.__dict__.get(method), _ORIGINAL, None)
                if original is not None:
                    setattr(cls, method, original)
        for module_name, cls_name in _SDK_ASYNC_TRANSPORTS:
            sdk_cls = getattr(sys.modules.get(module_name), cls_name, None)
            original = getattr(
                getattr(sdk_cls, "__dict__", {}).get("handle_async_request"), _ORIGINAL, None
            )
            if original is not None:
                sdk_cls.handle_async_request = original


def installed() -> bool:
    """True when :func:`install` is in effect for httpx."""
    return hasattr(httpx.HTTPTransport.__dict__.get("handle_request"), _ORIGINAL)


def _libraries() -> list[ModuleType]:
    found = []
    for name in _HTTP_LIBRARIES:
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return found


def _wrap(cls: type, method: str, wrapper: Callable[[Any], Any]) -> None:
    current_method = cls.__dict__.get(method)
    if current_method is None or hasattr(current_method, _ORIGINAL):
        return
    wrapped = wrapper(current_method)
    setattr(wrapped, _ORIGINAL, current_method)
    setattr(cls, method, wrapped)


def _sync_wrapper(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(original)
    def handle_request(self: Any, request: Any) -> Any:
        if current() is None:  # the fast path: no run, nothing to capture
            _warn_if_context_lost(None, request, _ROUTES)
            return original(self, request)
        return capture(request, functools.partial(original, self), _ROUTES)

    return handle_request


def _async_wrapper(
    original: Callable[[Any, Any], Awaitable[Any]],
) -> Callable[[Any, Any], Awaitable[Any]]:
    @functools.wraps(original)
    async def handle_async_request(self: Any, request: Any) -> Any:
        if current() is None:
            _warn_if_context_lost(None, request, _ROUTES)
            return await original(self, request)
        return await acapture(request, functools.partial(original, self), _ROUTES)

    return handle_async_request
