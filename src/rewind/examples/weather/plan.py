"""Profile a CSV and turn a model's plan into a valid one (see :mod:`rewind.examples.weather`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rewind.examples.weather.table import (
    _REASON_MAX,
    _TEXT_EXAMPLE_CHARS,
    AGGREGATES,
    DATE_GROUP_BYS,
    MAX_CATEGORIES,
    MONTHS,
    WEEKDAYS,
    DataError,
    _categorical,
    _iso_date,
    _read,
)

# --------------------------------------------------------------------------------------------
# profile and plan


def _plain(value: Any) -> int | float | str | None:
    """A raw cell as a JSON-safe scalar (numbers unrounded: they are data, not results)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or pd.api.types.is_integer(value):
        return int(value)
    if isinstance(value, float) or pd.api.types.is_float(value):
        number = float(value)
        return number + 0.0 if math.isfinite(number) else None
    return str(value)


def profile(csv_path: str | Path) -> dict[str, Any]:
    """Describe a CSV for the ``plan`` prompt.

    Args:
        csv_path: path of the CSV.

    Returns:
        ``{"rows": int, "columns": [{"name": str, "dtype": "number"|"date"|"text",
        "example": first non-empty cell (number as in the file, date as ``YYYY-MM-DD``, text cut
        to 40 characters) or None, "distinct": int (distinct non-empty cells)}],
        "date_range": [first ISO date, last ISO date] | None, "sha256": hex SHA-256 of the
        file's bytes}``. ``distinct`` is what decides which text columns are categorical.

    Raises:
        DataError: see :func:`load_table`.
    """
    table = _read(csv_path)
    frame = table.frame
    columns = []
    for name in frame.columns:
        series = frame[name]
        present = series.dropna()
        if name == table.date_column:
            dtype = "date"
            example: Any = _iso_date(present.iloc[0]) if len(present) else None
        elif name in table.numeric:
            dtype = "number"
            example = _plain(present.iloc[0]) if len(present) else None
        else:
            dtype = "text"
            example = str(present.iloc[0])[:_TEXT_EXAMPLE_CHARS] if len(present) else None
        columns.append(
            {"name": name, "dtype": dtype, "example": example, "distinct": table.distinct[name]}
        )
    date_range = None
    if table.date_column is not None:
        dates = frame[table.date_column].dropna()
        if len(dates):
            date_range = [_iso_date(dates.min()), _iso_date(dates.max())]
    return {
        "rows": len(frame),
        "columns": columns,
        "date_range": date_range,
        "sha256": table.sha256,
    }


def _profile_columns(profile: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    columns = profile.get("columns") if isinstance(profile, Mapping) else None
    if not isinstance(columns, list):
        raise DataError("profile has no 'columns' list; build it with profile(csv_path)")
    return [c for c in columns if isinstance(c, Mapping) and isinstance(c.get("name"), str)]


def _profile_numeric(profile: Mapping[str, Any]) -> list[str]:
    return [c["name"] for c in _profile_columns(profile) if c.get("dtype") == "number"]


def valid_group_bys(profile: Mapping[str, Any]) -> list[str]:
    """Group-bys a CSV allows, in the order offered to the model.

    Args:
        profile: the output of :func:`profile`.

    Returns:
        ``month``, ``season``, ``year``, ``weekday`` when the CSV has a date column, then the
        categorical column names in column order. May be empty.

    Raises:
        DataError: ``profile`` is not a profile.
    """
    columns = _profile_columns(profile)
    has_date = any(c.get("dtype") == "date" for c in columns)
    text = [(c["name"], int(c.get("distinct") or 0)) for c in columns if c.get("dtype") == "text"]
    return (list(DATE_GROUP_BYS) if has_date else []) + _categorical(has_date, text)


def _require_plannable(profile: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    numeric = _profile_numeric(profile)
    group_bys = valid_group_bys(profile)
    if not numeric:
        raise DataError(
            "the CSV has no numeric column to analyse; it needs at least one column of numbers"
        )
    if not group_bys:
        raise DataError(
            "the CSV has nothing to group by: it needs a date column (e.g. 'date' as YYYY-MM-DD) "
            f"or a text column with 1–{MAX_CATEGORIES} distinct values"
        )
    return numeric, group_bys


def plan_schema(profile: dict[str, Any]) -> dict[str, Any]:
    """JSON schema constraining the ``plan`` model's output for this CSV.

    Args:
        profile: the output of :func:`profile`.

    Returns:
        An object schema with properties ``metric`` (enum of the numeric columns), ``group_by``
        (enum of :func:`valid_group_bys`), ``aggregate`` (enum of :data:`AGGREGATES`) and
        ``reason`` (string, at most 200 characters), all required, no additional properties.

    Raises:
        DataError: the CSV has no numeric column or nothing to group by.
    """
    numeric, group_bys = _require_plannable(profile)
    return {
        "type": "object",
        "properties": {
            "metric": {"type": "string", "enum": numeric},
            "group_by": {"type": "string", "enum": group_bys},
            "aggregate": {"type": "string", "enum": list(AGGREGATES)},
            "reason": {"type": "string", "maxLength": _REASON_MAX},
        },
        "required": ["metric", "group_by", "aggregate", "reason"],
        "additionalProperties": False,
    }


_METRIC_HINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        r"\b(?:wet\w*|rain\w*|precip\w*|dry|drie\w*|drizzl\w*|snow\w*|showers?|downpours?)\b",
        ("precip", "rain", "snow"),
    ),
    (r"\b(?:hot\w*|warm\w*|heat\w*)\b", ("temp_max", "max_temp", "tmax", "high", "temp")),
    (
        r"\b(?:cold\w*|cool\w*|chill\w*|freez\w*|frost\w*)\b",
        ("temp_min", "min_temp", "tmin", "low", "temp"),
    ),
    (r"\btemp\w*", ("temp",)),
    (r"\b(?:wind\w*|breez\w*|gust\w*)\b", ("wind", "gust")),
)
_MONTH_WORDS = "|".join(m.lower() for m in MONTHS)
_WEEKDAY_WORDS = "|".join(d.lower() for d in WEEKDAYS)
_GROUP_HINTS: dict[str, str] = {
    "month": rf"\b(?:months?|monthly|{_MONTH_WORDS})\b",
    "season": r"\b(?:seasons?|seasonal\w*|winters?|springs?|summers?|autumns?)\b",
    "year": r"\b(?:years?|yearly|annual\w*|(?:19|20)\d\d)\b",
    "weekday": rf"\b(?:weekdays?|weekends?|day of (?:the )?week|(?:{_WEEKDAY_WORDS})s?)\b",
}
_AGGREGATE_HINTS: dict[str, str] = {
    "sum": r"\b(?:total\w*|sum|summed|cumulative\w*|altogether|in all|accumulat\w*)\b",
    "mean": r"\b(?:average\w*|mean|typical\w*|per day|daily)\b",
    "median": r"\bmedian\b",
    "max": r"\b(?:max|maximum|peak|record high|extreme\w*)\b",
    "min": r"\b(?:min|minimum|record low)\b",
}
_GROUP_ALIASES = {
    "months": "month",
    "monthly": "month",
    "seasons": "season",
    "seasonal": "season",
    "years": "year",
    "yearly": "year",
    "annual": "year",
    "annually": "year",
    "weekdays": "weekday",
    "day_of_week": "weekday",
    "dayofweek": "weekday",
    "day_of_the_week": "weekday",
}
_AGGREGATE_ALIASES = {
    "average": "mean",
    "avg": "mean",
    "total": "sum",
    "maximum": "max",
    "minimum": "min",
}


def _key(text: str) -> str:
    return re.sub(r"[\s\-]+", "_", text.strip().casefold())


def _match_choice(value: Any, choices: list[str], aliases: Mapping[str, str]) -> str | None:
    """Exact match, else a unique case/space-insensitive or alias match; None otherwise."""
    if not isinstance(value, str):
        return None
    if value in choices:
        return value
    key = _key(value)
    by_key: dict[str, list[str]] = {}
    for choice in choices:
        by_key.setdefault(_key(choice), []).append(choice)
    hits = by_key.get(key) or by_key.get(_key(aliases.get(key, "")), [])
    return hits[0] if len(hits) == 1 else None


def _first_hit(question: str, patterns: Mapping[str, str]) -> str | None:
    best: tuple[int, int, str] | None = None
    for order, (name, pattern) in enumerate(patterns.items()):
        found = re.search(pattern, question, flags=re.IGNORECASE)
        if found and (best is None or (found.start(), order) < best[:2]):
            best = (found.start(), order, name)
    return best[2] if best else None


def _mentions(question: str, names: list[str]) -> dict[str, str]:
    """Column names mentioned in the question (``temp_max`` also as ``temp max``)."""
    out = {}
    for name in sorted(names, key=lambda n: (-len(n), n)):
        spaced = re.escape(name.casefold()).replace("_", "[ _]")
        out[name] = rf"(?<!\w){spaced}(?!\w)"
    return out


def _question_metric(question: str, numeric: list[str]) -> str | None:
    """The metric the question itself names or implies ("wettest" → precipitation), if any."""
    named = _first_hit(question, _mentions(question, numeric))
    if named:
        return named
    hits = []
    for pattern, fragments in _METRIC_HINTS:
        found = re.search(pattern, question, flags=re.IGNORECASE)
        if found:
            hits.append((found.start(), fragments))
    for _, fragments in sorted(hits, key=lambda h: h[0]):
        for fragment in fragments:
            for name in numeric:
                if fragment in name.casefold():
                    return name
    return None


