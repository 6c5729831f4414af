"""The CLI's ``--json`` run and node objects (``rewind runs``, ``rewind show``) against the API's
(issue 9 point 5): where they agree, and the exact keys where they still differ.

The CLI objects are not yet dumped through ``rewind.api.models``: the API's ``Run`` and
``Execution`` require keys the CLI never printed (``fork_number``, ``change``, ``config``;
``status``, ``started_at``, ``live``, the calls' ``index``/hashes…), and the CLI names a sub-run's
spawning node ``spawning_position`` (0-based) where the API says ``spawning_number`` (1-based),
so serving the model shape changes the CLI output. These tests pin that the shared keys carry
the same values, so the two copies cannot drift further unnoticed.
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

API_ONLY_RUN_KEYS = {
    "fork_number",
    "change",
    "config",
    "last_audit",
    "spawning_number",
    "created_by",
}
CLI_ONLY_RUN_KEYS = {"spawning_position"}
API_ONLY_NODE_KEYS = {"status", "started_at", "live"}
API_ONLY_CALL_KEYS = {
    "index",
    "request_hash",
    "result_hash",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
}


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


def test_cli_run_json_is_the_api_run_minus_named_keys(
    runs: tuple[Rewind, list[RunRecord]],
) -> None:
    rw, records = runs
    for r in records:
        r = rw.store.get_run(r.run_id)
        cli, api = cli_run_json(r), api_run_json(r)
        assert set(api) - set(cli) == API_ONLY_RUN_KEYS
        assert set(cli) - set(api) == CLI_ONLY_RUN_KEYS
        assert {k: cli[k] for k in set(cli) & set(api)} == {k: api[k] for k in set(cli) & set(api)}
        # the API's shape goes through its model unchanged
        dumped = models.Run.model_validate(api).model_dump(mode="json", exclude_unset=True)
        assert dumped == api
        # the CLI's shape does not fit the model: required API keys are missing
        with pytest.raises(ValueError, match="fork_number"):
            models.Run.model_validate(cli)


def test_cli_node_json_is_the_api_execution_minus_named_keys(
    runs: tuple[Rewind, list[RunRecord]],
) -> None:
    rw, records = runs
    nodes = [n for r in records for n in rw.store.nodes_of(r.run_id)]
    assert any(n.calls for n in nodes)
    for n in nodes:
        cli, api = cli_node_json(n), api_node_json(n)
        assert set(api) - set(cli) == API_ONLY_NODE_KEYS
        assert set(cli) <= set(api)
        assert {k: v for k, v in cli.items() if k != "calls"} == {
            k: api[k] for k in cli if k != "calls"
        }
        for cli_call, api_call in zip(cli["calls"], api["calls"], strict=True):
            assert set(api_call) - set(cli_call) == API_ONLY_CALL_KEYS
            assert cli_call == {k: api_call[k] for k in cli_call}
        dumped = models.Execution.model_validate(api).model_dump(mode="json", exclude_unset=True)
        assert dumped == api
