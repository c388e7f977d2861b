"""The index schema: what a model's index keys and values mean, typed, and
the one place that decodes them.

A model's index (:class:`~fxpiece.cache.index.CacheIndex`) stores raw keys
``(int, int, int, str)`` and JSON values. Three kinds of entry live there:

- :class:`PieceKey`: one compiled (piece, entry) of a model;
- :class:`KernelsKey`: a kernel bundle, the model's own or one piece's;
- :class:`AotKey`: the ``n``-th ahead-of-time entry of a launch folder.

Schema 2 (:data:`SCHEMA`, written since this module) tags the kind in the
key's text field: ``"v2:piece:<compiler>"``, ``"v2:kernels:model"``,
``"v2:kernels:piece"``, ``"v2:aot"``. Schema 1 (caches written before) used
untagged keys with sentinels: ``(start, end, piece, compiler)``,
``(0, 0, -1, "kernels")``, ``(start, end, piece, "kernels")`` and
``(n, 0, -2, "aot")``. :func:`decode_key` reads both to the same typed key,
and :class:`EntryIndex` looks a key up under its schema-2 form first, then
its schema-1 form, so an existing cache still hits; it writes schema 2 only.

Values decode to :class:`Entry` (digest, handle, and an ahead-of-time
entry's traced files) or, for an ahead-of-time key, :class:`Unsupported`;
anything malformed decodes to ``None`` (treated as absent), never raises.

>>> k = PieceKey(1, 16, 0, "inductor")
>>> k.to_raw(), k.legacy_raw()
((1, 16, 0, 'v2:piece:inductor'), (1, 16, 0, 'inductor'))
>>> decode_key(k.to_raw()) == decode_key(k.legacy_raw()) == k
True
>>> decode_key((0, 0, -1, "kernels")), decode_key((3, 0, -2, "aot"))
(KernelsKey(start=0, end=0, piece=None), AotKey(n=3))
>>> Entry.from_raw({"digest": "ab", "handle": {"artifact": "artifacts/ab/ab"}}).artifact
'artifacts/ab/ab'
>>> Entry.from_raw({"digest": 7, "handle": {}}) is None
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fxpiece.cache.index import CacheIndex
from fxpiece.cache.layout import CacheLayout

__all__ = [
    "MODEL_KERNELS",
    "SCHEMA",
    "AotKey",
    "Entry",
    "EntryIndex",
    "IndexKey",
    "KernelsKey",
    "PieceKey",
    "RawKey",
    "UnknownKey",
    "Unsupported",
    "Value",
    "decode_key",
    "decode_value",
    "handle_artifact",
]

SCHEMA = 2
"""The index schema new entries are written in (see the module's docs)."""
_TAG = f"v{SCHEMA}:"
_PIECE = _TAG + "piece:"
_KERNELS_MODEL = _TAG + "kernels:model"
_KERNELS_PIECE = _TAG + "kernels:piece"
_AOT = _TAG + "aot"
_LATER = re.compile(r"v[0-9]+:")
"""A key tagged by some schema (this one or a later one)."""
_LEGACY_KERNELS = "kernels"
_LEGACY_AOT = "aot"

RawKey = tuple[int, int, int, str]
"""A key as :class:`~fxpiece.cache.index.CacheIndex` stores it."""

_DIGEST = re.compile(r"[0-9A-Za-z_-]{1,128}")
"""What a digest may be: no path characters, bounded."""
_MAX_REASON = 2000


@dataclass(frozen=True, slots=True)
class PieceKey:
    """One compiled (piece, entry): the token range ``[start, end]`` (an
    exact size: ``start == end``), the piece's index in the split graph and
    the compiler's name."""

    kind: ClassVar[str] = "piece"
    start: int
    end: int
    piece: int
    compiler: str

    def to_raw(self) -> RawKey:
        return (self.start, self.end, self.piece, _PIECE + self.compiler)

    def legacy_raw(self) -> RawKey:
        """The schema-1 form (also how ``fxpiece cache ls`` shows it)."""
        return (self.start, self.end, self.piece, self.compiler)

    def kernels(self) -> KernelsKey:
        """Where the kernels this piece's compile built are kept (one bundle
        per (piece, range), whatever the compiler)."""
        return KernelsKey(self.start, self.end, self.piece)


@dataclass(frozen=True, slots=True)
class KernelsKey:
    """A kernel bundle: one piece's (``piece`` set: what that piece's
    compile built) or the model's own (``piece is None``: what a build
    compiled outside any piece or rebuilt while loading)."""

    kind: ClassVar[str] = "kernels"
    start: int = 0
    end: int = 0
    piece: int | None = None

    @property
    def model_wide(self) -> bool:
        return self.piece is None

    def to_raw(self) -> RawKey:
        if self.piece is None:
            return (0, 0, 0, _KERNELS_MODEL)
        return (self.start, self.end, self.piece, _KERNELS_PIECE)

    def legacy_raw(self) -> RawKey:
        if self.piece is None:
            return (0, 0, -1, _LEGACY_KERNELS)
        return (self.start, self.end, self.piece, _LEGACY_KERNELS)


MODEL_KERNELS = KernelsKey()
"""The model's own kernel bundle."""


@dataclass(frozen=True, slots=True)
class AotKey:
    """The ``n``-th ahead-of-time entry of a launch folder (one per Dynamo
    graph captured; :mod:`fxpiece.piecewise.aot_start`)."""

    kind: ClassVar[str] = "aot"
    n: int

    def to_raw(self) -> RawKey:
        return (self.n, 0, 0, _AOT)

    def legacy_raw(self) -> RawKey:
        return (self.n, 0, -2, _LEGACY_AOT)


@dataclass(frozen=True, slots=True)
class UnknownKey:
    """A raw key no schema this version reads names (a later schema's, or
    garbage): kept as it is, never loaded."""

    kind: ClassVar[str] = "unknown"
    raw: tuple[Any, ...]

    def to_raw(self) -> tuple[Any, ...]:
        return self.raw

    def legacy_raw(self) -> tuple[Any, ...]:
        return self.raw


IndexKey = PieceKey | KernelsKey | AotKey
"""A key this version reads and writes."""


def _raw_parts(raw: object) -> tuple[int, int, int, str] | None:
    if not isinstance(raw, tuple | list) or len(raw) != 4:
        return None
    s, e, g, text = raw
    if not all(type(x) is int for x in (s, e, g)) or type(text) is not str:
        return None
    return s, e, g, text


def decode_key(raw: object) -> IndexKey | UnknownKey:
    """The typed key a raw index key (schema 2 or 1; a tuple, or a list as
    JSON gives it) names; :class:`UnknownKey` for anything else."""
    parts = _raw_parts(raw)
    if parts is None:
        return UnknownKey(tuple(raw) if isinstance(raw, tuple | list) else (raw,))
    s, e, g, text = parts
    if _LATER.match(text):
        if text.startswith(_PIECE) and len(text) > len(_PIECE):
            return PieceKey(s, e, g, text[len(_PIECE) :])
        if text == _KERNELS_PIECE:
            return KernelsKey(s, e, g)
        if text == _KERNELS_MODEL and (s, e, g) == (0, 0, 0):
            return MODEL_KERNELS
        if text == _AOT and e == 0 and g == 0 and s >= 0:
            return AotKey(s)
        return UnknownKey(parts)
    if text == _LEGACY_KERNELS:
        return MODEL_KERNELS if (s, e, g) == (0, 0, -1) else KernelsKey(s, e, g)
    if text == _LEGACY_AOT:
        return AotKey(s) if e == 0 and g == -2 and s >= 0 else UnknownKey(parts)
    return PieceKey(s, e, g, text) if text else UnknownKey(parts)


@dataclass(frozen=True, slots=True)
class Entry:
    """An index value: the artifact ``digest`` and the compiler's ``handle``
    (any JSON value but ``null``: an artifact's ``{"artifact", "blake3",
    "size"}``, or what a compiler without artifacts records, e.g.
    ``{"eager": true}``); an ahead-of-time entry also
    records its traced ``files`` (module name -> BLAKE3, ``None`` when
    unreadable)."""

    digest: str
    handle: Any
    files: dict[str, str | None] | None = None

    @classmethod
    def from_raw(cls, value: object) -> Entry | None:
        """The entry a stored value holds, or ``None`` if it is malformed
        (not an object, no digest or a digest that is not a short token, no
        handle, files that are not a name -> digest object); never raises."""
        if not isinstance(value, Mapping):
            return None
        digest, handle, files = value.get("digest"), value.get("handle"), value.get("files")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            return None
        if handle is None:
            return None
        if files is not None and not (
            isinstance(files, dict)
            and all(
                isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in files.items()
            )
        ):
            return None
        return cls(digest, handle, None if files is None else dict(files))

    def to_raw(self) -> dict[str, Any]:
        out: dict[str, Any] = {"digest": self.digest, "handle": self.handle}
        if self.files is not None:
            out["files"] = self.files
        return out

    @property
    def names_artifact(self) -> bool:
        """Whether the handle names an artifact file (safe or not)."""
        return isinstance(self.handle, Mapping) and "artifact" in self.handle

    @property
    def artifact(self) -> str | None:
        """The artifact the handle names, relative to the root (safe paths
        under ``artifacts/`` only)."""
        return handle_artifact(self.handle)


def handle_artifact(handle: object) -> str | None:
    """The artifact a handle names, relative to the root, if it is a safe
    path under ``artifacts/``."""
    rel = handle.get("artifact") if isinstance(handle, Mapping) else None
    return rel if isinstance(rel, str) and CacheLayout.is_artifact_rel(rel) else None


@dataclass(frozen=True, slots=True)
class Unsupported:
    """An ahead-of-time entry recording that the call cannot be captured
    (so later starts do not try again)."""

    reason: str

    @classmethod
    def from_raw(cls, value: object) -> Unsupported | None:
        if not isinstance(value, Mapping) or "digest" in value:
            return None
        reason = value.get("unsupported")
        return cls(reason[:_MAX_REASON]) if isinstance(reason, str) else None

    def to_raw(self) -> dict[str, Any]:
        return {"unsupported": self.reason}


Value = Entry | Unsupported


def decode_value(key: IndexKey | UnknownKey, value: object) -> Value | None:
    """The value stored under ``key``: an :class:`Entry`, an
    :class:`Unsupported` (ahead-of-time keys only), or ``None`` if it is
    malformed or the key is unknown."""
    if isinstance(key, UnknownKey):
        return None
    if isinstance(key, AotKey):
        unsupported = Unsupported.from_raw(value)
        if unsupported is not None:
            return unsupported
    return Entry.from_raw(value)


@dataclass(frozen=True, slots=True)
class EntryIndex:
    """A model's :class:`~fxpiece.cache.index.CacheIndex` through typed keys
    and values: reads find schema-2 entries, then schema-1 ones; writes are
    schema 2."""

    index: CacheIndex

    def value(self, key: IndexKey) -> Value | None:
        """The valid value stored under ``key`` (schema 2, else schema 1)."""
        for raw in (key.to_raw(), key.legacy_raw()):
            got = decode_value(key, self.index.get(raw))
            if got is not None:
                return got
        return None

    def get(self, key: IndexKey) -> Entry | None:
        """The valid :class:`Entry` stored under ``key``."""
        got = self.value(key)
        return got if isinstance(got, Entry) else None

    def put(self, key: IndexKey, value: Value) -> None:
        self.index.insert(key.to_raw(), value.to_raw())

    def put_many(self, items: Iterable[tuple[IndexKey, Value]]) -> None:
        """Insert many entries in one commit."""
        self.index.update([(k.to_raw(), v.to_raw()) for k, v in items])

    def remove(self, key: IndexKey) -> bool:
        """Remove ``key`` in both schemas; whether anything was there."""
        removed = False
        for raw in (key.to_raw(), key.legacy_raw()):
            if raw in self.index:
                removed = self.index.remove(raw) or removed
        return removed

    def items(self) -> list[tuple[IndexKey, Value | None]]:
        """Every entry as the index is now, decoded (a malformed value:
        ``None``; unknown keys are left out), sorted by raw key."""
        out: list[tuple[IndexKey, Value | None]] = []
        for raw, value in self.index.entries():
            key = decode_key(raw)
            if not isinstance(key, UnknownKey):
                out.append((key, decode_value(key, value)))
        return out
