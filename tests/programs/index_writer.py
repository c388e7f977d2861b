"""A writer on a shared index (core/test_index_concurrency.py): builds its
handle, says ``ready``, waits for ``go`` on stdin (so all start at once),
then commits its own keys (single inserts and ``update()`` batches) and, now
and then, a shared key. Any warning (a corrupt file seen) is an error.
Imports only the native module (no torch).

    python -m programs.index_writer PATH WID USE_FLOCK N_KEYS N_SHARED COMPACT_AFTER
"""

from __future__ import annotations

import json
import random
import sys
import warnings
from typing import Any

from fxpiece import _native as native


def main() -> None:
    warnings.simplefilter("error")
    path, wid, use_flock = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    n_keys, n_shared, compact_after = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    kw: dict[str, Any] = {} if use_flock else {"use_flock": False, "host": f"host{wid}"}
    idx = native.CacheIndex(path, compact_after=compact_after, **kw)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"

    rng = random.Random(wid)
    last_shared: dict[int, int] = {}
    seq, i, commits, compactions = 0, 0, 0, 0

    def shared_write(into: dict[Any, Any]) -> None:
        nonlocal seq
        s = rng.randrange(n_shared)
        seq += 1
        into[(-1, s, 0, "shared")] = {"w": wid, "seq": seq}
        last_shared[s] = seq

    while i < n_keys:
        if rng.random() < 0.5:
            idx.insert((wid, i, 0, "own"), {"w": wid, "i": i})
            i += 1
        else:
            n = min(rng.randint(2, 12), n_keys - i)
            batch: dict[Any, Any] = {
                (wid, i + j, 0, "own"): {"w": wid, "i": i + j} for j in range(n)
            }
            if rng.random() < 0.5:
                shared_write(batch)
            idx.update(batch)
            i += n
        commits += 1
        if rng.random() < 0.2:
            one: dict[Any, Any] = {}
            shared_write(one)
            idx.update(one)
            commits += 1
        if rng.random() < 0.05:
            idx.refresh()
        if rng.random() < 0.04:
            # Explicit compactions on top of the automatic ones (which wait for
            # more logs as the index grows). With flock, wait for the lock half of
            # the time (else a busy lock skips); without, they really race.
            compactions += idx.compact(timeout=60.0 if rng.random() < 0.5 else None)
    out = {"last_shared": last_shared, "commits": commits, "compactions": compactions}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
