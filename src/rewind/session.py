"""The model endpoint a command uses, opened only when a call actually misses the cache.

An unchanged replay is served entirely from the cache, so it must not even start the embedded
model server: :class:`LazyChatClient` starts it (or checks ``REWIND_BASE_URL``) on the first
live call and stops it on :meth:`LazyChatClient.close`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.errors import EndpointUnavailable
from rewind.llm import ChatClient, ChatResponse, Endpoint, llm_cache_key
from rewind.localmodel import DEFAULT_MODEL_ALIAS, model_endpoint

if TYPE_CHECKING:
    from rewind.replay import Rewind


@dataclass(frozen=True)
class ModelName:
    """What cache keys need before an endpoint is open: the model name."""

    model: str


class LazyChatClient:
    """A :class:`ChatClient` look-alike that opens its endpoint on the first live call.

    ``endpoint.model`` and :meth:`cache_key` work without starting anything. Thread-safe.

    Raises (from :meth:`complete`):
        EndpointUnavailable: the endpoint does not answer or the local server cannot start.
    """

    def __init__(self) -> None:
        env = Endpoint.from_env()
        self._model = env.model if env is not None else DEFAULT_MODEL_ALIAS
        self._stack = ExitStack()
        self._client: ChatClient | None = None
        self._lock = threading.Lock()
        self.started = False

    @property
    def endpoint(self) -> Endpoint | ModelName:
        """The open endpoint, or just the model name while nothing is open."""
        return self._client.endpoint if self._client is not None else ModelName(self._model)

    def cache_key(self, body: Mapping[str, Any]) -> str:
        """The LLM cache key of ``body`` (see :func:`rewind.llm.llm_cache_key`)."""
        return llm_cache_key(body, default_model=self._model)

    def open(self) -> ChatClient:
        """Open the endpoint now (starting the embedded server if needed)."""
        with self._lock:
            if self._client is None:
                endpoint = self._stack.enter_context(model_endpoint())
                # The endpoint may be the embedded llama.cpp server (top_p default 0.95): send
                # every keyed sampling default.
                self._client = self._stack.enter_context(
                    ChatClient(endpoint, send_sampling_defaults=True)
                )
                self.started = True
            return self._client

    def complete(self, body: Mapping[str, Any]) -> ChatResponse:
        """Send a request, opening the endpoint first if needed.

        Raises:
            EndpointUnavailable: the endpoint cannot be opened (marked
                :func:`rewind.call.not_sent`: the call is not recorded as failed), or as
                :meth:`ChatClient.complete`; ModelCallError: as :meth:`ChatClient.complete`.
        """
        from rewind.call import not_sent

        try:
            client = self.open()
        except EndpointUnavailable as exc:
            not_sent(exc)
            raise
        return client.complete(body)

    def close(self) -> None:
        """Close the client and stop the embedded server if this session started it."""
        with self._lock, contextlib.suppress(Exception):
            self._stack.close()
        self._client = None

    def __enter__(self) -> LazyChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def command_session(store: str, **rewind_kwargs: Any) -> Iterator[Rewind]:
    """A :class:`Rewind` on ``store`` whose model endpoint opens on the first cache miss; the
    endpoint (and the embedded server, if started) and the store are closed on exit.

    Raises:
        StoreError: the store cannot be opened.
    """
    from rewind.replay import Rewind

    with LazyChatClient() as client:
        rw = Rewind(store, chat_client=client, **rewind_kwargs)
        try:
            yield rw
        finally:
            rw.store.close()
