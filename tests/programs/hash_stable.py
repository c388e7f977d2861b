"""Hashes in a fresh interpreter (core/test_hashing.py: digests do not depend
on the process or PYTHONHASHSEED). Imports only the native module. Prints
``[hash_files(paths), hash_factors(value), hash_files_report(paths) digest]``.

    python -m programs.hash_stable PATHS_JSON
"""

from __future__ import annotations

import json
import sys

from fxpiece import _native as native


def main() -> None:
    paths = json.loads(sys.argv[1])
    value = {"z": [1, 2.5, None, True, "s", (3, 4)], "a": {"y": 2**80, "x": b"\x01"}, "m": -7}
    out = [
        native.hash_files(paths),
        native.hash_factors(value),
        native.hash_files_report(paths)[0],
    ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
