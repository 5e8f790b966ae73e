"""A stand-in for ``python -m actors.s3.worker`` that misbehaves on request.

The recording id of each request picks the behaviour: ``die`` exits 3, ``silent`` never
answers, ``garbage`` answers a line that is not JSON, ``linger`` makes it ignore the end
of its input (so it must be killed); anything else answers Missing. A real worker's
protocol otherwise: settings line first, then one JSON request per line.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    sys.stdin.readline()  # settings
    linger = False
    for line in sys.stdin:
        request_id, _op, recording_id = json.loads(line)
        if recording_id == "die":
            sys.exit(3)
        if recording_id == "silent":
            continue
        if recording_id == "linger":
            linger = True
        answer = "{{{not json" if recording_id == "garbage" else json.dumps(
            [request_id, "missing"])
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    if linger:
        time.sleep(60)


if __name__ == "__main__":
    main()
