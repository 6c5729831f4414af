"""Small pipelines used by the tests.

``pipeline``: 4 nodes, one conditional transition; it proves Rewind instruments any Burr
application, not only the demo. The others probe failures, busy runs, the tool cache and the LLM
cache.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from burr.core import State, action, default, expr
from burr.core.graph import GraphBuilder

import rewind
from rewind.calls import chat
from rewind.effects import FileTree, SQLiteTable, idempotency_key
from rewind.errors import EndpointUnavailable
from rewind.replay import Pipeline
from rewind.tools import tool

CALLS: list[str] = []


@tool("t_add")
def t_add(a: int, b: int) -> int:
    CALLS.append("t_add")
    return a + b


@tool("t_scale")
def t_scale(values: list[int], factor: int) -> list[int]:
    CALLS.append("t_scale")
    return [v * factor for v in values]


@action(reads=["x"], writes=["total"])
def start(state: State) -> State:
    return state.update(total=t_add(state["x"], rewind.param("offset", 10)))


@action(reads=["total"], writes=["series"])
def expand(state: State) -> State:
    return state.update(series=t_scale([state["total"], 1, 2], rewind.param("factor", 2)))


@action(reads=["series"], writes=["verdict"])
def big(state: State) -> State:
    return state.update(verdict={"size": "big", "sum": t_add(sum(state["series"]), 0)})


@action(reads=["series"], writes=["verdict"])
def small(state: State) -> State:
    return state.update(verdict={"size": "small", "sum": t_add(sum(state["series"]), 0)})


graph = (
    GraphBuilder()
    .with_actions(start=start, expand=expand, big=big, small=small)
    .with_transitions(
        ("start", "expand", default),
        ("expand", "big", expr("total >= 20")),
        ("expand", "small", default),
    )
    .build()
)

pipeline = Pipeline(name="tiny", graph=graph, entrypoint="start", ref="tests.pipelines:pipeline")


def _factor_at_least_one(
    node: str, name: str, value: Any, node_input: dict[str, Any]
) -> str | None:
    """``checked``'s ``param_check``: ``expand.factor`` must be an integer of at least 1."""
    if node == "expand" and name == "factor" and (not isinstance(value, int) or value < 1):
        return "factor must be an integer of at least 1"
    return None


# ``pipeline`` with a param_check: forks refuse (before writing) a factor below 1.
checked = Pipeline(
    name="checked",
    graph=graph,
    entrypoint="start",
    ref="tests.pipelines:checked",
    param_check=_factor_at_least_one,
)


# -- more pipelines for the engine tests -------------------------------------------------------
# Each one is importable through its ``ref`` so a fresh ``Rewind`` (a new process) can fork it.


def _linear(name: str, ref: str, **nodes: Any) -> Pipeline:
    names = list(nodes)
    builder = GraphBuilder().with_actions(**nodes)
    if len(names) > 1:
        builder = builder.with_transitions(*[(a, b, default) for a, b in itertools.pairwise(names)])
    return Pipeline(name=name, graph=builder.build(), entrypoint=names[0], ref=ref)


# A run that fails at its 2nd node (unless the fork overrides ``boom.fail``).


@action(reads=["x"], writes=["total"])
def prepare(state: State) -> State:
    return state.update(total=t_add(state["x"], 1))


@action(reads=["total"], writes=["checked"])
def boom(state: State) -> State:
    if rewind.param("fail", True):
        raise RuntimeError("boom went off")
    return state.update(checked=t_add(state["total"], 100))


@action(reads=["checked"], writes=["done"])
def finish(state: State) -> State:
    return state.update(done=state["checked"] * 2)


failing = _linear("failing", "tests.pipelines:failing", prepare=prepare, boom=boom, finish=finish)


# A run whose 2nd node blocks until the test releases it (to fork a run that is still running).

BLOCK_ENTERED = threading.Event()
BLOCK_RELEASE = threading.Event()


@action(reads=["total"], writes=["held"])
def hold(state: State) -> State:
    BLOCK_ENTERED.set()
    BLOCK_RELEASE.wait()
    return state.update(held=state["total"])


blocking = _linear("blocking", "tests.pipelines:blocking", prepare=prepare, hold=hold)


# Tool-cache probes: argument spelling, argument order, and two tools with one body.

