"""The ``fxpiece`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="fxpiece", description="fxpiece command line")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile a toy Llama piecewise, cold and warm", add_help=False)
    if argv[:1] == ["demo"]:
        from fxpiece.demo import main as demo_main

        return demo_main(argv[1:])
    parser.parse_args(argv)
    return 2
