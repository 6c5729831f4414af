"""Deterministic data functions behind the demo pipeline's tool nodes.

The demo pipeline is ``plan (llm) → research (tool) → analyse (tool) → critique (llm) →
revise (llm) → compose (llm) → verify (tool) → publish (tool)``. This module holds the pure
computations the tool nodes call, on the Seattle daily-weather table shipped with
``vega_datasets`` (NOAA, 2012–2015, 1,461 rows) or on any CSV a user passes.

Every function here is pure and deterministic: the same inputs give the same output, byte for
byte after ``json.dumps(sort_keys=True)``. Outputs are JSON-like (dict, list, str, int, float,
bool, None), never contain NaN or ±Inf, and computed floats are rounded (2 decimals unless the
metric is so small that 2 decimals would erase it, see :func:`analyse`), so the canonical hasher
can hash them and an unchanged replay reproduces them exactly.

CSV handling (any CSV, not only the weather table):

* **number** columns are those pandas reads as numeric (booleans excluded); ``inf``/``-inf``
  cells count as missing.
* the **date** column is the first column named ``date``/``ds``/``day``/``datetime``/
  ``timestamp``/``time`` (case-insensitive), else the first text column, whose non-empty cells
  parse with one fixed format (ISO 8601, ``YYYY/MM/DD``, ``MM/DD/YYYY``, ``DD.MM.YYYY``,
  ``DD/MM/YYYY``; first format that parses ≥ 90 % of cells wins, US order before European).
  Free-form guessing (dateutil) is never used: it resolves "March" against today's date.
  Time-zone offsets are dropped after converting to UTC when offsets are mixed, otherwise the
  local wall time is kept.
* every other column is **text**; a text column with 1–50 distinct values is a **categorical**
  column and may be used as a group-by.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
import re
import statistics
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "AGGREGATES",
    "DATE_GROUP_BYS",
    "DEFAULT_QUESTION",
    "GROUP_BYS",
    "MAX_CATEGORIES",
    "MONTHS",
    "SEASONS",
    "WEEKDAYS",
    "DataError",
    "analyse",
    "default_csv",
    "load_table",
    "normalize_plan",
    "numbers_in_text",
    "plan_schema",
    "profile",
    "render_report",
    "render_table",
    "research",
    "valid_group_bys",
    "verify",
]

DEFAULT_QUESTION = "Which month is wettest in Seattle, and by how much?"

#: Group-bys derived from the date column (only valid when the CSV has one).
DATE_GROUP_BYS: tuple[str, ...] = ("month", "season", "year", "weekday")
#: The named group-bys. Besides these, the name of any categorical column (a text column with
#: 1–:data:`MAX_CATEGORIES` distinct values, e.g. ``weather``) is a valid group-by; a categorical
#: column whose name collides with a date group-by is not offered while a date column exists.
#: :func:`valid_group_bys` lists what a given CSV allows.
GROUP_BYS: tuple[str, ...] = DATE_GROUP_BYS
AGGREGATES: tuple[str, ...] = ("mean", "sum", "median", "max", "min")
#: A text column with more distinct values than this is not offered as a group-by.
MAX_CATEGORIES = 50

MONTHS: tuple[str, ...] = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
#: Meteorological seasons, northern hemisphere: DJF, MAM, JJA, SON.
SEASONS: tuple[str, ...] = ("Winter", "Spring", "Summer", "Autumn")
WEEKDAYS: tuple[str, ...] = (
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
)

_DATE_NAMES = ("date", "ds", "day", "datetime", "timestamp", "time")
_DATE_FORMATS = (
    "ISO8601",
    "%Y/%m/%d",
    "%Y/%m/%d %H:%M",
    "%Y/%m/%d %H:%M:%S",
    "%m/%d/%Y",
    "%m/%d/%Y %H:%M",
    "%m/%d/%Y %H:%M:%S",
    "%d.%m.%Y",
    "%d/%m/%Y",
)
_DATE_MIN_SHARE = 0.9
#: Units documented for the vega ``seattle-weather.csv`` columns; applied when a CSV has exactly
#: that column set. Other CSVs get a unit only from a bracketed header suffix: ``rain (mm)``.
_SEATTLE_COLUMNS = frozenset({"date", "precipitation", "temp_max", "temp_min", "wind", "weather"})
_SEATTLE_UNITS = {"precipitation": "mm", "temp_max": "°C", "temp_min": "°C", "wind": "m/s"}
_TEXT_EXAMPLE_CHARS = 40
_REASON_MAX = 200
_EPS = 1e-9


class DataError(ValueError):
    """The CSV, a plan or an intermediate result is unusable; the message says how to fix it."""


# --------------------------------------------------------------------------------------------
# loading


def default_csv() -> Path:
    """Path of ``seattle-weather.csv`` inside the installed ``vega_datasets`` package.

    Located through the package's import spec, without importing it and without network.

    Raises:
        DataError: ``vega_datasets`` is not installed or the file is missing from it.
    """
    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or spec.origin is None:
        raise DataError(
            "the bundled dataset needs the 'vega_datasets' package: pip install vega_datasets, "
            "or pass a CSV path"
        )
    path = Path(spec.origin).parent / "_data" / "seattle-weather.csv"
    if not path.is_file():
        raise DataError(f"vega_datasets is installed but has no {path.name}; pass a CSV path")
    return path


class _Table:
    """A parsed CSV plus what the rest of the module needs to know about it."""

    def __init__(self, frame: pd.DataFrame, sha256: str, date_column: str | None) -> None:
        self.frame = frame
        self.sha256 = sha256
        self.date_column = date_column
        self.numeric = [c for c in frame.columns if _is_number(frame[c])]
        self.text = [c for c in frame.columns if c != date_column and c not in self.numeric]
        self.distinct = {c: int(frame[c].nunique(dropna=True)) for c in frame.columns}
        self.categorical = _categorical(
            date_column is not None, [(c, self.distinct[c]) for c in self.text]
        )
        self.group_bys = (list(DATE_GROUP_BYS) if date_column else []) + self.categorical


def _is_number(series: pd.Series) -> bool:
    return bool(
        pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype)
    )


def _categorical(has_date: bool, text_columns: Iterable[tuple[str, int]]) -> list[str]:
    out = []
    for name, distinct in text_columns:
        if has_date and name in DATE_GROUP_BYS:
            continue
        if 1 <= distinct <= MAX_CATEGORIES:
            out.append(name)
    return out


def _read(csv_path: str | Path) -> _Table:
    path = Path(csv_path)
    if not path.exists():
        raise DataError(
            f"CSV file not found: {path}. Pass the path of an existing CSV file, or omit it to "
            "use the bundled seattle-weather.csv"
        )
    if not path.is_file():
        raise DataError(f"not a file: {path}. Pass the path of a CSV file")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise DataError(f"CSV file is empty: {path}. It needs a header row and data rows")
    try:
        frame = pd.read_csv(io.BytesIO(data), encoding="utf-8-sig")
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"CSV file has no columns: {path}. It needs a header row") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(
            f"cannot parse {path} as CSV ({exc}). Save it as comma-separated UTF-8 text with "
            "one header row"
        ) from exc
    if frame.empty:
        raise DataError(f"CSV file has a header but no data rows: {path}")
    frame.columns = [str(c).strip() for c in frame.columns]
    if len(set(frame.columns)) != len(frame.columns):  # pandas already renamed exact repeats
        raise DataError(f"CSV header has duplicate column names: {path}. Rename them")
    for column in frame.columns:
        if _is_number(frame[column]):
            values = frame[column]
            if pd.api.types.is_float_dtype(values.dtype):
                frame[column] = values.where(values.map(math.isfinite, na_action="ignore"))
    date_column = _detect_date(frame)
    if date_column is not None:
        frame[date_column] = _parse_dates(frame[date_column])
    frame.attrs["date_column"] = date_column
    return _Table(frame, sha, date_column)


def _try_format(series: pd.Series, fmt: str) -> pd.Series | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parsed = pd.to_datetime(series, format=fmt, errors="coerce")
        except (ValueError, TypeError):
            try:
                parsed = pd.to_datetime(series, format=fmt, errors="coerce", utc=True)
            except (ValueError, TypeError):
                return None
    if not pd.api.types.is_datetime64_any_dtype(parsed.dtype):
        return None
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_localize(None)
    return parsed


def _parse_dates(series: pd.Series) -> pd.Series:
    present = series.notna()
    for fmt in _DATE_FORMATS:
        parsed = _try_format(series.astype("string"), fmt)
        if parsed is None:
            continue
        if int(present.sum()) and parsed[present].notna().mean() >= _DATE_MIN_SHARE:
            return parsed
    raise DataError("date column does not parse")  # pragma: no cover - guarded by _detect_date


def _detect_date(frame: pd.DataFrame) -> str | None:
    named = [c for c in frame.columns if c.lower() in _DATE_NAMES]
    others = [c for c in frame.columns if c not in named]
    for column in named + others:
        series = frame[column]
        if _is_number(series) or pd.api.types.is_bool_dtype(series.dtype):
            continue
        present = series.notna()
        if not int(present.sum()):
            continue
        sample = series[present].astype("string")
        for fmt in _DATE_FORMATS:
            parsed = _try_format(sample, fmt)
            if parsed is not None and parsed.notna().mean() >= _DATE_MIN_SHARE:
                return column
    return None


def load_table(csv_path: str | Path) -> pd.DataFrame:
    """Read a CSV into a DataFrame with its date column parsed.

    Args:
        csv_path: path of a comma-separated UTF-8 file with one header row.

    Returns:
        The table. Number columns keep pandas' numeric dtypes (``inf`` cells become NaN); the
        detected date column (see the module docstring) becomes ``datetime64`` (naive); its name
        is in ``frame.attrs["date_column"]`` (None when there is none).

    Header names are stripped of surrounding spaces; pandas renames exact repeats (``a``,
    ``a.1``).

    Raises:
        DataError: the file is missing, not a file, empty, header-only, has names that repeat
            after stripping spaces, or is not parseable as CSV (including non-UTF-8 bytes).
    """
    return _read(csv_path).frame


# --------------------------------------------------------------------------------------------
# profile and plan


def _iso_date(value: Any) -> str:
    ts = pd.Timestamp(value)
    return f"{ts.year:04d}-{ts.month:02d}-{ts.day:02d}"


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


# --------------------------------------------------------------------------------------------
# rendering


def _fmt(value: Any, decimals: int, unit: str) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    text = f"{float(value):.{decimals}f}"
    if text.startswith("-") and float(text) == 0:
        text = text[1:]
    return f"{text} {unit}" if unit else text


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_table(analysis: dict[str, Any]) -> str:
    """Markdown table of :func:`analyse`'s output.

    Args:
        analysis: the output of :func:`analyse`.

    Returns:
        A markdown table (header row, separator, one row per group, trailing newline). Columns:
        the group, the aggregate value, rows, then the mean and total (each omitted when the
        aggregate already is that). Numbers carry ``analysis["decimals"]`` places (2 by
        default) and the unit.

    Raises:
        DataError: ``analysis`` has no ``table`` list.
    """
    rows = analysis.get("table") if isinstance(analysis, Mapping) else None
    if not isinstance(rows, list):
        raise DataError("analysis has no 'table' list; pass the output of analyse()")
    decimals = analysis.get("decimals", 2)
    decimals = decimals if isinstance(decimals, int) and 0 <= decimals <= 12 else 2
    unit = str(analysis.get("unit") or "")
    aggregate = str(analysis.get("aggregate", "value"))
    metric = str(analysis.get("metric", ""))
    group_by = str(analysis.get("group_by", "group"))
    headers = [group_by.capitalize(), f"{aggregate.capitalize()} {metric}".strip(), "Rows"]
    extra = [
        f for f in ("mean", "total") if (f, aggregate) not in {("mean", "mean"), ("total", "sum")}
    ]
    headers += [f.capitalize() for f in extra]
    lines = [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|",
    ]
    for row in rows:
        row = row if isinstance(row, Mapping) else {}
        cells = [
            _cell(row.get("group", "")),
            _fmt(row.get("value"), decimals, unit),
            str(row.get("days", "")),
            *(_fmt(row.get(f), decimals, unit) for f in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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

    def field(name: str) -> str:
        value = analysis.get(name) or plan.get(name)
        if not isinstance(value, str) or not value:
            raise DataError(f"neither the analysis nor the plan names a '{name}'")
        return value

    metric, group_by, aggregate = field("metric"), field("group_by"), field("aggregate")
    _check_metric(table, metric)
    _check_group_by(table.group_bys, group_by, table.date_column is not None)
    _check_aggregate(aggregate)
    rows = _recompute(table, metric, group_by, aggregate)
    # precision from the recomputation, never from the analysis (a tampered "decimals" must not
    # loosen the check)
    decimals = _decimals(row["value"] for row in rows)

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
        for name in ("value", "mean", "total"):
            if not _close(theirs.get(name), row[name], decimals):
                mismatches.append(
                    {
                        "group": row["group"],
                        "field": name,
                        "analysis": _jsonable(theirs.get(name)),
                        "recomputed": _round(row[name], decimals),
                    }
                )
        if theirs.get("days") != row["days"] or isinstance(theirs.get("days"), bool):
            mismatches.append(
                {
                    "group": row["group"],
                    "field": "days",
                    "analysis": _jsonable(theirs.get("days")),
                    "recomputed": row["days"],
                }
            )
    for group in given_by_group:
        if group not in recomputed_groups:
            mismatches.append(
                {"group": group, "field": "group", "analysis": group, "recomputed": None}
            )
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
                    {
                        "group": None,
                        "field": name,
                        "analysis": _jsonable(theirs),
                        "recomputed": ours,
                    }
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

    plain, percents = _candidates(rows, decimals, table)
    years = _year_range(table)
    supported: list[dict[str, Any]] = []
    unsupported: list[dict[str, Any]] = []
    numbers = numbers_in_text(prose)
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
    return {
        "table_matches": not mismatches,
        "recomputed": recomputed,
        "mismatches": mismatches,
        "numbers_checked": len(numbers),
        "unsupported_numbers": unsupported,
        "supported_numbers": supported,
    }


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


# --------------------------------------------------------------------------------------------
# report


def answer_line(analysis: Mapping[str, Any]) -> str:
    """The answer computed from the data (never by the model): top group, value, and its lead
    over the runner-up, e.g. "**From the data:** November has the highest mean `precipitation`:
    5.35 mm, 0.33 mm more than December."."""
    top = analysis.get("top") or {}
    if not top:
        return "**From the data:** no group to report."
    unit = analysis.get("unit") or ""
    decimals = int(analysis.get("decimals", 2))

    def fmt(v: Any) -> str:
        return f"{float(v):.{decimals}f}" + (f" {unit}" if unit else "")

    line = (
        f"**From the data:** {top.get('group')} has the highest {analysis.get('aggregate', '')} "
        f"`{analysis.get('metric', '')}`: {fmt(top.get('value'))}"
    )
    runner, lead = analysis.get("runner_up"), analysis.get("top_minus_runner_up")
    if runner and lead is not None:
        line += f", {fmt(lead)} more than {runner.get('group')}"
    return line + "."