TOOL_CALLS: list[tuple[str, Any]] = []


@tool("t_sub")
def t_sub(a: int, b: int) -> int:
    TOOL_CALLS.append(("t_sub", (a, b)))
    return a - b


@tool("t_first")
def t_first(items: list[int]) -> int:
    TOOL_CALLS.append(("t_first", list(items)))
    return items[0]


@tool("t_double_a")
def t_double_a(n: int) -> int:
    TOOL_CALLS.append(("t_double_a", n))
    return n * 2


@tool("t_double_b")
def t_double_b(n: int) -> int:
    TOOL_CALLS.append(("t_double_b", n))
    return n * 2


@action(reads=[], writes=["kw", "pair", "twins"])
def probe(state: State) -> State:
    kw = [t_sub(a=5, b=3), t_sub(b=3, a=5)]
    pair = [t_first([7, 9]), t_first([9, 7])]
    twins = [t_double_a(4), t_double_b(4)]
    return state.update(kw=kw, pair=pair, twins=twins)


probes = _linear("probes", "tests.pipelines:probes", probe=probe)


# An LLM pipeline: ``ask`` calls the model through the LLM cache, ``shout`` only computes.

RAW_RESPONSES: list[bytes] = []


@action(reads=["question"], writes=["answer", "finish_reason"])
def ask(state: State) -> State:
    response = chat(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": state["question"]},
        ],
        temperature=rewind.param("temperature", 0.0),
        max_tokens=rewind.param("max_tokens", 32),
    )
    RAW_RESPONSES.append(response.raw)
    return state.update(answer=response.content, finish_reason=response.finish_reason)


@action(reads=["answer"], writes=["loud"])
def shout(state: State) -> State:
    return state.update(loud=state["answer"].upper())


llm_pipeline = _linear("llm", "tests.pipelines:llm_pipeline", ask=ask, shout=shout)


@action(reads=["question"], writes=["answer", "finish_reason"])
def ask_again(state: State) -> State:
    """``ask``, asking once more when the endpoint dropped the first request (the node
    catches the failure: it succeeds)."""
    messages = [{"role": "user", "content": state["question"]}]
    try:
        response = chat(messages, temperature=0.0)
    except EndpointUnavailable:
        response = chat(messages, temperature=0.0)
    return state.update(answer=response.content, finish_reason=response.finish_reason)


retrying_llm_pipeline = _linear(
    "retrying-llm", "tests.pipelines:retrying_llm_pipeline", ask_again=ask_again, shout=shout
)


# -- side effects, determinism flags and the effect audit (tests/test_effects.py, test_audit.py) --
# Every side-effecting tool below declares the resources it touches, so Rewind fingerprints them
# before and after each call. ``EFFECT_CALLS`` logs real executions (a served or dry-run call
# never appears there).

EFFECT_CALLS: list[tuple[str, Any]] = []


def _append_resources(path: str, line: str) -> list[FileTree]:
    return [FileTree(path)]


@tool("fx_append_line", determinism="side-effect", resources=_append_resources)
def fx_append_line(path: str, line: str) -> dict[str, Any]:
    """Append one line to a text file; the receipt says nothing about the file's content."""
    EFFECT_CALLS.append(("fx_append_line", line))
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    return {"status": "ok", "path": path}


@action(reads=["text"], writes=["line"])
def fx_prep(state: State) -> State:
    return state.update(line=state["text"] + rewind.param("suffix", ""))


@action(reads=["line", "path"], writes=["receipt"])
def fx_write(state: State) -> State:
    return state.update(receipt=fx_append_line(state["path"], state["line"]))


@action(reads=["receipt"], writes=["summary"])
def fx_after(state: State) -> State:
    # A dry-run of a call with new arguments returns {"dry_run": true, ...}: no status.
    return state.update(summary=f"write {state['receipt'].get('status', 'not executed')}")


@action(reads=["line"], writes=["echo"])
def fx_tail(state: State) -> State:
    return state.update(echo=state["line"].upper())


@action(reads=["summary", "echo"], writes=["done"])
def fx_final(state: State) -> State:
    return state.update(done=f"{state['summary']} / {state['echo']}")


