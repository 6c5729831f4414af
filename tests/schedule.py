"""How long each of the suite's longest test files takes, for ordering the files under xdist.

``make test`` runs ``-n 2 --dist loadfile --no-loadscope-reorder``: a worker takes the next whole
file, in collection order, whenever it becomes free. ``pytest_collection_modifyitems`` in
tests/conftest.py orders the files longest first (the longest-processing-time rule): a long file
started last would run alone on one worker after the other one has finished everything else.

The figures are the sums of ``--durations=0`` (setup, call and teardown of every test of the
file) in one whole-suite run under ``-n 2`` on the shared 2-core CI machine, under load (the
suite took 17 min that run); the session fixtures' teardown, reported on a worker's last test,
is left out. Only the order matters, and only roughly: a file not listed counts as 0 s and keeps
its collection place after the listed ones. Refresh the table after a file's cost changes a lot:
``python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=0``, then sum per file.
"""

from __future__ import annotations

FILE_SECONDS: dict[str, int] = {
    "test_team_verify.py": 185,
    "test_api.py": 145,
    "test_queue.py": 140,
    "test_cli.py": 138,
    "test_ui.py": 70,
    "test_benchmarks.py": 68,
    "test_ui_debugger.py": 64,
    "test_tracing_otel_input.py": 58,
    "test_cli_bad_input.py": 54,
    "test_users.py": 52,
    "test_burr_examples.py": 50,
    "test_attack13.py": 50,
    "test_api_conformance.py": 46,
    "test_canonical.py": 41,
    "test_cli_process.py": 29,
    "test_diff.py": 28,
    "test_sub_runs.py": 26,
    "test_effect_contract.py": 26,
    "test_serde.py": 24,
    "test_ui_graph.py": 23,
    "test_ui_runs.py": 22,
    "test_faults.py": 22,
    "test_tracing_import_replay.py": 21,
    "test_run_management.py": 21,
    "test_gc.py": 21,
    "test_ui_lists.py": 20,
    "test_drift.py": 20,
    "test_api_layout.py": 20,
    "test_ui_attack.py": 19,
    "test_attack16.py": 18,
    "test_tracing_service.py": 15,
    "test_cli_hostile.py": 15,
    "test_replay_hotpath.py": 14,
    "test_import_cycles.py": 14,
    "test_grid.py": 14,
    "test_objects.py": 13,
    "test_fork_plan.py": 13,
    "test_capture.py": 13,
    "test_audit.py": 13,
    "test_api_models.py": 11,
    "test_stability.py": 10,
    "test_localmodel.py": 10,
}
