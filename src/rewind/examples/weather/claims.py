"""Numbers in prose and the check of a report's claims against the data (see
:mod:`rewind.examples.weather`)."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rewind.examples.weather.analysis import (
    _check_aggregate,
    _check_group_by,
    _check_metric,
    _decimals,
    _round,
)
from rewind.examples.weather.table import (
    _EPS,
    DATE_GROUP_BYS,
    MONTHS,
    SEASONS,
    WEEKDAYS,
    DataError,
    _read,
    _Table,
)

# --------------------------------------------------------------------------------------------
# numbers in prose

_NUMBER_RE = re.compile(
    r"(?<![\w.])"
    r"(?P<sign>[-+\u2212](?=\d))?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?P<frac>\.\d+)?"
    r"(?P<pct>\s?%|\s(?:percent|per cent)\b)?"
)
_ORDINAL_RE = re.compile(r"(?:st|nd|rd|th)\b", re.IGNORECASE)
_DATE_RE = re.compile(r"(?<![\w.])(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?!\d)")
_CONTEXT = 40


def _wordish(char: str) -> bool:
    return char.isalpha() or char == "_"


def _context(text: str, start: int, end: int) -> str:
    left = max(0, start - _CONTEXT)
    right = min(len(text), end + _CONTEXT)
    snippet = " ".join(text[left:right].split())
    return ("…" if left > 0 else "") + snippet + ("…" if right < len(text) else "")


def numbers_in_text(text: str) -> list[dict[str, Any]]:
    """Every number stated in prose, in order of appearance.

    Recognised: integers and decimals (``12``, ``12.5``), thousands separators (``1,234.5``),
    signs (``-3``, ``+2``, ``−3`` with U+2212) when the sign is not glued to a preceding word,
    percentages (``45%``, ``45 %``, ``45 percent``), numbers glued to a following unit
    (``5.3mm``, ``3x``), both ends of ranges (``2012–2015``, ``2012-2015``: a hyphen between two
    numbers is not a minus sign).

    Skipped on purpose: numbers inside or right after a word (``SmolLM2``, ``Q4_1``, ``v1.2``,
    ``COVID-19``, ``GPT-4``), ordinals (``1st``, ``2nd``, ``23rd``: ranks, not data), the month
    and day of a ``YYYY-MM-DD`` or ``YYYY/MM/DD`` date (the year is kept, so an out-of-range
    date is still caught), scientific notation, and decimals without a leading digit (``.5``).

    Args:
        text: the prose.

    Returns:
        ``[{"text": the number as written (sign and % included), "value": int | float (a
        percentage is its number: ``45%`` → 45), "decimals": digits after the point,
        "percent": bool, "start": character offset of the number, "context": the number with
        up to 40 characters either side, whitespace collapsed}]``.
    """
    if not isinstance(text, str):
        return []
    in_dates: set[int] = set()
    for date in _DATE_RE.finditer(text):
        in_dates.update(range(date.start(2), date.end()))
    found = []
    for match in _NUMBER_RE.finditer(text):
        start, end = match.start(), match.end()
        if match.start("int") in in_dates:
            continue
        glued = start >= 2 and text[start - 1] in "-\u2212/" and _wordish(text[start - 2])
        if match.group("sign") is None and glued:
            continue  # COVID-19, GPT-4
        if not match.group("pct") and _ORDINAL_RE.match(
            text, match.end("frac") if match.group("frac") else match.end("int")
        ):
            continue
        digits = match.group("int").replace(",", "")
        frac = match.group("frac") or ""
        negative = match.group("sign") in ("-", "\u2212")
        decimals = len(frac) - 1 if frac else 0
        value: int | float = float(digits + frac) if frac else int(digits)
        if negative:
            value = -value
        if isinstance(value, float):
            value += 0.0
        pct = match.group("pct")
        found.append(
            {
                "text": text[start:end].strip() if pct else text[start:end],
                "value": value,
                "decimals": decimals,
                "percent": bool(pct),
                "start": start,
                "context": _context(text, start, end),
            }
        )
    return found


# --------------------------------------------------------------------------------------------
# verify


def _recompute(table: _Table, metric: str, group_by: str, aggregate: str) -> list[dict[str, Any]]:
    """Grouped statistics in plain Python (fsum, statistics.median) from the parsed CSV.

    Deliberately shares no code with :func:`analyse`: no selection, no pandas groupby.
    Returns unrounded rows shaped like analyse's table, in natural order.
    """
    frame = table.frame
    date_names: dict[str, list[str]] = {
        "month": list(MONTHS),
        "season": list(SEASONS),
        "weekday": list(WEEKDAYS),
    }
    season_of_month = {12: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 2, 7: 2, 8: 2, 9: 3, 10: 3, 11: 3}
    buckets: dict[Any, list[float]] = {}
    keys = frame[table.date_column] if group_by in DATE_GROUP_BYS else frame[group_by]
    for key_cell, cell in zip(keys.tolist(), frame[metric].tolist(), strict=True):
        if cell is None or pd.isna(cell) or key_cell is None or pd.isna(key_cell):
            continue
        number = float(cell)
        if not math.isfinite(number):
            continue
        if group_by == "month":
            key: Any = key_cell.month - 1
        elif group_by == "season":
            key = season_of_month[key_cell.month]
        elif group_by == "weekday":
            key = key_cell.weekday()
        elif group_by == "year":
            key = key_cell.year
        else:
            key = str(key_cell)
        buckets.setdefault(key, []).append(number)
    rows = []
    for key in sorted(buckets):
        numbers = buckets[key]
        total = math.fsum(numbers)
        stats = {
            "sum": total,
            "mean": total / len(numbers),
            "median": statistics.median(numbers),
            "max": max(numbers),
            "min": min(numbers),
        }
        label = date_names[group_by][key] if group_by in date_names else str(key)
        rows.append(
            {
                "group": label,
                "value": stats[aggregate],
                "days": len(numbers),
                "mean": stats["mean"],
                "total": total,
            }
        )
    return rows


def _extremes(rows: list[dict[str, Any]]) -> tuple[int, int | None, int]:
    """Indices of the highest, second-highest (None with one row) and lowest value.

    Ties go to the row that comes first; written independently of analyse's ``_summary``.
    """
    top = runner = bottom = None
    for i, row in enumerate(rows):
        value = row["value"]
        if top is None or value > rows[top]["value"]:
            top, runner = i, top
        elif runner is None or value > rows[runner]["value"]:
            runner = i
        if bottom is None or value < rows[bottom]["value"]:
            bottom = i
    assert top is not None and bottom is not None
    return top, runner, bottom


def _close(claimed: Any, truth: float, decimals: int) -> bool:
    if not isinstance(claimed, int | float) or isinstance(claimed, bool):
        return False
    if not math.isfinite(float(claimed)):
        return False
    return abs(float(claimed) - truth) <= 0.5 * 10.0**-decimals + _EPS * max(1.0, abs(truth))


def _candidates(
    rows: list[dict[str, Any]], decimals: int, table: _Table
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(plain candidates, extra percentage candidates), each as (description, value)."""
    plain: list[tuple[str, float]] = []
    for row in rows:
        group = row["group"]
        plain.append((f"{group} value", row["value"]))
        plain.append((f"{group} mean", row["mean"]))
        plain.append((f"{group} total", row["total"]))
        plain.append((f"{group} days", float(row["days"])))
    # the table as displayed (rounded), so a number re-rounded from the table is supported
    for row in rows:
        for name in ("value", "mean", "total"):
            plain.append((f"{row['group']} {name} (as shown)", _round(row[name], decimals)))
    percents: list[tuple[str, float]] = []
    if rows:
        top_i, runner_i, bottom_i = _extremes(rows)
        top, bottom = rows[top_i], rows[bottom_i]
        if runner_i is not None:
            runner = rows[runner_i]
            diff = top["value"] - runner["value"]
            names = f"{top['group']} − {runner['group']}"
            plain.append((f"{names} (top − runner-up)", diff))
            plain.append((f"{names} (top − runner-up, as shown)", _round(diff, decimals)))
            if runner["value"] > 0:
                ratio = top["value"] / runner["value"]
                plain.append((f"{top['group']} / {runner['group']} (top / runner-up)", ratio))
                percents.append((f"{top['group']} above {runner['group']} in %", (ratio - 1) * 100))
            plain.append(
                (
                    f"{top['group']} − {bottom['group']} (top − bottom)",
                    top["value"] - bottom["value"],
                )
            )
        if bottom["value"] > 0:
            ratio = top["value"] / bottom["value"]
            names = f"{top['group']} / {bottom['group']}"
            plain.append((f"{names} (top / bottom)", ratio))
            plain.append((f"{names} (top / bottom, as shown)", _round(ratio, 2)))
            percents.append((f"{names} (top / bottom) in %", ratio * 100))
            percents.append((f"{top['group']} above {bottom['group']} in %", (ratio - 1) * 100))
        totals = [row["total"] for row in rows]
        grand = math.fsum(totals)
        if grand > 0 and all(t >= 0 for t in totals):
            for row in rows:
                share = row["total"] / grand * 100
                percents.append((f"{row['group']} share of the grand total in %", share))
    plain.append(("rows in the CSV", float(len(table.frame))))
    plain.append(("rows used", float(sum(row["days"] for row in rows))))
    plain.append(("number of groups", float(len(rows))))
    for row in rows:
        try:
            label_value = float(str(row["group"]).replace(",", ""))
        except ValueError:
            continue
        if math.isfinite(label_value):
            plain.append((f"group label {row['group']}", label_value))
    if table.date_column is not None:
        dates = table.frame[table.date_column].dropna()
        if len(dates):
            first, last = int(dates.min().year), int(dates.max().year)
            plain.append(("years covered", float(last - first + 1)))
    return plain, percents


