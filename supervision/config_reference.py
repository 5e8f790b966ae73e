"""Regenerate README.md's configuration reference: ``python -m supervision.config_reference``."""

from __future__ import annotations

import sys
from pathlib import Path

from supervision.config import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def rewrite(readme: Path) -> bool:
    """Replace the block between the markers; return True when the file changed."""
    text = readme.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{reference_markdown()}\n{END}{tail}"
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    changed = rewrite(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md"))
    print("README.md updated" if changed else "README.md already up to date")
