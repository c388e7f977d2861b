"""A ``redis-server`` of a test's own (Debian's package; ``make redis``
installs it): a free port on 127.0.0.1, no persistence, stopped at the end.
Torch-free."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["REDIS_SERVER", "RedisServer", "free_port"]

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    """A TCP port nothing listens on now (it may be taken before it is used)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """``redis-server --port <free> --save '' --appendonly no`` in ``folder``,
    ready (it answered PING) when the constructor returns."""

    def __init__(self, folder: Path, *args: str) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(
                "redis-server is not on PATH: run `make redis` (apt-get install redis-server)"
            )
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        for _ in range(5):  # the free port may be taken between look and bind
            self.port = free_port()
            with open(folder / f"redis-{self.port}.log", "wb") as log:
                self.proc = subprocess.Popen(
                    [
                        *(REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"),
                        *("--save", "", "--appendonly", "no", "--dir", str(folder), *args),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"redis-server did not start; see the logs in {folder}")

    @property
    def url(self) -> str:
        return self.db_url(0)

    def db_url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _wait_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return True
            time.sleep(0.02)
        return False

    def signal(self, sig: int) -> None:
        """Send ``sig`` (``SIGSTOP`` freezes it: a slow or hung server)."""
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
