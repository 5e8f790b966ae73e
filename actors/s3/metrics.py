"""The S3 worker process's metrics."""

from __future__ import annotations

from prometheus_client import Counter

# ---- S3 worker
S3_WORKER_STARTS = Counter(
    "safetynet_s3_worker_starts",
    "S3 worker processes started (the first one, then one per restart after a crash).")
