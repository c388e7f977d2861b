"""Holds an exclusive flock on PATH (core/test_index.py), says ``locked``,
then sleeps until it is killed.

    python -m programs.hold_flock PATH
"""

from __future__ import annotations

import fcntl
import sys
import time


def main() -> None:
    f = open(sys.argv[1], "a")  # noqa: SIM115 (held until the process is killed)
    fcntl.flock(f, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main()
