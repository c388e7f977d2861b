"""Every key the cache uses, and the formulas that make them, in one place.

- the **model key**: BLAKE3 over the BLAKE3 of each factor group
  (:class:`KeyFactors`, :func:`factors_key`); names the model folder;
- the **artifact digest** of one compiled (piece, entry)
  (:func:`artifact_digest`); names the content-addressed artifact and its
  compile lease;
- the **index key** of one (piece, entry) inside a model's index
  (:func:`index_key`).

The factor values themselves are gathered by :mod:`fxpiece.piecewise.factors`
(which needs torch); this module is torch-free, so ``fxpiece cache explain``
uses the same formula as the backend.

>>> from fxpiece.cache.keys import factors_key, index_key
>>> factors_key({"env": {}, "graph": "x"}) == factors_key({"graph": "x", "env": {}})
True
>>> index_key(1, 16, 0, "inductor")
(1, 16, 0, 'inductor')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fxpiece.hashing import hash_factors

__all__ = [
    "AOT",
    "AOT_KEY",
    "AOT_TAG_SUFFIX",
    "GROUPS",
    "KERNELS",
    "KERNELS_KEY",
    "IndexKey",
    "KeyFactors",
    "aot_key",
    "artifact_digest",
    "factors_key",
    "index_key",
    "is_kernels_key",
    "kernels_digest",
    "piece_kernels_key",
    "shared_digest",
]

GROUPS = ("env", "config", "inductor", "graph", "code", "compiler")
"""The factor groups of a model key, in the order they are reported."""

IndexKey = tuple[int, int, int, str]

KERNELS = "kernels"
"""The compiler field of the index keys that hold kernel bundles."""
KERNELS_KEY: IndexKey = (0, 0, -1, KERNELS)
"""Where a model's index keeps the kernel bundle of what a build compiled
outside any piece or rebuilt while loading (:mod:`fxpiece.piecewise.kernels`)."""


def piece_kernels_key(key: IndexKey) -> IndexKey:
    """Where a model's index keeps the kernels a piece's compile built
    (next to the piece's own ``key``), so a process that loads the piece
    as soon as it is stored does not rebuild them."""
    return (key[0], key[1], key[2], KERNELS)


def is_kernels_key(key: IndexKey) -> bool:
    """Whether an index entry is a kernel bundle rather than a piece."""
    return key[3] == KERNELS


AOT = "aot"
"""The compiler field of the index keys that hold ahead-of-time entries."""


def aot_key(n: int) -> IndexKey:
    """Where a launch folder's index keeps its ``n``-th ahead-of-time entry
    (:mod:`fxpiece.piecewise.aot_start`): one per Dynamo graph captured."""
    return (n, 0, -2, AOT)


AOT_KEY: IndexKey = aot_key(0)
"""The first ahead-of-time entry (the first call's graph)."""
AOT_TAG_SUFFIX = ".aot"
"""Launch folders are ``models/<launch key>/<model_tag>.aot``."""


def factors_key(factors: Mapping[str, Any]) -> str:
    """The model key of ``factors`` (as in ``cache_key_factors.json``):
    BLAKE3 over the BLAKE3 of each group."""
    return hash_factors({k: hash_factors(v) for k, v in factors.items()})


@dataclass(frozen=True, slots=True)
class KeyFactors:
    """The factors of one model key, as written to ``cache_key_factors.json``."""

    env: dict[str, str]
    config: dict[str, Any]
    inductor: dict[str, Any]
    graph: str
    code: dict[str, Any]
    compiler: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {g: getattr(self, g) for g in GROUPS}

    @property
    def key(self) -> str:
        return factors_key(self.as_dict())


def shared_digest(
    *,
    compiler: Any,
    inductor: Any,
    env: Any,
    implementations: str | None,
    partition: bool,
    version: str,
) -> str:
    """What every artifact of one graph shares: the compiler factors, the
    resolved Inductor options, the environment factors, the sources of the
    op implementations the graph calls (inlined without being traced), the
    partition mode and fxpiece's own version."""
    return hash_factors(
        {
            "compiler": compiler,
            "inductor": inductor,
            "env": env,
            "implementations": implementations,
            "partition": partition,
            "fxpiece": version,
        }
    )


def artifact_digest(
    *,
    signature: str,
    inputs: list[Any],
    start: int,
    end: int,
    concrete: bool,
    shared: str,
    passes: str | None,
    compiler: str,
) -> str:
    """The content address of one compiled (piece, entry): the piece's
    canonical graph, its inputs' metadata, the entry, everything shared
    (:func:`shared_digest`), the post-grad passes' uuid and the compiler."""
    return hash_factors(
        {
            "piece": signature,
            "inputs": inputs,
            "entry": [start, end, concrete],
            "shared": shared,
            "passes": passes,
            "compiler": compiler,
        }
    )


def kernels_digest(payload_checksum: str) -> str:
    """The artifact digest of a kernel bundle: its content."""
    return hash_factors({"kernels": payload_checksum})


def index_key(start: int, end: int, piece: int, compiler: str) -> IndexKey:
    """The key of one (piece, entry) in a model's index."""
    return (start, end, piece, compiler)
