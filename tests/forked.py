"""Run a function of this test process in a forked child: another process, started in ~10 ms.

For tests that need several processes working at once on one store (its file locks, its
SQLite busy handling, Rewind's at-fork hooks): a fresh ``python -c`` interpreter costs ~1-2 s of
CPU each to import Python, Burr (pandas, numpy), SQLAlchemy and Rewind again; a fork of this
process has them imported already, and is a process of its own all the same (its own pid, file
descriptors, locks and connections; Rewind's at-fork hooks reset its pools and threads).

The child's stdin and stdout (pytest-xdist's channel to a worker) are /dev/null; what the
function returns (``str()``) comes back through a pipe; a raised exception's traceback goes to
stderr (pytest captures it) and the exit status is 1. The child leaves by ``os._exit``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Child:
    """A forked child: its ``pid`` and the read end of its result pipe."""

    pid: int
    result_fd: int

    def wait(self, timeout: float = 600.0) -> tuple[int, str]:
        """Wait for the child to exit: ``(exit status, what the function returned)``.

        Raises:
            TimeoutError: the child ran longer than ``timeout`` seconds (it is killed first).
        """
        deadline = time.monotonic() + timeout
        parts: list[bytes] = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.result_fd], [], [], left)[0]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    raise TimeoutError(f"forked child {self.pid} ran longer than {timeout} s")
                chunk = os.read(self.result_fd, 65536)
                if not chunk:
                    break
                parts.append(chunk)
        finally:
            os.close(self.result_fd)
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status), b"".join(parts).decode()


def start(target: Callable[[int], object]) -> tuple[int, int]:
    """Fork a child that runs ``target(write_fd)`` (the write end of a pipe to this process);
    ``(pid, read_fd)``: the child's pid and the pipe's read end, which this process closes."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_fd)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            target(write_fd)
            code = 0
        except BaseException:
            traceback.print_exc()  # on stderr, as the child's own interpreter would
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def fork(fn: Callable[..., Any], *args: Any) -> Child:
    """Start ``fn(*args)`` in a forked child of this process; :meth:`Child.wait` for it."""

    def target(write_fd: int) -> None:
        result = fn(*args)
        os.write(write_fd, str("" if result is None else result).encode())

    return Child(*start(target))
