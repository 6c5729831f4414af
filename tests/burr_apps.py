"""Burr apps written the way Burr's users write them (no Rewind Pipeline), for the attach tests.

Each factory returns what a user's ``application()`` returns: a built Burr ``Application`` (or
its ``ApplicationBuilder``) with runtime inputs, ``.bind(...)``, a lifecycle hook and optionally a
local tracker. ``STEPS`` collects what the user's own hook saw, so a test can tell it kept working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from burr.core import Application, ApplicationBuilder, State, action, default, expr
from burr.core.action import create_action, streaming_action
from burr.core.application import ApplicationContext
from burr.core.parallelism import MapActions, MapStates, RunnableGraph
from burr.integrations.pydantic import PydanticTypingSystem
from burr.lifecycle import PostRunStepHook
from burr.tracking import LocalTrackingClient
from pydantic import BaseModel

import rewind

STEPS: list[tuple[str, str]] = []
"""(app_id, node) of every step the user's own hook saw."""


class StepLog(PostRunStepHook):
    """The user's own hook: it must keep seeing every step of a recorded or forked run."""

    def post_run_step(self, *, app_id: str, action: Any, **future_kwargs: Any) -> None:
        STEPS.append((app_id, action.name))


@action(reads=[], writes=["question", "history"])
def ask(state: State, question: str) -> State:
    return state.update(question=question).append(history=question)


@action(reads=["question"], writes=["answer"])
def answer(state: State, style: str) -> State:
    reply = rewind.chat([{"role": "user", "content": f"{style}: {state['question']}"}])
    return state.update(answer=reply.content)


@action(reads=["question"], writes=["answer"])
def echo(state: State, style: str) -> State:
    return state.update(answer=f"{style}: {state['question']}")


@action(reads=["answer"], writes=["summary"], tags=["final"])
def summarise(state: State) -> State:
    return state.update(summary=state["answer"].upper())


def _builder(answer_node: Any, tracker_dir: str | None) -> ApplicationBuilder:
    b = (
        ApplicationBuilder()
        .with_actions(ask=ask, answer=answer_node.bind(style="briefly"), summarise=summarise)
        .with_transitions(("ask", "answer"), ("answer", "summarise"), ("summarise", "ask"))
        .with_state(history=[])
        .with_entrypoint("ask")
        .with_hooks(StepLog())
    )
    if tracker_dir is not None:
        b = b.with_tracker(LocalTrackingClient(project="rewind-test", storage_dir=tracker_dir))
    return b


def application(tracker_dir: str | None = None) -> Application:
    """A looping question → model answer → summary chat; the model through ``rewind.chat``."""
    return _builder(answer, tracker_dir).build()


def builder() -> ApplicationBuilder:
    """The same app, unbuilt."""
    return _builder(answer, None)


def pure_application() -> Application:
    """The same graph with no model call (for the CLI, which has no fake model)."""
    return _builder(echo, None).build()


# -- async --------------------------------------------------------------------------------------


@action(reads=["question"], writes=["answer"])
async def answer_async(state: State, style: str) -> State:
    await asyncio.sleep(0)
    reply = rewind.chat([{"role": "user", "content": f"{style}: {state['question']}"}])
    return state.update(answer=reply.content)


def async_application() -> Application:
    """The chat with an ``async`` model node between two synchronous ones."""
    return _builder(answer_async, None).build()


# -- streaming ----------------------------------------------------------------------------------


@streaming_action(reads=["question"], writes=["answer"])
def answer_streamed(state: State, style: str) -> Generator[tuple[dict, State | None], None, None]:
    reply = rewind.chat([{"role": "user", "content": f"{style}: {state['question']}"}])
    words = reply.content.split()
    for word in words:
        yield {"token": word}, None
    yield {"answer": reply.content}, state.update(answer=reply.content)


def streaming_application() -> Application:
    """The chat with a streaming model node."""
    return _builder(answer_streamed, None).build()


# -- parallel map -------------------------------------------------------------------------------


