"""One model's folder in the cache: its index, key factors and split graph."""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fxpiece.cache.entries import Entry, EntryIndex, handle_artifact
from fxpiece.cache.index import CacheIndex, write_atomic
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import read_regular
from fxpiece.cache.store import ArtifactStore
from fxpiece.cache.trust import check_tree, ensure_private_under
from fxpiece.context import validate_path_part
from fxpiece.errors import CacheError
from fxpiece.signing import BuilderKey, KeyRing, TrustedKeys

__all__ = ["ModelCache"]

_log = logging.getLogger("fxpiece")


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
        signer: BuilderKey | None = None,
        trusted_keys: TrustedKeys | None = None,
        keys: KeyRing | None = None,
        accept_unsigned: bool | None = None,
    ) -> None:
        """``signer`` / ``trusted_keys``: the key artifacts are signed with
        and the keys whose signatures load (default: this builder's key,
        made on first write, and :func:`~fxpiece.signing.trusted_keys`, each
        loaded on first need); or ``keys``, one
        :class:`~fxpiece.signing.KeyRing` shared by every model of a process
        (loaded once). ``accept_unsigned``: see
        :attr:`ArtifactStore.accept_unsigned`."""
        validate_path_part("model_tag", model_tag)
        if keys is None:
            keys = KeyRing(signer, trusted_keys)
        elif signer is not None or trusted_keys is not None:
            raise ValueError("give keys, or signer and trusted_keys, not both")
        self.layout = layout
        self.key = key
        self.readonly = readonly
        self.trust = trust
        self.folder = layout.model_dir(key, model_tag)
        index = layout.index_dir(self.folder)
        if not trust:
            # Checked before anything is created under the root: a symlinked
            # ``models/`` must not get folders created at its target.
            self._check_trusted(index)
        if not readonly:
            ensure_private_under(layout.root, index, trust=trust)
        self.index = CacheIndex(str(index), readonly=readonly)
        self.entries = EntryIndex(self.index)
        """The index through typed keys and values (:mod:`fxpiece.cache.entries`)."""
        self.artifacts = ArtifactStore(
            layout,
            readonly=readonly,
            trust=trust,
            on_quarantine=self._drop_entries,
            keys=keys,
            accept_unsigned=accept_unsigned,
        )

    def _check_trusted(self, index: Path) -> None:
        """Every folder code or entries are loaded from, the files of the
        index, and every folder above the root (see :mod:`fxpiece.cache.trust`)."""
        lay = self.layout
        folders = (
            lay.artifacts_dir,
            lay.models_dir,
            lay.locks_dir,
            lay.locks_dir / "slots",
            self.folder.parent,
        )
        check_tree(lay.root, (*folders, self.folder, index), files_in=(index,))

    @property
    def root(self) -> Path:
        return self.layout.root

    def quarantine(self, handle: Any) -> bool:
        """Move aside the artifact ``handle`` names (an entry that verified
        but does not load) and drop this model's index entries that point at
        it, in one step (:meth:`ArtifactStore.quarantine`): it is reported
        once, and what needs it is rebuilt. Whether anything was moved."""
        rel = handle_artifact(handle)
        if rel is None:
            return False
        return self.artifacts.quarantine(self.layout.digest_of_artifact(rel)) is not None

    def forget(self, handle: Any) -> None:
        """Drop this model's index entries that record ``handle`` (an
        artifact that is gone, or not what the handle recorded): what needs
        it is rebuilt and recorded again, and the loss is reported once, not
        on every start."""
        if not self.readonly:
            self._drop_where(lambda h: h == handle, "a lost artifact")

    def _drop_entries(self, rel: str) -> None:
        """Drop the index entries whose handle points at ``rel`` (just moved
        aside), as they are now."""
        self._drop_where(lambda h: handle_artifact(h) == rel, rel)

    def _drop_where(self, match: Callable[[Any], bool], what: str) -> None:
        """Remove every entry (as the index is now) whose handle ``match``es."""
        try:
            self.index.refresh()
            for key, value in self.index.entries():
                entry = Entry.from_raw(value)
                if entry is not None and match(entry.handle):
                    self.index.remove(key)
        except CacheError as e:
            _log.warning("fxpiece: could not drop the index entries of %s: %s", what, e)

    def ensure_locks_dir(self) -> Path:
        """``locks/``, created private after its levels are checked (a
        symlink there is refused, never followed: leases are never written
        out of the root)."""
        return ensure_private_under(self.layout.root, self.layout.locks_dir, trust=self.trust)

    def _write_text(self, path: Path, text: str) -> None:
        """Write ``text`` unless the file already holds it (read safely: the
        file may be anything; whatever it is, it is replaced atomically).
        Not fsynced: these files are for people (the key never reads them),
        and a start on a host new to the model writes three of them on its
        critical path; one a power cut empties is written again next time."""
        data = text.encode()
        try:
            if read_regular(path, len(data)) == data:
                return
        except OSError:
            pass
        write_atomic(str(path), data, fsync=False)

    def write_graph(self, text: Callable[[], str]) -> None:
        """Write the readable split graph (``text()``, made only when
        needed) unless the folder already has it: the graph is part of the
        folder's key, so a warm start does not print it again."""
        path = self.layout.graph_file(self.folder)
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_size > 0:
                return
        except OSError:
            pass
        self._write_text(path, text())

    def write_factors(self, factors: dict[str, Any]) -> None:
        self._write_text(
            self.layout.factors_file(self.folder), json.dumps(factors, indent=1, sort_keys=True)
        )
