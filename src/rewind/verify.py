"""``rewind verify``: fifteen checks that prove the demo's claims on a real run (the 14 of the
core, plus the effect audit).

Each check returns PASS/FAIL with the numbers it looked at. The checks re-derive their facts from
the store, the artifact files and the CSV rather than trusting what the engine reported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewind.canonical import sha256_hex
from rewind.demo import FORK_NUMBER, DemoResult
from rewind.examples import weather
from rewind.replay import Rewind
from rewind.store import NodeRecord

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Check:
    """One verification check: number (1-14), what it claims, whether it held, the evidence."""

    number: int
    claim: str
    passed: bool
    detail: str


def run_checks(rw: Rewind, demo: DemoResult, store_location: str) -> list[Check]:
    """Run the 15 checks against a finished demo (the audit check last: it tampers with the
    parent's artifact and restores it).

    Args:
        rw: the session whose store holds the demo's runs.
        demo: what :func:`rewind.demo.run_demo` returned.
        store_location: the store's location, reopened by a fresh Python process for check 14.
    """
    parent, fork, replay = demo.parent, demo.fork, demo.replay
    pn = rw.store.nodes_of(parent.run_id)
    fn = rw.store.nodes_of(fork.run_id)
    rn = rw.store.nodes_of(replay.run_id)
    k = FORK_NUMBER - 1
    checks: list[Check] = []

    def add(claim: str, fn_: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = fn_()
        except Exception as exc:  # a check that crashes is a failed check, with the reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        checks.append(Check(len(checks) + 1, claim, ok, detail))

    def c1() -> tuple[bool, str]:
        hashed = sum(
            1 for n in pn if _HEX64.match(n.input_hash) and _HEX64.match(n.output_hash or "")
        )
        return len(pn) == 8 and hashed == 8, f"{len(pn)} nodes, {hashed} with input+output sha256"

    def c2() -> tuple[bool, str]:
        art = _artifact(rw, parent.run_id)
        recorded = rw.node_output(pn[-1])["report"]["sha256"]
        on_disk = sha256_hex(art.read_bytes()) if art.exists() else "missing"
        return on_disk == recorded, f"file {on_disk[:12]} vs recorded {recorded[:12]}"

    def c3() -> tuple[bool, str]:
        llm_nodes = [n for n in pn if any(c.kind == "llm" for c in n.calls)]
        llm_sum = sum(n.tokens for n in llm_nodes)
        run = rw.store.get_run(parent.run_id)
        ok = run.tokens > 0 and run.tokens == llm_sum and len(llm_nodes) == 4
        return ok, f"run {run.tokens} tokens = {llm_sum} over {len(llm_nodes)} LLM nodes"

    def c4() -> tuple[bool, str]:
        inherited = [n for n in fn[:k] if n.inherited and n.cache_outcome == "inherited"]
        same = all(a.output_hash == b.output_hash for a, b in zip(pn[:k], fn[:k], strict=True))
        spent = sum(n.tokens for n in fn[:k])
        ok = len(inherited) == k and same and spent == 0
        return ok, f"{len(inherited)}/{k} inherited, hashes equal={same}, tokens {spent}"

    def c5() -> tuple[bool, str]:
        executed = [n for n in fn if not n.inherited]
        ok = len(executed) >= 3 and executed[0].position == k and executed[0].name == pn[k].name
        return (
            ok,
            f"{len(executed)} nodes executed from #{executed[0].position + 1} {executed[0].name}",
        )

    def c6() -> tuple[bool, str]:
        first = demo.diff.first_divergence
        if first is None or first.a is None or first.b is None:
            return False, "no divergence found"
        a_out, b_out = rw.node_output(pn[k]), rw.node_output(fn[k])
        paths = [c.path for c in first.changes]
        exact = all(
            _resolve(a_out, c.old_path or c.path, c.old) and _resolve(b_out, c.path, c.new)
            for c in first.changes
            if c.kind in ("changed", "type_changed")
        )
        ok = first.a.position == k and bool(paths) and exact
        shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3})" if len(paths) > 3 else "")
        return ok, f"first divergence #{first.a.position + 1} {first.name}: {shown}"

    def c7() -> tuple[bool, str]:
        a = sha256_hex(_artifact(rw, parent.run_id).read_bytes())
        b = sha256_hex(_artifact(rw, fork.run_id).read_bytes())
        return a != b, f"parent {a[:12]} vs fork {b[:12]}"

    def c8() -> tuple[bool, str]:
        executed = [n for n in rn if not n.inherited]
        calls = [c for n in executed for c in n.calls]
        hits = [c for c in calls if c.outcome == "hit"]
        served = [c for c in calls if c.outcome == "served"]
        node_hits = [n for n in executed if n.cache_outcome == "hit"]
        ok = (
            bool(executed)
            and len(node_hits) == len(executed)
            and len(hits) + len(served) == len(calls)
            and all(c.determinism == "side-effect" for c in served)
        )
        return ok, (
            f"{len(node_hits)}/{len(executed)} nodes hit; {len(hits)} calls hit, "
            f"{len(served)} side effect served from record"
        )

    def c9() -> tuple[bool, str]:
        run = rw.store.get_run(replay.run_id)
        return run.tokens == 0, f"{run.tokens} tokens"

    def c10() -> tuple[bool, str]:
        pairs = list(zip(pn, rn, strict=False))
        equal = sum(1 for a, b in pairs if a.output_hash == b.output_hash and a.name == b.name)
        return len(rn) == len(pn) and equal == len(pn), f"{equal}/{len(pn)} output hashes equal"

    def c11() -> tuple[bool, str]:
        a = _artifact(rw, parent.run_id).read_bytes()
        b = _artifact(rw, replay.run_id).read_bytes()
        return a == b, f"{len(a)} vs {len(b)} bytes, identical={a == b}"

    def c12() -> tuple[bool, str]:
        now = tuple(rw.store.nodes_of(parent.run_id))
        same = now == demo.parent_rows_before
        run = rw.store.get_run(parent.run_id)
        ok = same and run.status == demo.parent.status and run.tokens == demo.parent.tokens
        return (
            ok,
            f"{len(now)} rows identical={same} after {len(rw.store.children(run.run_id))} forks",
        )

    def c13() -> tuple[bool, str]:
        return _check_table_and_numbers(rw, pn)

    def c14() -> tuple[bool, str]:
        return _replay_in_fresh_process(store_location, parent.run_id, len(pn) - k)

    def c15() -> tuple[bool, str]:
        from rewind.audit import verify_effects_check

        return verify_effects_check(rw, demo)

    for claim, fn_ in [
        ("parent records all 8 nodes with input and output sha256", c1),
        ("artifact file exists; its sha256 equals the recorded publish hash", c2),
        ("parent tokens > 0 and equal the sum over its LLM nodes", c3),
        ("fork at node 3 inherits nodes 1-2 (not executed, equal hashes)", c4),
        ("fork executes from node 3 on (>= 3 nodes)", c5),
        ("diff: first divergence is node 3, naming the exact changed field paths", c6),
        ("forked artifact hash differs from the parent's", c7),
        ("unchanged replay from node 3 is 100% cache hits", c8),
        ("unchanged replay spends 0 tokens", c9),
        ("unchanged replay: every node output hash equals the parent's", c10),
        ("unchanged replay artifact is byte-identical to the parent's", c11),
        ("parent rows and hashes unchanged after both forks", c12),
        ("artifact table agrees with the CSV; every unsupported prose number listed", c13),
        ("unchanged replay in a fresh process on the reopened store: 100% hits, 0 tokens", c14),
        (
            "effect audit: replay's publish not-re-executed, parent and fork faithful to their "
            "folders, fork divergent from parent, tampered artifact divergent",
            c15,
        ),
    ]:
        add(claim, fn_)
    return checks


def _artifact(rw: Rewind, run_id: str) -> Path:
    arts = rw.store.artifacts_of(run_id)
    if not arts:
        raise FileNotFoundError(f"run {run_id[:12]} has no artifact")
    path: Path = arts[0]["path"]
    return path


def _resolve(value: Any, path: str, expected: Any) -> bool:
    """Follow a diff path like ``table[3].mean`` or ``['odd key']`` and compare with expected."""
    for token in re.findall(r"\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|\.?([^.\[]+)", path):
        index, quoted, plain = token
        if index:
            value = value[int(index)]
        else:
            key = quoted.replace("\\'", "'").replace("\\\\", "\\") if quoted else plain
            value = value[key]
    return bool(value == expected and type(value) is type(expected))


def _check_table_and_numbers(rw: Rewind, nodes: list[NodeRecord]) -> tuple[bool, str]:
    by_name = {n.name: rw.node_output(n) for n in nodes}
    analysis, check = by_name["analyse"]["analysis"], by_name["verify"]["check"]
    prose = by_name["compose"]["prose"]
    state = rw.node_state(nodes[0])
    # An independent recomputation here, with pandas directly on the CSV file.
    frame = weather.load_table(state["csv_path"])
    expected = _recompute(frame, analysis)
    table = {row["group"]: row for row in analysis["table"]}
    tolerance = 0.6 * 10 ** -int(analysis.get("decimals", 2))
    bad = [
        g for g, v in expected.items() if g not in table or abs(table[g]["value"] - v) > tolerance
    ]
    report = _artifact(rw, nodes[0].run_id).read_text(encoding="utf-8")
    decimals = int(analysis.get("decimals", 2))
    in_report = all(f"{row['value']:.{decimals}f}" in report for row in analysis["table"])
    numbers = weather.numbers_in_text(prose)
    listed = {u["text"] for u in check["unsupported_numbers"]}
    supported = {s["text"] for s in check["supported_numbers"]}
    unclassified = [n["text"] for n in numbers if n["text"] not in listed | supported]
    listed_in_report = all(u in report for u in listed)
    ok = (
        not bad
        and len(expected) == len(table)
        and in_report
        and check["table_matches"]
        and not unclassified
        and check["numbers_checked"] == len(numbers)
        and listed_in_report
    )
    detail = (
        f"{len(table)} groups, {len(bad)} mismatches vs pandas; prose numbers {len(numbers)}: "
        f"{len(listed)} unsupported listed ({', '.join(sorted(listed)[:4]) or 'none'})"
    )
    return ok, detail


def _recompute(frame: Any, analysis: dict[str, Any]) -> dict[str, float]:
    import pandas as pd

    metric, group_by, agg = analysis["metric"], analysis["group_by"], analysis["aggregate"]
    dates = pd.to_datetime(frame["date"]) if "date" in frame else None
    if group_by == "month" and dates is not None:
        keys = dates.dt.month.map(lambda m: weather.MONTHS[m - 1])
    elif group_by == "year" and dates is not None:
        keys = dates.dt.year.astype(str)
    elif group_by == "weekday" and dates is not None:
        keys = dates.dt.dayofweek.map(lambda d: weather.WEEKDAYS[d])
    elif group_by == "season" and dates is not None:
        # Meteorological seasons: Winter = Dec-Feb, Spring = Mar-May, ...
        keys = dates.dt.month.map(lambda m: weather.SEASONS[(m % 12) // 3])
    else:
        keys = frame[group_by].astype(str)
    series = frame[metric].groupby(keys).agg(agg)
    return {str(g): float(v) for g, v in series.dropna().items()}


def _replay_in_fresh_process(store: str, run_id: str, expected_nodes: int) -> tuple[bool, str]:
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "rewind", "--store", store, "fork", run_id, "--at", "3", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        return False, f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    out = json.loads(proc.stdout)
    nodes = [n for n in out["nodes"] if not n["inherited"]]
    hits = sum(1 for n in nodes if n["cache_outcome"] == "hit")
    ok = hits == len(nodes) == expected_nodes and out["run"]["tokens"] == 0
    return (
        ok,
        f"fresh process: {hits}/{len(nodes)} hits, {out['run']['tokens']} tokens",
    )
