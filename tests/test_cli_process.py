"""The tests' ``rewind`` runner: a command forked from the fork server (tests/cli_zygote.py)
behaves as the same command started as a plain ``python -m rewind`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewind.replay import Rewind
from tests import cli_process, pipelines
from tests.cli_process import FORK_SERVER_VARIABLE, ROOT, run_rewind


def both(
    monkeypatch: pytest.MonkeyPatch, *args: str, **kwargs: object
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """(forked, plain) results of one command."""
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    forked = run_rewind(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setenv(FORK_SERVER_VARIABLE, "0")
    plain = run_rewind(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.delenv(FORK_SERVER_VARIABLE)
    return forked, plain


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        [],
        ["nosuchcommand"],
        ["runs", "--limit", "0"],
        ["fork", "abcd", "--at", "1", "--set", "x"],
        ["show", "--help"],
    ],
    ids=lambda a: " ".join(a) or "no-args",
)
def test_a_forked_command_prints_and_exits_as_a_plain_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    forked, plain = both(monkeypatch, "--store", str(tmp_path / "store"), *args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert cli_process._FORK_SERVER._process is not None  # the first one was forked


def test_a_forked_command_gets_its_own_folder_environment_and_width(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    rw = Rewind(store)
    try:
        run_id = rw.record(pipelines.pipeline, {"x": 5}).run_id
    finally:
        rw.store.close()
    for columns in (60, 200):
        forked, plain = both(
            monkeypatch, "show", run_id, cwd=tmp_path, env={"REWIND_STORE": str(store)},
            columns=columns,
        )  # fmt: skip
        assert forked.returncode == 0, forked.stderr
        assert forked.stdout == plain.stdout and forked.stderr == plain.stderr
        assert max(len(line) for line in forked.stdout.splitlines()) <= columns
    # A relative --store is found from the command's own working folder.
    forked, plain = both(monkeypatch, "--store", "store", "runs", "--json", cwd=tmp_path)
    assert forked.returncode == 0 and [r["run_id"] for r in json.loads(forked.stdout)] == [run_id]
    assert forked.stdout == plain.stdout


def test_a_forked_command_imports_the_pipeline_and_records(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    store = tmp_path / "store"
    args = ("--store", str(store), "run", "--pipeline", "tests.pipelines:pipeline")
    proc = run_rewind(*args, "--state", '{"x": 3}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(run_rewind("--store", str(store), "runs", "--json", cwd=tmp_path).stdout)
    assert len(runs) == 1 and runs[0]["status"] == "completed"
    assert list(tmp_path.iterdir()) == [store]


def test_other_interpreter_settings_run_a_plain_subprocess(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    server = cli_process._FORK_SERVER
    base = {k: v for k, v in os.environ.items() if k != "REWIND_STORE"}
    base["PYTHONPATH"] = os.pathsep.join([str(cli_process.ROOT / "src"), str(cli_process.ROOT)])
    run_rewind("--help")  # the server now knows its settings
    assert server.serves(base | {"COLUMNS": "80", "REWIND_STORE": "x"})
    assert not server.serves(base | {"PYTHONHASHSEED": "7"})
    assert not server.serves(base | {"PYTHONPATH": "/elsewhere"})
    assert not server.serves(base | {"LC_ALL": "C"})
    monkeypatch.setenv(FORK_SERVER_VARIABLE, "0")
    assert not server.serves(base)


def test_a_command_that_runs_too_long_is_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    # `rewind serve` runs until it is stopped.
    with pytest.raises(subprocess.TimeoutExpired):
        run_rewind("--store", str(tmp_path / "store"), "serve", "--port", "0", timeout=3)


def test_the_server_exits_with_its_pytest_process(tmp_path: Path) -> None:
    """A pytest process killed without running ``atexit`` leaves no fork server behind."""
    code = (
        "import os, sys\n"
        "from tests.cli_process import _FORK_SERVER, run_rewind\n"
        "assert run_rewind('--help').returncode == 0\n"
        "print(_FORK_SERVER._process.pid, _FORK_SERVER._folder, flush=True)\n"
        "os._exit(0)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop(FORK_SERVER_VARIABLE, None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pid_text, folder = proc.stdout.split()
    pid = int(pid_text)
    for _ in range(600):  # it notices within a second; this bounds a hang, not the speed
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid), "the fork server outlived pytest"
    assert not Path(folder).exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True
