"""Lease files and single-flight waiting: locks that work on shared file
systems across hosts.

A lease is a file created with ``O_CREAT | O_EXCL`` (atomic on local file
systems and on NFSv3+), holding who owns it (host, pid-namespace identity,
pid, a random token). Its owner renews it by touching it from a heartbeat
thread. Nobody relies on ``flock``. A lease is *stale*, and may be taken
over, when its owner is a dead pid in this very PID namespace, when it has
not been renewed for ``ttl`` seconds (the reader's ``ttl``, never the one
written in the file), or when it is not a lease at all (a FIFO, symlink,
folder or oversized file planted under ``locks/``). Takeover renames the
stale file aside first, so two takers cannot both win.

A lease dated more than :data:`MAX_CLOCK_SKEW` seconds in the future (its
holder's clock runs ahead) never ages by our clock; a waiter watching it
(:class:`LeaseWatch`) times it on its own monotonic clock instead, from when
it first saw the lease as it is now (token and mtime), and takes it over
once it has not changed for ``ttl + MAX_CLOCK_SKEW`` seconds. A holder that
keeps renewing keeps its lease however far its clock runs ahead: each
renewal changes the mtime and restarts the wait. Such a lease is logged
once (its path and host).

:func:`acquire_or_wait` is the single-flight protocol the backend uses: take
the lease and compile, or wait for the holder's result.

>>> import tempfile, os
>>> from fxpiece.cache.lease import Lease
>>> p = os.path.join(tempfile.mkdtemp(), "x.lease")
>>> a = Lease.try_acquire(p, host="h1")
>>> Lease.try_acquire(p, host="h2") is None
True
>>> a.release()
>>> b = Lease.try_acquire(p, host="h2"); b.release()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from fxpiece import _native
from fxpiece.cache.layout import CacheLayout
from fxpiece.cache.safeio import read_regular
from fxpiece.errors import CacheError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "MAX_CLOCK_SKEW",
    "Lease",
    "LeaseInfo",
    "LeaseWatch",
    "Releasable",
    "WaitOutcome",
    "acquire_or_wait",
    "namespace_id",
    "pid_alive",
    "read_lease",
    "this_host",
]

DEFAULT_LEASE_TTL = 30.0
"""Seconds a lease may go unrenewed before others may take it over."""
MAX_CLOCK_SKEW = 5.0
"""Seconds a lease's time (its mtime, set by its holder's clock) may be ahead
of ours and still be aged by our clock. A lease dated further ahead is
suspect: a waiter gives it ``ttl + MAX_CLOCK_SKEW`` seconds without a change
on its own monotonic clock (:class:`LeaseWatch`), then takes it over."""
LEASE_LIMIT = 4096
"""A lease file is a small JSON object; anything bigger is not a lease."""
T = TypeVar("T")
_log = logging.getLogger("fxpiece")


this_host = _native.this_host
"""This host's name (the native core's, as in index temp-file names)."""


def namespace_id() -> str:
    """This boot and PID namespace (the native core's id, the one its temp
    file names carry): two containers sharing a host name have different
    ones, so a pid is only judged dead within its own namespace. ``"nons"``
    when it cannot be read (no ``/proc``): such a lease is judged by age only."""
    return _native.namespace_id() or "nons"


pid_alive = _native.pid_alive
"""Whether a pid is a live process here (``False`` for nonsense pids)."""


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    host: str
    ns: str
    pid: int
    token: str
    age: float
    """Seconds since the last renewal (by this reader's clock)."""
    hostile: str | None = None
    """Why the file is not a lease at all (FIFO, symlink, folder, too big)."""
    mtime_ns: int = 0
    """The file's mtime (its last renewal, by its holder's clock)."""


def _stamp(path: str) -> tuple[float, int]:
    """``(age, mtime_ns)`` of the file at ``path`` (age by our clock;
    negative when it is dated in the future)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0.0, 0
    return time.time() - st.st_mtime, st.st_mtime_ns


def read_lease(path: str) -> LeaseInfo | None:
    """The lease at ``path``, or ``None`` if there is none. A file that is
    being written (empty, partial, not JSON) has no token; one that is not a
    regular file or is too large has ``hostile`` set. Never blocks, never
    follows a symlink, never raises for what is in the file."""
    try:
        raw = read_regular(path, LEASE_LIMIT)
    except FileNotFoundError:
        return None
    except CacheError as e:
        age, mtime = _stamp(path)
        return LeaseInfo("", "", 0, "", age, hostile=e.strerror or str(e), mtime_ns=mtime)
    except OSError as e:
        age, mtime = _stamp(path)
        return LeaseInfo("", "", 0, "", age, hostile=f"unreadable: {e.strerror}", mtime_ns=mtime)
    age, mtime = _stamp(path)
    try:
        d = json.loads(raw.decode("utf-8"))
        host, ns, pid, token = d["host"], d.get("ns", ""), d["pid"], d["token"]
        if not (isinstance(host, str) and isinstance(ns, str) and isinstance(token, str)):
            raise TypeError
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31 or not token:
            raise TypeError
        return LeaseInfo(host, ns, pid, token, age, mtime_ns=mtime)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return LeaseInfo("", "", 0, "", age, mtime_ns=mtime)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class LeaseWatch:
    """One waiter's view of the leases dated in the future that it waits for
    (see the module doc): when it first saw each as it is now, timed on its
    own monotonic clock, never on the file's mtime."""

    def __init__(self, skew: float = MAX_CLOCK_SKEW) -> None:
        self.skew = skew
        self._seen: dict[str, tuple[str, int, float]] = {}
        """Lease path -> (token, mtime_ns, monotonic time first seen so)."""
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def overdue(self, path: str, info: LeaseInfo, ttl: float) -> bool:
        """Whether ``info``, the lease at ``path``, is dated more than
        ``skew`` seconds ahead of our clock and has not changed (same token,
        same mtime) for ``ttl + skew`` seconds since this watch first saw it
        so. Logs such a lease once (its path and host)."""
        now = time.monotonic()
        with self._lock:
            if info.hostile is not None or info.age >= -self.skew:
                self._seen.pop(path, None)
                return False
            seen = self._seen.get(path)
            if seen is None or seen[:2] != (info.token, info.mtime_ns):
                seen = (info.token, info.mtime_ns, now)
                self._seen[path] = seen
            first = (path, info.token) not in self._warned
            self._warned.add((path, info.token))
        if first:
            _log.warning(
                "fxpiece: lease %s of host %r is dated %.0f s in the future (more than the "
                "allowed clock skew of %g s: its holder's clock runs ahead); it is taken over "
                "unless it is renewed within %.1f s",
                path,
                info.host or "?",
                -info.age,
                self.skew,
                ttl + self.skew,
            )
        return now - seen[2] > ttl + self.skew


class Lease:
    """A held lease; renewed by a daemon thread until :meth:`release`."""

    def __init__(self, path: str, host: str, token: str, ttl: float) -> None:
        self.path = path
        self.host = host
        self.token = token
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"fxpiece-lease-{os.path.basename(path)}", daemon=True
        )
        self._thread.start()

    @classmethod
    def try_acquire(cls, path: str, *, host: str | None = None, ttl: float = 30.0) -> Lease | None:
        """Take the lease if nobody holds it; ``None`` if somebody does.
        Raises ``OSError`` if the lease cannot be created at all."""
        host = host or this_host()
        token = secrets.token_hex(8)
        body = json.dumps(
            {"host": host, "ns": namespace_id(), "pid": os.getpid(), "token": token, "ttl": ttl}
        )
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return None
        try:
            os.write(fd, body.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls(path, host, token, ttl)

    @staticmethod
    def is_stale(
        info: LeaseInfo, *, ttl: float, host: str | None = None, grace: float = 5.0
    ) -> bool:
        """Whether a lease may be taken over: not a lease at all, its owner is
        a dead pid in this PID namespace, or it was not renewed for ``ttl``
        (our ttl; an unreadable lease gets ``grace`` seconds to be written)."""
        if info.hostile is not None:
            return True
        if not info.token:
            return info.age > grace
        host = host or this_host()
        ns = namespace_id()
        if info.host == host and ns != "nons" and info.ns == ns and not pid_alive(info.pid):
            return True
        return info.age > ttl

    @classmethod
    def take_over(
        cls,
        path: str,
        seen: LeaseInfo,
        *,
        ttl: float,
        host: str | None = None,
        overdue: bool = False,
    ) -> Lease | None:
        """Break the stale lease ``seen`` and take it; ``None`` if somebody
        else broke or renewed it first. ``overdue``: ``seen`` is not stale by
        its age but a :class:`LeaseWatch` found it unrenewed too long (dated
        in the future); it is taken only if it is still exactly ``seen``."""
        cur = read_lease(path)
        if cur is None:
            return cls.try_acquire(path, host=host, ttl=ttl)
        unchanged = overdue and cur.mtime_ns == seen.mtime_ns
        if cur.token != seen.token or not (unchanged or cls.is_stale(cur, ttl=ttl, host=host)):
            return None
        aside = CacheLayout.stale_lease_name(path, secrets.token_hex(4))
        try:
            os.rename(path, aside)  # only one taker's rename finds the file
        except FileNotFoundError:
            return None
        moved = read_lease(aside)
        renewed = overdue and moved is not None and moved.mtime_ns != seen.mtime_ns
        if moved is not None and (moved.token != seen.token or renewed):
            # Another taker replaced the stale lease between our check and our
            # rename: put its lease back (link fails if the path is taken).
            with contextlib.suppress(OSError):
                os.link(aside, path)
            _unlink(aside)
            return None
        if moved is not None and moved.hostile is not None:
            with contextlib.suppress(OSError):
                os.rmdir(aside)  # a planted folder
        _unlink(aside)
        return cls.try_acquire(path, host=host, ttl=ttl)

    @classmethod
    def try_take(cls, path: str, *, ttl: float, watch: LeaseWatch | None = None) -> Lease | None:
        """Take the lease if it is free or stale (taken over); ``None`` if a
        live holder has it. Never waits. With ``watch``, a lease dated in the
        future that the watch has seen unchanged too long is stale too."""
        lease = cls.try_acquire(path, ttl=ttl)
        if lease is not None:
            return lease
        info = read_lease(path)
        if info is None:  # released meanwhile
            return cls.try_acquire(path, ttl=ttl)
        if cls.is_stale(info, ttl=ttl):
            return cls.take_over(path, info, ttl=ttl)
        if watch is not None and watch.overdue(path, info, ttl):
            return cls.take_over(path, info, ttl=ttl, overdue=True)
        return None

    def _heartbeat(self) -> None:
        period = max(0.05, self.ttl / 3)
        while not self._stop.wait(period):
            info = read_lease(self.path)
            if info is None or info.token != self.token:
                return  # taken over: stop renewing someone else's lease
            try:
                os.utime(self.path, None, follow_symlinks=False)
            except OSError:
                return

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours."""
        self._stop.set()
        self._thread.join(timeout=5)
        info = read_lease(self.path)
        if info is not None and info.token == self.token:
            _unlink(self.path)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Releasable(Protocol):
    """A held lease of any kind (a :class:`Lease` file, a lease on a remote
    store): released once the work it guards is done."""

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class WaitOutcome(Generic[T]):
    """What :func:`acquire_or_wait` ended with: the lease (compile now), the
    holder's ``result``, or neither (timed out: compile without a lease)."""

    lease: Releasable | None
    result: T | None
    waited_s: float


def acquire_or_wait(
    path: str,
    *,
    ttl: float,
    timeout: float,
    poll: Callable[[], T | None],
    watch: LeaseWatch | None = None,
) -> WaitOutcome[T]:
    """Single flight: take the lease at ``path``; if another process holds
    it, poll for its result (``poll()``, with back-off) until it appears, the
    lease frees up or goes stale (then it is taken over), or ``timeout``
    seconds pass. A lease dated in the future is timed by ``watch`` (a new
    :class:`LeaseWatch` when ``None``)."""
    watch = watch if watch is not None else LeaseWatch()
    lease = Lease.try_acquire(path, ttl=ttl)
    if lease is not None:
        return WaitOutcome(lease, None, 0.0)
    t0 = time.monotonic()
    delay = 0.05
    while True:
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
        result = poll()
        if result is not None:
            return WaitOutcome(None, result, time.monotonic() - t0)
        lease = Lease.try_take(path, ttl=ttl, watch=watch)
        if lease is not None:
            return WaitOutcome(lease, None, time.monotonic() - t0)
        if time.monotonic() - t0 > timeout:
            return WaitOutcome(None, None, time.monotonic() - t0)
