""":func:`programs.toy.run_toy` for a JSON spec in a fresh process, reporting
an exception instead of failing (tests/test_trust_attack.py: a warm start
that must refuse a cache).

    python -m programs.run_toy_or_error SPEC_JSON

Reports ``{"ok": True, **run_toy(...)}``, or ``{"ok": False, "type",
"msg", "filename"}`` of the exception raised.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from programs.report import report
from programs.toy import run_toy


def main(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, **run_toy(spec)}
    except Exception as e:
        return {
            "ok": False,
            "type": type(e).__name__,
            "msg": str(e),
            "filename": getattr(e, "filename", None),
        }


if __name__ == "__main__":
    report(main(json.loads(sys.argv[1])))
