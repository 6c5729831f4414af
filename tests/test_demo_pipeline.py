"""The demo research pipeline on the engine, with a fake model (fast): param checks before
anything is written, robustness on other CSVs, the computed answer line, side-effect replay."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from rewind.demo import demo_override, run_demo
from rewind.errors import InvalidOverride
from rewind.examples import research, weather
from rewind.replay import ParamOverride, Rewind
from tests.conftest import orphan_run, row_counts


@pytest.fixture
def parent(rw_llm: Rewind):
    run = rw_llm.record(research.build(), research.initial_state())
    assert run.status == "completed", run.error
    return run


def test_param_values_the_node_cannot_use_are_refused_before_writing(
    rw_llm: Rewind, parent
) -> None:
    before = row_counts(rw_llm.store)
    for param, value, needle in [
        ("group_by", "fortnight", "fortnight"),
        ("group_by", "", "group"),
        ("aggregate", "bogus", "bogus"),
        ("group_by", 3, "string"),
    ]:
        with pytest.raises(InvalidOverride, match=needle):
            rw_llm.fork(parent.run_id, at=3, override=ParamOverride("analyse", param, value))
    with pytest.raises(InvalidOverride, match="temperature"):
        rw_llm.fork(parent.run_id, at=4, override=ParamOverride("critique", "temperature", 9))
    assert row_counts(rw_llm.store) == before


def test_report_has_an_answer_computed_from_the_data(rw_llm: Rewind, parent) -> None:
    report = Path(rw_llm.store.artifacts_of(parent.run_id)[0]["path"]).read_text()
    analysis = rw_llm.node_output(rw_llm.store.nodes_of(parent.run_id)[2])["analysis"]
    assert weather.answer_line(analysis) in report
    assert f"{analysis['top']['group']} has the highest" in report


def test_single_group_analysis_does_not_crash_the_pipeline(rw_llm: Rewind, tmp_path: Path) -> None:
    csv = tmp_path / "one_year.csv"
    rows = [f"2023-01-{d:02d},{d * 1.5}" for d in range(1, 29)]
    csv.write_text("date,rain\n" + "\n".join(rows) + "\n")
    run = rw_llm.record(research.build(), research.initial_state(csv, "Which year is wettest?"))
    assert run.status == "completed", run.error
    fork = rw_llm.fork(
        run.run_id, at=3, override=ParamOverride("analyse", "group_by", "year"), effects="live"
    )
    assert fork.status == "completed", fork.error


def test_demo_override_is_valid_without_a_date_column(rw_llm: Rewind, tmp_path: Path) -> None:
    csv = tmp_path / "shops.csv"
    csv.write_text("region,revenue\n" + "\n".join(f"r{i % 3},{i * 2.5}" for i in range(30)))
    run = rw_llm.record(research.build(), research.initial_state(csv, "Which region earns most?"))
    assert run.status == "completed", run.error
    override = demo_override(rw_llm, run)
    assert override.param == "aggregate"  # no other grouping exists: the aggregate changes
    fork = rw_llm.fork(run.run_id, at=3, override=override, effects="live")
    assert fork.status == "completed", fork.error


def test_csv_with_nothing_to_plan_is_refused_up_front(tmp_path: Path) -> None:
    csv = tmp_path / "text.csv"
    csv.write_text("name,colour\na,red\nb,blue\n")
    with pytest.raises(weather.DataError, match="numeric"):
        research.initial_state(csv)


def test_demo_flow_unchanged_replay_serves_publish_and_materializes_the_artifact(
    rw_llm: Rewind,
) -> None:
    result = run_demo(rw_llm)
    replay_nodes = rw_llm.store.nodes_of(result.replay.run_id)
    publish = replay_nodes[-1]
    assert publish.cache_outcome == "hit" and publish.cache_reason == "side-effect-recorded"
    served = [c for c in publish.calls if c.determinism == "side-effect"]
    assert [c.label for c in served] == ["served:side-effect-recorded"]
    a = Path(rw_llm.store.artifacts_of(result.parent.run_id)[0]["path"]).read_bytes()
    b = Path(rw_llm.store.artifacts_of(result.replay.run_id)[0]["path"]).read_bytes()
    assert a == b
    assert result.replay.tokens == 0


def test_an_interrupted_run_is_marked_interrupted_and_can_be_forked(tmp_path: Path) -> None:
    from tests import pipelines

    rw = Rewind(tmp_path / "store")
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def interrupt_once_napping() -> None:
        # Not a timer: on a loaded machine one could fire before the run (or its node) started.
        pipelines.NAP_ENTERED.wait()
        # Ctrl-C, aimed at the main thread (the one recording): a process-wide os.kill may be
        # delivered to any other thread of the test session, and then the main thread only
        # handles it once its 60 s nap ends (seen in full-suite runs: 60 s for this test).
        signal.pthread_kill(main, signal.SIGINT)

    pipelines.NAP_ENTERED.clear()
    pipelines.NAP_ARMED.set()
    threading.Thread(target=interrupt_once_napping, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        rw.record(pipelines.sleepy, {"x": 1})
    run = rw.store.list_runs()[0]
    assert run.status == "interrupted"
    nodes = rw.store.nodes_of(run.run_id)
    assert nodes[-1].cache_outcome == "failed" and "KeyboardInterrupt" in (nodes[-1].error or "")
    fork = rw.fork(run.run_id, at=1)
    assert fork.status == "completed"


def test_a_run_whose_process_died_is_reaped_as_interrupted(tmp_path: Path) -> None:
    orphan_run(tmp_path, "orphan00")
    rw = Rewind(tmp_path)
    assert rw.store.get_run("orphan00").status == "interrupted"
