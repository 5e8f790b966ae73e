"""The docs stay true about the house: every repository path that README.md and docs/*.md
name exists, and the README fits a screen or two."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPS = ("actors/", "supervision/", "tests/", "bench/", "config/", "deploy/", "docs/",
        "requirements/", "tools/", ".ci/")
FILES = ("Makefile", "Dockerfile", "pyproject.toml", ".dockerignore")
# a repository path as prose names it: from a top-level folder, or one of the root files
_TOPS = "|".join(map(re.escape, TOPS))
_FILES = "|".join(map(re.escape, FILES))
PATH = re.compile(rf"(?<![\w./-])((?:{_TOPS})[\w./<>*{{}}-]*|(?:{_FILES})(?![\w.]))")
PLACEHOLDERS = ("<", ">", "*", "{", "}", "NNNN", "NAME")
README_MAX_LINES = 140


def named_paths(text: str) -> list[str]:
    """The paths *text* names, without trailing punctuation or a ``::test`` suffix;
    patterns (``actors/<job>/``, ``NNNN_*.sql``) are not paths."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".,:;)").split("::")[0]
        if not any(mark in path for mark in PLACEHOLDERS):
            found.append(path)
    return found


def test_every_path_the_docs_name_exists() -> None:
    missing = [f"{doc.relative_to(ROOT)}:{n}: {path}"
               for doc in DOCS for n, line in enumerate(doc.read_text().splitlines(), 1)
               for path in named_paths(line) if not (ROOT / path).exists()]
    assert missing == []


def test_the_path_finder_sees_paths_and_skips_patterns() -> None:
    line = ("see `supervision/db/migrate.py`, tests/unit/house/test_docs.py::test_x, "
            "`actors/<job>/settings.py`, `NNNN_*.sql`, the Makefile, AWS config/credentials.")
    assert named_paths(line) == ["supervision/db/migrate.py",
                                 "tests/unit/house/test_docs.py", "Makefile",
                                 "config/credentials"]


def test_the_readme_fits_in_140_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES
