"""One model's folder in the cache: its index, key factors and split graph."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from fxpiece.cache.index import CacheIndex, write_atomic
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.store import ArtifactStore
from fxpiece.cache.trust import check_parents, check_stat, check_trusted, ensure_private_dir
from fxpiece.context import validate_path_part

__all__ = ["ModelCache"]


class ModelCache:
    """``models/<key>/<model_tag>``: the index, ``cache_key_factors.json``
    and ``computation_graph.py``; opened read-only or created private."""

    def __init__(
        self,
        layout: CacheLayout,
        key: str,
        model_tag: str,
        *,
        trust: bool = False,
        readonly: bool = False,
    ) -> None:
        validate_path_part("model_tag", model_tag)
        self.layout = layout
        self.key = key
        self.readonly = readonly
        self.folder = layout.model_dir(key, model_tag)
        if not readonly:
            ensure_private_dir(self.folder)
        index = layout.index_dir(self.folder)
        if not trust:
            self._check_trusted(index)
        self.index = (
            CacheIndex(str(index), readonly=True)
            if readonly
            else CacheIndex(str(ensure_private_dir(index)))
        )
        self.artifacts = ArtifactStore(layout, readonly=readonly, trust=trust)

    def _check_trusted(self, index: Path) -> None:
        """Every folder code or entries are loaded from, the files of the
        index, and every folder above the root (see :mod:`fxpiece.cache.trust`)."""
        root = self.layout.root
        check_parents(root)
        try:
            check_stat(root, os.stat(root))  # the root itself may be a symlink you made
        except FileNotFoundError:
            return
        for folder in (
            self.layout.artifacts_dir,
            self.layout.models_dir,
            self.layout.locks_dir,
            self.folder.parent,
            self.folder,
            index,
        ):
            check_trusted(folder)
        try:
            entries = list(os.scandir(index))
        except OSError:
            return
        for e in entries:
            with contextlib.suppress(OSError):
                check_stat(Path(e.path), e.stat(follow_symlinks=False), "index file")

    @property
    def root(self) -> Path:
        return self.layout.root

    def _write_text(self, path: Path, text: str) -> None:
        try:
            if path.read_text() == text:
                return
        except OSError:
            pass
        write_atomic(str(path), text.encode())

    def write_graph(self, text: str) -> None:
        self._write_text(self.layout.graph_file(self.folder), text)

    def write_factors(self, factors: dict[str, Any]) -> None:
        self._write_text(
            self.layout.factors_file(self.folder), json.dumps(factors, indent=1, sort_keys=True)
        )