# prep → write (side effect on the file at ``path``) → after (reads the receipt) → tail (does not
# depend on the write) → final (depends on it through ``after``).
effects_pipeline = _linear(
    "effects",
    "tests.pipelines:effects_pipeline",
    prep=fx_prep,
    write=fx_write,
    after=fx_after,
    tail=fx_tail,
    final=fx_final,
)


# A tool that writes one note into a folder the user owns (issue 12: restore must keep files the
# tool never wrote, unless the user asks for replace).


def _folder_resources(folder: str, name: str, text: str) -> list[FileTree]:
    return [FileTree(folder)]


NOTE_WRITERS = {"now": 0, "max": 0}
"""How many fx_write_note calls are inside the tool at once (now) and at most (max)."""
_NOTE_LOCK = threading.Lock()


@tool("fx_write_note", determinism="side-effect", resources=_folder_resources)
def fx_write_note(folder: str, name: str, text: str) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_write_note", (name, text)))
    with _NOTE_LOCK:
        NOTE_WRITERS["now"] += 1
        NOTE_WRITERS["max"] = max(NOTE_WRITERS["max"], NOTE_WRITERS["now"])
    try:
        threading.Event().wait(0.05)  # a slow write: concurrent writers would overlap here
        (Path(folder) / name).write_text(text + "\n", encoding="utf-8")
    finally:
        with _NOTE_LOCK:
            NOTE_WRITERS["now"] -= 1
    return {"status": "ok"}


@action(reads=["folder", "text"], writes=["receipt"])
def fx_note(state: State) -> State:
    name = rewind.param("name", "note.txt")
    text = state["text"] + rewind.param("suffix", "")
    return state.update(receipt=fx_write_note(state["folder"], name, text))


folder_pipeline = _linear("folder", "tests.pipelines:folder_pipeline", note=fx_note)


# Several side-effecting calls in one node (issue 12: a fork that re-executes 1 of the
# parent's 3 calls must not pass the audit).


@action(reads=["path"], writes=["receipts"])
def fx_append_many(state: State) -> State:
    times = rewind.param("times", 3)
    return state.update(receipts=[fx_append_line(state["path"], f"line {i}") for i in range(times)])


repeat_pipeline = _linear("repeat", "tests.pipelines:repeat_pipeline", many=fx_append_many)

# A tool that always leaves the same file content but answers something new every time
# (issue 12: the audit compares (output, post-state) pairs and says which half differs).

STAMPS = itertools.count(1)


def _stamp_resources(path: str) -> list[FileTree]:
    return [FileTree(path)]


@tool("fx_stamp", determinism="side-effect", resources=_stamp_resources)
def fx_stamp(path: str) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_stamp", path))
    Path(path).write_text("stamped\n", encoding="utf-8")
    return {"ticket": next(STAMPS)}


@action(reads=["path"], writes=["ticket"])
def fx_stamp_node(state: State) -> State:
    return state.update(ticket=fx_stamp(state["path"]))


stamp_pipeline = _linear("stamp", "tests.pipelines:stamp_pipeline", stamp=fx_stamp_node)


@action(reads=["path"], writes=["receipts"])
def fx_double(state: State) -> State:
    first = fx_append_line(state["path"], "first")
    second = fx_append_line(state["path"], "second")
    return state.update(receipts=[first, second])


# One node writing the same file twice (the audit compares the first write with what the second
# call observed, and only the last write with the world as it is now).
twice_pipeline = _linear("twice", "tests.pipelines:twice_pipeline", double=fx_double)


# Seed 004, first class: ``write_config`` merges the defaults file (not a declared resource: it
# is only read) and the existing config into the config file, and returns a receipt that is
# invariant to the file's content.


def _config_resources(path: str, defaults_path: str, settings: dict[str, Any]) -> list[FileTree]:
    return [FileTree(path)]


@tool("fx_write_config", determinism="side-effect", resources=_config_resources)
def fx_write_config(path: str, defaults_path: str, settings: dict[str, Any]) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_write_config", settings))
    merged: dict[str, Any] = {}
    for source in (defaults_path, path):
        with contextlib.suppress(FileNotFoundError):
            merged.update(json.loads(Path(source).read_text(encoding="utf-8")))
    merged.update(settings)
    Path(path).write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return {"status": "ok", "path": path}


