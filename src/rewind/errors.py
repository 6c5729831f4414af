"""Rewind's error types: one line saying what is wrong, and a hint saying how to fix it.

Every error a person can act on derives from :class:`RewindError`, so the CLI and the API can
render the same two lines (what, then how) without knowing which module raised it.
"""

from __future__ import annotations

__all__ = [
    "CodeDrift",
    "ContextLost",
    "EndpointUnavailable",
    "ForkError",
    "InvalidOverride",
    "ModelCallError",
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

    ``str(error)`` is the message, followed by the hint on a second line when there is one.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class EndpointUnavailable(RewindError):
    """The model endpoint cannot be reached, or the embedded local model server cannot start."""


class ModelCallError(RewindError):
    """The model endpoint answered, but with a non-retryable error or a malformed body."""


class StoreError(RewindError):
    """The store cannot be opened or written, or holds something it should not."""


class UnknownRun(RewindError):
    """No recorded run has this id."""


class UnknownNode(RewindError):
    """The run has no node with this name or number."""


class InvalidOverride(RewindError):
    """An override is malformed or names a param/field the node does not have."""


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
