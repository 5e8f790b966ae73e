"""The scrubber's key words are one list (``SCRUBBED_KEY_WORDS``): every word in it masks
the value of a key that holds it, and a key holding none keeps its value."""

from __future__ import annotations

import pytest

from supervision.secrets import REDACTED, SCRUBBED_KEY_WORDS, SENSITIVE_KEY_WORDS, Scrubber


@pytest.mark.parametrize("word", SCRUBBED_KEY_WORDS)
def test_every_scrubbed_key_word_masks_the_value_of_its_key(word: str) -> None:
    line = f"connecting with x_{word}_y=hunter2-value&region=eu"
    assert Scrubber().scrub(line) == f"connecting with x_{word}_y={REDACTED}&region=eu"


def test_a_key_without_a_scrubbed_word_keeps_its_value() -> None:
    assert Scrubber().scrub("bucket=recordings&region=eu") == "bucket=recordings&region=eu"


def test_the_sensitive_words_are_among_the_scrubbed_ones() -> None:
    assert set(SENSITIVE_KEY_WORDS) <= set(SCRUBBED_KEY_WORDS)