def _default_metric(question: str, numeric: list[str]) -> str:
    return _question_metric(question, numeric) or numeric[0]


def _question_group_by(question: str, group_bys: list[str]) -> str | None:
    patterns = {g: p for g, p in _GROUP_HINTS.items() if g in group_bys}
    patterns.update(_mentions(question, [g for g in group_bys if g not in DATE_GROUP_BYS]))
    return _first_hit(question, patterns)


def _default_group_by(question: str, group_bys: list[str]) -> str:
    hit = _question_group_by(question, group_bys)
    if hit:
        return hit
    return "month" if "month" in group_bys else group_bys[0]


def normalize_plan(raw: dict[str, Any], profile: dict[str, Any], question: str) -> dict[str, Any]:
    """Turn the ``plan`` model's output into a valid plan.

    A field the model got right is kept; a value that differs only in case, spacing or by a
    plain alias (``"Precipitation"``, ``"monthly"``, ``"average"``, ``"total"``) is repaired and
    does not count as a fallback. Anything else (missing, wrong type, unknown column) falls back
    to a default derived from the question:

    * ``metric``: a numeric column named in the question; else by keyword — wet/rain/dry/snow
      → a ``precip``/``rain``/``snow`` column, hot/warm → ``temp_max``, cold/cool → ``temp_min``,
      temperature → any ``temp`` column, wind → ``wind``; else the first numeric column.
    * ``group_by``: the earliest grouping word in the question — month (or a month name),
      season (or a season name), year (or annual, or a 4-digit year), weekday (or a day name,
      weekend) — or a categorical column named in it; else ``month`` when there is a date
      column, else the first categorical column.
    * ``aggregate``: total/sum/cumulative → ``sum``, average/mean/typical/daily → ``mean``,
      median → ``median``, maximum/peak/extreme → ``max``, minimum → ``min``; otherwise
      ``mean``. Superlatives such as "wettest" default to the mean per row rather than the sum
      because groups have unequal sizes (February has 113 days in 2012–2015, January 124; a
      partial year would skew sums), so "wettest month" means the highest mean daily
      precipitation.
    * ``reason``: the model's text (whitespace collapsed, cut to 200 characters); when missing
      or empty, a sentence naming the defaults.

    Args:
        raw: the model's parsed JSON (anything that is not a dict counts as empty).
        profile: the output of :func:`profile`.
        question: the user's question.

    Returns:
        ``{"metric", "group_by", "aggregate", "reason", "fallbacks": [fields that fell back, in
        the order metric, group_by, aggregate, reason], "corrections": [{"field", "model",
        "used"}]}``. A correction is recorded when the model chose a valid value that contradicts
        what the question itself names ("wettest" → precipitation, "by month" → month).

    Raises:
        DataError: the CSV has no numeric column or nothing to group by.
    """
    numeric, group_bys = _require_plannable(profile)
    data = raw if isinstance(raw, Mapping) else {}
    question = question if isinstance(question, str) else ""
    fallbacks: list[str] = []

    corrections: list[dict[str, str]] = []
    metric = _match_choice(data.get("metric"), numeric, {})
    if metric is None:
        metric = _default_metric(question, numeric)
        fallbacks.append("metric")
    elif (asked := _question_metric(question, numeric)) and asked != metric:
        # Small models pick a valid but wrong column; the question's own words win.
        corrections.append({"field": "metric", "model": metric, "used": asked})
        metric = asked
    group_by = _match_choice(data.get("group_by"), group_bys, _GROUP_ALIASES)
    if group_by is None:
        group_by = _default_group_by(question, group_bys)
        fallbacks.append("group_by")
    elif (asked_g := _question_group_by(question, group_bys)) and asked_g != group_by:
        corrections.append({"field": "group_by", "model": group_by, "used": asked_g})
        group_by = asked_g
    aggregate = _match_choice(data.get("aggregate"), list(AGGREGATES), _AGGREGATE_ALIASES)
    if aggregate is None:
        aggregate = _first_hit(question, _AGGREGATE_HINTS) or "mean"
        fallbacks.append("aggregate")
    reason_raw = data.get("reason")
    reason = " ".join(reason_raw.split())[:_REASON_MAX] if isinstance(reason_raw, str) else ""
    if not reason:
        reason = f"Default from the question: {aggregate} of {metric} by {group_by}."
        fallbacks.append("reason")
    return {
        "metric": metric,
        "group_by": group_by,
        "aggregate": aggregate,
        "reason": reason,
        "fallbacks": fallbacks,
        "corrections": corrections,
    }
