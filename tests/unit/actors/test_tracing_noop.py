"""Spans before tracing is configured: nothing is recorded and nothing is built."""

from __future__ import annotations

import pytest

from actors import tracing


def test_spans_are_one_shared_no_op_until_tracing_is_configured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A span per row costs no attributes and no tracer call while tracing is off."""
    monkeypatch.setattr(tracing, "_configured", False)  # as in a daemon without endpoint
    first = tracing.span("recording-finalize.row", recording_id="r1")
    assert first is tracing.span("recording-finalize.row", recording_id="r2")
    with first as current:
        assert not current.is_recording()