def _year_range(table: _Table) -> tuple[int, int] | None:
    if table.date_column is None:
        return None
    dates = table.frame[table.date_column].dropna()
    if not len(dates):
        return None
    return int(dates.min().year), int(dates.max().year)


def verify(
    csv_path: str | Path, plan: dict[str, Any], analysis: dict[str, Any], prose: str
) -> dict[str, Any]:
    """Recompute the table from the CSV and check every number in the prose against the data.

    The file is re-read and the grouped statistics recomputed in plain Python (``math.fsum``,
    ``statistics.median``, ``datetime`` fields) straight from the parsed rows: only the CSV
    parser (:func:`load_table`) is shared with :func:`research`; nothing of the selection or of
    :func:`analyse`'s pandas groupby is reused. What is
    recomputed is the analysis' own ``metric``/``group_by``/``aggregate`` (a fork may override
    analyse's grouping without changing the plan); the plan only fills fields the analysis lacks.

    Table check: each recomputed group must appear in ``analysis["table"]`` with ``days`` equal
    and ``value``/``mean``/``total`` within half a unit of the last decimal (0.005 at 2 decimals;
    the precision is derived from the recomputed values, as :func:`analyse` does); a group
    missing from either side is a mismatch with field ``group``; ``top``, ``runner_up``,
    ``bottom``, ``top_minus_runner_up`` and ``top_over_bottom`` are checked too (reported with
    ``group`` None). ``table_matches`` is True only when there is no mismatch at all.

    A prose number is supported when, at its own displayed precision (``|x - v| <= 0.5 *
    10**-decimals`` plus a tiny epsilon), it equals: a recomputed group value/mean/total/days
    (raw or as shown in the table), top − runner-up, top − bottom, top/bottom or top/runner-up,
    the CSV's row count, the rows used, the number of groups, the number of years covered, a
    group label that is a number, or — for a whole number — a year within the data's range.
    A percentage may also equal top/bottom × 100, (top/bottom − 1) × 100, (top/runner-up − 1) ×
    100, or a group's share of the grand total (when totals are non-negative). Signs count.

    Args:
        csv_path: path of the CSV the analysis came from.
        plan: the normalised plan.
        analysis: the output of :func:`analyse` (possibly overridden by a fork).
        prose: the model-written text.

    Returns:
        ``{"table_matches": bool, "recomputed": [rows shaped like analysis["table"]],
        "mismatches": [{"group", "field", "analysis", "recomputed"}], "numbers_checked": int,
        "unsupported_numbers": [{"text", "value", "start", "context"}], "supported_numbers":
        [{"text", "value", "start", "matched": description of what it matched}]}``.

    Raises:
        DataError: unreadable CSV, or a metric/group_by/aggregate (from the analysis, else the
            plan) that this CSV does not allow.
    """
    table = _read(csv_path)
    analysis = analysis if isinstance(analysis, Mapping) else {}
    plan = plan if isinstance(plan, Mapping) else {}
    metric, group_by, aggregate = (
        _analysis_field(analysis, plan, name) for name in ("metric", "group_by", "aggregate")
    )
    _check_metric(table, metric)
    _check_group_by(table.group_bys, group_by, table.date_column is not None)
    _check_aggregate(aggregate)
    rows = _recompute(table, metric, group_by, aggregate)
    # precision from the recomputation, never from the analysis (a tampered "decimals" must not
    # loosen the check)
    decimals = _decimals(row["value"] for row in rows)
    mismatches = _table_mismatches(rows, analysis, decimals)
    recomputed = [
        {
            "group": row["group"],
            "value": _round(row["value"], decimals),
            "days": row["days"],
            "mean": _round(row["mean"], decimals),
            "total": _round(row["total"], decimals),
        }
        for row in rows
    ]
    if rows:
        mismatches += _extreme_mismatches(rows, recomputed, analysis, decimals)
    plain, percents = _candidates(rows, decimals, table)
    numbers = numbers_in_text(prose)
    supported, unsupported = _check_numbers(numbers, plain, percents, _year_range(table))
    return {
        "table_matches": not mismatches,
        "recomputed": recomputed,
        "mismatches": mismatches,
        "numbers_checked": len(numbers),
        "unsupported_numbers": unsupported,
        "supported_numbers": supported,
    }


