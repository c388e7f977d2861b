"""Build the API reference from the docstrings with pdoc (``make docs``).

Usage: ``python docs/build_api.py OUTPUT_DIR``. Writes one HTML page per public
module of fxpiece (``OUTPUT_DIR/index.html`` is the start page).

pdoc documents a package's submodules itself unless the package has
``__all__``; then only those it names. The modules it would not reach that
way are named here, once each, so every public module gets its page.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import pdoc
import pdoc.render

import fxpiece


def modules() -> list[str]:
    """``fxpiece`` and every public submodule pdoc would not find on its own."""
    names = ["fxpiece"]
    for info in pkgutil.walk_packages(fxpiece.__path__, "fxpiece."):
        parts = info.name.split(".")
        if any(part.startswith("_") for part in parts):
            continue
        parent = importlib.import_module(".".join(parts[:-1]))
        if parts[-1] not in getattr(parent, "__all__", [parts[-1]]):
            names.append(info.name)
    return names


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/build_api.py OUTPUT_DIR", file=sys.stderr)
        return 2
    pdoc.render.configure(docformat="restructuredtext")
    pdoc.pdoc(*modules(), output_directory=Path(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
