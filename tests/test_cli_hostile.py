"""Hostile text from runs reaches the terminal inert, through every command (a subprocess each).

The store holds a run whose id, pipeline name, node name, state value and error message carry
Rich markup (``[red]``, a stray ``[/x]``), an erase-screen sequence, an OSC 8 hyperlink, a bell, a
carriage return and a right-to-left override; a traced chain and an imported OTLP trace carry the
same in step and span names. Every command must exit as it would on benign text, print no
traceback, let none of the raw control sequences through, and show the hostile text literally
with its controls escaped (``tests.hostile.SHOWN``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from rewind.replay import ParamOverride, Rewind
from tests import hostile
from tests.cli_process import run_rewind
from tests.hostile import HOSTILE, NODE, RAW_CONTROLS, SHOWN

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = f"r{HOSTILE}"


def rewind(store: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # Wide enough that no table cell is cut: the whole escaped text must be visible.
    return run_rewind("--store", str(store), *args, stdin=stdin, columns=400, timeout=600)


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """A store with the hostile run (failed at its 2nd node), a fork of it, two traces of the
    hostile chain (one completed, one failed) and the hostile OTLP file (not yet imported)."""
    folder = tmp_path_factory.mktemp("hostile")
    store = folder / "store"
    rw = Rewind(store)
    try:
        run = rw.record(hostile.pipeline, {"x": HOSTILE}, run_id=RUN_ID)
        assert run.status == "failed"
        child = rw.fork(RUN_ID, at=1, override=ParamOverride(NODE, "tag", HOSTILE))
        hostile.TRACER.configure(store=rw.store)
        hostile.chain("fine")
        with contextlib.suppress(ValueError):
            hostile.chain(f"q{HOSTILE}", fail=True)
        traces = [r for r in rw.store.list_runs() if r.pipeline == f"c{HOSTILE}"]
        ok_trace = next(r.run_id for r in traces if r.status == "completed")
    finally:
        rw.store.close()
    return {
        "store": store,
        "run": RUN_ID,
        "fork": child.run_id,
        "trace": ok_trace,
        "otlp": hostile.otlp_file(folder / "spans.json"),
        "out": folder / "export.json",
    }


SHORT_ID = RUN_ID[:12]
"""What tables show of the hostile run id: markup only, shown literally."""
CASES: list[tuple[str, list[str], int, str | None]] = [
    ("run", ["run", "--pipeline", "tests.hostile:pipeline", "--state", "{state}"], 1, SHOWN),
    ("runs", ["runs"], 0, SHOWN),
    ("show", ["show", "{run}"], 0, SHOWN),
    ("show --node", ["show", "{run}", "--node", "1"], 0, SHOWN),
    ("fork", ["fork", "{run}", "--at", "1", "--set", f"{NODE}.tag=b{HOSTILE}"], 1, SHOWN),
    ("diff", ["diff", "{run}", "{fork}"], 0, SHOWN),
    # The run failed, so its audit fails closed (exit 1); the hostile id is shown inert anyway.
    ("audit", ["audit", "{run}"], 1, SHORT_ID),
    (
        "grid",
        ["grid", "{run}", "--at", "1", "--set", f"{NODE}.tag=c", "--set", f"{NODE}.tag=d"],
        1,
        SHOWN,
    ),
    ("stability", ["stability", "{run}", "--from", "1", "-k", "2"], 1, SHOWN),
    ("inspect", ["inspect", "{run}"], 0, SHOWN),
    ("failures", ["failures"], 0, SHORT_ID),
    ("root-cause", ["root-cause", "{run}"], 0, SHOWN),
    ("debug", ["debug", "{run}"], 0, SHOWN),
    ("replay-trace", ["replay-trace", "{trace}", "--set", f"input.question=e{HOSTILE}"], 0, SHOWN),
    ("otel export", ["otel", "export", "{run}", "--out", "{out}"], 0, None),
    ("otel import", ["otel", "import", "{otlp}"], 0, SHOWN),
    ("error: unknown run", ["show", f"ab{HOSTILE}"], 2, repr(f"ab{HOSTILE}")),
    ("error: unknown node", ["fork", "{run}", "--at", f"m{HOSTILE}"], 2, SHOWN),
    ("error: unknown step", ["inspect", "{run}", "--step", f"m{HOSTILE}"], 2, SHOWN),
]
DEBUG_SCRIPT = "list\nshow\nstate\nnext\nshow\nprint error.message\n"


@pytest.mark.parametrize(("label", "args", "code", "shown"), CASES, ids=[c[0] for c in CASES])
def test_hostile_text_is_shown_inert(
    hostile_store: dict[str, Path | str], label: str, args: list[str], code: int, shown: str | None
) -> None:
    values = {k: str(v) for k, v in hostile_store.items()} | {"state": json.dumps({"x": HOSTILE})}
    argv = [a.format(**values) if a.startswith("{") else a for a in args]
    stdin = DEBUG_SCRIPT if label == "debug" else None
    proc = rewind(Path(hostile_store["store"]), *argv, stdin=stdin)
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output[-3000:]
    assert "Traceback" not in output and "MarkupError" not in output, output[-3000:]
    for raw in RAW_CONTROLS:
        assert raw not in output, f"{raw!r} reached the terminal: {output[-2000:]!r}"
    if shown is not None:
        assert shown in output, output[-3000:]
    if code == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_unknown_run_id_is_printed_as_typed(hostile_store: dict[str, Path | str]) -> None:
    proc = rewind(Path(hostile_store["store"]), "show", "ab[red]cd")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown run 'ab[red]cd' — list runs with `rewind runs`"
