"""Every model client Rewind hands to a run satisfies the ChatBackend protocol (issue 9, point 9):
the model its keys default to, the cache key of a request, and sending it."""

from __future__ import annotations

from rewind.grid import SharedChatClient
from rewind.llm import ChatBackend, ChatClient
from rewind.session import LazyChatClient


def test_the_model_clients_are_chat_backends(chat_client: ChatClient) -> None:
    lazy = LazyChatClient()  # opens nothing until its first live call
    try:
        for client in (chat_client, lazy, SharedChatClient(chat_client)):
            assert isinstance(client, ChatBackend), type(client).__name__
            assert isinstance(client.endpoint.model, str) and client.endpoint.model
            body = {"messages": [{"role": "user", "content": "hi"}]}
            assert client.cache_key(body) == client.cache_key(dict(body))
        assert not lazy.started
    finally:
        lazy.close()


def test_an_object_without_complete_is_not_a_chat_backend() -> None:
    class NoSend:
        endpoint = None

        def cache_key(self, body: object) -> str:
            return ""

    assert not isinstance(NoSend(), ChatBackend)
