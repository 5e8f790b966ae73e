"""The S3 worker holds the S3 keys: it imports nothing from the daemon's working directory
and can leave no core file behind (issue #26)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.s3.objectstore import Transient
from actors.s3.process import open_object_store
from supervision.config import S3Config
from supervision.secrets import Secret

CFG = S3Config(endpoint_url="http://127.0.0.1:9", access_key_id=Secret("AKIDFAKE"),
               secret_access_key=Secret("fake-secret-value"), timeout=1.0)


async def test_a_planted_pycurl_in_the_working_directory_is_never_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a pycurl.py (and an actors/ package) in the daemon's working directory and
    PYTHONPATH=., the real worker starts and answers (connection refused), and the planted
    module never ran."""
    marker = tmp_path / "imported"
    (tmp_path / "pycurl.py").write_text(
        f"open({str(marker)!r}, 'w').write('captured')\nraise ImportError('planted')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", ".")
    async with open_object_store(CFG) as store:
        outcome = await store.head_recording("r1")
    assert outcome == Transient("ConnectError"), outcome  # the real worker answered
    assert not marker.exists()


async def test_the_worker_runs_with_core_dumps_off() -> None:
    """The running worker's core file size limit is 0 (soft and hard)."""
    async with open_object_store(CFG) as store:
        await store.head_recording("r1")
        worker = store._worker
        assert worker is not None
        limits = await trio.Path(f"/proc/{worker.process.pid}/limits").read_text()
    (line,) = [x for x in limits.splitlines() if x.startswith("Max core file size")]
    assert line.split()[4:6] == ["0", "0"], line