@action(reads=["config_path", "defaults_path"], writes=["receipt"])
def fx_configure(state: State) -> State:
    settings = {"limit": rewind.param("limit", 5)}
    receipt = fx_write_config(state["config_path"], state["defaults_path"], settings)
    return state.update(receipt=receipt)


@action(reads=["receipt"], writes=["said"])
def fx_report(state: State) -> State:
    return state.update(said=f"config {state['receipt']['status']}")


config_pipeline = _linear(
    "config", "tests.pipelines:config_pipeline", configure=fx_configure, report=fx_report
)


# Seed 004, second class: a SQLite table whose epoch (``meta.version``) is part of its state.

LIMITS_EPOCH_SQL = "SELECT version FROM meta"


def _limit_resources(db: str, key: str, value: int) -> list[SQLiteTable]:
    return [SQLiteTable(db, "limits", order_by="key", epoch_sql=LIMITS_EPOCH_SQL)]


def create_limits_db(db: str | Path, version: int = 1) -> None:
    """A database with an empty ``limits`` table and ``meta.version`` = ``version``."""
    con = sqlite3.connect(db)
    with con:
        con.execute("CREATE TABLE limits (key TEXT PRIMARY KEY, value INTEGER)")
        con.execute("CREATE TABLE meta (version INTEGER)")
        con.execute("INSERT INTO meta VALUES (?)", (version,))
    con.close()


@tool("fx_upsert_limit", determinism="side-effect", resources=_limit_resources)
def fx_upsert_limit(db: str, key: str, value: int) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_upsert_limit", (key, value)))
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT OR REPLACE INTO limits VALUES (?, ?)", (key, value))
    con.close()
    return {"status": "ok"}


@action(reads=["db"], writes=["receipt"])
def fx_store_limit(state: State) -> State:
    return state.update(receipt=fx_upsert_limit(state["db"], "rate", rewind.param("value", 5)))


@action(reads=["receipt"], writes=["confirmed"])
def fx_confirm(state: State) -> State:
    return state.update(confirmed=state["receipt"]["status"] == "ok")


limits_pipeline = _linear(
    "limits", "tests.pipelines:limits_pipeline", store_limit=fx_store_limit, confirm=fx_confirm
)


# Seed 004, third class: a tool with its own idempotency cache keyed on the idempotency key. The
# salted variant passes ``rewind.idempotency_key(base)``; the unsalted one passes the base, as a
# tool keyed on (session, turn) would.

IDEMPOTENCY_CACHE: dict[str, dict[str, Any]] = {}
KEYS_SEEN: list[str] = []


def _ledger_resources(ledger: str, account: str, amount: int, key: str | None) -> list[FileTree]:
    return [FileTree(ledger)]


@tool("fx_charge", determinism="side-effect", resources=_ledger_resources, idempotency_arg="key")
def fx_charge(ledger: str, account: str, amount: int, key: str | None) -> dict[str, Any]:
    KEYS_SEEN.append(str(key))
    if key is not None and key in IDEMPOTENCY_CACHE:
        return IDEMPOTENCY_CACHE[key]  # the cached original: nothing is executed
    EFFECT_CALLS.append(("fx_charge", (account, amount)))
    with open(ledger, "a", encoding="utf-8") as fh:
        fh.write(f"{account} {amount}\n")
    result = {"status": "charged", "account": account, "amount": amount}
    if key is not None:
        IDEMPOTENCY_CACHE[key] = result
    return result


@action(reads=["ledger", "account"], writes=["receipt"])
def fx_charge_salted(state: State) -> State:
    key = idempotency_key(f"{state['account']}:turn-1")
    return state.update(receipt=fx_charge(state["ledger"], state["account"], 10, key))


@action(reads=["ledger", "account"], writes=["receipt"])
def fx_charge_unsalted(state: State) -> State:
    key = f"{state['account']}:turn-1"
    return state.update(receipt=fx_charge(state["ledger"], state["account"], 10, key))


@action(reads=["receipt"], writes=["notice"])
def fx_notice(state: State) -> State:
    return state.update(notice=f"{state['receipt']['status']} {state['receipt']['amount']}")