def _analysis_field(analysis: Mapping[str, Any], plan: Mapping[str, Any], name: str) -> str:
    """The analysis' ``name`` (``metric``...), else the plan's (DataError when neither has it)."""
    value = analysis.get(name) or plan.get(name)
    if not isinstance(value, str) or not value:
        raise DataError(f"neither the analysis nor the plan names a '{name}'")
    return value


def _table_mismatches(
    rows: list[dict[str, Any]], analysis: Mapping[str, Any], decimals: int
) -> list[dict[str, Any]]:
    """Each group missing from either side, and each value/mean/total/days that differs."""
    mismatches: list[dict[str, Any]] = []
    given = analysis.get("table") if isinstance(analysis.get("table"), list) else []
    given_by_group: dict[str, Mapping[str, Any]] = {}
    for row in given:
        if isinstance(row, Mapping) and str(row.get("group")) not in given_by_group:
            given_by_group[str(row.get("group"))] = row
    recomputed_groups = {row["group"] for row in rows}
    for row in rows:
        theirs = given_by_group.get(row["group"])
        if theirs is None:
            mismatches.append(
                {
                    "group": row["group"],
                    "field": "group",
                    "analysis": None,
                    "recomputed": row["group"],
                }
            )
            continue
        mismatches += _row_mismatches(row, theirs, decimals)
    for group in given_by_group:
        if group not in recomputed_groups:
            mismatches.append(
                {"group": group, "field": "group", "analysis": group, "recomputed": None}
            )
    return mismatches