@action(reads=["topic"], writes=["note"])
def take_note(state: State) -> State:
    reply = rewind.chat([{"role": "user", "content": f"one fact about {state['topic']}"}])
    return state.update(note=reply.content)


class NoteEachTopic(MapStates):
    """Burr's parallel map: one sub-application per topic, notes joined in order."""

    def action(self, state: State, inputs: dict[str, Any]) -> Any:
        return RunnableGraph.create(take_note)

    def states(
        self, state: State, context: Any, inputs: dict[str, Any]
    ) -> Generator[State, None, None]:
        for topic in state["topics"]:
            yield state.update(topic=topic)

    def reduce(self, state: State, states: Any) -> State:
        return state.update(notes=[s["note"] for s in states])

    @property
    def reads(self) -> list[str]:
        return ["topics"]

    @property
    def writes(self) -> list[str]:
        return ["notes"]


@action(reads=["notes"], writes=["report"])
def report(state: State) -> State:
    return state.update(report=" | ".join(state["notes"]))


@action(reads=[], writes=["topics"])
def choose_topics(state: State, topics: list[str]) -> State:
    return state.update(topics=topics)


def map_application() -> Application:
    """topics (runtime input) → a parallel map of model calls → report."""
    return (
        ApplicationBuilder()
        .with_actions(choose=choose_topics, notes=NoteEachTopic(), report=report)
        .with_transitions(("choose", "notes", default), ("notes", "report", default))
        .with_entrypoint("choose")
        .with_hooks(StepLog())
        .build()
    )


# -- typed state --------------------------------------------------------------------------------


class Concept(BaseModel):
    term: str
    definition: str


class TypedChatState(BaseModel):
    question: str | None = None
    concept: Concept | None = None
    summary: str | None = None


@action.pydantic(reads=[], writes=["question"])
def typed_ask(state: TypedChatState, question: str) -> TypedChatState:
    state.question = question
    return state


@action.pydantic(reads=["question"], writes=["concept"])
def typed_define(state: TypedChatState) -> TypedChatState:
    reply = rewind.chat([{"role": "user", "content": f"define: {state.question}"}])
    state.concept = Concept(term=state.question or "", definition=reply.content)
    return state


@action.pydantic(reads=["concept"], writes=["summary"])
def typed_summarise(state: TypedChatState) -> TypedChatState:
    assert state.concept is not None
    state.summary = f"{state.concept.term}: {state.concept.definition[:20]}"
    return state


def typed_application() -> Application:
    """Burr's typed state: a pydantic model as the state, a nested model in one field."""
    return (
        ApplicationBuilder()
        .with_actions(ask=typed_ask, define=typed_define, summarise=typed_summarise)
        .with_transitions(("ask", "define"), ("define", "summarise"))
        .with_typing(PydanticTypingSystem(TypedChatState))
        .with_state(TypedChatState())
        .with_entrypoint("ask")
        .build()
    )


# -- recursive sub-applications -----------------------------------------------------------------


def _answer_in_two_styles(state: State, context: ApplicationContext, *, tracked: bool) -> State:
    """Runs a sub-application per style, the way Burr's recursive example does: the parent's
    tracker copied to the child (``tracked``), the child pointed at its spawning parent."""
    answers = []
    for style in ("briefly", "in detail"):
        b = (
            ApplicationBuilder()
            .with_actions(answer=answer.bind(style=style))
            .with_transitions()
            .with_state(question=state["question"])
            .with_entrypoint("answer")
        )
        if tracked:
            b = b.with_tracker(context.tracker.copy())  # remember to do `copy()` here! (Burr's)
        child = b.with_spawning_parent(context.app_id, context.sequence_id).build()
        _, _, child_state = child.run(halt_after=["answer"])
        answers.append(child_state["answer"])
    return state.update(answers=answers)


@action(reads=["question"], writes=["answers"])
def ask_in_two_styles(state: State, __context: ApplicationContext) -> State:
    return _answer_in_two_styles(state, __context, tracked=True)


