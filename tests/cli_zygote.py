"""A fork server for the tests' ``rewind`` commands: Python and the heavy libraries start once.

A ``rewind`` command run as ``python -m rewind`` spends most of its CPU time before it looks at
its arguments: interpreter start, then SQLAlchemy, Burr (which imports pandas and numpy), Typer
and Rich (~0.7 s of CPU each time on the 2-core CI machine; the suite runs several hundred
commands). This server imports those libraries once — never ``rewind`` itself, nor the tests'
modules — and then, for each command, forks:

* a *waiter*, which forks the *command* process and reports its pid, then its exit status;
* the *command* process: the caller's working folder, environment, ``sys.path`` (as
  ``python -m`` builds it from that folder and ``PYTHONPATH``) and stdin/stdout/stderr (the
  caller's pipe ends, passed over the socket), then ``runpy.run_module("rewind")`` exactly as
  ``python -m rewind`` runs it. It imports Rewind from the caller's ``PYTHONPATH`` afresh, so
  Rewind's import-time reads of the environment see the command's environment.

It exits like an interpreter does (non-daemon threads joined, ``atexit`` handlers run, output
flushed, ``SystemExit`` turned into the exit status, an uncaught exception printed with its
traceback and exit status 1). Its exit status, stdout and stderr are the process's own.

:mod:`tests.cli_process` uses it only when the command's interpreter-start settings (every
``PYTHON*`` variable, locale and time zone variables) equal the server's, and when the caller
passes no ``Popen`` options; anything else runs as a plain subprocess.

Run as ``python -m tests.cli_zygote SOCKET_PATH``. Protocol, per connection: the client sends a
4-byte big-endian length and a JSON object ``{"argv": [...], "env": {...}, "cwd": "...",
"obey_file_modes": false}`` (true: see :func:`obey_file_modes`) with
three file descriptors (stdin, stdout, stderr) attached to its first byte; the server answers
``pid <n>\\n`` and later ``exit <returncode>\\n`` (a negative return code: killed by that
signal, as :class:`subprocess.Popen` reports it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

PRELOAD = ("sqlalchemy", "sqlalchemy.dialects.sqlite", "burr.core", "burr.tracking.base", "typer",
           "rich.console", "rich.table", "httpx", "pydantic", "psutil", "tenacity", "orjson",
           "alembic.command", "alembic.script", "alembic.runtime.migration", "alembic.operations",
           "alembic.ddl.sqlite", "mako.template")  # fmt: skip
"""Third-party modules imported once, before any fork (Burr imports pandas and numpy).

Alembic (with Mako, which imports Pygments' lexers) is what every command that creates or
migrates a store imports: preloaded, such a command (``rewind run`` into a new folder) took
0.21 s of CPU in the forked process instead of 0.36 s (medians of 4, tests/cli_zygote.py's
protocol emulated in one process)."""


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    while len(head) < 4:
        head += conn.recv(4 - len(head))
    (size,) = struct.unpack(">I", head)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client hung up mid-request")
        body += chunk
    return json.loads(body), list(fds)


def _run_command(request: dict[str, Any], fds: list[int]) -> int:
    """In the command process: become ``python -m rewind ARGV`` and run it; the exit status."""
    import atexit
    import importlib
    import runpy
    import threading
    import time
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request.get("obey_file_modes"):
        obey_file_modes()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *BASE_PATH]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.argv = ["-m", *request["argv"]]
    code: int = 0
    try:
        try:
            runpy.run_module("rewind", run_name="__main__", alter_sys=True)
        finally:
            threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's exit
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    return code


_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def obey_file_modes() -> None:
    """Make this process (and any program it executes) obey file modes, as everyone must on
    read-only media: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set (so an
    ``exec`` does not give them back to root) and from its effective, permitted and inheritable
    sets (so this process, forked and not exec'd, loses them now). Root ignores file modes
    otherwise. A no-op without the capabilities (any other user).

    Raises:
        OSError: ``prctl`` or ``capset`` refused, or the capabilities are still effective.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    dac = (1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)
    if not data[0].effective & dac and not data[0].permitted & dac:
        return
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
    for part in ("effective", "permitted", "inheritable"):
        setattr(data[0], part, getattr(data[0], part) & ~dac)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if libc.capget(ctypes.byref(header), data) != 0 or data[0].effective & dac:
        raise OSError(ctypes.get_errno(), "CAP_DAC_OVERRIDE/READ_SEARCH still effective")


def _exit_status(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _serve_one(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the waiter: fork the command process, report its pid and then its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        os._exit(_run_command(request, fds))
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())


def main(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    parent = os.getppid()
    server.settimeout(1.0)
    print("ready", flush=True)
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the pytest process is gone (killed): so is its server
                import shutil

                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                return
            continue
        conn.settimeout(None)
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            code = 0
            try:
                _serve_one(conn, request, fds)
            except BaseException:
                code = 1
            os._exit(code)
        for fd in fds:
            os.close(fd)
        conn.close()


BASE_PATH: list[str] = []
"""The interpreter's own ``sys.path`` (stdlib, site-packages, ``.pth`` entries), without the
server's working folder and ``PYTHONPATH`` entries."""

if __name__ == "__main__":
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    BASE_PATH[:] = [p for p in sys.path[1:] if p not in own]
    main(sys.argv[1])
