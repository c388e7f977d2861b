"""Lease files: locks that work on shared file systems across hosts.

A lease is a file created with ``O_CREAT | O_EXCL`` (atomic on local file
systems and on NFSv3+), holding who owns it (host, pid, a random token). Its
owner renews it by touching it from a heartbeat thread. Nobody relies on
``flock``. A lease is *stale*, and may be taken over, when its owner is a
dead pid on this host, or when it has not been renewed for ``ttl`` seconds
(any host; the owner's host may be gone). Takeover renames the stale file
aside first, so two takers cannot both win.

>>> import tempfile, os
>>> from fxpiece.lease import Lease
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
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Lease", "LeaseInfo", "read_lease", "this_host"]


def this_host() -> str:
    return socket.gethostname() or "unknown"


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    host: str
    pid: int
    token: str
    ttl: float
    age: float
    """Seconds since the last renewal (by this reader's clock)."""


def read_lease(path: str) -> LeaseInfo | None:
    """The lease at ``path``, or ``None`` if there is none (or it is being
    written: an empty or partial file counts as fresh, see :meth:`Lease.is_stale`)."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        d: Any = json.loads(raw)
        return LeaseInfo(
            str(d["host"]),
            int(d["pid"]),
            str(d["token"]),
            float(d["ttl"]),
            time.time() - st.st_mtime,
        )
    except (ValueError, KeyError, TypeError):
        return LeaseInfo("", 0, "", 0.0, time.time() - st.st_mtime)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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
        """Take the lease if nobody holds it; ``None`` if somebody does."""
        host = host or this_host()
        token = secrets.token_hex(8)
        body = json.dumps({"host": host, "pid": os.getpid(), "token": token, "ttl": ttl})
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return None
        try:
            os.write(fd, body.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls(path, host, token, ttl)

    @staticmethod
    def is_stale(info: LeaseInfo, *, host: str | None = None, grace: float = 5.0) -> bool:
        """Whether a lease may be taken over: its owner is a dead pid on this
        host, or it was not renewed for its ttl (an unreadable lease gets
        ``grace`` seconds to be written)."""
        host = host or this_host()
        if not info.token:
            return info.age > grace
        if info.host == host and not _pid_alive(info.pid):
            return True
        return info.age > info.ttl

    @classmethod
    def take_over(
        cls, path: str, seen: LeaseInfo, *, host: str | None = None, ttl: float = 30.0
    ) -> Lease | None:
        """Break the stale lease ``seen`` and take it; ``None`` if somebody
        else broke or renewed it first."""
        cur = read_lease(path)
        if cur is None or cur.token != seen.token or not cls.is_stale(cur, host=host):
            return cls.try_acquire(path, host=host, ttl=ttl) if cur is None else None
        aside = f"{path}.stale-{secrets.token_hex(4)}"
        try:
            os.rename(path, aside)  # only one taker's rename finds the file
        except FileNotFoundError:
            return None
        moved = read_lease(aside)
        if moved is not None and moved.token != seen.token:
            # Another taker replaced the stale lease between our check and our
            # rename: put its lease back (link fails if the path is taken).
            with contextlib.suppress(OSError):
                os.link(aside, path)
            _unlink(aside)
            return None
        _unlink(aside)
        return cls.try_acquire(path, host=host, ttl=ttl)

    def _heartbeat(self) -> None:
        period = max(0.05, self.ttl / 3)
        while not self._stop.wait(period):
            info = read_lease(self.path)
            if info is None or info.token != self.token:
                return  # taken over: stop renewing someone else's lease
            try:
                os.utime(self.path, None)
            except OSError:
                return

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours."""
        self._stop.set()
        self._thread.join(timeout=5)
        info = read_lease(self.path)
        if info is not None and info.token == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