ledger_salted = _linear(
    "ledger_salted", "tests.pipelines:ledger_salted", charge=fx_charge_salted, notice=fx_notice
)
ledger_unsalted = _linear(
    "ledger_unsalted",
    "tests.pipelines:ledger_unsalted",
    charge=fx_charge_unsalted,
    notice=fx_notice,
)


# A side-effecting tool that declares no resources: nothing can be fingerprinted.


@tool("fx_notify", determinism="side-effect")
def fx_notify(message: str) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_notify", message))
    return {"sent": True}


@action(reads=["message"], writes=["sent"])
def fx_ping(state: State) -> State:
    return state.update(sent=fx_notify(state["message"]))


notify_pipeline = _linear("notify", "tests.pipelines:notify_pipeline", ping=fx_ping)


# A time-bound lookup: its entries expire after ``LOOKUP_TTL_S`` seconds, whatever its input.

LOOKUP_TTL_S = 60.0


@tool("fx_lookup", determinism="time-bound", ttl_s=LOOKUP_TTL_S)
def fx_lookup(query: Any) -> dict[str, Any]:
    EFFECT_CALLS.append(("fx_lookup", query))
    return {"query": query, "answer": len(json.dumps(query, sort_keys=True))}


@action(reads=["query"], writes=["found"])
def fx_look(state: State) -> State:
    query = state["query"]
    suffix = rewind.param("suffix", "")
    if suffix:
        query = f"{query}{suffix}"
    return state.update(found=fx_lookup(query))


@action(reads=["found"], writes=["size"])
def fx_use(state: State) -> State:
    return state.update(size=state["found"]["answer"])


ttl_pipeline = _linear("ttl", "tests.pipelines:ttl_pipeline", look=fx_look, use=fx_use)


# ``nap`` naps (until the test interrupts it) once each time the test arms it.
NAP_ARMED = threading.Event()
NAP_ENTERED = threading.Event()


@action(reads=["x"], writes=["y"])
def nap(state: State) -> State:
    import time as _time

    if NAP_ARMED.is_set():
        NAP_ARMED.clear()
        NAP_ENTERED.set()
        # Short sleeps, not one of 60 s: Python handles a signal between bytecodes, so Ctrl-C
        # ends the nap within 0.1 s even when the signal did not interrupt the sleep call itself
        # (in some full-suite runs one 60 s sleep ran to its end: the test took 60 s).
        for _ in range(600):
            _time.sleep(0.1)
    return state.update(y=t_add(state["x"], 1))


sleepy = Pipeline(
    name="sleepy",
    graph=GraphBuilder().with_actions(nap=nap).build(),
    entrypoint="nap",
    ref="tests.pipelines:sleepy",
)


# -- what-if grid and hash-stability pipelines -------------------------------------------------
# ``frame (tool) → draft (llm) → gist (tool) → review (llm) → publish_note (side-effect)``.
# ``gist`` keeps only the draft's "tone" (the temperature the fake model echoes, bucketed), so
# variants with different drafts can share one ``review`` input: the grid must run it once.

import re  # noqa: E402

from rewind.artifacts import publish as _publish_artifact  # noqa: E402


@tool("t_frame")
def t_frame(question: str, style: str) -> str:
    return f"[{style}] {question}"


@tool("t_gist")
def t_gist(draft: str) -> dict[str, Any]:
    match = re.search(r"at t=([0-9.]+)", draft)
    temperature = float(match.group(1)) if match else 0.0
    return {"tone": "warm" if temperature >= 0.5 else "cool"}


def _say(content: str) -> str:
    response = chat(
        [{"role": "user", "content": content}],
        temperature=rewind.param("temperature", 0.0),
        max_tokens=rewind.param("max_tokens", 32),
    )
    return response.content


@action(reads=["question"], writes=["prompt"])
def frame(state: State) -> State:
    return state.update(prompt=t_frame(state["question"], rewind.param("style", "plain")))


@action(reads=["prompt"], writes=["draft"])
def draft(state: State) -> State:
    return state.update(draft=_say(state["prompt"]))


@action(reads=["draft"], writes=["gist"])
def gist(state: State) -> State:
    return state.update(gist=t_gist(state["draft"]))


@action(reads=["gist"], writes=["review"])
def review(state: State) -> State:
    return state.update(review=_say(f"Review a {state['gist']['tone']} draft."))


