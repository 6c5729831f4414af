"""Reach the Burr sub-applications a node builds itself, through Burr's own tracker mechanism.

Burr's parallel actions (``MapStates``, ``MapActions``, ``MapActionsAndStates``) hand each
sub-application the parent's state persister and a ``copy()`` of its tracker, so Rewind's
recorder sees their steps by itself. A recursive sub-application is built by the user's action,
and Burr's documented way to link it to its parent is
``.with_tracker(__context.tracker.copy()).with_spawning_parent(...)``. :class:`SubAppTracker` is
the tracker Rewind gives every app it runs: it wraps the app's own tracker (if any), and its
copies — the trackers sub-applications get — forward every hook to a copy of the app's tracker
*and* report the sub-application's creation and steps to the run's recorder, which records it as
a sub-run linked to the node that built it.
"""

from __future__ import annotations

from typing import Any

from burr.tracking.base import SyncTrackingClient


class SubAppTracker(SyncTrackingClient):
    """The tracker of an app Rewind runs (``__context.tracker`` inside its actions).

    Args:
        inner: the app's own tracker, or None. On the run's own app it is attached separately,
            so this wrapper forwards nothing there; on a copy it is the inner tracker's copy and
            receives every hook.
        recorder: the run's :class:`rewind.recorder.Recorder` (its hooks take a
            sub-application's creation and steps).
        routed: False on the run's own app, True on the copies handed to sub-applications.
    """

    def __init__(self, inner: Any, recorder: Any, *, routed: bool = False) -> None:
        self.inner = inner
        self.recorder = recorder
        self.routed = routed

    def copy(self) -> SubAppTracker:
        """The tracker for a sub-application: a copy of the app's tracker plus the recorder."""
        copy = getattr(self.inner, "copy", None)
        return SubAppTracker(copy() if callable(copy) else self.inner, self.recorder, routed=True)

    def __getattr__(self, name: str) -> Any:
        # Anything else a user reads off ``__context.tracker`` is the app's own tracker's.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _forward(self, hook: str, record: bool, kwargs: dict[str, Any]) -> None:
        if not self.routed:
            return
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
