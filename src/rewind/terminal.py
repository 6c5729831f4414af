"""Untrusted text on the terminal: shown as inert text, whatever it contains.

Run ids, node and step names, error messages, state values and imported span names come from
users' code, users' data and foreign systems. Printed through Rich as markup, ``[/x]`` in an
error message crashes the command (``MarkupError``) and ``ab[red]cd`` is printed mangled; printed
raw, an escape sequence (``\\x1b[2J``), a carriage return, an OSC 8 hyperlink or a bidi override
(Trojan Source) clears the screen, overwrites a line, re-colours what follows or reorders it.
Every string that did not come from Rewind itself goes through this module before it reaches a
terminal, so it can never change how anything else on the screen is rendered:

- :func:`visible` writes every control, bidi and invisible formatting character as an escape
  (``\\u001b``, ``\\r``, ``\\u202e``), in the notation JSON uses, so the user sees it.
- :func:`inert` is :func:`visible` plus markup escaping: safe inside a Rich markup string.
- :func:`json_text` is Rich's ``print_json`` rendering with :func:`visible` applied.
- :func:`console` makes the consoles commands print through (no emoji codes: ``:skull:`` in a
  node name stays ``:skull:``; no highlighting).
- :class:`InertLogFormatter` does the same for log lines.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from typing import Any

from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.text import Text

__all__ = ["InertLogFormatter", "console", "inert", "json_text", "visible"]

_SHORT = {"\n": "\\n", "\r": "\\r"}
_JOINERS = frozenset("\u200c\u200d")
"""Zero-width (non-)joiners are Cf characters that ordinary text needs (emoji sequences, Persian,
Indic scripts); they cannot move or recolour anything, so they stay."""
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode general categories written as escapes: controls (C0, DEL, C1: ESC, CSI, BEL, CR...),
formatting characters (bidi embeddings/overrides/isolates, marks, zero-width space, BOM), lone
surrogates (they cannot even be encoded to UTF-8) and line/paragraph separators."""


def _escape_char(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` (``str()`` of it) with every dangerous character written as a visible escape.

    Args:
        text: any value; it is converted with ``str()``.
        multiline: keep ``\\n`` as a line break (a JSON document, a text diff, a log record
            with its traceback); otherwise it is shown as ``\\n`` so the value stays on one line.

    Returns:
        the text with C0/C1 controls (except tab, and newline when ``multiline``), formatting
        characters such as bidi overrides (except the zero-width joiners), lone surrogates and
        line/paragraph separators replaced by ``\\n``, ``\\r``, ``\\uXXXX`` or ``\\UXXXXXXXX``.
        Printable text, including every non-ASCII letter and emoji, is unchanged.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable() and s.isascii():  # the common case: nothing to look at
        return s
    out = []
    for ch in s:
        if ch == "\t" or (ch == "\n" and multiline) or ch in _JOINERS:
            out.append(ch)
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            out.append(_escape_char(ch))
        else:
            out.append(ch)
    return "".join(out)


_BRACKETS = re.compile(r"(\\*)(\[[a-z#/@][^[]*?]|\[|\Z)")
"""Backslashes, then a tag-shaped bracket (Rich's own tag pattern), any other ``[``, or the end."""
_SEAL = "[b][/b]"
"""An empty styled span ending inert text: its trailing backslashes, or an unclosed ``[a`` at its
end, stay literal whatever markup or text follows them."""


def _escape_bracket(match: re.Match[str]) -> str:
    backslashes, what = match.groups()
    if what == "":  # the end: halved if a tag follows, so double them and end with a tag
        return backslashes * 2 + _SEAL if backslashes else ""
    if what == "[":  # Rich turns "\[" outside a tag into "[": give it one more backslash
        return backslashes + "\\["
    return backslashes * 2 + "\\" + what  # Rich halves them and shows the escaped tag


def inert(text: object, *, multiline: bool = False) -> str:
    """``text`` made safe to interpolate into a Rich markup string: :func:`visible`, then markup
    escaping, so it renders as exactly ``visible(text)``: ``[red]`` is shown, never applied;
    ``[/x]`` cannot crash; backslashes cannot escape the markup around it.

    Rich's ``escape`` covers tags only; ``\\[`` outside a tag and trailing backslashes before
    a following tag still lose a backslash with it, hence this version of it.

    Args:
        text: any value (``str()`` of it); see :func:`visible` for ``multiline``.
    """
    shown = visible(text, multiline=multiline)
    if "[" not in shown and not shown.endswith("\\"):
        return shown
    escaped = _BRACKETS.sub(_escape_bracket, shown)
    if shown.rfind("[") > shown.rfind("]") and not escaped.endswith(_SEAL):
        # An unclosed "[a" at the end must not become a tag with what follows it ("red]...").
        escaped += _SEAL
    return escaped


def console(*, stderr: bool = False) -> Console:
    """The Rich console a command prints through: no highlighting and no ``:emoji:`` codes (a
    node named ``:skull:`` is printed as typed). Untrusted text still goes through
    :func:`inert` (markup) or :func:`visible` (``markup=False``)."""
    return Console(stderr=stderr, highlight=False, emoji=False)


def json_text(value: Any) -> Text:
    """``value`` as indented, highlighted JSON, exactly as Rich's ``Console.print_json`` renders
    it (indent 2, non-ASCII kept, no wrapping; print it with ``soft_wrap=True``), but with
    :func:`visible` applied: JSON itself escapes C0 controls, not C1 controls or bidi overrides.

    Args:
        value: a JSON-like value; other objects are shown with ``str()``.
    """
    dumped = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    text = JSONHighlighter()(visible(dumped, multiline=True))
    text.no_wrap = True
    text.overflow = None
    return text


class InertLogFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose lines pass through :func:`visible` (line breaks kept:
    a record may carry a traceback), so a node name or error message in a log line cannot drive
    the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record with dangerous characters escaped."""
        return visible(super().format(record), multiline=True)