@action(reads=["draft", "review"], writes=["note"])
def publish_note(state: State) -> State:
    note = _publish_artifact("note.md", f"{state['draft']}\n\n{state['review']}\n")
    return state.update(note=note)


grid_pipeline = _linear(
    "grid",
    "tests.pipelines:grid_pipeline",
    frame=frame,
    draft=draft,
    gist=gist,
    review=review,
    publish_note=publish_note,
)


# A pipeline with two branches, a join, a loop back and long node names (the UI's graph test):
# round 0 takes the season branch, round 1 the month branch, then the review publishes.

LOAD_RECORDS = "load_the_quarterly_rainfall_records_from_every_weather_station"
DECIDE_GROUPING = "decide_how_to_group_the_rainfall_for_this_round"
BY_SEASON = "summarise_rainfall_by_season_for_the_regional_report"
BY_MONTH = "summarise_rainfall_by_month_with_anomaly_detection"
MERGE_DRAFT = "merge_both_summaries_and_draft_the_narrative"
REVIEW_STYLE = "review_the_draft_against_the_house_style_guide"
PUBLISH_REPORT = "publish"


@action(reads=["stations"], writes=["records", "rounds"])
def load_records(state: State) -> State:
    records = [{"station": s, "mm": 10 * i} for i, s in enumerate(state["stations"])]
    return state.update(records=records, rounds=0)


@action(reads=["rounds"], writes=["grouping"])
def decide_grouping(state: State) -> State:
    return state.update(grouping="season" if state["rounds"] % 2 == 0 else "month")


@action(reads=["records"], writes=["summary"])
def by_season(state: State) -> State:
    return state.update(summary={"by": "season", "mm": sum(r["mm"] for r in state["records"])})


@action(reads=["records"], writes=["summary"])
def by_month(state: State) -> State:
    return state.update(summary={"by": "month", "mm": sum(r["mm"] for r in state["records"])})


@action(reads=["summary", "rounds"], writes=["draft"])
def merge_draft(state: State) -> State:
    summary = state["summary"]
    return state.update(draft=f"Round {state['rounds']}: {summary['mm']} mm by {summary['by']}.")


@action(reads=["rounds"], writes=["rounds"])
def review_style(state: State) -> State:
    return state.update(rounds=state["rounds"] + 1)


@action(reads=["draft"], writes=["report"])
def publish_report(state: State) -> State:
    return state.update(report=state["draft"])


branching = Pipeline(
    name="branching",
    graph=GraphBuilder()
    .with_actions(
        **{
            LOAD_RECORDS: load_records,
            DECIDE_GROUPING: decide_grouping,
            BY_SEASON: by_season,
            BY_MONTH: by_month,
            MERGE_DRAFT: merge_draft,
            REVIEW_STYLE: review_style,
            PUBLISH_REPORT: publish_report,
        }
    )
    .with_transitions(
        (LOAD_RECORDS, DECIDE_GROUPING, default),
        (DECIDE_GROUPING, BY_SEASON, expr("grouping == 'season'")),
        (DECIDE_GROUPING, BY_MONTH, default),
        (BY_SEASON, MERGE_DRAFT, default),
        (BY_MONTH, MERGE_DRAFT, default),
        (MERGE_DRAFT, REVIEW_STYLE, default),
        (REVIEW_STYLE, DECIDE_GROUPING, expr("rounds < 2")),
        (REVIEW_STYLE, PUBLISH_REPORT, default),
    )
    .build(),
    entrypoint=LOAD_RECORDS,
    ref="tests.pipelines:branching",
)


# A loop that runs its node ``laps`` times (a run with many node executions, for the UI's lists).


@action(reads=["lap", "laps"], writes=["lap"])
def lap(state: State) -> State:
    return state.update(lap=state["lap"] + 1)


@action(reads=["lap"], writes=["done"])
def finish_laps(state: State) -> State:
    return state.update(done=state["lap"])


laps = Pipeline(
    name="laps",
    graph=GraphBuilder()
    .with_actions(lap=lap, finish_laps=finish_laps)
    .with_transitions(("lap", "lap", expr("lap < laps")), ("lap", "finish_laps", default))
    .build(),
    entrypoint="lap",
    ref="tests.pipelines:laps",
)
