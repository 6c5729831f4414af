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

The module is split along its seams: :mod:`.table` (constants, CSV loading), :mod:`.plan`
(profile, plan schema and normalization), :mod:`.analysis` (research, analyse),
:mod:`.render` (the table and the report as text), :mod:`.claims` (numbers in prose, verify).
"""

from __future__ import annotations

from rewind.examples.weather.analysis import analyse, research, selection_group_bys
from rewind.examples.weather.claims import numbers_in_text, verify
from rewind.examples.weather.plan import normalize_plan, plan_schema, profile, valid_group_bys
from rewind.examples.weather.render import answer_line, render_report, render_table
from rewind.examples.weather.table import (
    AGGREGATES,
    DATE_GROUP_BYS,
    DEFAULT_QUESTION,
    GROUP_BYS,
    MAX_CATEGORIES,
    MONTHS,
    SEASONS,
    WEEKDAYS,
    DataError,
    default_csv,
    load_table,
)

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
    "answer_line",
    "default_csv",
    "load_table",
    "normalize_plan",
    "numbers_in_text",
    "plan_schema",
    "profile",
    "render_report",
    "render_table",
    "research",
    "selection_group_bys",
    "valid_group_bys",
    "verify",
]
