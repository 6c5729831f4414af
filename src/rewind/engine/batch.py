"""The fork batch: one recorded run forked at one node once per member, the core that
:func:`rewind.grid.grid` (one member per variant, concurrently) and
:func:`rewind.stability.stability` (K samples, one after the other) share.

A batch has an id (:func:`new_batch_id`), and every member fork carries the parent's run config
plus ``{"purpose": <purpose>, "<purpose>_batch": <batch id>}`` and the member's own keys, so a
batch's runs can be found from the runs table. :func:`run_fork_batch` launches the members —
``rw.fork`` on this process's threads, or a :data:`RemoteFork` (a task queue's workers) — and
returns one :class:`ForkOutcome` per member, in member order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.errors import RewindError
from rewind.store import RunRecord

if TYPE_CHECKING:
    from rewind.replay import Override, Rewind

__all__ = [
    "ForkBatch",
    "ForkMember",
    "ForkOutcome",
    "RemoteFork",
    "new_batch_id",
    "run_fork_batch",
]

RemoteFork = Callable[[str, int, "Override | None", str, str, dict[str, Any]], RunRecord]
"""``(parent_run_id, at, override, new_run_id, effects, config) -> run``: one fork (a grid
variant, a stability sample) executed elsewhere — on a task queue's workers — returning its run
once it ended."""


def new_batch_id() -> str:
    """A batch id: UTC time to the second, then 8 random hex digits
    (``20260101T120000Z-1a2b3c4d``)."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def _new_run_id() -> str:
    from rewind.replay import new_run_id

    return new_run_id()


@dataclass(frozen=True)
class ForkMember:
    """One fork of a batch.

    Attributes:
        override: the change this fork carries, or None.
        config: run-config keys of this member (merged after the batch's ``purpose`` keys).
        run_id: the fork's run id (a fresh uuid4 hex by default).
    """

    override: Override | None
    config: dict[str, Any]
    run_id: str = field(default_factory=_new_run_id)


@dataclass(frozen=True)
class ForkBatch:
    """Forks of one parent at one node, sharing a batch id and fork options.

    Attributes:
        parent: the parent run (planned: see :func:`~rewind.engine.plan.plan_fork`).
        at: the fork node's 1-based number.
        purpose: ``grid``, ``stability``…: the run config's ``purpose``; the batch id goes in
            ``<purpose>_batch``.
        members: the forks, in order.
        effects: side-effect mode of every fork.
        cache_mode: the forks' cache mode (``replay``, ``stability``).
        restore: ``refuse`` or ``replace`` (see :meth:`Rewind.fork`).
        batch: the batch id (:func:`new_batch_id` by default).
    """

    parent: RunRecord
    at: int
    purpose: str
    members: tuple[ForkMember, ...]
    effects: str
    cache_mode: str = "replay"
    restore: str = "refuse"
    batch: str = field(default_factory=new_batch_id)

    def config(self, member: ForkMember) -> dict[str, Any]:
        """The run config of ``member``: the parent's, the batch keys, the member's keys."""
        batch_keys = {"purpose": self.purpose, f"{self.purpose}_batch": self.batch}
        return self.parent.config | batch_keys | member.config


@dataclass(frozen=True)
class ForkOutcome:
    """How one member of a batch ended.

    Attributes:
        index: the member's 0-based position.
        run: its run (None when the fork never started one).
        error: why it failed — the run's error, a Rewind error's message and hint, or
            ``Type: message`` for an unexpected exception — or None.
        wall_ms: the member's wall time (ms).
        exc: the exception the fork raised, or None.
    """

    index: int
    run: RunRecord | None
    error: str | None
    wall_ms: float
    exc: BaseException | None


OutcomeListener = Callable[[ForkOutcome], None]


def run_fork_batch(
    rw: Rewind,
    batch: ForkBatch,
    *,
    workers: int | None = None,
    run_fork: RemoteFork | None = None,
    on_outcome: OutcomeListener | None = None,
    keep: tuple[type[BaseException], ...] = (BaseException,),
) -> tuple[list[ForkOutcome], float]:
    """Run every member of ``batch`` and collect how each ended.

    Args:
        rw: the session whose ``fork`` runs the members (its store records them).
        batch: the forks.
        workers: threads of a pool the members run on (≥ 1); None: one after the other in the
            calling thread.
        run_fork: executes one member elsewhere and returns its run once it ended; default
            ``rw.fork`` (with the batch's ``cache_mode`` and ``restore``).
        on_outcome: called in the calling thread with each outcome as it arrives (completion
            order with a pool, member order without).
        keep: exception types a member's fork may raise and still be an outcome (its run, when
            one was recorded, is the outcome's run); any other exception is raised when the
            member ends — with a pool, after every member ended.
    Returns:
        (the outcomes in member order, the batch's wall time in ms).
    Raises:
        whatever a member's fork raised that is not in ``keep``.
    """
    started = time.perf_counter()
    members = batch.members
    outcomes: dict[int, ForkOutcome] = {}
    if workers is None:
        for i in range(len(members)):
            outcomes[i] = _checked(_run_member(rw, batch, i, run_fork), keep)
            if on_outcome is not None:
                on_outcome(outcomes[i])
    else:
        with ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"rewind-{batch.purpose}"
        ) as pool:
            futures = {
                pool.submit(_run_member, rw, batch, i, run_fork): i for i in range(len(members))
            }
            for future in as_completed(futures):
                outcome = future.result()
                outcomes[outcome.index] = outcome
                if on_outcome is not None:
                    on_outcome(outcome)
        for outcome in outcomes.values():  # completion order
            _checked(outcome, keep)
    return [outcomes[i] for i in range(len(members))], _ms(started)


def _checked(outcome: ForkOutcome, keep: tuple[type[BaseException], ...]) -> ForkOutcome:
    """``outcome``, unless its fork raised an exception not in ``keep`` (then that is raised)."""
    if outcome.exc is not None and not isinstance(outcome.exc, keep):
        raise outcome.exc
    return outcome


def _run_member(rw: Rewind, batch: ForkBatch, i: int, run_fork: RemoteFork | None) -> ForkOutcome:
    """Run member ``i``; every exception becomes part of the outcome (see :class:`ForkOutcome`)."""
    member = batch.members[i]
    started = time.perf_counter()
    config = batch.config(member)
    try:
        if run_fork is not None:
            run = run_fork(
                batch.parent.run_id, batch.at, member.override, member.run_id, batch.effects, config
            )
        else:
            run = rw.fork(
                batch.parent.run_id,
                at=batch.at,
                override=member.override,
                new_run_id=member.run_id,
                effects=batch.effects,
                cache_mode=batch.cache_mode,
                restore=batch.restore,
                config=config,
            )
        return ForkOutcome(i, run, run.error, _ms(started), None)
    except RewindError as exc:
        # The fork recorded the run as failed before re-raising an environment error.
        said = exc.message + (f" — {exc.hint}" if exc.hint else "")  # the fix, too
        return ForkOutcome(i, _run_or_none(rw, member.run_id), said, _ms(started), exc)
    except BaseException as exc:  # a bug or a store failure: the caller decides (see `keep`)
        error = f"{type(exc).__name__}: {exc}"
        return ForkOutcome(i, _run_or_none(rw, member.run_id), error, _ms(started), exc)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _run_or_none(rw: Rewind, run_id: str) -> RunRecord | None:
    try:
        return rw.store.get_run(run_id)
    except RewindError:
        return None