@action(reads=["question"], writes=["answers"])
def ask_in_two_styles_untracked(state: State, __context: ApplicationContext) -> State:
    """Sub-applications built without the parent's tracker or persister (Rewind cannot see
    their steps)."""
    return _answer_in_two_styles(state, __context, tracked=False)


def recursive_application(*, tracked: bool = True) -> Application:
    """question (runtime input) → two sub-applications answering it."""
    return (
        ApplicationBuilder()
        .with_actions(ask=ask, both=ask_in_two_styles if tracked else ask_in_two_styles_untracked)
        .with_transitions(("ask", "both"))
        .with_state(history=[])
        .with_entrypoint("ask")
        .build()
    )


def untracked_recursive_application() -> Application:
    """question → two sub-applications not handed the parent's tracker."""
    return recursive_application(tracked=False)


# -- sub-applications calling the OpenAI SDK (issue 10: each child a sub-run) --------------------


def _ask_model(prompt: str) -> str:
    """One chat completion through the OpenAI SDK (OPENAI_BASE_URL/OPENAI_API_KEY from the env)."""
    import openai

    reply = openai.OpenAI().chat.completions.create(
        model="stub-model", messages=[{"role": "user", "content": prompt}], temperature=0
    )
    return reply.choices[0].message.content or ""


@action(reads=["topic"], writes=["note"])
def sdk_take_note(state: State) -> State:
    return state.update(note=_ask_model(f"one fact about {state['topic']}"))


class SdkNoteEachTopic(NoteEachTopic):
    """Burr's ``MapStates``: one sub-application per topic, each calling the OpenAI SDK."""

    def action(self, state: State, inputs: dict[str, Any]) -> Any:
        return RunnableGraph.create(sdk_take_note)


def sdk_map_application() -> Application:
    """topics (runtime input) → a parallel map of OpenAI SDK calls → report."""
    return (
        ApplicationBuilder()
        .with_actions(choose=choose_topics, notes=SdkNoteEachTopic(), report=report)
        .with_transitions(("choose", "notes", default), ("notes", "report", default))
        .with_entrypoint("choose")
        .build()
    )


@action(reads=["question"], writes=["answer"])
def sdk_answer(state: State, style: str, audience: str) -> State:
    return state.update(answer=_ask_model(f"{style}, for {audience}: {state['question']}"))


@action(reads=["answers"], writes=["summary"])
def sdk_summarise(state: State) -> State:
    return state.update(summary=" / ".join(state["answers"]))


@action(reads=["question"], writes=["answers"])
def sdk_ask_in_two_styles(state: State, __context: ApplicationContext) -> State:
    """Burr's recursive pattern: a sub-application per style, given the parent's tracker."""
    answers = []
    for style in ("briefly", "in detail"):
        child = (
            ApplicationBuilder()
            .with_actions(answer=sdk_answer.bind(style=style))
            .with_transitions()
            .with_state(question=state["question"])
            .with_entrypoint("answer")
            .with_tracker(__context.tracker.copy())
            .with_spawning_parent(__context.app_id, __context.sequence_id)
            .build()
        )
        _, _, child_state = child.run(halt_after=["answer"], inputs={"audience": "a student"})
        answers.append(child_state["answer"])
    return state.update(answers=answers)


def sdk_recursive_application() -> Application:
    """question (runtime input) → two recursive sub-applications (OpenAI SDK) → summary."""
    return (
        ApplicationBuilder()
        .with_actions(ask=ask, both=sdk_ask_in_two_styles, summarise=sdk_summarise)
        .with_transitions(("ask", "both"), ("both", "summarise"))
        .with_state(history=[])
        .with_entrypoint("ask")
        .build()
    )


@action(reads=["question"], writes=["take"])
def sdk_persona_take(state: State, persona: str) -> State:
    return state.update(take=_ask_model(f"as {persona}: {state['question']}"))


