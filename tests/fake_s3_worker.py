"""A stand-in for ``python -m actors.s3.worker`` that misbehaves on request.

The recording id of each request picks the behaviour: ``die`` exits 3, ``silent`` never
answers, ``garbage`` answers a line that is not JSON, ``linger`` makes it ignore the end
of its input (so it must be killed), ``whoami`` answers a Transient naming the access key
it would sign with now (``signed_by:<key id>``, from its settings or the last credentials
line); anything else answers Missing. A real worker's protocol otherwise: settings line
first, then one JSON request or credentials line per line.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    credentials = json.loads(sys.stdin.readline())["credentials"]  # settings
    signer = credentials[0] if credentials else None
    linger = False
    for line in sys.stdin:
        fields = json.loads(line)
        if fields[0] == "credentials":  # new keys: [tag, key id, secret, token]
            signer = fields[1]
            continue
        request_id, _op, recording_id = fields
        if recording_id == "die":
            sys.exit(3)
        if recording_id == "silent":
            continue
        if recording_id == "linger":
            linger = True
        if recording_id == "whoami":
            answer = json.dumps([request_id, "transient", f"signed_by:{signer}"])
        elif recording_id == "garbage":
            answer = "{{{not json"
        else:
            answer = json.dumps([request_id, "missing"])
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    if linger:
        time.sleep(60)


if __name__ == "__main__":
    main()
