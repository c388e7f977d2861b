"""Post-grad passes and the pass manager installed in Inductor.

A pass subclasses :class:`InductorPass`, rewrites the ``torch.fx.Graph`` it
is called with in place, and has a :meth:`~InductorPass.uuid` that changes
when its code or options change (it enters the cache key). Inside a pass,
:func:`fxpiece.current_compile_range` is the :class:`~fxpiece.Range` being
compiled.

>>> import torch
>>> from fxpiece.piecewise.passes import InductorPass
>>> class CountNodes(InductorPass):
...     def __init__(self, limit: int) -> None:
...         self.limit = limit
...     def options(self):
...         return {"limit": self.limit}
...     def __call__(self, graph: torch.fx.Graph) -> None:
...         pass
>>> CountNodes(1).uuid() != CountNodes(2).uuid()
True
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import os
import sys
import sysconfig
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch.fx

from fxpiece.context import current_compile_range
from fxpiece.errors import ConfigError
from fxpiece.hashing import hash_factors, hash_files_report
from fxpiece.piecewise._torch_compat import CustomGraphPassBase
from fxpiece.ranges import Range

__all__ = ["InductorPass", "PassManager", "pass_sources"]


_MAX_MODULES = 256


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(sorted({os.path.abspath(paths[k]) + os.sep for k in keys}))


def _is_library(path: str) -> bool:
    """Part of Python or an installed third-party package (keyed by their
    versions elsewhere), not of the project."""
    return path.startswith(_library_dirs())


def _source_of(name: str) -> str | None:
    """The source file of module ``name``, found without importing anything
    and whatever this process has imported: a loaded module by its
    ``__file__``, any other through the path finder, package by package
    (each parent's search locations from its spec). So every process that
    sees the same files gives a pass the same uuid (it used to skip a
    module whose parent package was not loaded yet)."""
    mod = sys.modules.get(name)
    if mod is not None:
        path = getattr(mod, "__file__", None)
        return os.path.abspath(path) if isinstance(path, str) else None
    spec = _spec_of(name)
    origin = spec.origin if spec is not None else None
    return os.path.abspath(origin) if origin and os.path.isfile(origin) else None


def _spec_of(name: str) -> importlib.machinery.ModuleSpec | None:
    """``name``'s spec from the path finder, its parents' specs giving the
    folders to look in (nothing is imported)."""
    parent, _, _ = name.rpartition(".")
    search: list[str] | None = None  # sys.path, for a top-level name
    if parent:
        loaded = sys.modules.get(parent)
        parent_spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if parent_spec is None:
            parent_spec = _spec_of(parent)
        locations = parent_spec.submodule_search_locations if parent_spec is not None else None
        if locations is None:
            return None  # not a package: ``name`` is an attribute
        search = list(locations)
    try:
        return importlib.machinery.PathFinder.find_spec(name, search)
    except (ImportError, ValueError):
        return None


def _imports(name: str, path: str) -> set[str]:
    """Names of the modules the source at ``path`` (module ``name``)
    imports, read statically: the same answer in every process."""
    try:
        st = os.stat(path)
    except OSError:
        return set()
    return set(_imports_of(name, path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=1024)
def _imports_of(name: str, path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """:func:`_imports`, parsed once per file version."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base_pkg = ".".join(up[: len(up) - node.level + 1])
                base = f"{base_pkg}.{base}" if base else base_pkg
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(out)


def pass_sources(cls: type) -> dict[str, str]:
    """The modules a pass class can depend on, by name, with the BLAKE3 of
    their source: the class's module and, transitively, every module its
    source imports that belongs to the same top-level package or is not an
    installed library (those are keyed by their versions)."""
    root = cls.__module__
    root_file = _source_of(root)
    if root_file is None:
        raise ConfigError(
            "post_grad_passes",
            f"cannot read the source of pass class {cls.__qualname__} to build its uuid; "
            "define it in a file, or override uuid() to return a string that changes "
            "whenever its behaviour does",
        )
    top = root.split(".")[0]
    files: dict[str, str] = {}
    queue = [root]
    while queue and len(files) < _MAX_MODULES:
        name = queue.pop()
        path = _source_of(name) if name not in files else None
        if path is None:
            continue
        if name != root and name.split(".")[0] != top and _is_library(path):
            continue
        files[name] = path
        if path.endswith(".py"):
            queue.extend(sorted(_imports(name, path) - set(files)))
    report = hash_files_report(sorted(files.values()))
    digest = {f.path: f.digest for f in report.files}
    return {name: digest.get(path) or "unreadable" for name, path in sorted(files.items())}


class InductorPass(ABC):
    """A post-grad pass run by Inductor on each compiled piece."""

    @abstractmethod
    def __call__(self, graph: torch.fx.Graph) -> None:
        """Rewrite ``graph`` in place."""

    def options(self) -> Any:
        """JSON-like options that change what the pass does (enter the uuid)."""
        return None

    def uuid(self) -> str:
        """Changes whenever the pass's options or the source of anything it
        can depend on do: its module and the project modules it uses
        (:func:`pass_sources`). Override it for a pass defined without a file."""
        return hash_factors(
            {
                "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "sources": pass_sources(type(self)),
                "options": self.options(),
            }
        )

    def is_applicable_for_range(self, compile_range: Range) -> bool:
        """Whether to run when compiling for ``compile_range``."""
        return True


class PassManager(CustomGraphPassBase):
    """Runs the configured passes in order; what Inductor's
    ``post_grad_custom_post_pass`` is set to. Its uuid covers every pass's
    uuid and the compile range, so each range gets its own Inductor cache
    entry."""

    def __init__(self, passes: Sequence[InductorPass], compile_range: Range | None) -> None:
        self.passes = tuple(passes)
        self.compile_range = compile_range

    def __call__(self, graph: torch.fx.Graph) -> None:
        r = current_compile_range() or self.compile_range
        for p in self.passes:
            if r is None or p.is_applicable_for_range(r):
                p(graph)

    def uuid(self) -> str:
        r = self.compile_range
        return hash_factors(
            {
                "passes": [p.uuid() for p in self.passes],
                "range": None if r is None else [r.start, r.end],
            }
        )
