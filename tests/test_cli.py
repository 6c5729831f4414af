"""End-to-end tests of every ``rewind`` command, run as a user would: a subprocess.

The fast ones drive the small test pipeline (tests.pipelines: no model needed); the slow ones run
``rewind demo`` and ``rewind verify`` against the embedded local model.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli_process import run_rewind

ROOT = Path(__file__).resolve().parent.parent


def rewind(store: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return run_rewind("--store", str(store), *args, timeout=timeout)


def ok_json(store: Path, *args: str) -> Any:
    proc = rewind(store, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def row_counts(store: Path) -> dict[str, int]:
    con = sqlite3.connect(store / "rewind.db")
    try:
        tables = ["runs", "nodes", "calls", "blobs", "burr_state", "llm_cache", "tool_cache"]
        return {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    finally:
        con.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    store = tmp_path_factory.mktemp("store")
    out = ok_json(store, "run", "--pipeline", "tests.pipelines:pipeline", "--state", '{"x": 5}')
    return store, out["run"]["run_id"]


def test_run_records_every_node(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    out = ok_json(store, "show", run_id)
    assert out["run"]["status"] == "completed"
    assert [n["name"] for n in out["nodes"]] == ["start", "expand", "small"]
    assert all(len(n["output_hash"]) == 64 for n in out["nodes"])
    assert [n["cache_reason"] for n in out["nodes"]] == ["bypass"] * 3


def test_runs_lists_the_run(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    assert run_id in [r["run_id"] for r in ok_json(store, "runs")]
    table = rewind(store, "runs")
    assert table.returncode == 0 and run_id[:12] in table.stdout


def test_show_one_node(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    out = ok_json(store, "show", run_id[:8], "--node", "expand")
    assert out["output"] == {"series": [30, 2, 4]}
    assert out["input"]["params"] == {"factor": 2}
    assert out["state"]["total"] == 15


def test_fork_without_override_is_an_unchanged_replay(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    out = ok_json(store, "fork", run_id, "--at", "2")
    executed = [n for n in out["nodes"] if not n["inherited"]]
    assert [n["cache_outcome"] for n in executed] == ["hit", "hit"]
    assert out["run"]["tokens"] == 0 and out["run"]["parent_run_id"] == run_id
    parent = ok_json(store, "show", run_id)
    assert [n["output_hash"] for n in out["nodes"]] == [n["output_hash"] for n in parent["nodes"]]


def test_fork_with_param_then_diff(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    child = ok_json(store, "fork", run_id, "--at", "start", "--set", "start.offset=1")
    assert child["nodes"][0]["cache_reason"] == "override"
    d = ok_json(store, "diff", run_id, child["run"]["run_id"])
    assert d["first_divergence"] == 0
    first = d["nodes"][0]
    assert [c["path"] for c in first["changes"]] == ["total"]
    assert (first["changes"][0]["old"], first["changes"][0]["new"]) == (15, 6)
    human = rewind(store, "diff", run_id, child["run"]["run_id"])
    assert human.returncode == 0 and "first divergence" in human.stdout


def test_fork_with_output_override(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    child = ok_json(
        store, "fork", run_id, "--at", "expand", "--set-output", "expand.series=[100,2,4]"
    )
    assert child["nodes"][1]["cache_outcome"] == "override"
    d = ok_json(store, "diff", run_id, child["run"]["run_id"])
    assert [c["path"] for c in d["nodes"][1]["changes"]] == ["series[0]"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["fork", "nosuchrun", "--at", "1"], "unknown run"),
        (["fork", "{run}", "--at", "nosuch"], "has no node 'nosuch'"),
        (["fork", "{run}", "--at", "9"], "no node number 9"),
        (["fork", "{run}", "--at", "start", "--set", "start.nosuch=1"], "no param 'nosuch'"),
        (["fork", "{run}", "--at", "expand", "--set-output", "expand.nosuch=1"], "nosuch"),
        (
            ["fork", "{run}", "--at", "expand", "--set-output", "expand.series=[1,"],
            "not valid JSON",
        ),
        (["fork", "{run}", "--at", "start", "--set", "offset=1"], "malformed override"),
        (
            [
                "fork",
                "{run}",
                "--at",
                "start",
                "--set",
                "start.offset=1",
                "--set",
                "start.offset=2",
            ],
            "exactly one change",
        ),
        (["show", "nosuchrun"], "unknown run"),
        (["diff", "{run}", "nosuchrun"], "unknown run"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    recorded: tuple[Path, str], args: list[str], needle: str
) -> None:
    store, run_id = recorded
    before = row_counts(store)
    proc = rewind(store, *[a.replace("{run}", run_id) for a in args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert row_counts(store) == before


def test_fork_of_running_or_failed_run_is_refused(tmp_path: Path) -> None:
    from rewind.store import open_store

    store = open_store(tmp_path)
    with store.write() as conn:
        store.create_run(conn, run_id="busy0000", pipeline="tiny", pipeline_ref="")
    store.close()
    before = row_counts(tmp_path)
    proc = rewind(tmp_path, "fork", "busy0000", "--at", "1")
    assert proc.returncode == 2 and "still running" in proc.stderr
    failed = ok_json_allow_fail(tmp_path)
    # `finish` comes after the node that failed: the run never reached it.
    proc = rewind(tmp_path, "fork", failed, "--at", "finish")
    assert proc.returncode == 2, proc.stderr
    assert "failed at node 'boom' (#2) before reaching 'finish'" in proc.stderr, proc.stderr
    assert row_counts(tmp_path)["runs"] == before["runs"] + 1


def ok_json_allow_fail(store: Path) -> str:
    state = '{"x": 1}'
    proc = rewind(store, "run", "--pipeline", "tests.pipelines:failing", "--state", state, "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["run"]["status"] == "failed"
    # It fails where it is meant to: at its 2nd node, `boom`, after `prepare` completed.
    assert [(n["name"], n["cache_outcome"]) for n in out["nodes"]] == [
        ("prepare", "miss"),
        ("boom", "failed"),
    ], out["nodes"]
    assert "boom went off" in out["run"]["error"]
    return str(out["run"]["run_id"])


@pytest.mark.slow
def test_demo_on_the_local_model(tmp_path: Path) -> None:
    proc = rewind(tmp_path, "demo")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "first divergence: node 3 analyse" in proc.stdout
    assert "0 (recorded run:" in proc.stdout
    assert "✗" not in proc.stdout


@pytest.mark.slow
def test_verify_passes_all_checks(tmp_path: Path) -> None:
    proc = rewind(tmp_path, "verify")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "15/15 checks passed" in proc.stdout


def test_unreachable_model_endpoint_is_one_clear_error(tmp_path: Path) -> None:
    env = {"REWIND_BASE_URL": "http://127.0.0.1:9/v1", "REWIND_MODEL": "some-model"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = rewind(tmp_path, "run")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "does not answer" in last and "REWIND_BASE_URL" in last
    # The endpoint is checked before anything is recorded.
    assert json.loads(rewind(tmp_path, "runs", "--json").stdout) == []


def test_param_of_another_json_type_is_refused(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    before = row_counts(store)
    proc = rewind(store, "fork", run_id, "--at", "1", "--set", "start.offset=NaN")
    assert proc.returncode == 2
    assert "recorded as a number" in proc.stderr
    assert row_counts(store) == before


def test_audit_of_a_run_without_side_effects(recorded: tuple[Path, str]) -> None:
    store, run_id = recorded
    proc = rewind(store, "audit", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdicts"] == []
