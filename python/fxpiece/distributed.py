"""Compile once per job without a shared file system (``torch.distributed``).

Each rank keeps its own cache folder. Before anything is compiled, the ranks
agree on what each of them has (an all-gather of per-digest flags, in one
deterministic order); every digest that no rank has is compiled by exactly
one rank (round-robin, all ranks compile in parallel); then every artifact
that some rank lacks is broadcast by a rank that has it, and the others store
it locally (verified against its BLAKE3 checksum). All ranks take part in
every collective, so none waits on one alone, and afterwards every rank loads
every piece from its own cache.

>>> # in each rank, after torch.distributed.init_process_group("gloo"):
>>> # model = fxpiece.compile(model, config, backend_cls=DistributedBackend)
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from fxpiece.backend import Backend, Work
from fxpiece.config import CompileConfig
from fxpiece.errors import CacheError
from fxpiece.store import ModelCache

__all__ = ["DistributedBackend"]


class DistributedBackend(Backend):
    """A :class:`~fxpiece.Backend` whose ranks share compiled pieces through
    ``torch.distributed`` collectives (any backend; gloo on CPU)."""

    def __init__(self, config: CompileConfig | None = None, group: Any = None) -> None:
        super().__init__(config)
        self.group = group
        self.shared_in = 0
        """Artifacts this rank received from other ranks."""
        self.shared_out = 0
        """Artifacts this rank sent to other ranks."""

    def _loadable(self, w: Work, mc: ModelCache) -> bool:
        value = mc.index.get(self._index_key(w.item, w.entry))
        if not isinstance(value, dict) or value.get("digest") != w.ctx.digest:
            return False
        handle = value.get("handle")
        if isinstance(handle, dict) and "artifact" in handle:
            return mc.artifacts.verified_path(handle) is not None
        return True

    def _export(self, w: Work, mc: ModelCache) -> dict[str, Any]:
        value = mc.index.get(self._index_key(w.item, w.entry))
        data = None
        handle = value.get("handle") if isinstance(value, dict) else None
        if isinstance(handle, dict) and "artifact" in handle:
            path = mc.artifacts.verified_path(handle)
            if path is None:
                raise CacheError(
                    errno.ENOENT, f"artifact for {w.ctx.digest} vanished before sharing"
                )
            data = Path(path).read_bytes()
        return {"value": value, "data": data}

    def _import(self, w: Work, payload: dict[str, Any], mc: ModelCache) -> None:
        value = dict(payload["value"])
        if payload["data"] is not None:
            handle = mc.artifacts.put(w.ctx.digest, payload["data"])
            if handle["blake3"] != value["handle"]["blake3"]:
                raise CacheError(
                    errno.EIO,
                    f"artifact {w.ctx.digest} received from another rank fails its checksum",
                )
            value["handle"] = handle
        mc.index.insert(self._index_key(w.item, w.entry), value)
        self._count("num_cache_entries_updated")
        self.shared_in += 1

    def before_build(self, work: Sequence[Work], model_cache: ModelCache | None) -> None:
        if model_cache is None or not dist.is_available() or not dist.is_initialized():
            return
        rank = dist.get_rank(self.group)
        world = dist.get_world_size(self.group)
        unique: dict[str, Work] = {}
        for w in work:
            unique.setdefault(w.ctx.digest, w)
        items = list(unique.values())
        have = [self._loadable(w, model_cache) for w in items]
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
                w = items[i]
                self._count("num_cache_misses")
                self._compile(w.item, w.entry, w.args, w.ctx, model_cache, w.stats)
        for i, w in enumerate(items):
            holders = [r for r in range(world) if gathered[r][i]]
            if len(holders) == world:
                continue
            src = holders[0] if holders else owner[i]
            box: list[Any] = [self._export(w, model_cache) if rank == src else None]
            dist.broadcast_object_list(box, src=src, group=self.group)
            if rank == src:
                self.shared_out += 1
            elif not gathered[rank][i]:
                self._import(w, box[0], model_cache)
