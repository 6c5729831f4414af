"""How long each of the suite's longest test files takes, for ordering the files under xdist.

``make test`` runs ``-n 2 --dist loadfile --no-loadscope-reorder``: a worker takes the next whole
file, in collection order, whenever it becomes free. ``pytest_collection_modifyitems`` in
tests/conftest.py orders the files longest first (the longest-processing-time rule): a long file
started last would run alone on one worker after the other one has finished everything else.

The figures are the sums of ``--durations=0`` (setup, call and teardown of every test of the
file) in one whole-suite run under ``-n 2`` on the shared 2-core CI machine with nothing else
running (the suite took 5 min 31 s that run); the session fixtures' teardown, reported on a
worker's last test, is left out. Only the order matters, and only roughly: a file not listed
counts as 0 s and keeps its collection place after the listed ones. Refresh the table after
a file's cost changes a lot: ``python -m pytest -n 2 --dist loadfile --no-loadscope-reorder
--durations=0``, then sum per file.
"""

from __future__ import annotations

FILE_SECONDS: dict[str, int] = {
    "test_team_verify.py": 56,
    "test_api.py": 53,
    "test_cli.py": 51,
    "test_queue.py": 40,
    "test_benchmarks.py": 34,
    "test_ui.py": 31,
    "test_api_conformance.py": 21,
    "test_ui_debugger.py": 21,
    "test_faults.py": 18,
    "test_serde.py": 18,
    "test_tracing_otel_input.py": 17,
    "test_users.py": 17,
    "test_burr_examples.py": 13,
    "test_ui_runs.py": 13,
    "test_run_management.py": 12,
    "test_ui_attack.py": 11,
    "test_attack13.py": 10,
    "test_cli_process.py": 10,
    "test_ui_lists.py": 10,
    "test_cli_bad_input.py": 9,
    "test_diff.py": 9,
    "test_effect_contract.py": 9,
    "test_ui_graph.py": 9,
    "test_gc.py": 8,
    "test_sub_runs.py": 7,
    "test_api_layout.py": 6,
    "test_api_models.py": 6,
    "test_canonical.py": 6,
    "test_drift.py": 6,
    "test_capture.py": 5,
    "test_grid.py": 5,
    "test_localmodel.py": 5,
    "test_api_browser.py": 4,
    "test_attack16.py": 4,
}
