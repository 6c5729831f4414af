"""Research (select rows) and analyse (aggregate per group) (see :mod:`rewind.examples.weather`)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rewind.examples.weather.table import (
    _SEATTLE_COLUMNS,
    _SEATTLE_UNITS,
    AGGREGATES,
    DATE_GROUP_BYS,
    MONTHS,
    SEASONS,
    WEEKDAYS,
    DataError,
    _iso_date,
    _read,
    _Table,
)

# --------------------------------------------------------------------------------------------
# research and analyse


def _unit(table_columns: Iterable[str], metric: str) -> str:
    bracket = re.search(r"[(\[]\s*([^()\[\]]{1,12}?)\s*[)\]]\s*$", metric)
    if bracket:
        return bracket.group(1)
    if set(table_columns) == _SEATTLE_COLUMNS:
        return _SEATTLE_UNITS.get(metric, "")
    return ""


def _plan_field(plan: Mapping[str, Any], field: str) -> str:
    value = plan.get(field) if isinstance(plan, Mapping) else None
    if not isinstance(value, str) or not value:
        raise DataError(f"plan has no '{field}'; pass a plan made by normalize_plan()")
    return value


def _check_metric(table: _Table, metric: str) -> None:
    if metric not in table.numeric:
        kind = "a text or date column" if metric in table.frame.columns else "not a column"
        raise DataError(
            f"metric '{metric}' is {kind} of this CSV; numeric columns are: "
            f"{', '.join(table.numeric) or '(none)'}. Fix the plan (normalize_plan() does)"
        )


def _check_group_by(group_bys: list[str], group_by: str, has_date: bool) -> None:
    if group_by not in group_bys:
        hint = (
            " (month/season/year/weekday need a date column)"
            if group_by in DATE_GROUP_BYS and not has_date
            else ""
        )
        raise DataError(
            f"group_by '{group_by}' is not valid for this CSV{hint}; valid group-bys are: "
            f"{', '.join(group_bys) or '(none)'}"
        )


def research(csv_path: str | Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Select the rows and columns the analysis needs, in a compact columnar form.

    The selection holds everything :func:`analyse` needs to group by *any* valid group-by, so a
    fork that overrides ``analyse``'s ``group_by`` or ``aggregate`` needs no new research; for
    the same reason the output does not depend on the plan's ``group_by``/``aggregate`` (a
    changed plan grouping still hits the research cache).

    Args:
        csv_path: path of the CSV.
        plan: a plan with ``metric`` (a numeric column) and ``group_by`` (checked to be valid
            for the CSV, so a bad plan fails here rather than downstream).

    Returns:
        ``{"csv_sha256": hex, "metric": str, "unit": str ("mm", "°C", "m/s" for the Seattle
        columns, a bracketed header unit such as ``rain (mm)``, else ""), "date_column": str |
        None, "columns": [date column, metric, categorical columns...], "source_rows": rows in
        the CSV, "rows": rows selected (metric present), "dropped_missing": rows whose metric is
        empty, "dates": [ISO ``YYYY-MM-DD`` or None per row] | None, "values": [number per row,
        as in the file], "categories": {column: {"levels": sorted distinct texts, "codes":
        [index into levels or None per row]}}}``. About 33 KB of JSON for the Seattle table.

    Raises:
        DataError: unreadable CSV (see :func:`load_table`), plan without ``metric``/``group_by``,
            a metric that is not a numeric column, or a group_by the CSV does not allow.
    """
    table = _read(csv_path)
    metric = _plan_field(plan, "metric")
    _check_metric(table, metric)
    _check_group_by(table.group_bys, _plan_field(plan, "group_by"), table.date_column is not None)
    frame = table.frame
    keep = frame[metric].notna()
    selected = frame[keep]
    integer = pd.api.types.is_integer_dtype(selected[metric].dtype)
    values = [int(v) if integer else float(v) + 0.0 for v in selected[metric].tolist()]
    dates = None
    if table.date_column is not None:
        dates = [None if pd.isna(d) else _iso_date(d) for d in selected[table.date_column]]
    categories = {}
    for column in table.categorical:
        texts = selected[column]
        levels = sorted({str(v) for v in frame[column].dropna()})
        index = {level: i for i, level in enumerate(levels)}
        codes = [None if pd.isna(v) else index[str(v)] for v in texts]
        categories[column] = {"levels": levels, "codes": codes}
    columns = ([table.date_column] if table.date_column else []) + [metric, *table.categorical]
    return {
        "csv_sha256": table.sha256,
        "metric": metric,
        "unit": _unit(frame.columns, metric),
        "date_column": table.date_column,
        "columns": columns,
        "source_rows": len(frame),
        "rows": len(values),
        "dropped_missing": len(frame) - len(values),
        "dates": dates,
        "values": values,
        "categories": categories,
    }


def _round(value: float, decimals: int) -> float:
    number = round(float(value), decimals) + 0.0
    if not math.isfinite(number):  # pragma: no cover - inputs are finite by construction
        raise DataError(f"non-finite result {value!r}")
    return number


def _decimals(values: Iterable[float]) -> int:
    """2, or more when the largest magnitude is below 0.1 (so 3 significant digits survive)."""
    largest = max((abs(v) for v in values), default=0.0)
    if largest == 0 or largest >= 0.1:
        return 2
    return max(2, min(6, 2 - math.floor(math.log10(largest))))


