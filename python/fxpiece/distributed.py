"""Compile once per job without a shared file system (``torch.distributed``).

Each rank keeps its own cache folder. Before anything is compiled, the ranks
agree on what each of them has (an all-gather of per-digest flags, in one
deterministic order); every digest that no rank has is compiled by exactly
one rank (round-robin, all ranks compile in parallel); then every artifact
that some rank lacks is broadcast by a rank that has it, and the others store
it locally (verified against its BLAKE3 checksum), with the kernel bundle
its compile built, so no rank rebuilds those kernels. All ranks take part in
every collective, so none waits on one alone, and afterwards every rank loads
every piece from its own cache.

In each rank, after ``torch.distributed.init_process_group`` (here a job of
one rank):

>>> import tempfile, torch, torch.distributed as dist, fxpiece
>>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
>>> config = fxpiece.CompileConfig(compiler="eager", cache_dir=tempfile.mkdtemp())
>>> model = fxpiece.compile(torch.nn.Linear(4, 4), backend=DistributedBackend(config))
>>> model(torch.ones(3, 4)).shape
torch.Size([3, 4])
>>> model.start.path  # its ranks build at the same point: Dynamo traces on every start
'dynamo'
>>> dist.destroy_process_group()
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from fxpiece.cache.entries import Entry
from fxpiece.cache.model import ModelCache
from fxpiece.cache.slots import host_slot_base, host_slot_dir
from fxpiece.cache.store import checksum
from fxpiece.config import CompileConfig
from fxpiece.errors import CacheError
from fxpiece.piecewise.backend import Backend
from fxpiece.piecewise.coordination import SharedFolder
from fxpiece.piecewise.plan import Work
from fxpiece.piecewise.stats import ProgressEvent

if TYPE_CHECKING:
    from fxpiece.piecewise.resolver import Resolver

__all__ = ["Collectives", "DistributedBackend"]


class Collectives(SharedFolder):
    """How the ranks of a ``torch.distributed`` job coordinate (a
    :class:`~fxpiece.piecewise.coordination.Coordination`): after planning,
    an all-gather of what each rank has, one compile per missing digest
    (round-robin) and a broadcast of every artifact some rank lacks. Leases
    stay in each rank's cache root; compile slots are this host's own folder
    (ranks may have private roots), shared by every rank of the host."""

    aot_unsupported: str | None = (
        "DistributedBackend exchanges artifacts with collectives while it builds, and "
        "every rank must build at the same point; a saved Dynamo output loads them "
        "at another point (ranks that start differently would deadlock)"
    )

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.shared_in = 0
        """Artifacts this rank received from other ranks."""
        self.shared_out = 0
        """Artifacts this rank sent to other ranks."""
        self.kernels_in = 0
        """Kernel bundles this rank received with those artifacts."""

    def slot_folder(self, mc: ModelCache | None) -> tuple[Path, Path] | None:
        """``/dev/shm``'s per-user slot folder (each level below it checked
        before anything is created in it)."""
        return host_slot_base(), host_slot_dir()

    @staticmethod
    def _entry(w: Work, mc: ModelCache) -> Entry | None:
        entry = mc.entries.get(w.key)
        return entry if entry is not None and entry.digest == w.digest else None

    def _loadable(self, w: Work, mc: ModelCache) -> bool:
        entry = self._entry(w, mc)
        if entry is None:
            return False
        return not entry.names_artifact or mc.artifacts.load(entry.handle) is not None

    def _export(self, w: Work, mc: ModelCache) -> dict[str, Any]:
        entry = self._entry(w, mc)
        if entry is None:  # its compile could not be recorded: each rank builds it
            return {"value": None, "data": None, "kernels": None}
        data = None
        if entry.names_artifact:
            data = mc.artifacts.load(entry.handle)
            if data is None:
                raise CacheError(errno.ENOENT, f"artifact for {w.digest} vanished before sharing")
        out: dict[str, Any] = {"value": entry.to_raw(), "data": data, "kernels": None}
        kernels = mc.entries.get(w.key.kernels())
        if kernels is not None:
            payload = mc.artifacts.load(kernels.handle)
            if payload is not None:  # else the receiver rebuilds them
                out["kernels"] = {"value": kernels.to_raw(), "data": payload}
        return out

    @staticmethod
    def _store(mc: ModelCache, value: object, data: bytes | None) -> Entry:
        """The entry another rank sent (``value``), its handle pointing at
        ``data`` stored here (verified against the checksum the sender
        recorded)."""
        entry = Entry.from_raw(value)
        if entry is None:
            raise CacheError(errno.EIO, "a malformed index entry was received from another rank")
        if data is not None:
            expected = entry.handle.get("blake3") if isinstance(entry.handle, dict) else None
            if checksum(data) != expected:
                raise CacheError(
                    errno.EIO,
                    f"artifact {entry.digest} received from another rank fails its checksum",
                )
            entry = replace(entry, handle=mc.artifacts.put(entry.digest, data))
        return entry

    def _import(self, resolver: Resolver, w: Work, payload: dict[str, Any], mc: ModelCache) -> None:
        if payload["value"] is None:
            return
        kernels = payload.get("kernels")
        if kernels is not None:  # first: whoever sees the piece finds its kernels
            mc.entries.put(w.key.kernels(), self._store(mc, kernels["value"], kernels["data"]))
            self.kernels_in += 1
        entry = self._store(mc, payload["value"], payload["data"])
        if entry.digest != w.digest:
            raise CacheError(errno.EIO, f"another rank sent {entry.digest} for {w.digest}")
        resolver.record(w, mc, entry)
        self.shared_in += 1

    def before(self, resolver: Resolver, work: Sequence[Work], mc: ModelCache | None) -> None:
        """The exchange (every rank takes part in every collective)."""
        if mc is None or not dist.is_available() or not dist.is_initialized():
            return
        rank = dist.get_rank(self.group)
        world = dist.get_world_size(self.group)
        unique: dict[str, Work] = {}
        for w in work:
            unique.setdefault(w.digest, w)
        items = list(unique.values())
        have = [self._loadable(w, mc) for w in items]
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, have, group=self.group)
        if len({len(g) for g in gathered}) != 1:
            raise CacheError(
                errno.EINVAL, "ranks disagree on the pieces to compile (different models?)"
            )
        nobody = [i for i in range(len(items)) if not any(g[i] for g in gathered)]
        owner = {i: k % world for k, i in enumerate(nobody)}
        for i, r in owner.items():
            if r == rank:
                resolver.count("num_cache_misses")
                resolver.compile(items[i], mc)
        for i, w in enumerate(items):
            holders = [r for r in range(world) if gathered[r][i]]
            if len(holders) == world:
                continue
            src = holders[0] if holders else owner[i]
            box: list[Any] = [self._export(w, mc) if rank == src else None]
            dist.broadcast_object_list(box, src=src, group=self.group)
            if rank == src:
                self.shared_out += 1
            elif not gathered[rank][i]:
                self._import(resolver, w, box[0], mc)


class DistributedBackend(Backend):
    """A :class:`~fxpiece.Backend` whose ranks share compiled pieces through
    ``torch.distributed`` collectives (any backend; gloo on CPU): a backend
    given the :class:`Collectives` coordination of ``group``."""

    def __init__(
        self,
        config: CompileConfig | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
        group: Any = None,
    ) -> None:
        self.collectives = Collectives(group)
        super().__init__(config, progress, coordination=self.collectives)

    @property
    def group(self) -> Any:
        return self.collectives.group

    @property
    def shared_in(self) -> int:
        """Artifacts this rank received from other ranks."""
        return self.collectives.shared_in

    @property
    def shared_out(self) -> int:
        """Artifacts this rank sent to other ranks."""
        return self.collectives.shared_out

    @property
    def kernels_in(self) -> int:
        """Kernel bundles this rank received with those artifacts."""
        return self.collectives.kernels_in
