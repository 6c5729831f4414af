"""Reach the Burr sub-applications a node builds itself, through Burr's own tracker mechanism.

Burr's parallel actions (``MapStates``, ``MapActions``, ``MapActionsAndStates``) hand each
sub-application the parent's state persister and a ``copy()`` of its tracker, so Rewind's
recorder sees their steps by itself. A recursive sub-application is built by the user's action,
and Burr's documented way to link it to its parent is
``.with_tracker(__context.tracker.copy()).with_spawning_parent(...)``. :class:`RunTracker` is
the tracker Rewind gives every app it runs: it wraps the app's own tracker (if any) and has no
hook of its own (Burr calls nothing of it at the run's steps); its copies — the trackers
sub-applications get, :class:`SubAppTracker` — forward every hook to a copy of the app's
tracker *and* report the sub-application's creation and steps to the run's recorder, which
records it as a sub-run linked to the node that built it.
"""

from __future__ import annotations

from typing import Any

from burr.tracking.base import SyncTrackingClient


class RunTracker:
    """The tracker of an app Rewind runs (``__context.tracker`` inside its actions).

    It implements no lifecycle hook, so Burr calls it at no step of the run's own app (the
    app's own tracker is attached separately and gets every hook); only its :meth:`copy` — the
    tracker a sub-application gets — matters.

    Args:
        inner: the app's own tracker, or None.
        recorder: the run's :class:`rewind.recorder.Recorder` (its hooks take a
            sub-application's creation and steps).
    """

    def __init__(self, inner: Any, recorder: Any) -> None:
        self.inner = inner
        self.recorder = recorder

    def copy(self) -> SubAppTracker:
        """The tracker for a sub-application: a copy of the app's tracker plus the recorder."""
        copy = getattr(self.inner, "copy", None)
        return SubAppTracker(copy() if callable(copy) else self.inner, self.recorder)

    def __getattr__(self, name: str) -> Any:
        # Anything else a user reads off ``__context.tracker`` is the app's own tracker's.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


class SubAppTracker(RunTracker, SyncTrackingClient):
    """The tracker of a sub-application of an app Rewind runs: forwards every hook to a copy of
    the app's tracker (``inner``, may be None) and reports the sub-application's creation and
    steps to the run's recorder."""

    def _forward(self, hook: str, record: bool, kwargs: dict[str, Any]) -> None:
        method = getattr(self.inner, hook, None)
        if callable(method):
            method(**kwargs)
        if record:
            getattr(self.recorder, hook)(**kwargs)

    def post_application_create(self, **future_kwargs: Any) -> None:
        """A sub-application was built: the recorder opens its sub-run."""
        self._forward("post_application_create", True, future_kwargs)

    def pre_run_step(self, **future_kwargs: Any) -> None:
        """A sub-application's step starts."""
        self._forward("pre_run_step", True, future_kwargs)

    def post_run_step(self, **future_kwargs: Any) -> None:
        """A sub-application's step ended: the recorder records it on the sub-run."""
        self._forward("post_run_step", True, future_kwargs)

    def pre_start_span(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("pre_start_span", False, future_kwargs)

    def post_end_span(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("post_end_span", False, future_kwargs)

    def do_log_attributes(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("do_log_attributes", False, future_kwargs)

    def pre_start_stream(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("pre_start_stream", False, future_kwargs)

    def post_stream_item(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("post_stream_item", False, future_kwargs)

    def post_end_stream(self, **future_kwargs: Any) -> None:
        """Forwarded to the app's tracker."""
        self._forward("post_end_stream", False, future_kwargs)
