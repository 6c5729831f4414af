"""How long each of the suite's longest test files takes, for ordering the files under xdist.

``make test`` runs ``-n 3 --dist loadfile --no-loadscope-reorder``: a worker takes the next whole
file, in collection order, whenever it becomes free. ``pytest_collection_modifyitems`` in
tests/conftest.py orders the files longest first (the longest-processing-time rule): a long file
started last would run alone on one worker after the other one has finished everything else.

The figures are the sums of ``--durations=0`` (setup, call and teardown of every test of the
file) in one whole-suite run under ``-n 2`` on the shared 2-core CI machine with nothing else
running (the suite took 5 min 50 s that run); the session fixtures' teardown, reported on a
worker's last test, is left out. Only the order matters, and only roughly: a file not listed
counts as 0 s and keeps its collection place after the listed ones. Refresh the table after
a file's cost changes a lot: ``python -m pytest -n 2 --dist loadfile --no-loadscope-reorder
--durations=0``, then sum per file.
"""

from __future__ import annotations

FILE_SECONDS: dict[str, int] = {
    "test_queue.py": 41,
    "test_team_verify.py": 41,
    "test_api.py": 40,
    "test_cli.py": 39,
    "test_ui.py": 35,
    "test_api_conformance.py": 33,
    "test_benchmarks.py": 32,
    "test_users.py": 30,
    "test_ui_debugger.py": 24,
    "test_ui_runs.py": 22,
    "test_cli_process.py": 17,
    "test_tracing_otel_input.py": 17,
    "test_serde.py": 16,
    "test_burr_examples.py": 14,
    "test_cli_bad_input.py": 14,
    "test_run_management.py": 14,
    "test_diff.py": 12,
    "test_effect_contract.py": 12,
    "test_gc.py": 12,
    "test_ui_attack.py": 10,
    "test_ui_graph.py": 10,
    "test_ui_lists.py": 10,
    "test_attack13.py": 9,
    "test_faults.py": 9,
    "test_api_models.py": 8,
    "test_grid.py": 8,
    "test_sub_runs.py": 8,
    "test_attack16.py": 7,
    "test_canonical.py": 7,
    "test_drift.py": 7,
    "test_localmodel.py": 6,
    "test_api_browser.py": 5,
    "test_capture.py": 5,
    "test_capture_sdks.py": 4,
}
