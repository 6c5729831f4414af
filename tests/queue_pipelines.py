"""A small tool-only pipeline for the task-queue tests, importable by ``rewind worker`` processes
(``ref="tests.queue_pipelines:scaling"``).

Its ``scale`` node can be held inside a worker through a folder named by ``REWIND_TEST_GATE``
(set only in the workers' environment, so outputs never depend on it):

- ``mode`` file says ``hold``: the node writes ``entered-<pid>-<n>`` and waits until a
  ``release`` file exists — a job is mid-run while the test kills its worker process.
- ``mode`` says ``rendezvous``: the node waits until nodes of two different processes entered,
  so a grid's variants provably spread over two workers.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from burr.core import State, action, default
from burr.core.graph import GraphBuilder

import rewind
from rewind.replay import Pipeline
from rewind.tools import tool

GATE_ENV = "REWIND_TEST_GATE"
GATE_WAIT_S = 300.0  # a bound on a forgotten gate (the test failed), not a speed requirement


@tool("q_scale")
def q_scale(values: list[int], factor: int) -> list[int]:
    return [v * factor for v in values]


@action(reads=["x"], writes=["series"])
def seed(state: State) -> State:
    x = int(state["x"])
    return state.update(series=[x, x + 1, x + 2])


@action(reads=["series"], writes=["scaled"])
def scale(state: State) -> State:
    factor = rewind.param("factor", 2)
    _gate()
    return state.update(scaled=q_scale(list(state["series"]), factor))


@action(reads=["scaled"], writes=["total"])
def total(state: State) -> State:
    return state.update(total=sum(state["scaled"]))


def entered_pid(path: Path) -> int:
    """The pid of the process that wrote ``entered-<pid>-<n>`` (named, so a reader never sees
    a half-written file)."""
    return int(path.name.split("-")[1])


def set_gate(folder: Path, name: str, text: str) -> None:
    """Write ``folder/name`` atomically (workers read it while the test writes it)."""
    tmp = folder / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / name)


def _entered_pids(folder: Path) -> set[int]:
    return {entered_pid(p) for p in folder.glob("entered-*")}


def _gate() -> None:
    folder_name = os.environ.get(GATE_ENV)
    if not folder_name:
        return
    folder = Path(folder_name)
    mode = (folder / "mode").read_text().strip() if (folder / "mode").exists() else ""
    if mode not in ("hold", "rendezvous"):
        return
    set_gate(folder, f"entered-{os.getpid()}-{uuid.uuid4().hex[:8]}", "")
    deadline = time.monotonic() + GATE_WAIT_S
    while time.monotonic() < deadline:
        if mode == "hold" and (folder / "release").exists():
            return
        if mode == "rendezvous" and len(_entered_pids(folder)) >= 2:
            return
        time.sleep(0.05)


scaling = Pipeline(
    name="scaling",
    graph=GraphBuilder()
    .with_actions(seed=seed, scale=scale, total=total)
    .with_transitions(("seed", "scale", default), ("scale", "total", default))
    .build(),
    entrypoint="seed",
    ref="tests.queue_pipelines:scaling",
)
