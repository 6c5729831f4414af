"""The weather example's constants and CSV loading: column kinds, date detection, the
Seattle table (see :mod:`rewind.examples.weather`)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

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


def _iso_date(value: Any) -> str:
    ts = pd.Timestamp(value)
    return f"{ts.year:04d}-{ts.month:02d}-{ts.day:02d}"
