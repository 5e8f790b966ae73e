"""What do the dev stack's bulk uploads cost, against httpx? (issue 29, the suite's CPU)

A benchmark (not a test). The tests and the demo seed their recordings' binaries with
many PUTs (the chaos scenarios thousands each). ``put_objects`` (libcurl: HTTP and SigV4
in C, 16 on the wire) is timed against the baseline the suite used before: httpx's
``AsyncClient`` under Trio with httpx-auth's ``AWS4Auth``, 16 at a time over a pool of 16
connections. Both PUT ``--objects`` 64-byte audio/ogg objects with their duration
metadata into the same SeaweedFS, alternately, ``--rounds`` times. Reported per round:
CPU per PUT of the caller and of SeaweedFS, wall time, and the ratios to the baseline.

    .venv/bin/python bench/uploads.py [--rounds 3] [--objects 3000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import trio
from httpx_auth import AWS4Auth

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._measure import CpuMeter
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.dev.uploads import Upload, object_headers

BUCKET = "bench-uploads"
BODY = b"OggS" + bytes(60)
HEADERS = object_headers("audio/ogg", {"duration-seconds": "42"})


def with_httpx(s3: S3Server, keys: list[str]) -> None:
    creds = s3.credentials
    auth = AWS4Auth(creds.access_key_id, creds.secret_access_key, creds.region, "s3")

    async def main() -> None:
        limiter = trio.CapacityLimiter(16)

        async def put(client: httpx.AsyncClient, key: str) -> None:
            async with limiter:
                response = await client.put(f"/{BUCKET}/{key}", content=BODY,
                                            headers=HEADERS)
            response.raise_for_status()

        async with httpx.AsyncClient(base_url=s3.endpoint_url, auth=auth, timeout=30,
                                     limits=httpx.Limits(max_connections=16)) as client, \
                trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(put, client, key)

    trio.run(main)


def with_curl(s3: S3Server, keys: list[str]) -> None:
    s3.put_objects(BUCKET, [Upload(key, BODY, HEADERS) for key in keys])


def measure(s3: S3Server, upload: Callable[[S3Server, list[str]], None], n: int
            ) -> tuple[float, float, float]:
    """(caller ms/PUT, SeaweedFS ms/PUT, wall s); every object is checked afterwards."""
    keys = [f"call-recordings/{uuid.uuid4()}" for _ in range(n)]
    meter = CpuMeter({"weed": s3.pid})
    with meter.measure():
        upload(s3, keys)
    for key in keys[:: max(1, n // 20)]:
        assert s3.head_object(BUCKET, key)["x-amz-meta-duration-seconds"] == "42"
    return (meter.used["python"] / n * 1e3, meter.used["weed"] / n * 1e3, meter.wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--objects", type=int, default=3000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="safetynet-bench-uploads-"))
    s3 = S3Server(base)
    start_all([s3])
    try:
        s3.create_bucket(BUCKET)
        with_curl(s3, [f"warm/{n}" for n in range(200)])  # volumes grown, connections up
        print(f"{args.objects} PUTs a round | caller ms/PUT | SeaweedFS ms/PUT | wall s")
        for round_no in range(1, args.rounds + 1):
            base_caller, base_weed, base_wall = measure(s3, with_httpx, args.objects)
            caller, weed, wall = measure(s3, with_curl, args.objects)
            print(f"round {round_no} httpx + AWS4Auth | {base_caller:.3f} | {base_weed:.3f} "
                  f"| {base_wall:.2f}")
            print(f"round {round_no} put_objects      | {caller:.3f} | {weed:.3f} "
                  f"| {wall:.2f}")
            print(f"round {round_no} ratio to httpx   | {caller / base_caller:.2f} "
                  f"| {weed / base_weed:.2f} | {wall / base_wall:.2f}")
    finally:
        stop_all([s3])
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
