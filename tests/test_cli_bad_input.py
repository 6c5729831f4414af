"""Bad input, for every command: exit 2, one line on stderr (what is wrong — how to fix it), no
traceback, nothing written (the store's row counts unchanged, no stray store folder created).

Each case runs ``rewind`` as a user would (a subprocess) in an empty working folder, against a
store holding one recorded run of the small test pipeline.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from rewind.replay import Rewind
from rewind.store import open_store, schema
from tests import pipelines
from tests.cli_process import run_rewind
from tests.conftest import row_counts

ROOT = Path(__file__).resolve().parent.parent


def rewind(
    cwd: Path, *args: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    return run_rewind(*args, cwd=cwd, env=env, timeout=600, **popen)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """(store folder, run id, an empty working folder)."""
    store = tmp_path_factory.mktemp("bad-input") / "store"
    rw = Rewind(store)
    try:
        run_id = rw.record(pipelines.pipeline, {"x": 5}).run_id
    finally:
        rw.store.close()
    junk = store.parent / "junk.json"
    junk.write_text("not json at all")
    cwd = store.parent / "cwd"
    cwd.mkdir()
    return store, run_id, cwd


def counts(store: Path) -> dict[str, int]:
    st = open_store(store, read_only=True)
    try:
        return row_counts(st)
    finally:
        st.close()


P = "tests.pipelines:pipeline"
BIG = "9" * 25
# (argv after `--store STORE`, a phrase the one line must contain)
CASES: list[tuple[list[str], str]] = [
    (["run", "--pipeline", P, "--state", '{"x": NaN}'], "NaN"),
    (["run", "--pipeline", P, "--state", '{"x": [1, -Infinity]}'], "$.x[1]"),
    (["run", "--pipeline", P, "--state", '{"x": ' + "1" * 5000 + "}"], "--state"),
    (["run", "--pipeline", P, "--state", "[" * 100_000], "--state"),
    (["run", "--pipeline", P, "--state", "[5]"], "JSON object"),
    (["run", "--pipeline", P, "--state", '{"x":'], "not valid JSON"),
    (["run", "--pipeline", "../../x:y", "--state", "{}"], "not a module name"),
    (["run", "--pipeline", "/tmp/x.py:p", "--state", "{}"], "not a module name"),
    (["run", "--pipeline", "nosuchmodule_zz:p"], "cannot import"),
    (["run", "--pipeline", "tests.pipelines:nosuch"], "cannot import"),
    (["run", "--pipeline", "tests.pipelines"], "module:attribute"),
    (["run", "--state", "{}"], "--halt-before need --app"),
    (["run", "--pipeline", P, "--csv", "x.csv"], "belong to the demo"),
    (["runs", "--limit", BIG], "--limit"),
    (["runs", "--limit", "0"], "--limit"),
    (["runs", "--limit", "abc"], "--limit"),
    (["runs", "--bogus"], "--bogus"),
    (["show", "nosuchrun"], "unknown run"),
    (["show", "ab"], "at least 4"),
    (["show", "{run}", "--node", "99"], "no node number 99"),
    (["show", "{run}", "--node", "²"], "no node '²'"),
    (["fork", "{run}", "--at", BIG], "no node number"),
    (["fork", "{run}", "--at", "1", "--effects", "bogus"], "bogus"),
    (["fork", "{run}", "--at", "1", "--set", "start.offset=1", "--set-output", "x.y=1"], "one"),
    (["diff", "{run}", "nosuchrun"], "unknown run"),
    (["audit", "nosuchrun"], "unknown run"),
    (["audit", "{run}", "--against", "nosuchrun"], "unknown run"),
    (["stability", "{run}", "-k", "0"], "-k"),
    (["stability", "{run}", "-k", BIG], "-k"),
    (["stability", "{run}", "--from", "nosuch"], "nosuch"),
    (["grid", "{run}", "--at", "1"], "--set"),
    (["grid", "{run}", "--at", "1", "--set", "start.offset=1", "--workers", "0"], "--workers"),
    (["grid", "{run}", "--at", "1", "--set", "start.offset=1", "--workers", BIG], "--workers"),
    (["inspect", "nosuchrun"], "unknown run"),
    (["inspect", "{run}", "--setting", "bogus=1"], "bogus"),
    (["inspect", "{run}", "--step", "nosuch"], "nosuch"),
    (["failures", "--since", "yesterdayish"], "yesterdayish"),
    (["failures", "--since", "1e400"], "1e400"),
    (["failures", "--since", "nan"], "nan"),
    (["failures", "--limit", "0"], "--limit"),
    (["failures", "--limit", BIG], "--limit"),
    (["failures", "--examples", "-1"], "--examples"),
    (["failures", "--kind", "bogus"], "bogus"),
    (["root-cause", "nosuchrun"], "unknown run"),
    (["debug", "nosuchrun"], "unknown run"),
    (["replay-trace", "nosuchrun"], "unknown run"),
    (["otel", "export", "{run}", "--out", "/missing/dir/x.json"], "/missing/dir"),
    (["otel", "export", "{run}"], "--out"),
    (["otel", "export", "nosuchrun", "--out", "x.json"], "unknown run"),
    (["otel", "export", "{run}", "--endpoint", "ftp://x"], "http"),
    (["otel", "import", "/missing/spans.json"], "spans.json"),
    (["otel", "import", "{junk}"], "junk.json"),
    (["nosuchcommand"], "nosuchcommand"),
    (["serve", "--port", "99999"], "--port"),
    (["serve", "--port", "-1"], "--port"),
    (["serve", "--workers", "0"], "--workers"),
]


@pytest.mark.parametrize(("args", "needle"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(
    recorded: tuple[Path, str, Path], args: list[str], needle: str
) -> None:
    store, run_id, cwd = recorded
    junk = str(store.parent / "junk.json")
    argv = [a.replace("{run}", run_id).replace("{junk}", junk) for a in args]
    before = counts(store)
    proc = rewind(cwd, "--store", str(store), *argv)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert needle in lines[0], lines[0]
    assert " — " in lines[0], f"no hint on how to fix it: {lines[0]}"
    assert counts(store) == before
    assert list(cwd.iterdir()) == [], "a store or file was created in the working folder"


def test_store_is_accepted_after_the_command(recorded: tuple[Path, str, Path]) -> None:
    store, run_id, cwd = recorded
    proc = rewind(cwd, "show", run_id, "--store", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    assert run_id in proc.stdout
    out = store.parent / "after.json"
    proc = rewind(cwd, "otel", "export", run_id, "--store", str(store), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    # After the command wins over before it, as the last --store given.
    proc = rewind(cwd, "--store", "elsewhere", "runs", "--store", str(store), "--json")
    assert proc.returncode == 0 and run_id in proc.stdout, proc.stderr
    assert list(cwd.iterdir()) == []


def test_unknown_store_url_creates_nothing(recorded: tuple[Path, str, Path]) -> None:
    _, _, cwd = recorded
    proc = rewind(cwd, "--store", "foo://bar", "runs")
    assert proc.returncode == 2 and "foo://bar" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (cwd / ".rewind").exists()


def test_empty_rewind_store_variable_is_an_error(recorded: tuple[Path, str, Path]) -> None:
    _, _, cwd = recorded
    proc = rewind(cwd, "runs", env={"REWIND_STORE": ""})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the environment variable REWIND_STORE is set but empty")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(cwd.iterdir()) == []


def test_read_commands_on_a_missing_store_create_nothing(recorded: tuple[Path, str, Path]) -> None:
    _, _, cwd = recorded
    for args in (["runs"], ["show", "abcd"], ["failures"], ["inspect", "abcd"]):
        proc = rewind(cwd, *args)
        assert proc.returncode == 2 and "no store at" in proc.stderr, proc.stderr
        assert list(cwd.iterdir()) == []


def test_commands_on_a_run_refuse_a_missing_store_and_create_nothing(
    recorded: tuple[Path, str, Path],
) -> None:
    # A mistyped --store used to be created empty, then the run was "unknown".
    _, _, cwd = recorded
    for args in (
        ["fork", "abcd", "--at", "1"],
        ["replay-trace", "abcd"],
        ["debug", "abcd"],
        ["audit", "abcd"],
        ["grid", "abcd", "--at", "1", "--set", "a.b=1"],
        ["stability", "abcd", "-k", "2"],
    ):
        proc = rewind(cwd, *args)
        assert proc.returncode == 2 and "no store at" in proc.stderr, (args, proc.stderr)
        assert list(cwd.iterdir()) == [], args


def test_fork_of_a_run_without_nodes_says_it_was_interrupted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with store.write() as conn:
        store.create_run(conn, run_id="gone0000", pipeline="tiny", pipeline_ref=P)
        conn.execute(
            update(schema.runs)
            .where(schema.runs.c.run_id == "gone0000")
            .values(status="interrupted")
        )
    before = row_counts(store)
    store.close()
    proc = rewind(tmp_path, "--store", str(tmp_path), "fork", "gone0000", "--at", "1")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "recorded no nodes" in line and "interrupted" in line and "rewind run" in line, line
    assert "no node number" not in line
    st = open_store(tmp_path, read_only=True)
    assert row_counts(st) == before
    st.close()


def test_read_commands_work_on_a_read_only_store(tmp_path: Path) -> None:
    """A store on read-only media (here: a folder and files nobody may write; even root obeys
    the modes in the commands) can be listed, shown, diffed, inspected, audited, exported."""
    store = tmp_path / "store"
    rw = Rewind(store)
    try:
        a = rw.record(pipelines.pipeline, {"x": 5}).run_id
        b = rw.record(pipelines.pipeline, {"x": 50}).run_id
    finally:
        rw.store.close()
    out = tmp_path / "out"
    out.mkdir()
    for f in store.iterdir():
        f.chmod(0o444)
    store.chmod(0o555)
    try:
        before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in store.iterdir())
        for args in (
            ["runs", "--json"],
            ["show", a],
            ["show", a, "--node", "2"],
            ["diff", a, b],
            ["audit", a],
            ["inspect", a],
            ["failures"],
            ["root-cause", a],
            ["otel", "export", a, "--out", str(out / "spans.json")],
        ):
            proc = rewind(tmp_path, "--store", str(store), *args, obey_file_modes=True)
            assert proc.returncode == 0, (args, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr
            if args[0] == "runs":
                assert a in proc.stdout and b in proc.stdout
        after = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in store.iterdir())
        assert after == before  # nothing created or written, not even a -wal/-shm file
        # A command that records says in one line that it cannot write.
        proc = rewind(tmp_path, "--store", str(store), "fork", a, "--at", "1", obey_file_modes=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    finally:
        store.chmod(0o755)
        for f in store.iterdir():
            f.chmod(0o644)
