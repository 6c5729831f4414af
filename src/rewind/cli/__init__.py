"""The ``rewind`` command line: every command and all terminal rendering live in this package.

Domain modules return records and raise :class:`~rewind.errors.RewindError`; the modules here
turn them into tables, lines and JSON, and into exit codes. Bad input (unknown run, unknown node,
a field the node does not have, malformed JSON, a fork of a run still running or that failed
before the fork node) exits with status 2 and one line saying what is wrong and how to fix it;
nothing is written to the store in that case.

Modules: :mod:`~rewind.cli.app` (the Typer app, ``--store``, sessions, errors and exit codes),
:mod:`~rewind.cli.render` (shared tables, run summaries, the diff, JSON), and one module per
command group: ``record`` (demo, run, verify), ``runs`` (runs, show, diff), ``fork``, ``audit``,
``stability``, ``grid``, ``serve`` (serve, worker), ``traces`` (replay-trace, inspect, failures,
root-cause, debug), ``otel``, ``manage`` (gc, cancel, delete, archive, user).

Commands are registered here, in the order ``rewind --help`` lists them.
"""

from __future__ import annotations

from rewind.cli import audit, fork, grid, manage, record, runs, serve, stability, traces
from rewind.cli.app import app, main

__all__ = ["app", "main"]

app.command("demo")(record.demo)
app.command("run")(record.run)
app.command("runs")(runs.runs)
app.command("show")(runs.show)
app.command("fork")(fork.fork)
app.command("diff")(runs.diff)
app.command("audit")(audit.audit)
app.command("stability")(stability.stability_cmd)
app.command("grid")(grid.grid_cmd)
app.command("serve")(serve.serve)
app.command("worker")(serve.worker)
app.command("verify")(record.verify)
app.command("replay-trace")(traces.replay_trace_cmd)
app.command("inspect")(traces.inspect_cmd)
app.command("failures")(traces.failures_cmd)
app.command("root-cause")(traces.root_cause_cmd)
app.command("debug")(traces.debug_cmd)
app.add_typer(traces.otel_app, name="otel")
app.command("gc")(manage.gc_cmd)
app.command("cancel")(manage.cancel_cmd)
app.command("delete")(manage.delete_cmd)
app.add_typer(manage.archive_app, name="archive")
app.add_typer(manage.user_app, name="user")
