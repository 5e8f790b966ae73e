"""Text that came from data, made safe to print on an operator's terminal.

>>> printable("s3:http_503\x1b[2J")
's3:http_503\\x1b[2J'
>>> cell("video/[/x] :warning:").plain
'video/[/x] :warning:'

A ``last_error`` or an id is written by other services and by S3: it may hold terminal
control sequences (which would recolour, retitle or clear the operator's terminal) or
rich markup and emoji codes (which rich would interpret — or crash on, as on a stray
closing tag). Both are shown as the text they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text


def printable(text: object) -> str:
    """*text* with every non-printable character (controls, escapes, line and format
    characters) spelled as a Python escape, so what is printed is what is stored."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))


def cell(text: object) -> Text:
    """:func:`printable` as a rich ``Text``: a table cell that rich never parses for
    markup or emoji codes (stronger than ``rich.markup.escape``, which leaves a
    backslash before a non-tag bracket to be eaten)."""
    from rich.text import Text  # rich loads only for the verbs that draw tables

    return Text(printable(text))
