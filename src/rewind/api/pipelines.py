"""Pipelines the API can start runs of.

A request never names a module to import or a file to read: it names an entry of this registry
(``research``, the demo, by default). The demo takes a question; the CSV is always the dataset
shipped with Rewind, so no request can make the server read a file outside its store. Other
pipelines are registered by the code that builds the app (tests register their small ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rewind.errors import InvalidOverride
from rewind.replay import Pipeline


@dataclass(frozen=True)
class StartInputs:
    """What a start-run request may carry (already validated by the route's model)."""

    question: str | None = None
    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class PipelineEntry:
    """A pipeline the API can start.

    Attributes:
        name: the registry key a request uses.
        build: returns the :class:`Pipeline` (called once per run).
        initial_state: turns request inputs into the run's initial state; raises
            :class:`InvalidOverride` (HTTP 422) naming the field when they are unusable.
        description: one line for the UI.
        inputs: request fields it accepts, with a short description each.
    """

    name: str
    build: Callable[[], Pipeline]
    initial_state: Callable[[StartInputs], dict[str, Any]]
    description: str = ""
    inputs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, pipeline: Pipeline, default_state: dict[str, Any], description: str = ""
    ) -> PipelineEntry:
        """An entry for a fixed pipeline whose initial state is ``default_state`` updated with
        the request's ``state`` object."""

        def initial(inputs: StartInputs) -> dict[str, Any]:
            if inputs.question is not None:
                raise _bad("question", f"pipeline {pipeline.name!r} takes no question")
            return dict(default_state) | dict(inputs.state or {})

        return cls(
            name=pipeline.name,
            build=lambda: pipeline,
            initial_state=initial,
            description=description,
            inputs={"state": "initial state fields (JSON object) merged over the defaults"},
        )


def _bad(name: str, message: str) -> InvalidOverride:
    return InvalidOverride(message, f"remove {name!r} from the request", field=name)


def research_entry() -> PipelineEntry:
    """The demo research pipeline on the bundled Seattle weather CSV."""
    from rewind.examples import research, weather

    def initial(inputs: StartInputs) -> dict[str, Any]:
        if inputs.state is not None:
            raise _bad("state", "the research pipeline takes a question, not a state")
        return research.initial_state(None, inputs.question)

    return PipelineEntry(
        name="research",
        build=research.build,
        initial_state=initial,
        description="8-node research agent on NOAA Seattle weather 2012-2015 "
        f"(default question: {weather.DEFAULT_QUESTION})",
        inputs={"question": "the question to answer from the data"},
    )


def default_pipelines() -> dict[str, PipelineEntry]:
    """The registry ``rewind serve`` uses: the demo pipeline."""
    entry = research_entry()
    return {entry.name: entry}
