"""LLM calls from inside a run: :func:`chat` goes through the LLM cache.

The cache key is :func:`rewind.llm.llm_cache_key` (DESIGN rule 5: every output-affecting
parameter with provider defaults filled in, never volatile fields). A hit returns the recorded
response body byte-identical (content, finish_reason, usage, logprobs) and spends 0 tokens. A call
sampled at an effective temperature > 0 (an omitted temperature is the provider default 1.0) is
flagged ``non-deterministic``: still cached, so an unchanged replay stays exact, but shown as such.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewind.cache import DEFAULT_POLICY, CallPolicy, Executed, through_cache
from rewind.context import RunContext, current
from rewind.errors import EndpointUnavailable
from rewind.llm import DEFAULT_TEMPERATURE, ChatResponse, llm_request_key, plain_request_key


def chat(messages: Sequence[Mapping[str, Any]], **params: Any) -> ChatResponse:
    """Send a chat completion through the current run's LLM cache.

    Args:
        messages: OpenAI chat messages (``[{"role": "user", "content": "…"}]``).
        **params: request parameters (``temperature``, ``max_tokens``, ``response_format``…);
            ``None`` values are dropped. An omitted temperature is keyed as the provider default
            1.0, never 0.
    Returns:
        the response; on a cache hit it is rebuilt from the recorded bytes (``latency_ms`` 0).
    Raises:
        EndpointUnavailable: no model endpoint is configured for this run, or it cannot be
            reached; ModelCallError: the endpoint refused the request.
    """
    ctx = current()
    client = ctx.chat_client if ctx is not None else None
    if client is None:
        raise EndpointUnavailable(
            "no model endpoint is configured for this run",
            "pass chat_client= to Rewind(...) or run through the rewind CLI",
        )
    body: dict[str, Any] = {"messages": [dict(m) for m in messages]}
    body.update({k: v for k, v in params.items() if v is not None})
    return send(body, default_model=client.endpoint.model)


def chat_plain(
    plain: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> ChatResponse:
    """``chat(messages, **params)`` when the caller holds the request's plain copy already:
    ``plain`` is :func:`rewind.tracing.model.plain_fields` of ``{"messages": messages,
    **params}`` (a traced step's input). The key is computed from it by
    :func:`rewind.llm.plain_request_key` (the same key, without checking every value again);
    the body sent on a miss is :func:`chat`'s.

    Raises:
        as :func:`chat`.
    """
    ctx = current()
    client = ctx.chat_client if ctx is not None else None
    if ctx is None or client is None:
        return chat(messages, **params)  # raises as chat does
    default_model = client.endpoint.model
    fields = {k: v for k, v in plain.items() if v is not None}
    key, request = plain_request_key(fields, default_model=default_model)

    def body() -> dict[str, Any]:
        # Built only when the call misses (a served call sends nothing).
        out: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        out.update({k: v for k, v in params.items() if v is not None})
        return out

    # The plain copy's fields (None dropped) hold the body's temperature and model.
    return _send(ctx, fields, key, request, default_model, body)


def send(body: Mapping[str, Any], *, default_model: str | None = None) -> ChatResponse:
    """Send a whole chat-completions request body through the current run's LLM cache.

    :func:`chat` builds the body; a replay of recorded calls (:mod:`rewind.tracing.recorded`)
    sends the body it recorded. The model endpoint is needed only when the call misses: a replay
    served wholly from the cache runs without one.

    Args:
        body: ``messages``, ``model`` and parameters; ``None`` values are not sent.
        default_model: the model keyed (and sent) when the body names none.
    Returns:
        the response (rebuilt from the recorded bytes on a hit).
    Raises:
        EndpointUnavailable: no run is active; or the call misses and no endpoint is configured
            or reachable. ModelCallError: the endpoint refused the request.
        ValueError: the body names no model and there is no ``default_model``.
    """
    ctx = current()
    if ctx is None:
        raise EndpointUnavailable(
            "no Rewind run is active", "call it inside a traced step or a Rewind run"
        )
    body = {k: v for k, v in body.items() if v is not None}
    key, request = llm_request_key(body, default_model=default_model)
    return _send(ctx, body, key, request, default_model, lambda: body)


def _send(
    ctx: RunContext,
    fields: Mapping[str, Any],
    key: str,
    request: bytes,
    default_model: str | None,
    body: Callable[[], Mapping[str, Any]],
) -> ChatResponse:
    """Serve a keyed request from the cache or send ``body()`` (see :func:`send`): ``fields``
    are the request's fields without ``None`` values (its ``model`` and ``temperature`` are the
    body's)."""
    client = ctx.chat_client
    model = fields.get("model") or default_model

    def execute() -> Executed:
        if client is None:
            raise EndpointUnavailable(
                f"the call to {model} is not in the cache and no model endpoint is configured",
                "set REWIND_BASE_URL and REWIND_MODEL to an endpoint serving that model",
            )
        response = client.complete(body())
        return Executed(
            response.raw, response.prompt_tokens, response.completion_tokens, response.latency_ms
        )

    temperature = fields.get("temperature", DEFAULT_TEMPERATURE)
    sampled = isinstance(temperature, int | float) and temperature > 0
    policy = CallPolicy("non-deterministic") if sampled else DEFAULT_POLICY
    data, record = through_cache(
        ctx,
        kind="llm",
        name=str(model),
        key=key,
        request=request,
        execute=execute,
        policy=policy,
    )
    return ChatResponse.from_raw(data, latency_ms=record.latency_ms)
