"""A writer for core/test_native_pidns.py (run inside and outside a fresh
PID namespace): says hello (its host name and pid), waits for the START
file, then commits ``n`` keys, refreshing between commits (every refresh
lists the folder and cleans temp files), compacting now and then. Prints how
many commits succeeded and the first failures.

    python -m programs.pidns_writer PATH START WID N
"""

from __future__ import annotations

import json
import os
import sys
import time

from fxpiece import _native as native


def main() -> None:
    path, start, wid, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    idx = native.CacheIndex(path, compact_after=16)
    print(json.dumps({"ready": True, "host": idx.host, "pid": os.getpid()}), flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(start):
        assert time.monotonic() < deadline, "never started"
        time.sleep(0.001)
    ok, failures = 0, []
    for i in range(n):
        try:
            idx.insert((i, i + 1, 0, wid), {"w": wid, "i": i})
            ok += 1
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")
        idx.refresh()
        if i % 25 == 24:
            idx.compact()
    out = {"ok": ok, "failures": failures[:5], "n_failures": len(failures)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
