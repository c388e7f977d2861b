"""Every key the cache uses, and the formulas that make them, in one place.

- the **model key**: BLAKE3 over the BLAKE3 of each factor group
  (:class:`KeyFactors`, :func:`factors_key`); names the model folder;
- the **artifact digest** of one compiled (piece, entry)
  (:func:`artifact_digest`); names the content-addressed artifact and its
  compile lease;
- what a model's index keys and values mean is the index schema,
  :mod:`fxpiece.cache.entries`.

The factor values themselves are gathered by :mod:`fxpiece.piecewise.factors`
(which needs torch); this module is torch-free, so ``fxpiece cache explain``
uses the same formula as the backend.

>>> from fxpiece.cache.keys import factors_key
>>> factors_key({"env": {}, "graph": "x"}) == factors_key({"graph": "x", "env": {}})
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fxpiece.hashing import hash_factors

__all__ = [
    "AOT_TAG_SUFFIX",
    "GROUPS",
    "KeyFactors",
    "artifact_digest",
    "factors_key",
    "kernels_digest",
    "shared_digest",
]

GROUPS = ("env", "config", "inductor", "graph", "code", "compiler")
"""The factor groups of a model key, in the order they are reported."""

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
