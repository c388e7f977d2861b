"""Benchmark: hashing every .py file of the installed torch package (or PATHs).

    python benches/bench_hash.py [PATH ...] [--runs N]

The same as ``fxpiece bench hash``; see :mod:`fxpiece.bench_hash`. Prints
fxpiece vs the reference (Python reads, joins path and contents with
newlines, one sha256) vs the read floor, with the targets (>= 10x faster than
the reference, <= 1.5x the read floor).
"""

from fxpiece.bench_hash import main

if __name__ == "__main__":
    raise SystemExit(main())