def _row_mismatches(
    row: Mapping[str, Any], theirs: Mapping[str, Any], decimals: int
) -> list[dict[str, Any]]:
    """The fields of one group's row the analysis got wrong."""
    out = []
    for name in ("value", "mean", "total"):
        if not _close(theirs.get(name), row[name], decimals):
            out.append(
                {
                    "group": row["group"],
                    "field": name,
                    "analysis": _jsonable(theirs.get(name)),
                    "recomputed": _round(row[name], decimals),
                }
            )
    if theirs.get("days") != row["days"] or isinstance(theirs.get("days"), bool):
        out.append(
            {
                "group": row["group"],
                "field": "days",
                "analysis": _jsonable(theirs.get("days")),
                "recomputed": row["days"],
            }
        )
    return out


def _extreme_mismatches(
    rows: list[dict[str, Any]],
    recomputed: list[dict[str, Any]],
    analysis: Mapping[str, Any],
    decimals: int,
) -> list[dict[str, Any]]:
    """Mismatches of ``top``, ``runner_up``, ``bottom``, ``top_minus_runner_up`` and
    ``top_over_bottom`` (``group`` None)."""
    mismatches: list[dict[str, Any]] = []
    top_i, runner_i, bottom_i = _extremes(rows)
    top, bottom = rows[top_i]["value"], rows[bottom_i]["value"]
    for name, index in (("top", top_i), ("runner_up", runner_i), ("bottom", bottom_i)):
        theirs = analysis.get(name)
        if index is None:
            ok, ours = theirs is None, None
        else:
            ours = {"group": recomputed[index]["group"], "value": recomputed[index]["value"]}
            ok = (
                isinstance(theirs, Mapping)
                and theirs.get("group") == ours["group"]
                and _close(theirs.get("value"), rows[index]["value"], decimals)
            )
        if not ok:
            mismatches.append(
                {"group": None, "field": name, "analysis": _jsonable(theirs), "recomputed": ours}
            )
    expected = {
        "top_minus_runner_up": (
            None if runner_i is None else top - rows[runner_i]["value"],
            decimals,
        ),
        "top_over_bottom": (top / bottom if bottom > 0 else None, 2),
    }
    for name in ("top_minus_runner_up", "top_over_bottom"):
        truth, places = expected[name]
        theirs = analysis.get(name)
        ok = (truth is None and theirs is None) or (
            truth is not None and _close(theirs, truth, places)
        )
        if not ok:
            mismatches.append(
                {
                    "group": None,
                    "field": name,
                    "analysis": _jsonable(theirs),
                    "recomputed": None if truth is None else _round(truth, places),
                }
            )
    return mismatches


def _check_numbers(
    numbers: list[dict[str, Any]],
    plain: list[tuple[str, float]],
    percents: list[tuple[str, float]],
    years: tuple[int, int] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(supported numbers with what they matched, unsupported numbers with their context)."""
    supported: list[dict[str, Any]] = []
    unsupported: list[dict[str, Any]] = []
    for number in numbers:
        value, places = number["value"], number["decimals"]
        pool = plain + percents if number["percent"] else plain
        matched = next((label for label, truth in pool if _close(value, truth, places)), None)
        if (
            matched is None
            and years is not None
            and not number["percent"]
            and isinstance(value, int)
            and years[0] <= value <= years[1]
        ):
            matched = "a year within the data's range"
        entry = {"text": number["text"], "value": value, "start": number["start"]}
        if matched is None:
            unsupported.append({**entry, "context": number["context"]})
        else:
            supported.append({**entry, "matched": matched})
    return supported, unsupported


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy of whatever an (possibly tampered) analysis holds."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value + 0.0 if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
