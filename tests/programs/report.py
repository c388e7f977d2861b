"""Torch-free helpers for subprocess programs: report a JSON result to the
test that started the program (:func:`programs.run.run_program` reads it),
count differences, keep log messages."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

RESULT_MARK = "FXPIECE-TEST-RESULT:"


def report(value: Any) -> None:
    """Pass ``value`` (JSON) back to the test; the last report wins."""
    print(RESULT_MARK + json.dumps(value), flush=True)


def counter_diff(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Non-zero differences of two counter snapshots."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def keep_logs(name: str = "fxpiece") -> list[str]:
    """The messages logger ``name`` emits from now on (a list that grows)."""
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    logging.getLogger(name).addHandler(Keep())
    return kept
