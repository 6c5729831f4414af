"""The CLI's ``--json`` run and node objects (``rewind runs``, ``rewind show``) are the API's
(issue 9 point 5: one schema per record): both come from ``rewind.record_json`` and go through the
API's models unchanged; the CLI adds only ``spawning_position`` (the 0-based twin of the API's
``spawning_number``), kept for scripts written against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rewind.api import models
from rewind.api.views import node_json as api_node_json
from rewind.api.views import run_json as api_run_json
from rewind.cli.render import node_json as cli_node_json
from rewind.cli.render import run_json as cli_run_json
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import ParamOverride, Rewind
from rewind.store import RunRecord
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel

CLI_ONLY_RUN_KEYS = {"spawning_position"}


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[tuple[Rewind, list[RunRecord]]]:
    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(FakeModel().handler),
        retry=RetryPolicy(attempts=1),
    )
    rw = Rewind(tmp_path / "store", chat_client=client)
    parent = rw.record(pipelines.grid_pipeline, {"question": "why is the sky blue"})
    fork = rw.fork(
        parent.run_id,
        at="draft",
        override=ParamOverride("draft", "temperature", 0.9),
        effects="live",
    )
    assert (parent.status, fork.status) == ("completed", "completed")
    yield rw, [parent, fork]
    rw.store.close()
    client.close()


def test_cli_run_json_is_the_api_run(runs: tuple[Rewind, list[RunRecord]]) -> None:
    rw, records = runs
    for r in records:
        r = rw.store.get_run(r.run_id)
        cli, api = cli_run_json(r), api_run_json(r)
        assert set(api) <= set(cli)
        assert set(cli) - set(api) == CLI_ONLY_RUN_KEYS
        assert {k: cli[k] for k in api} == api
        assert cli["spawning_position"] == (
            None if api["spawning_number"] is None else api["spawning_number"] - 1
        )
        # the shared shape goes through the API's model unchanged
        dumped = models.Run.model_validate(api).model_dump(mode="json", exclude_unset=True)
        assert dumped == api


def test_cli_node_json_is_the_api_execution(runs: tuple[Rewind, list[RunRecord]]) -> None:
    rw, records = runs
    nodes = [n for r in records for n in rw.store.nodes_of(r.run_id)]
    assert any(n.calls for n in nodes)
    for n in nodes:
        cli, api = cli_node_json(n), api_node_json(n)
        assert cli == api
        dumped = models.Execution.model_validate(api).model_dump(mode="json", exclude_unset=True)
        assert dumped == api
