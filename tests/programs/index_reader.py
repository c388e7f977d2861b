"""A reader on a shared index (core/test_index_concurrency.py): refreshes in
a loop while the writers run until the file STOP exists; the set of keys it
sees must only grow (no torn file, no entry that comes and goes).

    python -m programs.index_reader PATH STOP USE_FLOCK
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

from fxpiece import _native as native


def main() -> None:
    warnings.simplefilter("error")
    path, stop, use_flock = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    kw: dict[str, Any] = {} if use_flock else {"use_flock": False, "host": "reader"}
    idx = native.CacheIndex(path, **kw)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    seen: set[Any] = set()
    refreshes = 0
    while not os.path.exists(stop):
        idx.refresh()
        refreshes += 1
        own = {k for k in idx.keys() if k[3] == "own"}  # noqa: SIM118 (a native method)
        lost = seen - own
        assert not lost, f"keys disappeared: {sorted(lost)[:5]}"
        seen = own
        time.sleep(0.003)
    print(json.dumps({"refreshes": refreshes, "seen": len(seen)}), flush=True)


if __name__ == "__main__":
    main()
