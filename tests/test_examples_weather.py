"""Tests for the demo pipeline's deterministic data functions (rewind.examples.weather)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.examples import weather as w

SEASON_ORDER = ["Winter", "Spring", "Summer", "Autumn"]


def dumps(value: Any) -> str:
    """Canonical-ish JSON; raises on NaN/inf like the canonical hasher does."""
    return json.dumps(value, sort_keys=True, allow_nan=False, ensure_ascii=False)


@pytest.fixture(scope="module")
def csv() -> Path:
    return w.default_csv()


@pytest.fixture(scope="module")
def prof(csv: Path) -> dict[str, Any]:
    return w.profile(csv)


@pytest.fixture(scope="module")
def plan(prof: dict[str, Any]) -> dict[str, Any]:
    return w.normalize_plan(
        {"metric": "precipitation", "group_by": "month", "aggregate": "mean", "reason": "rain"},
        prof,
        w.DEFAULT_QUESTION,
    )


@pytest.fixture(scope="module")
def selection(csv: Path, plan: dict[str, Any]) -> dict[str, Any]:
    return w.research(csv, plan)


@pytest.fixture(scope="module")
def by_month(selection: dict[str, Any]) -> dict[str, Any]:
    return w.analyse(selection, group_by="month", aggregate="mean")


@pytest.fixture(scope="module")
def frame(csv: Path) -> pd.DataFrame:
    """An independent read of the dataset for reference computations."""
    df = pd.read_csv(csv)
    df["date"] = pd.to_datetime(df["date"], format="%Y/%m/%d")
    return df


@pytest.fixture
def messy_csv(tmp_path: Path) -> Path:
    path = tmp_path / "messy.csv"
    path.write_text(
        "day,city,rain (mm),temp,note\n"
        "2020-01-03,Oslo,1.5,-3,a\n"
        "2020-01-04,Bergen,,2.5,b\n"
        "2020-02-10,Oslo,inf,,c\n"
        ",Bergen,4,1,d\n"
        "2020-07-01,,0.25,18.5,\n"
        "2020-12-31,Oslo,2,,f\n",
        encoding="utf-8",
    )
    return path


# ------------------------------------------------------------------------------ dataset, profile


def test_default_csv_is_the_shipped_file(csv: Path) -> None:
    assert csv.name == "seattle-weather.csv"
    assert csv.is_file()


def test_profile_of_seattle(csv: Path, prof: dict[str, Any]) -> None:
    assert prof["rows"] == 1461
    assert [(c["name"], c["dtype"]) for c in prof["columns"]] == [
        ("date", "date"),
        ("precipitation", "number"),
        ("temp_max", "number"),
        ("temp_min", "number"),
        ("wind", "number"),
        ("weather", "text"),
    ]
    assert prof["columns"][0]["example"] == "2012-01-01"
    assert prof["columns"][5]["distinct"] == 5
    assert prof["date_range"] == ["2012-01-01", "2015-12-31"]
    assert prof["sha256"] == hashlib.sha256(csv.read_bytes()).hexdigest()
    dumps(prof)


def test_load_table_parses_the_date_column(csv: Path) -> None:
    df = w.load_table(csv)
    assert df.attrs["date_column"] == "date"
    assert pd.api.types.is_datetime64_any_dtype(df["date"].dtype)
    assert len(df) == 1461


def test_plan_schema(prof: dict[str, Any]) -> None:
    schema = w.plan_schema(prof)
    props = schema["properties"]
    assert props["metric"]["enum"] == ["precipitation", "temp_max", "temp_min", "wind"]
    assert props["group_by"]["enum"] == [*w.GROUP_BYS, "weather"]
    assert props["aggregate"]["enum"] == list(w.AGGREGATES)
    assert props["reason"] == {"type": "string", "maxLength": 200}
    assert schema["required"] == ["metric", "group_by", "aggregate", "reason"]
    assert schema["additionalProperties"] is False
    dumps(schema)


# ------------------------------------------------------------------------------ normalize_plan


def test_normalize_plan_keeps_a_valid_plan(plan: dict[str, Any]) -> None:
    assert plan == {
        "metric": "precipitation",
        "group_by": "month",
        "aggregate": "mean",
        "reason": "rain",
        "fallbacks": [],
        "corrections": [],
    }


def test_normalize_plan_corrects_a_valid_but_contradicting_choice(prof: dict[str, Any]) -> None:
    raw = {"metric": "temp_max", "group_by": "year", "aggregate": "sum", "reason": "x"}
    plan = w.normalize_plan(raw, prof, "Which month is wettest in Seattle?")
    assert (plan["metric"], plan["group_by"], plan["aggregate"]) == (
        "precipitation",
        "month",
        "sum",
    )
    assert plan["corrections"] == [
        {"field": "metric", "model": "temp_max", "used": "precipitation"},
        {"field": "group_by", "model": "year", "used": "month"},
    ]
    assert plan["fallbacks"] == []
    report = w.render_report(
        "Q",
        plan,
        w.analyse(w.research(w.default_csv(), plan), group_by="month", aggregate="sum"),
        "prose",
        {},
    )
    assert "the question names `precipitation`" in report


def test_normalize_plan_falls_back_from_the_question(prof: dict[str, Any]) -> None:
    got = w.normalize_plan({}, prof, w.DEFAULT_QUESTION)
    assert (got["metric"], got["group_by"], got["aggregate"]) == ("precipitation", "month", "mean")
    assert got["fallbacks"] == ["metric", "group_by", "aggregate", "reason"]
    assert got["reason"]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("How much rain fell in total each year?", ("precipitation", "year", "sum")),
        ("Which weekday is hottest on average?", ("temp_max", "weekday", "mean")),
        ("What is the coldest season?", ("temp_min", "season", "mean")),
        ("Peak wind by weather type", ("wind", "weather", "max")),
        ("median temp_min per month", ("temp_min", "month", "median")),
        ("", ("precipitation", "month", "mean")),
    ],
)
def test_normalize_plan_question_defaults(
    prof: dict[str, Any], question: str, expected: tuple[str, str, str]
) -> None:
    got = w.normalize_plan({"metric": "humidity", "group_by": 7}, prof, question)
    assert (got["metric"], got["group_by"], got["aggregate"]) == expected
    assert got["fallbacks"][:3] == ["metric", "group_by", "aggregate"]


def test_normalize_plan_repairs_case_and_aliases(prof: dict[str, Any]) -> None:
    raw = {"metric": " Precipitation", "group_by": "Monthly", "aggregate": "average", "reason": 3}
    got = w.normalize_plan(raw, prof, "anything")
    assert (got["metric"], got["group_by"], got["aggregate"]) == ("precipitation", "month", "mean")
    assert got["fallbacks"] == ["reason"]


def test_normalize_plan_tolerates_garbage(prof: dict[str, Any]) -> None:
    got = w.normalize_plan(None, prof, w.DEFAULT_QUESTION)  # type: ignore[arg-type]
    assert got["metric"] == "precipitation"
    long = w.normalize_plan({"reason": "x " * 300}, prof, "")
    assert len(long["reason"]) <= 200
    dumps(got)


# ------------------------------------------------------------------------------ research


def test_research_is_compact_and_complete(selection: dict[str, Any]) -> None:
    assert selection["metric"] == "precipitation"
    assert selection["unit"] == "mm"
    assert selection["rows"] == selection["source_rows"] == 1461
    assert selection["columns"] == ["date", "precipitation", "weather"]
    assert selection["dates"][:2] == ["2012-01-01", "2012-01-02"]
    assert selection["values"][:2] == [0.0, 10.9]
    weather = selection["categories"]["weather"]
    assert weather["levels"] == ["drizzle", "fog", "rain", "snow", "sun"]
    assert weather["levels"][weather["codes"][0]] == "drizzle"
    assert len(dumps(selection).encode()) < 60_000


def test_research_does_not_depend_on_grouping(csv: Path, plan: dict[str, Any]) -> None:
    other = {**plan, "group_by": "weather", "aggregate": "max"}
    assert dumps(w.research(csv, plan)) == dumps(w.research(csv, other))


# ------------------------------------------------------------------------------ analyse


@pytest.mark.parametrize("aggregate", ["sum", "mean"])
def test_analyse_by_month_matches_pandas(
    selection: dict[str, Any], frame: pd.DataFrame, aggregate: str
) -> None:
    got = w.analyse(selection, group_by="month", aggregate=aggregate)
    assert [row["group"] for row in got["table"]] == list(w.MONTHS)
    grouped = frame.groupby(frame["date"].dt.month)["precipitation"]
    expected = grouped.agg(aggregate)
    counts = grouped.count()
    for month, row in enumerate(got["table"], start=1):
        assert row["value"] == pytest.approx(expected[month], abs=0.005)
        assert row["mean"] == pytest.approx(grouped.mean()[month], abs=0.005)
        assert row["total"] == pytest.approx(grouped.sum()[month], abs=0.005)
        assert row["days"] == counts[month]
    assert sum(row["days"] for row in got["table"]) == 1461
    assert got["unit"] == "mm"
    assert got["metric"] == "precipitation"
    dumps(got)


def test_wettest_month_by_mean_daily_precipitation(
    by_month: dict[str, Any], frame: pd.DataFrame
) -> None:
    means = frame.groupby(frame["date"].dt.month)["precipitation"].mean()
    assert means.idxmax() == 11  # November
    assert by_month["top"] == {"group": "November", "value": round(means[11], 2)}
    assert by_month["runner_up"]["group"] == "December"
    assert by_month["bottom"]["group"] == "July"
    assert by_month["top_minus_runner_up"] == round(means[11] - means[12], 2)
    assert by_month["top_over_bottom"] == round(means[11] / means[7], 2)


@pytest.mark.parametrize("group_by", [*w.GROUP_BYS, "weather"])
@pytest.mark.parametrize("aggregate", w.AGGREGATES)
def test_every_group_by_and_aggregate_works(
    selection: dict[str, Any], frame: pd.DataFrame, group_by: str, aggregate: str
) -> None:
    got = w.analyse(selection, group_by=group_by, aggregate=aggregate)
    labels = [row["group"] for row in got["table"]]
    expected_labels = {
        "month": list(w.MONTHS),
        "season": SEASON_ORDER,
        "year": ["2012", "2013", "2014", "2015"],
        "weekday": list(w.WEEKDAYS),
        "weather": ["drizzle", "fog", "rain", "snow", "sun"],
    }[group_by]
    assert labels == expected_labels
    assert sum(row["days"] for row in got["table"]) == 1461
    values = [row["value"] for row in got["table"]]
    assert got["top"]["value"] == max(values)
    assert got["bottom"]["value"] == min(values)
    dumps(got)


def test_analyse_regroups_without_new_research(
    selection: dict[str, Any], frame: pd.DataFrame
) -> None:
    got = w.analyse(selection, group_by="weather", aggregate="sum")
    expected = frame.groupby("weather")["precipitation"].sum()
    for row in got["table"]:
        assert row["value"] == pytest.approx(expected[row["group"]], abs=0.005)


def test_analyse_rejects_bad_arguments(selection: dict[str, Any]) -> None:
    with pytest.raises(w.DataError, match="aggregate 'average'"):
        w.analyse(selection, group_by="month", aggregate="average")
    with pytest.raises(w.DataError, match=r"group_by 'city'.*valid group-bys are: month"):
        w.analyse(selection, group_by="city", aggregate="mean")
    with pytest.raises(w.DataError, match="research"):
        w.analyse({}, group_by="month", aggregate="mean")


def test_small_values_keep_significant_digits(tmp_path: Path) -> None:
    path = tmp_path / "tiny.csv"
    path.write_text("date,dose\n2020-01-01,0.0012\n2020-02-01,0.0034\n", encoding="utf-8")
    plan = {"metric": "dose", "group_by": "month"}
    got = w.analyse(w.research(path, plan), group_by="month", aggregate="mean")
    assert got["decimals"] == 5
    assert [row["value"] for row in got["table"]] == [0.0012, 0.0034]
    check = w.verify(path, plan, got, "February is 0.0034, January 0.0012.")
    assert check["table_matches"]
    assert check["unsupported_numbers"] == []


# ------------------------------------------------------------------------------ rendering


def test_render_table(by_month: dict[str, Any]) -> None:
    table = w.render_table(by_month)
    lines = table.splitlines()
    assert lines[0] == "| Month | Mean precipitation | Rows | Total |"
    assert lines[1].startswith("| --- |")
    assert len(lines) == 2 + 12
    assert "| November | 5.35 mm | 120 | 642.50 mm |" in lines


def test_render_table_sum_shows_mean_column(selection: dict[str, Any]) -> None:
    table = w.render_table(w.analyse(selection, group_by="season", aggregate="sum"))
    assert table.splitlines()[0] == "| Season | Sum precipitation | Rows | Mean |"


# ------------------------------------------------------------------------------ numbers_in_text


def test_numbers_in_text_basics() -> None:
    text = "It rained 1,234.5 mm; lows hit -3 °C (−2.5 on average), 45% of days, +4 and 12 percent."
    got = w.numbers_in_text(text)
    assert [(n["text"], n["value"], n["decimals"], n["percent"]) for n in got] == [
        ("1,234.5", 1234.5, 1, False),
        ("-3", -3, 0, False),
        ("−2.5", -2.5, 1, False),
        ("45%", 45, 0, True),
        ("+4", 4, 0, False),
        ("12 percent", 12, 0, True),
    ]
    first = got[0]
    assert text[first["start"] : first["start"] + 7] == "1,234.5"
    assert "1,234.5" in first["context"]


def test_numbers_in_text_skips_words_ordinals_and_date_parts() -> None:
    text = (
        "SmolLM2 (Q4_1, v1.2, GPT-4, COVID-19) says the 2nd and 23rd days of 2013-11-05 "
        "were wet over 2012–2015 and 2012-2015, 5mm and 3x."
    )
    got = [n["text"] for n in w.numbers_in_text(text)]
    assert got == ["2013", "2012", "2015", "2012", "2015", "5", "3"]


def test_numbers_in_text_handles_lists_and_empty_input() -> None:
    assert [n["value"] for n in w.numbers_in_text("1,2,3 and 2012,2013.")] == [
        1,
        2,
        3,
        2012,
        2013,
    ]
    assert w.numbers_in_text("") == []
    assert w.numbers_in_text("no numbers here") == []


# ------------------------------------------------------------------------------ verify


def test_verify_flags_exactly_the_invented_number(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    prose = "November averages 5.35 mm, 42.7 more than July."
    check = w.verify(csv, plan, by_month, prose)
    assert check["table_matches"] is True
    assert check["mismatches"] == []
    assert check["numbers_checked"] == 2
    assert [n["text"] for n in check["unsupported_numbers"]] == ["42.7"]
    assert "42.7 more than July" in check["unsupported_numbers"][0]["context"]
    assert check["supported_numbers"] == [
        {"text": "5.35", "value": 5.35, "start": 18, "matched": "November value"}
    ]
    assert check["recomputed"] == by_month["table"]
    dumps(check)


def test_verify_supports_derived_numbers(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    prose = (
        "Across 1,461 days from 2012 to 2015, November (5.4 mm a day, 642.5 mm in all) beat "
        "December by 0.33 mm and was 13.77 times as wet as July, about 1277% of it; "
        "it holds 14.5% of the total over 12 months."
    )
    check = w.verify(csv, plan, by_month, prose)
    assert check["unsupported_numbers"] == [], check["unsupported_numbers"]
    assert check["numbers_checked"] == 10


def test_verify_respects_displayed_precision(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    # November's mean is 5.354...: 5.35 and 5.4 are right at their precision; 5.3 is the shown
    # 5.35 re-rounded (a half-way tie, accepted); 5.36, 5.2 and 2019 are not supported.
    check = w.verify(csv, plan, by_month, "5.35 5.4 5.3 5.36 5.2 2019")
    assert [n["text"] for n in check["unsupported_numbers"]] == ["5.36", "5.2", "2019"]
    matched = {n["text"]: n["matched"] for n in check["supported_numbers"]}
    assert matched == {
        "5.35": "November value",
        "5.4": "November value",
        "5.3": "November value (as shown)",
    }


def test_verify_detects_a_tampered_table(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    tampered = json.loads(json.dumps(by_month))
    tampered["table"][2]["value"] = round(tampered["table"][2]["value"] + 0.1, 2)
    check = w.verify(csv, plan, tampered, "")
    assert check["table_matches"] is False
    assert check["mismatches"] == [
        {
            "group": "March",
            "field": "value",
            "analysis": tampered["table"][2]["value"],
            "recomputed": by_month["table"][2]["value"],
        }
    ]


def test_verify_detects_tampered_summary_and_groups(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    tampered = json.loads(json.dumps(by_month))
    tampered["top"] = {"group": "December", "value": 5.02}
    del tampered["table"][0]
    tampered["table"][0]["days"] = 999
    check = w.verify(csv, plan, tampered, "")
    fields = {(m["group"], m["field"]) for m in check["mismatches"]}
    assert fields == {("January", "group"), ("February", "days"), (None, "top")}


def test_verify_follows_the_analysis_grouping(
    csv: Path, plan: dict[str, Any], selection: dict[str, Any]
) -> None:
    # A fork overrode analyse.group_by: the plan still says month.
    forked = w.analyse(selection, group_by="weather", aggregate="max")
    check = w.verify(csv, plan, forked, "")
    assert check["table_matches"] is True
    assert [r["group"] for r in check["recomputed"]] == ["drizzle", "fog", "rain", "snow", "sun"]


@pytest.mark.parametrize("group_by", [*w.GROUP_BYS, "weather"])
@pytest.mark.parametrize("aggregate", w.AGGREGATES)
def test_verify_agrees_with_analyse_everywhere(
    csv: Path, selection: dict[str, Any], group_by: str, aggregate: str
) -> None:
    for metric in ("precipitation", "temp_min"):
        plan = {"metric": metric, "group_by": group_by, "aggregate": aggregate}
        sel = selection if metric == "precipitation" else w.research(csv, plan)
        analysis = w.analyse(sel, group_by=group_by, aggregate=aggregate)
        check = w.verify(csv, plan, analysis, "")
        assert check["table_matches"], check["mismatches"]
        assert check["recomputed"] == analysis["table"]


# ------------------------------------------------------------------------------ report


def test_render_report(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any], tmp_path: Path
) -> None:
    clean = "November is wettest at 5.35 mm a day."
    report = w.render_report(
        w.DEFAULT_QUESTION, plan, by_month, clean, w.verify(csv, plan, by_month, clean)
    )
    assert report.startswith(f"# {w.DEFAULT_QUESTION}\n\n{clean}\n")
    assert w.render_table(by_month).strip() in report
    assert "## Verification" in report
    assert "every number in the prose is supported by the data" in report
    assert str(csv.parent) not in report and str(tmp_path) not in report
    assert report.endswith("\n") and not report.endswith("\n\n")

    invented = "November is wettest at 5.35 mm, 42.7 more than July."
    report = w.render_report(
        w.DEFAULT_QUESTION, plan, by_month, invented, w.verify(csv, plan, by_month, invented)
    )
    assert "1 of 2 numbers in the prose are not supported" in report
    assert "`42.7`" in report


# ------------------------------------------------------------------------------ determinism, NaN


def _pipeline(path: Path, question: str) -> list[Any]:
    prof = w.profile(path)
    plan = w.normalize_plan({}, prof, question)
    sel = w.research(path, plan)
    analysis = w.analyse(sel, group_by=plan["group_by"], aggregate=plan["aggregate"])
    prose = "The top group is 2.5 and 99.9 is made up; 45% of 2020."
    check = w.verify(path, plan, analysis, prose)
    report = w.render_report(question, plan, analysis, prose, check)
    return [prof, w.plan_schema(prof), plan, sel, analysis, w.render_table(analysis), check, report]


def test_determinism(csv: Path) -> None:
    first = [dumps(x) for x in _pipeline(csv, w.DEFAULT_QUESTION)]
    second = [dumps(x) for x in _pipeline(csv, w.DEFAULT_QUESTION)]
    assert first == second


def test_messy_csv_has_no_nan_anywhere(messy_csv: Path) -> None:
    prof = w.profile(messy_csv)
    assert [c["dtype"] for c in prof["columns"]] == ["date", "text", "number", "number", "text"]
    assert w.plan_schema(prof)["properties"]["group_by"]["enum"] == [
        *w.GROUP_BYS,
        "city",
        "note",
    ]
    outputs = _pipeline(messy_csv, "total rain per city")
    plan, sel = outputs[2], outputs[3]
    assert (plan["metric"], plan["group_by"], plan["aggregate"]) == ("rain (mm)", "city", "sum")
    assert sel["unit"] == "mm"
    assert sel["rows"] == 4 and sel["dropped_missing"] == 2  # one empty cell, one inf
    assert None in sel["dates"]
    for output in outputs:
        dumps(output)
    for group_by in [*w.GROUP_BYS, "city", "note"]:
        for aggregate in w.AGGREGATES:
            for metric in ("rain (mm)", "temp"):
                p = {"metric": metric, "group_by": group_by}
                analysis = w.analyse(
                    w.research(messy_csv, p), group_by=group_by, aggregate=aggregate
                )
                check = w.verify(messy_csv, p, analysis, "-3 and 18.5 and 7")
                assert check["table_matches"], check["mismatches"]
                dumps(analysis)
                dumps(check)
    assert dumps(_pipeline(messy_csv, "q")) == dumps(_pipeline(messy_csv, "q"))


def test_csv_without_dates_groups_by_category(tmp_path: Path) -> None:
    path = tmp_path / "sales.csv"
    path.write_text("region,sales\nnorth,10\nsouth,20.5\nnorth,\neast,5\n", encoding="utf-8")
    prof = w.profile(path)
    assert prof["date_range"] is None
    assert w.valid_group_bys(prof) == ["region"]
    plan = w.normalize_plan({"group_by": "month"}, prof, "sales by month")
    assert plan["group_by"] == "region" and "group_by" in plan["fallbacks"]
    with pytest.raises(w.DataError, match="need a date column"):
        w.research(path, {"metric": "sales", "group_by": "month"})
    analysis = w.analyse(w.research(path, plan), group_by="region", aggregate="sum")
    assert [(r["group"], r["value"]) for r in analysis["table"]] == [
        ("east", 5.0),
        ("north", 10.0),
        ("south", 20.5),
    ]
    assert analysis["top_over_bottom"] == 4.1


def test_categorical_named_like_a_date_group_by_is_not_offered(tmp_path: Path) -> None:
    path = tmp_path / "clash.csv"
    path.write_text("date,month,v\n2020-01-01,Jan,1\n2020-02-01,Feb,2\n", encoding="utf-8")
    assert w.valid_group_bys(w.profile(path)) == list(w.GROUP_BYS)
    analysis = w.analyse(
        w.research(path, {"metric": "v", "group_by": "month"}), group_by="month", aggregate="sum"
    )
    assert [r["group"] for r in analysis["table"]] == ["January", "February"]


def test_single_group_and_zero_bottom(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text("date,v\n2020-01-01,0\n2020-01-02,0\n2021-03-01,2\n", encoding="utf-8")
    sel = w.research(path, {"metric": "v", "group_by": "year"})
    by_year = w.analyse(sel, group_by="year", aggregate="sum")
    assert by_year["top_over_bottom"] is None
    assert by_year["bottom"] == {"group": "2020", "value": 0.0}
    by_season = w.analyse(sel, group_by="season", aggregate="sum")
    assert by_season["table"] == [
        {"group": "Winter", "value": 0.0, "days": 2, "mean": 0.0, "total": 0.0},
        {"group": "Spring", "value": 2.0, "days": 1, "mean": 2.0, "total": 2.0},
    ]
    single = w.analyse(
        w.research(path, {"metric": "v", "group_by": "month"}), group_by="weekday", aggregate="max"
    )
    assert len(single["table"]) == 3
    only = tmp_path / "only.csv"
    only.write_text("date,v\n2020-01-01,1\n", encoding="utf-8")
    lone = w.analyse(
        w.research(only, {"metric": "v", "group_by": "month"}), group_by="month", aggregate="mean"
    )
    assert lone["runner_up"] is None and lone["top_minus_runner_up"] is None
    assert w.verify(only, {"metric": "v"}, lone, "1")["table_matches"] is True


# ------------------------------------------------------------------------------ errors


def test_missing_path_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(w.DataError, match=r"CSV file not found: .*nope\.csv"):
        w.profile(tmp_path / "nope.csv")
    with pytest.raises(w.DataError, match="not a file"):
        w.load_table(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "CSV file is empty"),
        ("\n\n  \n", "CSV file is empty"),
        ("date,v\n", "header but no data rows"),
        ('a,b\n1,"unterminated\n', "cannot parse"),
        ("a, a\n1,2\n", "duplicate column names"),
    ],
)
def test_bad_csv_is_a_data_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(w.DataError, match=message):
        w.profile(path)


def test_non_utf8_csv_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("city,v\nZürich,1\n".encode("latin-1"))
    with pytest.raises(w.DataError, match="UTF-8"):
        w.load_table(path)


def test_plan_naming_an_unknown_column_is_a_data_error(
    csv: Path, plan: dict[str, Any], by_month: dict[str, Any]
) -> None:
    with pytest.raises(w.DataError, match=r"'humidity' is not a column.*precipitation, temp_max"):
        w.research(csv, {**plan, "metric": "humidity"})
    with pytest.raises(w.DataError, match="'weather' is a text or date column"):
        w.research(csv, {**plan, "metric": "weather"})
    with pytest.raises(w.DataError, match="group_by 'city' is not valid"):
        w.research(csv, {**plan, "group_by": "city"})
    with pytest.raises(w.DataError, match="plan has no 'metric'"):
        w.research(csv, {"group_by": "month"})
    with pytest.raises(w.DataError, match="'humidity' is not a column"):
        w.verify(csv, plan, {**by_month, "metric": "humidity"}, "")


def test_unplannable_csv_is_a_data_error(tmp_path: Path) -> None:
    numbers_only = tmp_path / "n.csv"
    numbers_only.write_text("x,y\n1,2\n", encoding="utf-8")
    with pytest.raises(w.DataError, match="nothing to group by"):
        w.plan_schema(w.profile(numbers_only))
    text_only = tmp_path / "t.csv"
    text_only.write_text("x,y\na,b\n", encoding="utf-8")
    with pytest.raises(w.DataError, match="no numeric column"):
        w.normalize_plan({}, w.profile(text_only), "")


def test_output_sizes(selection: dict[str, Any], by_month: dict[str, Any]) -> None:
    research_bytes = len(dumps(selection).encode())
    analyse_bytes = len(dumps(by_month).encode())
    assert research_bytes < 60_000
    assert analyse_bytes < 4_000
