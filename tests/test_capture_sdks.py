"""HTTP-layer capture of LiteLLM and instructor: the libraries people call on top of the OpenAI SDK.

No code change in the node: LiteLLM's ``completion``/``acompletion`` with an ``openai/`` model and
an ``api_base``, and instructor over ``openai.OpenAI``/``AsyncOpenAI`` with a pydantic response
model, are recorded at the transport; an unchanged replay sends 0 requests (counted at the
loopback model server, :mod:`tests.model_stub`) and returns the same answers; a changed param
re-sends exactly the call it changes. LiteLLM is slow to import (seconds of CPU): those tests are
``slow``; it never fetches its model price map (``LITELLM_LOCAL_MODEL_COST_MAP``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from burr.core import State
from pydantic import BaseModel

import rewind
from rewind.replay import ParamOverride, Rewind
from tests.model_stub import STUB_MODEL, ModelStub
from tests.test_capture import node_row, one_node, output, record_sent, replay_unchanged
from tests.test_capture import rw as rw  # the fixture

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: the bundled price map


def _json_reply(question: str, n: int) -> str:
    """Answers instructor's JSON mode: a Fact naming the request number."""
    return json.dumps({"topic": question.rsplit(" ", 1)[-1], "fact": f"fact #{n}"})


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as server:
        yield server


@pytest.fixture
def json_stub() -> Iterator[ModelStub]:
    with ModelStub(reply=_json_reply) as server:
        yield server


def two_calls(ask: Callable[[str], str]) -> Callable[[State], list[str]]:
    """A node body asking a fixed question and one about the ``topic`` param (default rain)."""

    def body(state: State) -> list[str]:
        return [ask("tell me about clouds"), ask(f"tell me about {rewind.param('topic', 'rain')}")]

    return body


def check_changed_param_resends_one_call(rw: Rewind, parent: str, stub: ModelStub) -> None:
    """A fork changing the ``topic`` param: exactly the call it changes is sent again."""
    sent = stub.count
    fork = rw.fork(parent, at=1, override=ParamOverride(node_row(rw, parent).name, "topic", "snow"))
    assert fork.status == "completed", fork.error
    assert stub.count == sent + 1
    assert "snow" in json.dumps(stub.requests[-1]["messages"])
    assert [c.outcome for c in node_row(rw, fork.run_id).calls] == ["hit", "miss"]
    assert output(rw, fork.run_id)[0] == output(rw, parent)[0]


# -- LiteLLM -------------------------------------------------------------------------------------


def litellm_request(stub: ModelStub, prompt: str) -> dict[str, Any]:
    """What a user passes LiteLLM for an OpenAI-compatible server."""
    return {
        "model": f"openai/{STUB_MODEL}",
        "api_base": stub.base_url,
        "api_key": "sk-test-not-a-real-key",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
    }


@pytest.mark.slow
def test_litellm_completion_is_captured_and_replays_without_requests(
    rw: Rewind, stub: ModelStub
) -> None:
    import litellm

    def ask(prompt: str) -> str:
        reply = litellm.completion(**litellm_request(stub, prompt))
        return str(reply.choices[0].message.content)

    parent, answers = record_sent(rw, one_node("litellm", two_calls(ask)), stub, sent=2)
    assert answers == ["answer #1 to tell me about clouds", "answer #2 to tell me about rain"]
    assert output(rw, replay_unchanged(rw, parent, stub, sent=2)) == answers
    check_changed_param_resends_one_call(rw, parent, stub)


@pytest.mark.slow
def test_litellm_acompletion_is_captured_and_replays_without_requests(
    rw: Rewind, stub: ModelStub
) -> None:
    import litellm

    def ask(prompt: str) -> str:
        async def main() -> str:
            reply = await litellm.acompletion(**litellm_request(stub, prompt))
            return str(reply.choices[0].message.content)

        return asyncio.run(main())

    parent, answers = record_sent(rw, one_node("alitellm", two_calls(ask)), stub, sent=2)
    assert answers[1] == "answer #2 to tell me about rain"
    assert output(rw, replay_unchanged(rw, parent, stub, sent=2)) == answers
    check_changed_param_resends_one_call(rw, parent, stub)


# -- instructor ----------------------------------------------------------------------------------


class Fact(BaseModel):
    topic: str
    fact: str


def test_instructor_structured_output_is_captured_and_replays_without_requests(
    rw: Rewind, json_stub: ModelStub
) -> None:
    import instructor

    client = instructor.from_openai(
        openai.OpenAI(base_url=json_stub.base_url, api_key="sk-test", max_retries=0),
        mode=instructor.Mode.JSON,
    )

    def ask(prompt: str) -> str:
        fact = client.chat.completions.create(
            model=STUB_MODEL,
            response_model=Fact,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_retries=0,
        )
        assert isinstance(fact, Fact)
        return fact.model_dump_json()

    parent, answers = record_sent(rw, one_node("instructor", two_calls(ask)), json_stub, sent=2)
    assert [json.loads(a) for a in answers] == [
        {"topic": "clouds", "fact": "fact #1"},
        {"topic": "rain", "fact": "fact #2"},
    ]
    # instructor sent the schema-bearing request: the key covers response_format and the schema
    assert json_stub.requests[0]["response_format"] == {"type": "json_object"}
    assert "Fact" in json.dumps(json_stub.requests[0]["messages"])
    assert output(rw, replay_unchanged(rw, parent, json_stub, sent=2)) == answers
    check_changed_param_resends_one_call(rw, parent, json_stub)


def test_instructor_over_the_async_client_is_captured(rw: Rewind, json_stub: ModelStub) -> None:
    import instructor

    def ask(prompt: str) -> str:
        async def main() -> str:
            raw = openai.AsyncOpenAI(base_url=json_stub.base_url, api_key="k", max_retries=0)
            client = instructor.from_openai(raw, mode=instructor.Mode.JSON)
            fact = await client.chat.completions.create(
                model=STUB_MODEL,
                response_model=Fact,
                messages=[{"role": "user", "content": prompt}],
                max_retries=0,
            )
            await raw.close()
            return fact.model_dump_json()

        return asyncio.run(main())

    parent, answers = record_sent(rw, one_node("ainstructor", two_calls(ask)), json_stub, sent=2)
    assert json.loads(answers[1]) == {"topic": "rain", "fact": "fact #2"}
    assert output(rw, replay_unchanged(rw, parent, json_stub, sent=2)) == answers
    check_changed_param_resends_one_call(rw, parent, json_stub)


def test_node_row_outcomes_after_instructor_record(rw: Rewind, json_stub: ModelStub) -> None:
    import instructor

    client = instructor.from_openai(
        openai.OpenAI(base_url=json_stub.base_url, api_key="k", max_retries=0),
        mode=instructor.Mode.JSON,
    )

    def ask(state: State) -> Any:
        return client.chat.completions.create(
            model=STUB_MODEL,
            response_model=Fact,
            messages=[{"role": "user", "content": "tell me about hail"}],
            max_retries=0,
        ).model_dump()

    parent, answer = record_sent(rw, one_node("instructor1", ask), json_stub, sent=1)
    node = node_row(rw, parent)
    assert (node.cache_outcome, node.cache_reason) == ("miss", "bypass")
    assert node.prompt_tokens == 7 and node.calls[0].kind == "llm"
    assert answer == {"topic": "hail", "fact": "fact #1"}
