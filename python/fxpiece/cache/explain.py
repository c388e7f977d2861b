"""Why did it recompile: which cache-key factors differ between two keys.

A key is BLAKE3 over the factor groups written to each model folder's
``cache_key_factors.json`` (``env``, ``config``, ``inductor``, ``graph``,
``code``, ``compiler``; see :mod:`fxpiece.cache.keys`). :func:`diff_factors`
compares two such dicts and names exactly what differs, so "why did it
recompile" has a one-line answer (:meth:`FactorDiff.summary`). It is pure
(no I/O) and fast: equal groups are skipped with one comparison.

>>> from fxpiece.cache.explain import diff_factors
>>> a = {"env": {}, "config": {"compile_sizes": [16]}, "graph": "ab12", "code": {"files": {}}}
>>> b = {"env": {}, "config": {"compile_sizes": [16, 32]}, "graph": "ab12", "code": {"files": {}}}
>>> d = diff_factors(a, b)
>>> d.summary()
'config.compile_sizes: [16] -> [16, 32]'
>>> d.same, [c.name for c in d.config]
(False, ['compile_sizes'])
>>> diff_factors(a, a).summary()
'no factor differs (same key)'
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fxpiece.cache.keys import GROUPS, factors_key
from fxpiece.cache.layout import FACTORS_FILE, KEY_DIR_LEN, CacheLayout
from fxpiece.cache.safeio import read_regular
from fxpiece.context import SAFE_NAME
from fxpiece.errors import CacheError

__all__ = [
    "Change",
    "FactorDiff",
    "FileChange",
    "diff_factors",
    "load_factors",
    "nearest_sibling",
    "read_factors",
    "resolve_model_folder",
]

Kind = Literal["added", "removed", "changed"]

_HEX = re.compile(r"^[0-9a-f]{1,64}$")
_MISSING: Any = object()
FACTORS_LIMIT = 64 << 20
"""Largest ``cache_key_factors.json`` read (bytes)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One factor that differs: ``old`` is its value in A, ``new`` in B
    (``None`` with ``kind`` ``"added"``/``"removed"`` when absent)."""

    group: str
    """``env``, ``config``, ``inductor``, ``graph``, ``code``, ``compiler``, or
    another top-level group."""
    name: str
    """The factor inside its group (dotted for nested dicts); ``""`` for a
    group that is a single value (``graph``)."""
    kind: Kind
    old: Any
    new: Any

    @property
    def label(self) -> str:
        if self.group == "env":
            return f"env {self.name}"
        return f"{self.group}.{self.name}" if self.name else self.group

    def describe(self, width: int = 120) -> str:
        absent = "unset" if self.group == "env" else "(absent)"
        old = absent if self.kind == "added" else _show(self.old, width)
        new = absent if self.kind == "removed" else _show(self.new, width)
        return f"{self.label}: {old} -> {new}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "kind": self.kind,
            "old": self.old,
            "new": self.new,
        }


@dataclass(frozen=True, slots=True)
class FileChange:
    """A traced source file that differs, with its BLAKE3 digest in A and B
    (``None`` where it was not traced, or could not be read)."""

    path: str
    kind: Kind
    old: str | None
    new: str | None
    implementation: bool = False
    """The file holds an op implementation (a kernel, fake, autograd
    formula, decomposition or lowering), not code Dynamo traced."""

    @property
    def noun(self) -> str:
        return "op implementation file" if self.implementation else "traced file"

    def describe(self) -> str:
        return f"{self.path} ({_short(self.old)} -> {_short(self.new)})"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind, "old": self.old}
        out["new"] = self.new
        if self.implementation:
            out["implementation"] = True
        return out


@dataclass(frozen=True, slots=True)
class FactorDiff:
    """Everything that differs between two factor dicts (A -> B)."""

    env: tuple[Change, ...] = ()
    """Environment variables (allow-listed) added, removed or changed."""
    config: tuple[Change, ...] = ()
    """:class:`~fxpiece.CompileConfig` factors (``config.compile_entries``...)."""
    inductor: tuple[Change, ...] = ()
    """Resolved Inductor options."""
    graph: Change | None = None
    """The Dynamo graph digest (its code or its inputs' metadata changed)."""
    files: tuple[FileChange, ...] = ()
    """Traced source files added, removed or changed."""
    code: tuple[Change, ...] = ()
    """Other ``code`` factors (its overall digest when no file explains it)."""
    compiler: tuple[Change, ...] = ()
    """torch version, Python, machine, vector ISA, C++ compiler, adaptor."""
    other: tuple[Change, ...] = ()
    """Top-level groups this version of fxpiece does not know."""

    @property
    def same(self) -> bool:
        return not (
            self.env
            or self.config
            or self.inductor
            or self.graph
            or self.files
            or self.code
            or self.compiler
            or self.other
        )

    @property
    def changes(self) -> tuple[Change, ...]:
        """Every factor change but the traced files, in group order."""
        g = (self.graph,) if self.graph is not None else ()
        return (
            *self.env,
            *self.config,
            *self.inductor,
            *g,
            *self.code,
            *self.compiler,
            *self.other,
        )

    @property
    def groups(self) -> tuple[str, ...]:
        """Names of the groups that differ (``code`` for traced files)."""
        seen = [c.group for c in self.changes]
        if self.files:
            seen.append("code")
        return tuple(g for g in (*GROUPS, *sorted(set(seen) - set(GROUPS))) if g in seen)

    def __len__(self) -> int:
        return len(self.changes) + len(self.files)

    def summary(self) -> str:
        """One line: the one thing that differs, or counts and first names."""
        if self.same:
            return "no factor differs (same key)"
        parts: list[str] = []
        for noun, changes in (
            ("environment variables", self.env),
            ("config fields", self.config),
            ("inductor options", self.inductor),
        ):
            parts.extend(_summarize(noun, changes))
        if self.graph is not None:
            # describe() is "graph: <old> -> <new>" already.
            parts.append(f"{self.graph.describe(40)} (the Dynamo graph or its inputs)")
        if self.files:
            parts.append(_summarize_files(self.files))
        for noun, changes in (
            ("code factors", self.code),
            ("compiler fields", self.compiler),
            ("other factors", self.other),
        ):
            parts.extend(_summarize(noun, changes))
        return "; ".join(parts)

    def lines(self, width: int = 120) -> list[str]:
        """One line per difference, values shortened to about ``width``."""
        out: list[str] = []
        for c in (*self.env, *self.config, *self.inductor):
            out.append(c.describe(width))
        if self.graph is not None:
            out.append(self.graph.describe(width))
        for f in self.files:
            out.append(f"{f.noun} {f.kind}: {f.describe()}")
        for c in (*self.code, *self.compiler, *self.other):
            out.append(c.describe(width))
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``same``, ``summary``, ``groups``, ``changes``, ``files``."""
        return {
            "same": self.same,
            "summary": self.summary(),
            "groups": list(self.groups),
            "changes": [c.as_dict() for c in self.changes],
            "files": [f.as_dict() for f in self.files],
        }


def _short(digest: str | None) -> str:
    if digest is None:
        return "none"
    return f"{digest[:8]}.." if len(digest) > 10 else digest


def _show(value: Any, width: int) -> str:
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    if isinstance(value, str) and len(value) == 64 and _HEX.match(value):
        return _short(value)
    return text if len(text) <= width else f"{text[: max(8, width - 3)]}..."


def _summarize(noun: str, changes: tuple[Change, ...]) -> list[str]:
    if not changes:
        return []
    if len(changes) == 1:
        return [changes[0].describe(60)]
    names = ", ".join(c.label for c in changes[:3])
    more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
    return [f"{len(changes)} {noun} differ: {names}{more}"]


def _summarize_files(files: tuple[FileChange, ...]) -> str:
    parts = []
    groups = [(k, impl) for k in ("changed", "added", "removed") for impl in (True, False)]
    for kind, impl in groups:
        these = [f for f in files if f.kind == kind and f.implementation == impl]
        if not these:
            continue
        noun = these[0].noun + ("" if len(these) == 1 else "s")
        if len(these) == 1:
            what = these[0].describe() if kind == "changed" else these[0].path
        else:
            what = ", ".join(f.path for f in these[:3])
            if len(these) > 3:
                what += f" (+{len(these) - 3} more)"
        parts.append(f"{len(these)} {noun} {kind}: {what}")
    return "; ".join(parts)


def _norm(v: Any) -> Any:
    """Tuples as lists, as after a JSON round trip (the factors on disk)."""
    if isinstance(v, tuple | list):
        return [_norm(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _norm(x) for k, x in v.items()}
    return v


def _diff_values(group: str, prefix: str, a: Any, b: Any, out: list[Change]) -> None:
    if a is _MISSING:
        out.append(Change(group, prefix, "added", None, b))
    elif b is _MISSING:
        out.append(Change(group, prefix, "removed", a, None))
    elif isinstance(a, Mapping) and isinstance(b, Mapping) and group != "env":
        for k in sorted(set(a) | set(b), key=str):
            va, vb = a.get(k, _MISSING), b.get(k, _MISSING)
            if va is _MISSING or vb is _MISSING or va != vb:
                _diff_values(group, f"{prefix}.{k}" if prefix else str(k), va, vb, out)
    elif a != b and _norm(a) != _norm(b):
        out.append(Change(group, prefix, "changed", a, b))


def _group_changes(group: str, a: Any, b: Any) -> tuple[Change, ...]:
    if a == b:
        return ()
    out: list[Change] = []
    if group == "env" and isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b)):
            va, vb = a.get(k, _MISSING), b.get(k, _MISSING)
            if va != vb:
                _diff_values(group, str(k), va, vb, out)
        return tuple(out)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        _diff_values(group, "", a, b, out)
    elif _norm(a) != _norm(b):
        kind: Kind = "added" if a is _MISSING else "removed" if b is _MISSING else "changed"
        out.append(
            Change(group, "", kind, None if a is _MISSING else a, None if b is _MISSING else b)
        )
    return tuple(out)


def _code_diff(a: Any, b: Any) -> tuple[tuple[FileChange, ...], tuple[Change, ...]]:
    a = a if isinstance(a, Mapping) else {}
    b = b if isinstance(b, Mapping) else {}
    fa = a.get("files") if isinstance(a.get("files"), Mapping) else {}
    fb = b.get("files") if isinstance(b.get("files"), Mapping) else {}
    impl = {
        p
        for side in (a, b)
        for p in (side.get("implementation_files") or ())
        if isinstance(side.get("implementation_files"), list)
    }
    files: list[FileChange] = []
    if fa != fb:
        for path in sorted(set(fa) | set(fb)):
            da, db = fa.get(path, _MISSING), fb.get(path, _MISSING)
            if da == db:
                continue
            if da is _MISSING:
                files.append(FileChange(path, "added", None, db, path in impl))
            elif db is _MISSING:
                files.append(FileChange(path, "removed", da, None, path in impl))
            else:
                files.append(FileChange(path, "changed", da, db, path in impl))
    rest_a = {k: v for k, v in a.items() if k != "files"}
    rest_b = {k: v for k, v in b.items() if k != "files"}
    # The overall digest follows from the files; report it only when no file
    # explains it (e.g. a file unreadable in one and not the other).
    if files:
        rest_a.pop("digest", None)
        rest_b.pop("digest", None)
    return tuple(files), _group_changes("code", rest_a, rest_b)


def diff_factors(a: Mapping[str, Any], b: Mapping[str, Any]) -> FactorDiff:
    """What differs from factors ``a`` to factors ``b`` (as in
    ``cache_key_factors.json`` or ``KeyFactors.as_dict()``). Pure and fast."""
    kw: dict[str, Any] = {}
    for group in ("env", "config", "inductor", "compiler"):
        kw[group] = _group_changes(group, a.get(group, _MISSING), b.get(group, _MISSING))
    graph = _group_changes("graph", a.get("graph", _MISSING), b.get("graph", _MISSING))
    kw["graph"] = graph[0] if graph else None
    if a.get("code") != b.get("code"):
        kw["files"], kw["code"] = _code_diff(a.get("code"), b.get("code"))
    other: list[Change] = []
    for group in sorted((set(a) | set(b)) - set(GROUPS)):
        other.extend(_group_changes(group, a.get(group, _MISSING), b.get(group, _MISSING)))
    kw["other"] = tuple(other)
    return FactorDiff(**kw)


def _not_found(msg: str, path: str) -> CacheError:
    return CacheError(errno.ENOENT, msg, path)


def resolve_model_folder(folder_or_key: str | os.PathLike[str], root: Path | None = None) -> Path:
    """The model folder (``<root>/models/<key>/<tag>``) named by a folder
    path, a ``cache_key_factors.json`` path, or a key prefix (hex, at least
    4 characters), optionally followed by ``/<model_tag>``.

    A key folder with several model tags needs the tag. Raises
    :class:`~fxpiece.CacheError` naming the candidates when nothing or more
    than one folder matches.
    """
    text = os.fspath(folder_or_key)
    path = Path(text).expanduser()
    if path.is_file() and path.name == FACTORS_FILE:
        return path.parent
    if path.is_dir():
        if (path / FACTORS_FILE).is_file() or CacheLayout.index_dir(path).is_dir():
            return path
        tags = sorted(p for p in path.iterdir() if p.is_dir() and (p / FACTORS_FILE).is_file())
        if len(tags) == 1:
            return tags[0]
        if tags:
            names = ", ".join(p.name for p in tags)
            raise CacheError(
                errno.EINVAL, f"{path} holds several model tags ({names}); name one", text
            )
        raise _not_found(f"{path} is not a model folder (no {FACTORS_FILE})", text)
    prefix, _, tag = text.partition("/")
    prefix = prefix.lower()
    if not _HEX.match(prefix) or len(prefix) < 4 or (tag and not SAFE_NAME.fullmatch(tag)):
        raise _not_found(
            f"{text!r} is neither a model folder nor a key prefix (hex, at least 4 "
            "characters, optionally followed by /<model tag>)",
            text,
        )
    if root is None:
        raise _not_found(f"no cache root given to look up key {text!r}", text)
    layout = CacheLayout(root)
    found: list[Path] = []
    for folder in layout.model_dirs(tag or None):
        key_dir = folder.parent.name
        if not key_dir.startswith(prefix[:KEY_DIR_LEN]):
            continue
        # Longer prefixes than the folder name (key[:32]) are checked on the full key.
        if len(prefix) > KEY_DIR_LEN:
            try:
                if not factors_key(read_factors(folder)).startswith(prefix):
                    continue
            except CacheError:
                continue
        found.append(folder)
    if not found:
        raise _not_found(f"no model in {layout.models_dir} has a key starting with {text!r}", text)
    if len(found) > 1:
        names = ", ".join(f"{p.parent.name[:12]}/{p.name}" for p in found[:8])
        raise CacheError(
            errno.EINVAL, f"{text!r} matches {len(found)} models ({names}); be more specific", text
        )
    return found[0]


def read_factors(model_dir: Path) -> dict[str, Any]:
    """The factors in a model folder's ``cache_key_factors.json``
    (a regular file under 64 MiB, a JSON object) or :class:`CacheError`."""
    path = CacheLayout.factors_file(model_dir)
    try:
        value = json.loads(read_regular(path, FACTORS_LIMIT))
    except FileNotFoundError:
        raise _not_found(f"{path} does not exist", str(path)) from None
    except (OSError, ValueError, RecursionError) as e:
        raise CacheError(errno.EIO, f"cannot read {path}: {e}", str(path)) from None
    if not isinstance(value, dict):
        raise CacheError(errno.EIO, f"{path} is not a JSON object", str(path))
    return value


def load_factors(folder_or_key: str | os.PathLike[str], root: Path | None = None) -> dict[str, Any]:
    """The factors of a model folder or key prefix (see :func:`resolve_model_folder`).

    >>> import json, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> folder = root / "models" / ("ab" * 16) / "backbone"
    >>> folder.mkdir(parents=True)
    >>> _ = (folder / FACTORS_FILE).write_text(json.dumps({"graph": "x"}))
    >>> load_factors("abab", root), load_factors(folder)
    ({'graph': 'x'}, {'graph': 'x'})
    """
    return read_factors(resolve_model_folder(folder_or_key, root))


def nearest_sibling(
    root: Path,
    model_tag: str,
    factors: Mapping[str, Any],
    *,
    exclude_key: str | None = None,
    limit: int = 16,
) -> tuple[Path, FactorDiff] | None:
    """The cached model folder with the same ``model_tag`` whose factors
    differ least from ``factors`` (ties: the most recent), with the diff;
    ``None`` if there is no other key for that tag. ``exclude_key`` (the
    key being looked up) is skipped. Reads at most ``limit`` folders (the
    most recently written). For the backend's explain-on-miss."""
    layout = CacheLayout(root)
    skip = CacheLayout.key_dir_name(exclude_key) if exclude_key else None
    candidates = [p for p in layout.model_dirs(model_tag) if p.parent.name != skip]

    def mtime(p: Path) -> float:
        try:
            return CacheLayout.factors_file(p).stat().st_mtime
        except OSError:
            return 0.0

    candidates.sort(key=mtime, reverse=True)
    best: tuple[int, Path, FactorDiff] | None = None
    for folder in candidates[:limit]:
        try:
            other = read_factors(folder)
        except CacheError:
            continue
        d = diff_factors(other, factors)
        if d.same:
            continue  # this very key
        if best is None or len(d) < best[0]:
            best = (len(d), folder, d)
    return (best[1], best[2]) if best else None
