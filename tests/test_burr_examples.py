"""Acceptance for issue 10: Burr's own example apps (tests/apps/), recorded and forked unchanged.

The apps call the OpenAI SDK inside their actions; the SDK is pointed at a real loopback model
server with its own environment variables (OPENAI_BASE_URL, OPENAI_API_KEY) and their trackers
write under a temporary HOME. Model requests are counted where they arrive — at the server — never
in Rewind's bookkeeping. The stub's answers carry its request number, so a request an unchanged
fork re-sent would also change a hash. One slow test runs the real embedded llama-cpp server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind import InputOverride, Rewind
from tests.apps import multi_modal_chatbot, streaming_chatbot
from tests.model_stub import ModelStub

MODE_QUESTION = "respond with *only* a single word representing the mode"
PROMPT = "Who was Aaron Burr, sir?"


def _reply(question: str, n: int) -> str:
    # the apps ask the model to pick a mode first; answer like a model that follows instructions
    return "answer_question" if MODE_QUESTION in question else f"answer #{n} to {question}"


@dataclass(frozen=True)
class Example:
    """One vendored app: how to build it and run it as its README does."""

    ref: str
    build: Callable[[Path], Any]
    halt_after: list[str]
    nodes: list[str]


EXAMPLES = {
    "multi-modal-chatbot": Example(
        ref="tests.apps.multi_modal_chatbot:application",
        build=lambda home: multi_modal_chatbot.application(storage_dir=str(home / "burr")),
        halt_after=["response"],
        nodes=[
            "prompt",
            "check_openai_key",
            "check_safety",
            "decide_mode",
            "answer_question",
            "response",
        ],
    ),
    "streaming-chatbot (async)": Example(
        ref="tests.apps.streaming_chatbot:application",
        build=lambda home: streaming_chatbot.application(),
        halt_after=streaming_chatbot.TERMINAL_ACTIONS,
        nodes=["prompt", "check_safety", "decide_mode", "answer_question"],
    ),
}


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelStub]:
    with ModelStub(reply=_reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the apps' trackers write ~/.burr
        yield server


def hashes(rw: Rewind, run_id: str) -> list[tuple[str, str | None]]:
    return [(n.name, n.output_hash) for n in rw.store.nodes_of(run_id)]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_burr_example_records_and_forks_without_new_model_requests(
    name: str, stub: ModelStub, tmp_path: Path
) -> None:
    ex = EXAMPLES[name]
    rw = Rewind(tmp_path / "store")
    parent = rw.record(ex.build(tmp_path), inputs={"prompt": PROMPT}, halt_after=ex.halt_after)
    assert parent.status == "completed", parent.error
    nodes = rw.store.nodes_of(parent.run_id)
    assert [n.name for n in nodes] == ex.nodes
    assert stub.count == 2  # choose the mode, then answer (streamed in the async app)
    by_name = {n.name: n for n in nodes}
    for model_node in ("decide_mode", "answer_question"):
        node = by_name[model_node]
        assert (node.cache_outcome, node.cache_reason) == ("miss", "bypass")
    # a stream reports usage only when asked (stream_options.include_usage): the app does not ask
    assert by_name["decide_mode"].tokens > 0
    answer = rw.node_output(by_name["answer_question"])["response"]["content"]
    assert answer.startswith("answer #2 to Please answer the following question")
    assert answer.strip().endswith(PROMPT)
    assert parent.tokens > 0

    for at in range(1, len(ex.nodes) + 1):
        child = rw.fork(parent.run_id, at=at)
        assert child.status == "completed", child.error
        assert hashes(rw, child.run_id) == hashes(rw, parent.run_id), at
        assert child.tokens == 0
        executed = [n for n in rw.store.nodes_of(child.run_id) if not n.inherited]
        assert all(n.cache_outcome in ("hit", "none") for n in executed), at
    assert stub.count == 2

    changed = rw.fork(
        parent.run_id,
        at="prompt",
        override=InputOverride("prompt", "prompt", "Who was Alexander Hamilton?"),
    )
    assert changed.status == "completed", changed.error
    d = rw.diff(parent.run_id, changed.run_id)
    assert d.first_divergence is not None and d.first_divergence.name == "prompt"
    assert stub.count == 4
    assert "Alexander Hamilton" in stub.requests[-1]["messages"][-1]["content"]


def test_burr_example_from_the_command_line(stub: ModelStub, tmp_path: Path) -> None:
    from tests.test_cli import ok_json

    store = tmp_path / "store"
    ex = EXAMPLES["multi-modal-chatbot"]
    args = ["--app", ex.ref, "--inputs", f'{{"prompt": "{PROMPT}"}}', "--halt-after", "response"]
    parent = ok_json(store, "run", *args)
    assert [n["name"] for n in parent["nodes"]] == ex.nodes
    assert stub.count == 2
    rid = parent["run"]["run_id"]
    same = ok_json(store, "fork", rid, "--at", "decide_mode")
    assert [n["output_hash"] for n in same["nodes"]] == [n["output_hash"] for n in parent["nodes"]]
    assert stub.count == 2
    changed = ok_json(
        store, "fork", rid, "--at", "1", "--set-input", 'prompt.prompt="Who was Hamilton?"'
    )
    assert changed["nodes"][0]["output_hash"] != parent["nodes"][0]["output_hash"]
    assert stub.count == 4


@pytest.mark.slow
def test_burr_example_on_the_embedded_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.localmodel import LocalModelServer

    log = tmp_path / "llama-server.log"

    def requests_served() -> int:
        # uvicorn's access log of the llama-cpp server: one line per request it answered
        return len(re.findall(r'"POST /v1/chat/completions', log.read_text(errors="replace")))

    with LocalModelServer(log_path=log) as server:
        endpoint = server.start() if server.endpoint is None else server.endpoint
        monkeypatch.setenv("OPENAI_BASE_URL", endpoint.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        rw = Rewind(tmp_path / "store")
        app = multi_modal_chatbot.application(storage_dir=str(tmp_path / "burr"))
        parent = rw.record(app, inputs={"prompt": "What is 2+2?"}, halt_after=["response"])
        assert parent.status == "completed", parent.error
        sent = requests_served()
        assert sent >= 1 and parent.tokens > 0
        names = [n.name for n in rw.store.nodes_of(parent.run_id)]
        for at in range(1, len(names) + 1):
            child = rw.fork(parent.run_id, at=at)
            assert hashes(rw, child.run_id) == hashes(rw, parent.run_id), at
            assert child.tokens == 0
        assert requests_served() == sent
        changed = rw.fork(
            parent.run_id, at=1, override=InputOverride("prompt", "prompt", "What is 3+3?")
        )
        assert rw.diff(parent.run_id, changed.run_id).first_divergence.name == "prompt"
        assert requests_served() > sent