class SdkTwoPersonas(MapActions):
    """Burr's ``MapActions``: two actions over the same state, each an OpenAI SDK call."""

    def actions(self, state: State, context: Any, inputs: dict[str, Any]) -> Any:
        yield create_action(sdk_persona_take.bind(persona="a poet"), "poet")
        yield create_action(sdk_persona_take.bind(persona="a critic"), "critic")

    def state(self, state: State, inputs: dict[str, Any]) -> State:
        return state

    def reduce(self, state: State, states: Any) -> State:
        return state.update(takes=[s["take"] for s in states])

    @property
    def reads(self) -> list[str]:
        return ["question"]

    @property
    def writes(self) -> list[str]:
        return ["takes"]


def sdk_map_actions_application() -> Application:
    """question (runtime input) → two personas in parallel (``MapActions``)."""
    return (
        ApplicationBuilder()
        .with_actions(ask=ask, personas=SdkTwoPersonas())
        .with_transitions(("ask", "personas"))
        .with_state(history=[])
        .with_entrypoint("ask")
        .build()
    )


@action(reads=["topic"], writes=["note"])
async def sdk_take_note_async(state: State) -> State:
    import openai

    client = openai.AsyncOpenAI()
    reply = await client.chat.completions.create(
        model="stub-model",
        messages=[{"role": "user", "content": f"one fact about {state['topic']}"}],
        temperature=0,
    )
    await client.close()
    return state.update(note=reply.choices[0].message.content or "")


class SdkNoteEachTopicAsync(NoteEachTopic):
    """An async ``MapStates``: Burr gathers the sub-applications with asyncio."""

    def action(self, state: State, inputs: dict[str, Any]) -> Any:
        return RunnableGraph.create(sdk_take_note_async)

    def is_async(self) -> bool:
        return True

    async def reduce(self, state: State, states: Any) -> State:  # type: ignore[override]
        return state.update(notes=[s["note"] async for s in states])


def sdk_async_map_application() -> Application:
    """topics (runtime input) → an async parallel map of AsyncOpenAI calls → report."""
    return (
        ApplicationBuilder()
        .with_actions(choose=choose_topics, notes=SdkNoteEachTopicAsync(), report=report)
        .with_transitions(("choose", "notes", default), ("notes", "report", default))
        .with_entrypoint("choose")
        .build()
    )


@action(reads=["topics"], writes=["notes"])
def sdk_notes_in_a_child(state: State, __context: ApplicationContext) -> State:
    """A recursive sub-application whose one node is itself a parallel map (two levels)."""
    child = (
        ApplicationBuilder()
        .with_actions(notes=SdkNoteEachTopic())
        .with_transitions()
        .with_state(topics=state["topics"])
        .with_entrypoint("notes")
        .with_tracker(__context.tracker.copy())
        .with_spawning_parent(__context.app_id, __context.sequence_id)
        .build()
    )
    _, _, child_state = child.run(halt_after=["notes"])
    return state.update(notes=child_state["notes"])


def sdk_nested_application() -> Application:
    """topics → a child app running a map of OpenAI SDK calls → report."""
    return (
        ApplicationBuilder()
        .with_actions(choose=choose_topics, notes=sdk_notes_in_a_child, report=report)
        .with_transitions(("choose", "notes", default), ("notes", "report", default))
        .with_entrypoint("choose")
        .build()
    )


@action(reads=["notes", "rounds"], writes=["report", "rounds"])
def report_round(state: State) -> State:
    return state.update(report=" | ".join(state["notes"]), rounds=state["rounds"] + 1)


@action(reads=["report"], writes=["final"])
def finish(state: State) -> State:
    return state.update(final=state["report"])


def sdk_looping_map_application() -> Application:
    """topics → (parallel map → report) twice → finish: the map node runs twice, and Burr gives
    its children the same app ids both times."""
    return (
        ApplicationBuilder()
        .with_actions(
            choose=choose_topics, notes=SdkNoteEachTopic(), report=report_round, finish=finish
        )
        .with_transitions(
            ("choose", "notes"),
            ("notes", "report"),
            ("report", "notes", expr("rounds < 2")),
            ("report", "finish", default),
        )
        .with_state(rounds=0)
        .with_entrypoint("choose")
        .build()
    )
