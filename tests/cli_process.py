"""Run the ``rewind`` command as a user would: a process of its own, this checkout's sources first.

Each command is a separate process with its own exit status, stdout and stderr. By default it
is forked from a server (:mod:`tests.cli_zygote`, one per pytest process) that has already
started Python and imported the heavy third-party libraries, instead of starting a new
interpreter (~0.7 s of CPU a command on the 2-core CI machine). A command whose interpreter
start would differ — another ``PYTHONPATH``, ``PYTHONHASHSEED`` or any ``PYTHON*``, locale or
time zone variable — or that passes ``Popen`` options (``preexec_fn``...) runs as a plain
``python -m rewind`` subprocess, as does every command when ``REWIND_TESTS_FORK_SERVER=0``.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests import cli_zygote

ROOT = Path(__file__).resolve().parent.parent
FORK_SERVER_VARIABLE = "REWIND_TESTS_FORK_SERVER"
_USER_STORE_VARIABLES = ("REWIND_STORE", "REWIND_OBJECTS")
_START_WAIT_S = 300  # a bound on a hung start (imports on a loaded machine), not a speed check


def run_rewind(
    *args: str,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    columns: int = 160,
    timeout: float = 900,
    obey_file_modes: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """``python -m rewind ARGS`` with ``PYTHONPATH`` = this checkout's ``src`` and root (an
    editable install of another checkout must not answer instead), ``COLUMNS`` = ``columns``,
    ``REWIND_STORE`` and ``REWIND_OBJECTS`` (a developer's own store and bucket) removed unless
    ``env`` sets them. Output is captured as text. ``obey_file_modes``: the command runs without
    the capabilities that let root ignore file modes (:func:`tests.cli_zygote.obey_file_modes`).

    Raises:
        subprocess.TimeoutExpired: the command ran longer than ``timeout`` seconds (it is
            killed first).
    """
    full_env = {k: v for k, v in os.environ.items() if k not in _USER_STORE_VARIABLES}
    full_env |= {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "COLUMNS": str(columns),
        **(env or {}),
    }
    if not popen and _FORK_SERVER.serves(full_env):
        return _FORK_SERVER.run(
            list(args), full_env, Path(cwd), stdin or "", timeout, obey_file_modes
        )
    if obey_file_modes:
        assert "preexec_fn" not in popen, "obey_file_modes sets preexec_fn"
        popen["preexec_fn"] = cli_zygote.obey_file_modes
    return subprocess.run(
        [sys.executable, "-m", "rewind", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        input=stdin or "",
        timeout=timeout,
        check=False,
        **popen,
    )


def _startup_settings(env: dict[str, str]) -> dict[str, str]:
    """The variables the interpreter reads when it starts (the fork server read its own)."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(("PYTHON", "LC_")) or k in ("LANG", "LANGUAGE", "TZ")
    }


class _ForkServer:
    """This process's connection to a :mod:`tests.cli_zygote` server, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket_path: str | None = None
        self._settings: dict[str, str] | None = None
        self._folder: str | None = None

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with environment ``env`` may be forked from the server."""
        if os.environ.get(FORK_SERVER_VARIABLE, "1") == "0" or sys.platform != "linux":
            return False
        with self._lock:
            if self._settings is None:
                self._settings = _startup_settings(env)
            return _startup_settings(env) == self._settings

    def _ensure_started(self) -> str:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                assert self._socket_path is not None
                return self._socket_path
            assert self._settings is not None
            self._folder = tempfile.mkdtemp(prefix="rewind-zygote-")
            self._socket_path = os.path.join(self._folder, "socket")
            env = {k: v for k, v in os.environ.items() if k not in _startup_settings(os.environ)}
            env |= self._settings
            self._process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("cli_zygote.py")), self._socket_path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                cwd=self._folder,
            )
            assert self._process.stdout is not None
            ready = _read_line(self._process.stdout, _START_WAIT_S)
            if ready != b"ready\n":
                self._process.kill()
                raise RuntimeError(f"the rewind fork server did not start (said {ready!r})")
            atexit.register(self.stop)
            return self._socket_path

    def stop(self) -> None:
        """Stop the server (commands already forked run on)."""
        with self._lock:
            if self._process is not None:
                self._process.kill()
                self._process.wait()
                if self._process.stdout is not None:
                    self._process.stdout.close()
                self._process = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        stdin: str,
        timeout: float,
        obey_file_modes: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Fork ``rewind ARGS`` from the server; like ``subprocess.run(..., text=True)``."""
        path = self._ensure_started()
        request = {"argv": args, "env": env, "cwd": str(cwd), "obey_file_modes": obey_file_modes}
        body = json.dumps(request).encode()
        encoding = "utf-8" if sys.flags.utf8_mode else locale.getencoding()
        pipes = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            head = struct.pack(">I", len(body))
            socket.send_fds(conn, [head[:1]], theirs)
            conn.sendall(head[1:] + body)
        finally:
            for fd in theirs:
                os.close(fd)
        out: dict[int, bytes] = {}
        readers = [threading.Thread(target=_drain, args=(fd, out), daemon=True) for fd in ours[1:]]
        writer = threading.Thread(target=_feed, args=(ours[0], stdin.encode(encoding)), daemon=True)
        for t in (*readers, writer):
            t.start()
        replies = conn.makefile("rb")
        pid = None
        try:
            conn.settimeout(timeout)
            pid = int(replies.readline().split()[1])
            code = int(replies.readline().split()[1])
        except TimeoutError:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            for t in (*readers, writer):
                t.join(30)
            raise subprocess.TimeoutExpired(
                [sys.executable, "-m", "rewind", *args],
                timeout,
                output=_text(out.get(ours[1], b""), encoding),
                stderr=_text(out.get(ours[2], b""), encoding),
            ) from None
        except (IndexError, ValueError) as exc:
            raise RuntimeError("the rewind fork server hung up without an exit status") from exc
        finally:
            replies.close()
            conn.close()
        for t in (*readers, writer):
            t.join()
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "rewind", *args],
            code,
            _text(out[ours[1]], encoding),
            _text(out[ours[2]], encoding),
        )


def _read_line(stream: Any, timeout: float) -> bytes:
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else b""


def _drain(fd: int, out: dict[int, bytes]) -> None:
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
        out[fd] = b"".join(chunks)


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass  # the command exited without reading all of stdin, as subprocess.run allows
    finally:
        os.close(fd)


def _text(data: bytes, encoding: str) -> str:
    """Bytes as ``subprocess.run(text=True)`` returns them (universal newlines)."""
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


_FORK_SERVER = _ForkServer()
