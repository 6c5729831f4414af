"""``rewind audit``: the effect-equivalence audit of a run, as a table or JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    fail,
    is_store_error,
    require_existing_store,
    store_location,
)
from rewind.errors import RewindError, StoreError
from rewind.terminal import console as make_console
from rewind.terminal import inert

if TYPE_CHECKING:
    from rich.table import Table

    from rewind.audit import AuditReport, ResourceAudit


def audit(
    run_id: Annotated[str, typer.Argument(help="Run to audit (id or unique prefix).")],
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="Reference run (default: the run's parent; 'current' or no parent: the "
            "resources' current state).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Effect-equivalence audit: one verdict per side-effecting call (exit 0 only if all are
    faithful)."""
    try:
        try:
            # Writable, so the verdict is kept as the run's "admissible" label.
            code = audit_command(store_location(), run_id, against, as_json, read_only=False)
        except Exception as exc:
            if not (isinstance(exc, StoreError) or is_store_error(exc)):
                raise
            # A store on read-only media (refused at open, or at the verdict's write) is still
            # audited; the verdict is then not kept.
            code = audit_command(store_location(), run_id, against, as_json, read_only=True)
    except RewindError as exc:
        fail(exc)
    raise SystemExit(code)


_COLOURS = {
    "faithful": "green",
    "divergent": "red",
    "audit-incomplete": "yellow",
    "not-re-executed": "magenta",
}
"""Verdict colours (:data:`rewind.audit.VERDICTS`)."""


def summary_line(report: AuditReport) -> str:
    """One plain-text line: run, reference, pass/fail and why."""
    against = report.against or "nothing"
    status = "PASS" if report.passed else "FAIL"
    return f"audit {report.run_id[:12]} against {against}: {status} — {report.note}"


def render_audit(report: AuditReport) -> Table:
    """A Rich table: one row per audited resource (a call without resources gets one row).

    Columns: node number and name, call index, tool, verdict, resource, recorded post digest,
    reference post digest, epoch delta, reason, dependents.
    """
    from rich.table import Table

    from rewind.audit import _short, _shorten_name

    t = Table(title=inert(summary_line(report)), title_justify="left")
    for col in ("#", "node", "call", "tool", "verdict", "resource", "recorded", "reference"):
        t.add_column(col, no_wrap=col in ("#", "node", "call", "verdict"))
    for col in ("epoch Δ", "reason", "depends on it"):
        t.add_column(col, overflow="fold", min_width=24 if col == "reason" else None)
    for v in report.verdicts:
        colour = _COLOURS.get(v.verdict, "white")
        rows: Sequence[ResourceAudit | None] = v.resources or (None,)
        for i, r in enumerate(rows):
            first = i == 0
            t.add_row(
                str(v.position + 1) if first else "",
                inert(v.node) if first else "",
                str(v.call_index) if first else "",
                inert(v.tool) if first else "",
                f"[{colour}]{v.verdict}[/]" if first else "",
                "" if r is None else inert(_shorten_name(r.resource)),
                "" if r is None else _short(r.recorded_digest),
                "" if r is None or not r.reference else _short(r.reference_digest),
                "" if r is None else r.epoch_delta,
                inert(v.reason) if first else "",
                inert(", ".join(v.dependents)) if first else "",
            )
    return t


def audit_command(
    store: str, run_id: str, against: str | None, as_json: bool, *, read_only: bool = False
) -> int:
    """``rewind audit RUN [--against PARENT] [--json]``: print the audit, return the exit code.

    Args:
        store: the store location (folder, .db file or URL).
        run_id: the run to audit (id or unique prefix).
        against: reference run, ``"current"``, or None (parent, else current state).
        as_json: print :meth:`AuditReport.to_json` instead of a table.
        read_only: open the store read-only (the audit reads runs and re-fingerprints
            resources; it writes nothing), so a store on read-only media can be audited.
    Returns:
        0 only when every side-effecting call is ``faithful`` (or there is none), else 1.
    Raises:
        UnknownRun: the run or the reference does not exist (the CLI turns it into exit 2).
    """

    from rewind.audit import audit_run
    from rewind.replay import Rewind
    from rewind.store import open_store

    require_existing_store(store)
    rw = Rewind(open_store(store, read_only=read_only))
    try:
        report = audit_run(rw, run_id, against)
    finally:
        rw.store.close()
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        console = make_console()
        console.print(render_audit(report))
        for v in report.verdicts:
            if v.dependents:
                console.print(
                    inert(
                        f"#{v.position + 1} {v.node} is {v.verdict}: conclusions of "
                        f"{', '.join(v.dependents)} depend on it"
                    )
                )
        if report.inherited_skipped:
            skipped = ", ".join(report.inherited_skipped)
            console.print(
                "inherited from the run that executed them (not re-executed here): "
                + inert(skipped)
            )
    return 0 if report.passed else 1
