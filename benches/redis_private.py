"""A private ``redis-server`` for a benchmark: a free port on 127.0.0.1, no
persistence, its files in ``folder``; stopped when the block ends.

    with private_server(Path(tmp)) as port: ...
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def private_server(folder: Path) -> Iterator[int]:
    """Start one, wait until it accepts connections, yield its port."""
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not on PATH: run `make redis`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(exe, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(folder)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit("redis-server did not start")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
