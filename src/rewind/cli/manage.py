"""Store management: ``rewind gc``, ``cancel``, ``delete``, ``archive list|restore`` and
``user add|list|revoke|rotate``."""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    fail,
    opened_store,
    session,
)
from rewind.cli.render import (
    console,
    emit_json,
)
from rewind.errors import InvalidOverride, RewindError
from rewind.terminal import inert, json_text


def gc_cmd(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Age: runs finished and cache entries last used longer ago go (30d, 12h, 90m).",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only print what would go; write nothing.")
    ] = False,
    archive: Annotated[
        str | None,
        typer.Option(
            "--archive",
            help="Object store URL for run archives (default: $REWIND_OBJECTS, else the store "
            "folder).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Retention: expire unused cache entries, archive old finished runs to the object store
    (never an ancestor of a kept run, never a running one), delete blobs no row names."""
    from rewind.store.retention import archive_store, collect_garbage, parse_age

    try:
        age = parse_age(older_than)  # bad input is refused before the store is opened
    except RewindError as exc:
        fail(exc)
    with opened_store(read_only=dry_run, must_exist=True) as opened:
        report = collect_garbage(
            opened, age, dry_run=dry_run, archive=archive_store(opened, archive)
        )
    if as_json:
        emit_json(report.to_json())
        return

    def did(past: str, base: str) -> str:
        return f"would {base}" if dry_run else past

    head = "gc (dry run: nothing written)" if dry_run else "gc"
    console.print(
        f"[bold]{head}[/] older than {inert(older_than)}; archives in {inert(report.archive_url)}"
    )
    console.print(
        f"  cache entries {did('expired', 'expire')}: "
        f"{report.llm_cache_expired} llm, {report.tool_cache_expired} tool"
    )
    archived_bytes = sum(a.archive_bytes for a in report.archived)
    console.print(
        f"  runs {did('archived', 'archive')}: {len(report.archived)} "
        f"({sum(a.rows for a in report.archived)} rows, {archived_bytes} archive bytes)"
    )
    for a in report.archived:
        console.print(
            f"    {inert(a.run_id)}  {inert(a.pipeline)}  {a.status}  {a.rows} rows  "
            f"{a.blobs} blobs  {a.archive_bytes} B"
        )
    if report.kept_ancestors:
        console.print(
            f"  kept as ancestors of kept runs: {len(report.kept_ancestors)} "
            f"({', '.join(inert(r[:12]) for r in report.kept_ancestors)})"
        )
    if report.left_unfinished:
        console.print(f"  left alone, not finished: {len(report.left_unfinished)}")
    for item in report.skipped:
        console.print(f"  skipped {inert(item['run_id'])}: {inert(item['reason'])}")
    console.print(
        f"  blobs {did('deleted', 'delete')}: {report.blobs_deleted} "
        f"({report.blob_bytes} bytes; {report.objects_deleted} in the object store)"
    )


def cancel_cmd(
    run_id: Annotated[str, typer.Argument(help="The running run (id or unique prefix).")],
    store: StoreOpt = None,
) -> None:
    """Cancel a running run, whichever process executes it (a server, another `rewind run`):
    it stops before its next node and ends `cancelled`; a run whose process is gone is marked
    `interrupted` at once."""
    from rewind import progress

    with opened_store(must_exist=True) as opened:
        run = opened.get_run(run_id)
        if opened.reap_orphans([run.run_id]):
            console.print(f"run {inert(run.run_id)}: its process is gone; marked interrupted")
            return
        if not progress.request_cancel(opened, run.run_id, os.environ.get("REWIND_USER")):
            raise InvalidOverride(
                f"run {run.run_id[:12]} already finished ({opened.get_run(run.run_id).status})",
                "only a running run can be cancelled",
            )
    console.print(
        f"cancel requested: run {inert(run.run_id)} stops before its next node "
        "(a node already executing finishes first)"
    )


def delete_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to delete (id or unique prefix).")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking for confirmation.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check and print what would go.")
    ] = False,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Delete a run for good (no archive), with gc's rules: never a run a kept run descends
    from (delete its forks first), its sub-runs go with it, never a running run; then the blobs
    no row names any more."""
    from rewind.store.retention import delete_run

    with opened_store(read_only=dry_run, must_exist=True) as opened:
        run = opened.get_run(run_id)
        if not dry_run:
            opened.reap_orphans([run.run_id])  # a dead process's run is no longer running
        plan = delete_run(opened, run.run_id, dry_run=True)
        if not (dry_run or yes):
            if not sys.stdin.isatty():
                raise InvalidOverride(
                    f"deleting run {run.run_id[:12]} needs a confirmation",
                    "pass --yes (or --dry-run to see what would go)",
                    field="yes",
                )
            subs = f" and its {len(plan.sub_runs)} sub-run(s)" if plan.sub_runs else ""
            if not typer.confirm(f"Delete run {inert(run.run_id)}{subs} ({plan.rows} rows)?"):
                raise SystemExit(1)
        deleted = plan if dry_run else delete_run(opened, run.run_id)
    if as_json:
        emit_json({"dry_run": dry_run} | deleted.to_json())
        return
    verb = "would delete" if dry_run else "deleted"
    console.print(
        f"{verb} run {inert(deleted.run_id)}: {deleted.rows} rows"
        + (f", {len(deleted.sub_runs)} sub-run(s)" if deleted.sub_runs else "")
    )
    if not dry_run:
        console.print(
            f"  blobs deleted: {deleted.blobs_deleted} ({deleted.blob_bytes} bytes; "
            f"{deleted.objects_deleted} in the object store)"
        )


archive_app = typer.Typer(
    no_args_is_help=True, help="Runs archived by `rewind gc`: list them, restore one."
)


@archive_app.command("list")
def archive_list_cmd(as_json: JsonOpt = False, store: StoreOpt = None) -> None:
    """List archived runs, newest archive first."""
    from rewind.store.retention import archived_runs

    with session(model=False, read_only=True) as rw:
        items = archived_runs(rw.store)
    if as_json:
        emit_json(items)
        return
    t = Table(title="archived runs", title_justify="left")
    for col in ("run", "pipeline", "status", "parent", "archived", "bytes", "archive"):
        t.add_column(col)
    for r in items:
        t.add_row(
            inert(r["run_id"][:12]),
            inert(r["pipeline"]),
            inert(r["status"]),
            inert((r["parent_run_id"] or "")[:12]),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r["archived_at"])),
            str(r["archive_bytes"]),
            inert(r["archive_ref"]),
        )
    console.print(t)


