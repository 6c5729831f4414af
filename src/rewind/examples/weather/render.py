"""The analysis table and the final report as text (see :mod:`rewind.examples.weather`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rewind.examples.weather.table import DataError

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
    lines += _plan_notes(plan)
    lines += ["", render_table(analysis).rstrip("\n"), "", "## Verification", ""]
    lines += _verification_lines(check)
    return "\n".join(lines) + "\n"


def _plan_notes(plan: Mapping[str, Any]) -> list[str]:
    """The report's lines on the plan's corrections (a field the question names) and defaults."""
    lines: list[str] = []
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
    return lines


def _verification_lines(check: Mapping[str, Any]) -> list[str]:
    """The "Verification" section's bullets: the table check and the unsupported numbers."""
    lines: list[str] = []
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
    return lines
