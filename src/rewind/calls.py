"""LLM calls from inside a run: :func:`chat` goes through the LLM cache.

The cache key is :func:`rewind.llm.llm_cache_key` (DESIGN rule 5: every output-affecting
parameter with provider defaults filled in, never volatile fields). A hit returns the recorded
response body byte-identical (content, finish_reason, usage, logprobs) and spends 0 tokens. A call
sampled at an effective temperature > 0 (an omitted temperature is the provider default 1.0) is
flagged ``non-deterministic``: still cached, so an unchanged replay stays exact, but shown as such.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewind.cache import DEFAULT_POLICY, CallPolicy, Executed, through_cache
from rewind.canonical import canonical_bytes
from rewind.context import current
from rewind.errors import EndpointUnavailable
from rewind.llm import DEFAULT_TEMPERATURE, ChatResponse, normalize_request


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
    key = client.cache_key(body)
    request = canonical_bytes(normalize_request(body, default_model=client.endpoint.model))

    def execute() -> Executed:
        response = client.complete(body)
        return Executed(
            response.raw, response.prompt_tokens, response.completion_tokens, response.latency_ms
        )

    temperature = body.get("temperature", DEFAULT_TEMPERATURE)
    sampled = isinstance(temperature, int | float) and temperature > 0
    policy = CallPolicy("non-deterministic") if sampled else DEFAULT_POLICY
    data, record = through_cache(
        ctx,
        kind="llm",
        name=client.endpoint.model,
        key=key,
        request=request,
        execute=execute,
        policy=policy,
    )
    return ChatResponse.from_raw(data, latency_ms=record.latency_ms)