@archive_app.command("restore")
def archive_restore_cmd(
    run_id: Annotated[str, typer.Argument(help="Archived run id (or a unique prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Bring an archived run back exactly (same rows and hashes), with its archived ancestors."""
    from rewind.store.retention import restore_run

    with session(model=False) as rw:
        restored = restore_run(rw.store, run_id)
    if as_json:
        emit_json(
            {
                "run_id": restored.run_id,
                "rows": restored.rows,
                "blobs": restored.blobs,
                "ancestors": list(restored.ancestors),
            }
        )
        return
    console.print(
        f"restored run {inert(restored.run_id)}: {restored.rows} rows, {restored.blobs} blobs"
        + (
            f" (and archived ancestors {', '.join(inert(a[:12]) for a in restored.ancestors)})"
            if restored.ancestors
            else ""
        )
    )


user_app = typer.Typer(
    no_args_is_help=True,
    help="API users: bearer tokens (stored hashed), teams and admins. With any user, every "
    "request to `rewind serve` needs a token, and each user sees their own and their team's runs.",
)

TeamOpt = Annotated[
    str | None,
    typer.Option("--team", help="The user's team: users of one team see each other's runs."),
]


@user_app.command("add")
def user_add_cmd(
    name: Annotated[str, typer.Argument(help="User name: letters, digits, '.', '_', '-'.")],
    admin: Annotated[bool, typer.Option("--admin", help="The user sees every run.")] = False,
    team: TeamOpt = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Add a user and print their new API token (shown once: only its hash is stored)."""
    from rewind.store.users import add_user, check_name

    try:
        check_name(name)  # bad input is refused before the store is opened or created
        if team is not None:
            check_name(team, "team name")
    except RewindError as exc:
        fail(exc)
    with opened_store() as st:
        user, token = add_user(st, name, team=team, admin=admin)
    _print_token(user.to_json(), token, as_json, "added")


@user_app.command("list")
def user_list_cmd(as_json: JsonOpt = False, store: StoreOpt = None) -> None:
    """List users (name, team, admin, active or revoked); never tokens."""
    from rewind.store.users import list_users

    with opened_store(read_only=True) as st:
        users = list_users(st)
    if as_json:
        console.print(json_text([u.to_json() for u in users]), soft_wrap=True)
        return
    if not users:
        console.print("no users: the API is open on loopback (add one with `rewind user add`)")
        return
    table = Table("user", "team", "admin", "status", "created")
    for u in users:
        table.add_row(
            inert(u.name),
            inert(u.team or "-"),
            "yes" if u.admin else "no",
            "active" if u.active else "revoked",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(u.created_at)),
        )
    console.print(table)


@user_app.command("revoke")
def user_revoke_cmd(
    name: Annotated[str, typer.Argument(help="The user whose token stops working.")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Revoke a user's token (their runs stay theirs; `rewind user rotate` re-enables them)."""
    from rewind.store.users import revoke_user

    with opened_store() as st:
        user = revoke_user(st, name)
    if as_json:
        console.print(json_text(user.to_json()), soft_wrap=True)
    else:
        console.print(f"revoked user {inert(user.name)}: the API refuses their token from now on")


@user_app.command("rotate")
def user_rotate_cmd(
    name: Annotated[str, typer.Argument(help="The user who gets a new token.")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Give a user a new token (printed once); the old one stops working at once."""
    from rewind.store.users import rotate_token

    with opened_store() as st:
        user, token = rotate_token(st, name)
    _print_token(user.to_json(), token, as_json, "rotated the token of")


def _print_token(user: dict[str, Any], token: str, as_json: bool, done: str) -> None:
    if as_json:
        console.print(json_text(user | {"token": token}), soft_wrap=True)
        return
    console.print(f"{done} user {inert(str(user['name']))}; their API token (shown only once):")
    console.print(token, soft_wrap=True, highlight=False)
    console.print("send it as 'Authorization: Bearer <token>', or paste it in the UI's Settings")
