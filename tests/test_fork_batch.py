"""The fork batch core (``rewind.engine.batch``) that grid and stability share: run configs,
member order, and which errors are outcomes and which stop the batch.

Uses ``tests.pipelines.grid_pipeline`` on a real store with the conftest fake model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rewind.engine.batch import ForkBatch, ForkMember, ForkOutcome, new_batch_id, run_fork_batch
from rewind.errors import RewindError
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Override, ParamOverride, Rewind
from rewind.store import RunRecord
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel

TEMPS = [0.7, 0.9, 0.2]


@pytest.fixture
def rw(tmp_path: Path) -> Iterator[Rewind]:
    model = FakeModel()
    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(model.handler),
        retry=RetryPolicy(attempts=1),
    )
    session = Rewind(tmp_path / "store", chat_client=client)
    yield session
    session.store.close()
    client.close()


@pytest.fixture
def parent(rw: Rewind) -> RunRecord:
    run = rw.record(pipelines.grid_pipeline, {"question": "why is the sky blue"})
    assert run.status == "completed", run.error
    return run


def _batch(parent: RunRecord, purpose: str = "grid") -> ForkBatch:
    members = tuple(
        ForkMember(ParamOverride("draft", "temperature", t), {"variant": i})
        for i, t in enumerate(TEMPS)
    )
    return ForkBatch(parent=parent, at=2, purpose=purpose, members=members, effects="live")


@pytest.mark.parametrize("workers", [None, 2])
def test_members_fork_with_the_batch_config_in_member_order(
    rw: Rewind, parent: RunRecord, workers: int | None
) -> None:
    batch = _batch(parent)
    seen: list[ForkOutcome] = []
    outcomes, wall_ms = run_fork_batch(rw, batch, workers=workers, on_outcome=seen.append)

    assert [o.index for o in outcomes] == [0, 1, 2]
    assert sorted(o.index for o in seen) == [0, 1, 2]
    assert wall_ms > 0
    for i, o in enumerate(outcomes):
        assert o.exc is None and o.error is None
        assert o.run is not None and o.run.run_id == batch.members[i].run_id
        stored = rw.store.get_run(o.run.run_id)
        assert stored.status == "completed"
        assert stored.parent_run_id == parent.run_id
        assert stored.config == parent.config | {
            "purpose": "grid",
            "grid_batch": batch.batch,
            "variant": i,
        }
    assert len({m.run_id for m in batch.members}) == 3


def _failing_fork(rw: Rewind, fail_at: int, exc: BaseException) -> Any:
    """A RemoteFork that forks locally, except member ``fail_at`` (by its override's value)."""
    calls: list[float] = []
    lock = threading.Lock()

    def run_fork(
        parent_id: str,
        at: int,
        override: Override | None,
        new_id: str,
        effects: str,
        config: dict[str, Any],
    ) -> RunRecord:
        assert isinstance(override, ParamOverride)
        with lock:
            calls.append(override.value)
        if override.value == TEMPS[fail_at]:
            raise exc
        return rw.fork(
            parent_id,
            at=at,
            override=override,
            new_run_id=new_id,
            effects=effects,
            config=config,
        )

    run_fork.calls = calls  # type: ignore[attr-defined]
    return run_fork


def test_in_order_an_error_not_kept_stops_the_batch_at_once(rw: Rewind, parent: RunRecord) -> None:
    run_fork = _failing_fork(rw, 1, RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        run_fork_batch(rw, _batch(parent), run_fork=run_fork, keep=(RewindError,))
    assert run_fork.calls == TEMPS[:2], "the third member never started"


def test_a_kept_error_is_an_outcome_with_the_message_and_hint(
    rw: Rewind, parent: RunRecord
) -> None:
    run_fork = _failing_fork(rw, 1, RewindError("endpoint gone", "start the model"))
    outcomes, _ = run_fork_batch(rw, _batch(parent), run_fork=run_fork, keep=(RewindError,))

    assert [o.exc is None for o in outcomes] == [True, False, True]
    assert outcomes[1].error == "endpoint gone — start the model"
    assert outcomes[1].run is None, "the fork never recorded a run"
    assert outcomes[2].run is not None and outcomes[2].run.status == "completed"


def test_on_a_pool_an_error_not_kept_is_raised_after_every_member_ended(
    rw: Rewind, parent: RunRecord
) -> None:
    run_fork = _failing_fork(rw, 0, RuntimeError("boom"))
    batch = _batch(parent)
    with pytest.raises(RuntimeError, match="boom"):
        run_fork_batch(rw, batch, workers=2, run_fork=run_fork, keep=(RewindError,))
    assert sorted(run_fork.calls) == sorted(TEMPS)
    assert rw.store.get_run(batch.members[2].run_id).status == "completed"


def test_batch_ids_are_distinct_and_sortable_by_time() -> None:
    a, b = new_batch_id(), new_batch_id()
    assert a != b
    assert len(a) == len("20260101T120000Z-1a2b3c4d") and a[8] == "T" and a[15] == "Z"
