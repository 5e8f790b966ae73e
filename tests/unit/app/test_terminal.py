"""Text from data is printed as the text it is: no control sequence, markup or emoji code
of its own takes effect on the operator's terminal."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from supervision.app.terminal import cell, printable


def test_control_characters_are_spelled_out_not_sent() -> None:
    """Escape sequences, bells, newlines and bidi overrides become visible escapes;
    printable text (accents included) is left alone."""
    stored = "s3:http_503\x1b[2J\x1b]0;owned\x07\nnext\u202eélan"
    shown = printable(stored)
    assert shown == "s3:http_503\\x1b[2J\\x1b]0;owned\\x07\\nnext\\u202eélan"
    assert shown.isprintable()


def test_a_table_cell_with_markup_renders_verbatim() -> None:
    """A last_error holding a stray closing tag, a style tag, an emoji code and a
    backslash before a bracket renders exactly as stored (rich crashed on the first)."""
    stored = r"video/[/x] [bold red]x[/] :warning: \[y"
    table = Table()
    table.add_column("last_error")
    table.add_row(cell(stored))
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    assert stored in out.getvalue()
