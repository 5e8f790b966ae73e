"""Classification of a HEAD object answer (SPEC §3), on odd metadata: never an exception,
always an outcome that says why."""

from __future__ import annotations

import pytest

from actors.s3.objectstore import Found, HeadOutcome, Poison, classify_object

KEY = "call-recordings/r1"


def _headers(**overrides: str) -> dict[str, str]:
    headers = {"content-type": "audio/ogg", "content-length": "64",
               "x-amz-meta-duration-seconds": "42"}
    headers.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return headers


def test_well_formed_metadata_is_adopted() -> None:
    """The plain case still works: ASCII digits within range."""
    assert classify_object(KEY, 200, _headers(x_amz_meta_duration_seconds=" 7 ")) == Found(
        KEY, 64, "Ogg", 7)


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        ("\u00b2", Poison("duration_invalid:?")),  # '²'.isdigit() is True, int('²') raises
        ("\u0663", Poison("duration_invalid:?")),  # ARABIC-INDIC DIGIT THREE: int() takes it
        ("9" * 4300, Poison("duration_invalid:" + "9" * 32)),  # past int's str digit limit
        ("9" * 5000, Poison("duration_invalid:" + "9" * 32)),
        ("2147483648", Poison("duration_invalid:2147483648")),  # past the int column
        ("-1", Poison("duration_invalid:-1")),
        ("4.5", Poison("duration_invalid:4.5")),
        ("", Poison("duration_invalid:")),
        ("1\x002", Poison("duration_invalid:1?2")),
    ],
)
def test_odd_duration_is_poison_with_a_printable_reason(duration: str,
                                                        expected: HeadOutcome) -> None:
    """Only ASCII digits that fit ``duration_seconds`` are adopted; the reason is printable."""
    assert classify_object(KEY, 200, _headers(x_amz_meta_duration_seconds=duration)) == expected


@pytest.mark.parametrize("length", ["\u00b2", "6\u00b2", "1" * 4400, str(2**63), "", "0x40"])
def test_odd_content_length_is_poison(length: str) -> None:
    """A Content-Length that is not a bigint of ASCII digits quarantines the row."""
    assert classify_object(KEY, 200, _headers(content_length=length)) == Poison(
        "content_length_missing")


def test_unknown_content_type_reason_is_printable() -> None:
    """Control and non-ASCII characters of a Content-Type never reach ``last_error``."""
    outcome = classify_object(KEY, 200, _headers(content_type="audio/\x00og\u00ff"))
    assert outcome == Poison("content_type_unknown:audio/?og?")
