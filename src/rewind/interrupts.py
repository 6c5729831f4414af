"""Hold Ctrl-C and SIGTERM while a run is written, so an interrupt never loses it.

A KeyboardInterrupt raised inside a write rolls its transaction back: a trace whose chain had
ended (or had been interrupted) was then not stored at all, though the CLI said the run was
marked interrupted. :class:`held_interrupts` swaps SIGINT's and SIGTERM's handlers for one that
notes the signal; when the block ends the old handlers are back and the first noted signal is
handed to its old handler (``KeyboardInterrupt`` for SIGINT and for the CLI's SIGTERM). A second
signal while one is held is not held (the user insists): it raises ``KeyboardInterrupt`` there.

The handlers are read and set through ``_signal`` (the C module ``signal`` wraps): ``signal``'s
enum conversions made the four swaps of every trace's exit cost ~12 us; these cost ~0.5 us.
"""

from __future__ import annotations

import _signal
import os
import threading
from typing import Any

_HELD = (_signal.SIGINT, _signal.SIGTERM)
_MAIN = threading.main_thread()


class held_interrupts:  # used as a context manager, named like one
    """``with held_interrupts(): ...`` runs the block with SIGINT and SIGTERM held (see the
    module doc).

    Only the main thread can set signal handlers, and only it gets ``KeyboardInterrupt``: in
    another thread, or for a signal the process ignores, nothing is changed.
    """

    __slots__ = ("_caught", "_old")

    def __init__(self) -> None:
        self._old: list[tuple[int, Any]] = []
        self._caught: list[int] = []

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        for signum in _HELD:
            handler = _signal.getsignal(signum)
            if handler is not None and handler != _signal.SIG_IGN:
                self._old.append((signum, handler))
                _signal.signal(signum, self._note)

    def _note(self, signum: int, _frame: Any) -> None:
        if self._caught:
            raise KeyboardInterrupt
        self._caught.append(signum)

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self._old:
            _signal.signal(signum, handler)
        if self._caught:
            signum = self._caught[0]
            _deliver(signum, dict(self._old)[signum])


def _deliver(signum: int, handler: Any) -> None:
    """Hand a held signal to the handler it was held from (the default: sent again)."""
    if callable(handler):
        handler(signum, None)
    else:  # SIG_DFL: the default action (SIGTERM ends the process)
        os.kill(os.getpid(), signum)
