"""A writer killed with SIGKILL at a random moment (core/
test_index_concurrency.py): commits in a loop after ``go`` on stdin and
prints each committed key only after ``insert()``/``update()`` returned.

    python -m programs.index_crash_writer PATH WID COMPACT_AFTER
"""

from __future__ import annotations

import random
import sys

from fxpiece import _native as native


def main() -> None:
    path, wid, compact_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    idx = native.CacheIndex(path, compact_after=compact_after)
    print("ready", flush=True)
    sys.stdin.readline()
    rng = random.Random(wid)
    i = 0
    while True:
        if rng.random() < 0.6:
            idx.insert((wid, i, 0, "crash"), {"w": wid, "i": i})
            print(i, flush=True)
            i += 1
        else:
            n = rng.randint(2, 8)
            idx.update({(wid, i + j, 0, "crash"): {"w": wid, "i": i + j} for j in range(n)})
            print(" ".join(str(i + j) for j in range(n)), flush=True)
            i += n
        if rng.random() < 0.1:
            idx.compact()  # so that kills also land inside compactions


if __name__ == "__main__":
    main()
