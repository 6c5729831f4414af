"""rewind.terminal: untrusted text is shown inert (markup literal, controls escaped)."""

from __future__ import annotations

import io
import json
import logging
import unicodedata

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from rewind.terminal import InertLogFormatter, console, inert, json_text, visible
from tests.hostile import HOSTILE, SHOWN

DANGEROUS = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def render(markup: str) -> str:
    """What a terminal receives when ``markup`` is printed through Rich with colours on."""
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system="truecolor", width=500).print(
        markup, soft_wrap=True
    )
    return buf.getvalue()


def test_hostile_string_is_shown_escaped() -> None:
    assert visible(HOSTILE) == SHOWN
    assert Text.from_markup(inert(HOSTILE)).plain == SHOWN


def test_markup_around_inert_text_keeps_its_meaning() -> None:
    out = render(f"[bold]{inert(HOSTILE)}[/] after")
    # Rewind's own markup still applies; the hostile text neither closes nor opens a style,
    # so " after" is printed unstyled (the reset comes right before it).
    assert "\x1b[1m" in out and out.rstrip().endswith("\x1b[0m after")
    for raw in ("\x1b[2J", "\x1b]8", "\x07", "\u202e", "\r"):
        assert raw not in out


def test_backslashes_cannot_escape_the_markup_around_them() -> None:
    for text in ("\\[", "\\[x", "a\\", "a\\\\", "\\[b]", "\\\\[a]", "[\\", "\\[[a]"):
        assert Text.from_markup(f"[bold]{inert(text)}[/bold]").plain == text
        assert Text.from_markup(f"({inert(text)}) [red]x[/]").plain == f"({text}) x"
        assert Text.from_markup(inert(text)).plain == text


def test_console_prints_emoji_codes_as_typed() -> None:
    out = console()
    with out.capture() as captured:
        out.print(f"node {inert(':skull: :red_circle:')}")
    assert captured.get() == "node :skull: :red_circle:\n"


def test_printable_text_is_unchanged() -> None:
    text = "résumé 東京 [not markup] a/b\tc ‍👩‍💻 x\u200cy"
    assert visible(text) == text
    assert visible("two\nlines") == "two\\nlines"
    assert visible("two\nlines", multiline=True) == "two\nlines"


def test_every_kind_of_dangerous_character_is_escaped() -> None:
    cases = {
        "\x1b": "\\u001b",  # ESC (CSI, OSC sequences start with it)
        "\x9b": "\\u009b",  # C1 CSI: some terminals honour it alone
        "\x7f": "\\u007f",
        "\r": "\\r",
        "\u202e": "\\u202e",  # right-to-left override
        "\u2067": "\\u2067",  # right-to-left isolate
        "\u200b": "\\u200b",  # zero-width space
        "\u2028": "\\u2028",  # line separator
        "\ud800": "\\ud800",  # lone surrogate: cannot even be encoded
        "\U000e0041": "\\U000e0041",  # tag character
    }
    for raw, shown in cases.items():
        assert visible(f"a{raw}b") == f"a{shown}b"


BRACKETY = st.text(alphabet="[]/\\ab=# \x1b", max_size=12)


@given(st.one_of(st.text(), BRACKETY), BRACKETY)
def test_inert_text_renders_as_exactly_its_visible_form(text: str, tail: str) -> None:
    # Never a MarkupError, markup in the text is never applied, and it cannot swallow or escape
    # the markup around it (Rewind's own tags, or another inert string).
    assert Text.from_markup(f"[bold]{inert(text)}[/bold]").plain == visible(text)
    assert Text.from_markup(f"{inert(text)}{inert(tail)}[red]x[/]").plain == (
        visible(text) + visible(tail) + "x"
    )
    assert Text.from_markup(inert(text)).plain == visible(text)


@given(st.text())
def test_visible_text_holds_no_dangerous_character(text: str) -> None:
    for multiline in (False, True):
        shown = visible(text, multiline=multiline)
        allowed = {"\t", "\u200c", "\u200d"} | ({"\n"} if multiline else set())
        bad = [c for c in shown if unicodedata.category(c) in DANGEROUS and c not in allowed]
        assert bad == []
        shown.encode("utf-8")  # lone surrogates are gone too


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))))
def test_visible_keeps_safe_text(text: str) -> None:
    assert visible(text) == text


def test_json_text_matches_rich_print_json_on_benign_values() -> None:
    value = {"a": [1, 2.5, None, True], "é": "東京", "nested": {"k": "v"}}
    ours, rich = io.StringIO(), io.StringIO()
    Console(file=ours, width=120, force_terminal=True).print(json_text(value), soft_wrap=True)
    Console(file=rich, width=120, force_terminal=True).print_json(json.dumps(value))
    assert ours.getvalue() == rich.getvalue()


def test_json_text_escapes_what_json_leaves_raw() -> None:
    text = json_text({"x": "a\u202eb\x9bc\x1bd"}).plain
    assert "\u202e" not in text and "\x9b" not in text and "\x1b" not in text
    assert json.loads(text) == {"x": "a\u202eb\x9bc\x1bd"}  # still the same JSON document


def test_log_formatter_escapes_the_record() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(InertLogFormatter("%(message)s"))
    log = logging.getLogger("rewind.test_terminal")
    log.addHandler(handler)
    try:
        log.error("node %s failed\nsecond line", HOSTILE)
    finally:
        log.removeHandler(handler)
    assert stream.getvalue() == f"node {SHOWN} failed\nsecond line\n"