def render_report(
    question: str,
    plan: dict[str, Any],
    analysis: dict[str, Any],
    prose: str,
    check: dict[str, Any],
) -> str:
    """The published markdown artifact.

    Contains the question as title, the model-written prose, how the table was computed (and
    the plan's reason), the table from :func:`render_table` (never written by the model), and a
    "Verification" section: whether the table matches the independent recomputation, and each
    unsupported number in the prose with its context, or "every number in the prose is
    supported by the data". No timestamps, run ids or paths: the bytes are hashed and compared
    across replays.

    Args:
        question: the user's question.
        plan: the normalised plan.
        analysis: the output of :func:`analyse`.
        prose: the model-written text.
        check: the output of :func:`verify`.

    Returns:
        Markdown text ending with a single newline.

    Raises:
        DataError: ``analysis`` has no ``table`` list.
    """
    title = " ".join(str(question or "").split()) or "Report"
    body = str(prose or "").strip() or "_(no prose was written)_"
    plan = plan if isinstance(plan, Mapping) else {}
    check = check if isinstance(check, Mapping) else {}
    metric = analysis.get("metric", "")
    unit = analysis.get("unit") or ""
    method = (
        f"{str(analysis.get('aggregate', '')).capitalize()} of `{metric}`"
        + (f" ({unit})" if unit else "")
        + f" by {analysis.get('group_by', '')}, over {analysis.get('rows', 0)} rows."
    )
    lines = [f"# {title}", "", body, "", answer_line(analysis), "", "## Data", "", method]
    corrections = plan.get("corrections")
    for c in corrections if isinstance(corrections, list) else []:
        lines += [
            "",
            f"The model planned {c.get('field')} `{c.get('model')}`; the question names "
            f"`{c.get('used')}`, which was used.",
        ]
    fallbacks = plan.get("fallbacks")
    if isinstance(fallbacks, list) and fallbacks:
        lines += ["", f"Defaults were used for: {', '.join(str(f) for f in fallbacks)}."]
    lines += ["", render_table(analysis).rstrip("\n"), "", "## Verification", ""]
    mismatches = check.get("mismatches") or []
    if check.get("table_matches"):
        lines.append("- The table matches an independent recomputation from the CSV.")
    else:
        lines.append("- The table does **not** match an independent recomputation from the CSV:")
        for item in mismatches:
            where = item.get("group") if item.get("group") is not None else "summary"
            lines.append(
                f"  - {where} `{item.get('field')}`: analysis {item.get('analysis')}, "
                f"recomputed {item.get('recomputed')}"
            )
    unsupported = check.get("unsupported_numbers") or []
    checked = check.get("numbers_checked", 0)
    lines.append(
        "- A number counts as supported when the data produces that value; what the prose "
        "attributes it to is not checked."
    )
    if not unsupported:
        lines.append(
            f"- Result: every number in the prose is supported by the data ({checked} checked)."
        )
    else:
        lines.append(
            f"- {len(unsupported)} of {checked} numbers in the prose are not supported by the data:"
        )
        for item in unsupported:
            context = str(item.get("context", "")).replace("`", "'")
            lines.append(f"  - `{item.get('text')}` in “{context}”")
    return "\n".join(lines) + "\n"
