"""How processes that share a cache coordinate their compiles: a strategy the
:class:`~fxpiece.piecewise.resolver.Resolver` is given.

A strategy says where a host's compile slots are, how a compile lease on a
digest is taken (without waiting, or waiting for its holder's result), and
what to do once the work is planned, before anything is loaded or compiled
(:class:`~fxpiece.distributed.Collectives` exchanges artifacts between the
ranks of a job there), where to look when the local index lacks entries
(:meth:`Coordination.fetch`) and what to do with entries just built
(:meth:`Coordination.publish`): :class:`~fxpiece.piecewise.remote_tier.RemoteTier`
pulls and pushes them through a remote store. :class:`SharedFolder`, the
default, keeps leases and slots in the cache root, for processes on one host
or on hosts that share the root's file system.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fxpiece.cache.entries import IndexKey
from fxpiece.cache.lease import Lease, Releasable, WaitOutcome, acquire_or_wait, this_host
from fxpiece.cache.model import ModelCache
from fxpiece.piecewise.plan import Work

if TYPE_CHECKING:
    from fxpiece.piecewise.resolver import Resolver

__all__ = ["Coordination", "SharedFolder"]


class Coordination(Protocol):
    """What a :class:`~fxpiece.piecewise.resolver.Resolver` asks of the
    processes it shares a cache with."""

    aot_unsupported: str | None
    """Why a start that loads a saved Dynamo output cannot use this strategy
    (``None``: it can)."""

    def slot_folder(self, mc: ModelCache | None) -> tuple[Path, Path] | None:
        """``(base, folder)`` of this host's compile slots (every level below
        ``base`` checked before anything is created); ``None``: unbounded."""
        ...

    def try_lease(self, mc: ModelCache, digest: str, ttl: float) -> Releasable | None:
        """The compile lease on ``digest`` if it is free (or stale), without
        waiting; ``None`` when another process holds it. ``OSError``: no
        lease can be taken here."""
        ...

    def lease_or_wait(
        self,
        mc: ModelCache,
        digest: str,
        *,
        ttl: float,
        timeout: float,
        poll: Callable[[], Callable[..., Any] | None],
    ) -> WaitOutcome[Callable[..., Any]]:
        """The lease on ``digest``, or the holder's result (``poll``), or
        neither after ``timeout``."""
        ...

    def before(self, resolver: Resolver, work: Sequence[Work], mc: ModelCache | None) -> None:
        """Run once per graph after planning, before any entry is loaded or
        compiled (may compile with ``resolver.compile`` and store entries)."""
        ...

    def fetch(self, mc: ModelCache, keys: Sequence[IndexKey]) -> bool:
        """``mc``'s index here lacks ``keys``: bring what the processes this
        cache is shared with elsewhere have of the model into it (verified).
        Whether anything was stored."""
        ...

    def publish(self, mc: ModelCache, keys: Sequence[IndexKey]) -> None:
        """The entries at ``keys`` (and what they point at) were just built
        and recorded in ``mc``: share them where :meth:`fetch` looks."""
        ...


class SharedFolder:
    """Leases (``locks/<digest>``) and compile slots (``locks/slots/<host>``)
    in the cache root: processes on one host, or on hosts that share the
    root's file system."""

    aot_unsupported: str | None = None

    def slot_folder(self, mc: ModelCache | None) -> tuple[Path, Path] | None:
        """Under the root when the cache is written; ``None`` (no bound) when
        this process shares no cache (disabled or read-only: it compiles in
        memory, alone)."""
        if mc is not None and not mc.readonly:
            return mc.layout.root, mc.layout.locks_dir / "slots" / this_host()
        return None

    def try_lease(self, mc: ModelCache, digest: str, ttl: float) -> Lease | None:
        mc.ensure_locks_dir()
        return Lease.try_take(str(mc.layout.lease_path(digest)), ttl=ttl)

    def lease_or_wait(
        self,
        mc: ModelCache,
        digest: str,
        *,
        ttl: float,
        timeout: float,
        poll: Callable[[], Callable[..., Any] | None],
    ) -> WaitOutcome[Callable[..., Any]]:
        mc.ensure_locks_dir()
        return acquire_or_wait(
            str(mc.layout.lease_path(digest)), ttl=ttl, timeout=timeout, poll=poll
        )

    def before(self, resolver: Resolver, work: Sequence[Work], mc: ModelCache | None) -> None:
        """Nothing: processes find each other's work through the folder."""

    def fetch(self, mc: ModelCache, keys: Sequence[IndexKey]) -> bool:
        """Nothing: the folder is all there is."""
        return False

    def publish(self, mc: ModelCache, keys: Sequence[IndexKey]) -> None:
        """Nothing: the entries are in the folder already."""
