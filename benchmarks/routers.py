"""What the benchmarks that start a router process share: a free port, waiting until the
process listens on it, a router run from a checkout for the length of a block, and a native
client connection to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gossiprouter.protocol import native as wire


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


@contextmanager
def serving(src: Path, port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m gossiprouter serve`` from the checkout ``src`` on 127.0.0.1:``port`` with
    ``args`` (warnings only, output discarded), once it listens; terminated at the end of the
    block if it still runs (``--src DIR`` of the benchmarks: the code before a change)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "warning", *args],
        cwd=src, env=dict(os.environ, PYTHONPATH=str(src)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_listening(proc, port, 20.0):
            if proc.poll() is not None:
                raise RuntimeError(f"router exited with status {proc.returncode} before "
                                   "listening")
            raise TimeoutError(f"nothing listening on 127.0.0.1:{port}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def native_client(port: int) -> socket.socket:
    """A native connection to the router on ``port`` (TCP_NODELAY), past HELLO and WELCOME."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench")))
    dec = wire.Decoder()
    while not dec.frames():
        data = s.recv(65536)
        if not data:
            raise RuntimeError("router closed the connection before WELCOME")
        dec.feed(data)
    return s
