"""Child of the kill -9 trials in ``test_faults.py`` (forked there): records a chain, to be killed.

``python -m tests.kill_child STORE FD SEED`` records a 12-node chain whose nodes take a random
short time (0–30 ms) except one slow node (1 s). It reports to the parent through the pipe FD (one
``os.write`` per line, atomic below PIPE_BUF; what was written stays readable in the pipe after a
SIGKILL, and a pipe write never waits on a disk the way an fsync'ed file would):

- ``run <run_id> <unix s>`` when the run starts;
- ``node <position> <unix s>`` when a node is recorded (Rewind's ``node_finished`` event);
- ``commit-start <unix s> <positions>`` / ``commit-end <unix s> <positions>`` around every commit
  of recorded rows (the store's ``write_batch``, wrapped here to observe it);
- ``done <status>`` when the run has finished.

The parent kills it with SIGKILL at a random moment and compares the report with the store.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.replay import Pipeline, Rewind
from rewind.store.store import WriteBatch

NODES = 12
SLOW_NODE_S = 1.0
SHORT_NODE_MAX_S = 0.03


def chain(durations: list[float]) -> Pipeline:
    """A linear pipeline ``k00 → k01 → …``; node i sleeps ``durations[i]`` s and bumps ``x``."""

    def node(i: int) -> Callable[..., State]:
        @action(reads=["x"], writes=["x"])
        def step(state: State) -> State:
            time.sleep(durations[i])
            return state.update(x=state["x"] + 1)

        return step

    names = [f"k{i:02d}" for i in range(len(durations))]
    graph = (
        GraphBuilder()
        .with_actions(**{name: node(i) for i, name in enumerate(names)})
        .with_transitions(*[(a, b, default) for a, b in itertools.pairwise(names)])
        .build()
    )
    return Pipeline(name="kill-chain", graph=graph, entrypoint=names[0])


def durations_for(seed: int) -> list[float]:
    """Node durations (s) of a trial: short random ones and one slow node past the third."""
    rng = random.Random(seed)
    durations = [rng.uniform(0, SHORT_NODE_MAX_S) for _ in range(NODES)]
    durations[rng.randrange(3, NODES - 1)] = SLOW_NODE_S
    return durations


def main(store: str, fd: int, seed: int) -> None:
    def report(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def on_event(event: str, payload: dict[str, Any]) -> None:
        if event == "run_started":
            report(f"run {payload['run_id']} {time.time():.6f}")
        elif event == "node_finished":
            report(f"node {payload['position']} {time.time():.6f}")

    rw = Rewind(store, on_event=on_event)
    write_batch = rw.store.write_batch

    def observed_write_batch(batch: WriteBatch, **kwargs: Any) -> None:
        positions = ",".join(str(n["position"]) for n in batch.nodes) or "-"
        report(f"commit-start {time.time():.6f} {positions}")
        write_batch(batch, **kwargs)  # the run's last rows finish the run in the same commit
        report(f"commit-end {time.time():.6f} {positions}")

    rw.store.write_batch = observed_write_batch  # type: ignore[method-assign]
    run = rw.record(chain(durations_for(seed)), {"x": 0})
    report(f"done {run.status}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
