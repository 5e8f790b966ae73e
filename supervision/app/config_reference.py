"""Regenerate the configuration reference in ``docs/configuration.md``:

    python -m supervision.app.config_reference [PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

from supervision.app.settings import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
DEFAULT_PATH = Path("docs/configuration.md")


def rewrite(doc: Path) -> bool:
    """Replace the block between the markers; return True when the file changed."""
    text = doc.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{reference_markdown()}\n{END}{tail}"
    if new != text:
        doc.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    print(f"{path} updated" if rewrite(path) else f"{path} already up to date")
