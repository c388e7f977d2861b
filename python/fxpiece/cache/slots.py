"""Compile slots: a per-host counting semaphore made of lease files.

Inductor compiles are CPU-bound; N processes compiling at once on a host
with fewer cores thrash. Before compiling, a process takes one of ``count``
slots: ``slot-0.lease`` ... ``slot-<count-1>.lease`` in a folder shared by
the processes of one host (``<cache root>/locks/slots/<host>/``, or a
private folder in the host's temporary file system). A slot is a
:class:`~fxpiece.cache.lease.Lease`: created with ``O_EXCL``, renewed by a
heartbeat, and freed the same way a dead lease is (a dead holder in this
PID namespace at once; an unrenewed one after ``ttl``, or after ``ttl`` plus
the allowed clock skew on this process's own clock when it is dated in the
future; a planted non-lease file at once). Every level of the folder below
its ``base`` (the cache root, or ``/dev/shm``) is checked before anything is
created in it: a symlink there is refused, never followed. Processes
configured with different counts share the low slot numbers, so the
smallest count bounds them all.

>>> import tempfile
>>> from pathlib import Path
>>> slots = CompileSlots(Path(tempfile.mkdtemp()), count=1)
>>> first, waited = slots.acquire(timeout=1.0)
>>> slots.acquire(timeout=0.1)[0] is None   # the only slot is taken
True
>>> first.release()
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

from fxpiece.cache.lease import DEFAULT_LEASE_TTL, Lease, LeaseWatch
from fxpiece.cache.trust import ensure_private_dir, ensure_private_under
from fxpiece.errors import CacheError

__all__ = ["CompileSlots", "default_parallel_compiles", "host_slot_base", "host_slot_dir"]


def default_parallel_compiles(compile_threads: int | None = None) -> int:
    """Cores this process may use divided by the threads one Inductor
    compile uses (``compile_threads``; Inductor's setting when ``None``),
    at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    if compile_threads is None:
        from fxpiece.piecewise import _torch_compat

        compile_threads = _torch_compat.inductor_compile_threads()
    return max(1, cores // max(1, compile_threads))


def host_slot_base() -> Path:
    """This host's temporary file system: ``/dev/shm`` when it exists, else
    the temporary folder (shared by every user: what fxpiece creates in it
    is checked level by level, see :func:`host_slot_dir`)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def host_slot_dir() -> Path:
    """A folder of this host only, private to this user, for processes that
    share no cache root: ``fxpiece-<uid>/compile-slots`` under
    :func:`host_slot_base`."""
    return host_slot_base() / f"fxpiece-{os.getuid()}" / "compile-slots"


def _private(folder: Path) -> str | None:
    """Why ``folder`` cannot hold our slots (another user could fill or
    remove them), or ``None``."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return f"{folder}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != os.getuid():
        return f"{folder} is owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class CompileSlots:
    """``count`` compile slots in ``folder`` (see the module doc). ``base``:
    the folder ``folder`` is under (the cache root, :func:`host_slot_base`),
    whose every level below is checked before anything is created in it;
    ``None``: only the folder itself is checked."""

    def __init__(
        self,
        folder: Path,
        count: int,
        ttl: float = DEFAULT_LEASE_TTL,
        *,
        base: Path | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.folder = folder
        self.count = count
        self.ttl = ttl
        self.base = base
        self._watch = LeaseWatch()
        """Times slot leases dated in the future (a holder's clock ahead)."""

    def prepare(self) -> str | None:
        """Create the folder (0700, every level we create; with ``base``,
        every level checked before anything is created in it); why it cannot
        be used, or ``None``."""
        try:
            if self.base is None:
                ensure_private_dir(self.folder)
            else:
                ensure_private_under(self.base, self.folder)
        except CacheError as e:
            return str(e)
        return _private(self.folder)

    def acquire(self, timeout: float) -> tuple[Lease | None, float]:
        """Take a free slot, waiting up to ``timeout`` seconds: ``(slot,
        seconds waited)``; the slot is ``None`` if none freed up in time.
        Raises ``OSError`` if slot files cannot be created at all."""
        t0 = time.monotonic()
        delay = 0.02
        while True:
            for i in range(self.count):
                path = str(self.folder / f"slot-{i}.lease")
                lease = Lease.try_take(path, ttl=self.ttl, watch=self._watch)
                if lease is not None:
                    return lease, time.monotonic() - t0
            if time.monotonic() - t0 >= timeout:
                return None, time.monotonic() - t0
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
