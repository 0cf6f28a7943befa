"""What the benchmarks that start a router process share: a free port, and waiting until the
process listens on it."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(proc: subprocess.Popen[bytes], port: int, seconds: float) -> bool:
    """Until ``proc`` accepts connections on ``port``: True, or False if it ended or did not
    within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
