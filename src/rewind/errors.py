"""Rewind's error types: one line saying what is wrong, and a hint saying how to fix it.

Every error a person can act on derives from :class:`RewindError`, so the CLI and the API can
render the same two lines (what, then how) without knowing which module raised it.
"""

from __future__ import annotations

import copy
from typing import Self

__all__ = [
    "CodeDrift",
    "ContextLost",
    "EndpointUnavailable",
    "ForkError",
    "InvalidOverride",
    "InvalidRequest",
    "ModelCallError",
    "ModelErrorStatus",
    "ModelTransportError",
    "ParentMissing",
    "RewindError",
    "RunBusy",
    "StateLoadError",
    "StoreError",
    "UnknownNode",
    "UnknownRun",
    "UnstorableValue",
]


class RewindError(Exception):
    """Base of Rewind's user-facing errors.

    Args:
        message: one line saying what is wrong (no trailing period needed, no newline).
        hint: one line saying how to fix it; empty when there is nothing useful to suggest.
        field: the request field at fault (``at``, ``override.param``, ``overrides.1.node``),
            as the API reports it next to the message; None when no one field is.
        run_id: the run that was recorded (as failed) before the error was raised; None when
            nothing was written. The CLI exits 1 for such an error, 2 for bad input.

    ``str(error)`` is the message, followed by the hint on a second line when there is one.
    """

    def __init__(
        self,
        message: str,
        hint: str = "",
        *,
        field: str | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.message = message
        self.hint = hint
        self.field = field
        self.run_id = run_id

    def for_run(self, run_id: str) -> Self:
        """This error (same type, message, hint and details) naming the run it was recorded
        on: a copy, since the error was raised by code that did not know the run."""
        clone = copy.copy(self)
        clone.run_id = run_id
        return clone

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class EndpointUnavailable(RewindError):
    """The model endpoint cannot be reached, or the embedded local model server cannot start."""


class ModelTransportError(EndpointUnavailable):
    """A model request captured from an SDK (:mod:`rewind.capture`) whose connection failed: it
    could not connect, timed out, or the endpoint dropped it (an ``httpx.TransportError`` other
    than the client's own protocol errors). The cache records the call as ``failed:raised``, so
    a replay raises the same error to the SDK where the recording got an answer after it (the
    SDK's retry) and sends the request again otherwise; users see the SDK's own error.

    Args:
        message, hint: as :class:`RewindError`.
        transport_error: the httpx exception's class name (``ConnectError``, ``ReadTimeout``...).
    """

    def __init__(self, message: str, hint: str = "", *, transport_error: str) -> None:
        super().__init__(message, hint)
        self.transport_error = transport_error


class ModelCallError(RewindError):
    """The model endpoint answered, but with a non-retryable error or a malformed body."""


class ModelErrorStatus(ModelCallError):
    """A model request captured from an SDK (:mod:`rewind.capture`) that the endpoint answered
    with an HTTP status it may answer differently later (:attr:`Recorded.failed
    <rewind.capture.exchange.Recorded.failed>`: 401/403, 408/409/425/429, 5xx). It carries the
    response so that the cache records the call as ``failed:raised`` (a replay then hands the SDK
    the same response, or sends the request again once nothing answered after it) while the
    capture returns the response to the SDK, which raises its own error; users never see it.

    Args:
        message, hint: as :class:`RewindError`.
        response: the recorded response (:func:`rewind.capture.exchange.encode_envelope`).
    """

    def __init__(self, message: str, hint: str = "", *, response: bytes) -> None:
        super().__init__(message, hint)
        self.response = response


class StoreError(RewindError):
    """The store cannot be opened or written, or holds something it should not."""


class ParentMissing(StoreError):
    """A new run row names a parent (or spawning) run the store no longer holds: archived by
    ``rewind gc`` or deleted while the new run ran."""


class InvalidRequest(RewindError):
    """Bad input: the request names something that does not exist or carries a value that
    cannot be used. The CLI exits 2 and the API answers 422 (404 for the unknown run or node
    subclasses); nothing is written. ``field`` names the request field at fault."""


class UnknownRun(InvalidRequest):
    """No recorded run has this id."""


class UnknownNode(InvalidRequest):
    """The run has no node with this name or number."""


class InvalidOverride(InvalidRequest):
    """An override is malformed or names a param/field the node does not have (or a value
    the node cannot take), or a fork's mode is unknown."""


class RunBusy(RewindError):
    """The run is still running, so it cannot be forked yet."""


class ForkError(RewindError):
    """A fork cannot start: its source row is missing or the parent failed before the fork node."""


class UnstorableValue(RewindError):
    """A state value (or Burr input) has a type Rewind cannot store exactly; refused at record
    time, before it is written (see :mod:`rewind.serde`).

    Attributes:
        path: where the value sits, starting with its state field (``report.rows[3].when``).
        type_name: the value's type as ``module.QualName``.
    """

    def __init__(
        self, message: str, hint: str = "", *, path: str = "", type_name: str = ""
    ) -> None:
        super().__init__(message, hint)
        self.path = path
        self.type_name = type_name


class StateLoadError(RewindError):
    """A stored state value cannot be loaded back (its class no longer imports, its serializer
    is not registered in this process...): the fork that needs it fails with this reason."""


class ContextLost(RewindError):
    """Code that must belong to a run (a side-effecting tool) runs in a thread or task that lost
    the run context while the run is active."""


class CodeDrift(ForkError):
    """The pipeline's graph changed since the run was recorded, where the fork would run it
    (a node renamed, removed or inserted; a transition changed). ``differences`` lists them."""

    def __init__(self, message: str, hint: str = "", differences: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint)
        self.differences = differences