def selection_group_bys(selection: Mapping[str, Any]) -> list[str]:
    """Group-bys a selection (the output of :func:`research`) provides: the date groupings when
    it has dates, then its categorical columns."""
    has_date = isinstance(selection.get("dates"), list)
    categories = selection.get("categories") or {}
    return (list(DATE_GROUP_BYS) if has_date else []) + [
        c for c in categories if not (has_date and c in DATE_GROUP_BYS)
    ]


def _check_aggregate(aggregate: str) -> None:
    if aggregate not in AGGREGATES:
        raise DataError(f"aggregate '{aggregate}' is unknown; use one of: {', '.join(AGGREGATES)}")


def _summary(table: list[dict[str, Any]], raw: list[float], decimals: int) -> dict[str, Any]:
    """top / runner_up / bottom and the two derived numbers, from unrounded values."""
    order = sorted(range(len(raw)), key=lambda i: (-raw[i], i))
    low = sorted(range(len(raw)), key=lambda i: (raw[i], i))

    def pick(i: int) -> dict[str, Any]:
        return {"group": table[i]["group"], "value": table[i]["value"]}

    top, bottom = order[0], low[0]
    runner = order[1] if len(order) > 1 else None
    return {
        "top": pick(top),
        "runner_up": pick(runner) if runner is not None else None,
        "bottom": pick(bottom),
        "top_minus_runner_up": (
            _round(raw[top] - raw[runner], decimals) if runner is not None else None
        ),
        "top_over_bottom": _round(raw[top] / raw[bottom], 2) if raw[bottom] > 0 else None,
    }


def analyse(selection: dict[str, Any], *, group_by: str, aggregate: str) -> dict[str, Any]:
    """Grouped statistics of the selected metric.

    Args:
        selection: the output of :func:`research`.
        group_by: ``month``/``season``/``year``/``weekday`` (rows without a date are left out)
            or a categorical column of the selection (rows with an empty cell are left out).
        aggregate: one of :data:`AGGREGATES`, applied to the metric within each group.

    Returns:
        ``{"metric", "group_by", "aggregate", "unit", "rows": rows used, "decimals": int,
        "table": [{"group": label, "value": aggregate, "days": rows in the group, "mean",
        "total"}], "top": {"group", "value"}, "runner_up": {...} | None, "bottom": {...},
        "top_minus_runner_up": float | None, "top_over_bottom": float | None}``.
        Labels are month names (January..December), seasons (Winter = Dec–Feb, Spring, Summer,
        Autumn), years as text, weekday names (Monday..Sunday) or category texts, in that
        natural order (categories sorted); only groups with rows appear. ``days`` counts rows
        (days for a daily table). Floats are rounded to ``decimals`` places: 2, or more when the
        largest group value is below 0.1 in magnitude. ``top`` is the highest value, ``bottom``
        the lowest (ties: first in natural order). ``runner_up``/``top_minus_runner_up`` are
        None with a single group; ``top_over_bottom`` (2 decimals) is None unless the bottom
        value is positive.

    Raises:
        DataError: malformed selection, unknown aggregate, a group_by the selection cannot
            provide, or no rows left to group.
    """
    if not isinstance(selection, Mapping) or not isinstance(selection.get("values"), list):
        raise DataError("selection has no 'values' list; pass the output of research()")
    _check_aggregate(aggregate)
    group_bys = selection_group_bys(selection)
    _check_group_by(group_bys, group_by, isinstance(selection.get("dates"), list))
    values = pd.Series(selection["values"], dtype="float64")
    if group_by in DATE_GROUP_BYS:
        dates = pd.to_datetime(
            pd.Series(selection["dates"], dtype="object"), format="%Y-%m-%d", errors="coerce"
        )
        if len(dates) != len(values):
            raise DataError("selection 'dates' and 'values' differ in length; re-run research()")
        if group_by == "month":
            order = dates.dt.month - 1
            labels: list[str] = list(MONTHS)
        elif group_by == "season":
            order = (dates.dt.month % 12) // 3
            labels = list(SEASONS)
        elif group_by == "weekday":
            order = dates.dt.day_of_week
            labels = list(WEEKDAYS)
        else:
            years = dates.dt.year
            first = int(years.min()) if years.notna().any() else 0
            order = years - first
            last = int(years.max()) if years.notna().any() else -1
            labels = [str(y) for y in range(first, last + 1)]
    else:
        category = selection["categories"][group_by]
        codes = category.get("codes")
        if not isinstance(codes, list) or len(codes) != len(values):
            raise DataError(f"selection category '{group_by}' is malformed; re-run research()")
        order = pd.Series(codes, dtype="float64")
        labels = [str(level) for level in category.get("levels", [])]
    frame = pd.DataFrame({"key": order, "value": values}).dropna()
    if frame.empty:
        raise DataError(f"no rows with both a value and a '{group_by}' to group by")
    frame["key"] = frame["key"].astype("int64")
    grouped = frame.groupby("key", sort=True)["value"]
    stats = grouped.agg(["count", "sum", "mean", "median", "max", "min"])
    raw = [float(stats.at[k, aggregate]) for k in stats.index]
    decimals = _decimals(raw)
    table = [
        {
            "group": labels[int(k)],
            "value": _round(stats.at[k, aggregate], decimals),
            "days": int(stats.at[k, "count"]),
            "mean": _round(stats.at[k, "mean"], decimals),
            "total": _round(stats.at[k, "sum"], decimals),
        }
        for k in stats.index
    ]
    return {
        "metric": str(selection.get("metric", "")),
        "group_by": group_by,
        "aggregate": aggregate,
        "unit": str(selection.get("unit") or ""),
        "rows": int(stats["count"].sum()),
        "decimals": decimals,
        "table": table,
        **_summary(table, raw, decimals),
    }
