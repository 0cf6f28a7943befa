"""What a router process holds in memory, with the compiled fast path and without (issue 24).

Each case starts a fresh router process (``gossiprouter serve``) with ``--fast-path off`` and
then ``on``, drives it with plain sockets from this process, and reads the router's resident
set size (``VmRSS`` in ``/proc/PID/status``) before and after. Cases:

* ``multicast``: one sender and ``--receivers`` receivers in a group; after one small multicast
  (which teaches the thread the route), one 64 KiB multicast; RSS growth once every receiver
  has read it (what is retained for them). With 4,000 receivers its copies could exceed
  ``fast_path_max_bytes`` (64 MiB), so Python routes it; ``multicast-relayed`` raises that
  bound to 1 GiB so that the thread relays it.
* ``learned-64k`` / ``frames-60k``: ``--pairs`` pairs of connections; each sender unicasts
  ``--frames`` frames of 64 KiB (65,536 bytes on the wire: the thread relays them) or of
  60,000 bytes to its receiver, one at a time (each read before the next is sent); then RSS
  per connection, idle.
* ``preauth``: ``--preauth`` connections that send the preamble and the first 60,000 bytes of
  a 64 KiB HELLO and stop: RSS per connection before authentication.
* ``idle``: ``--connections`` native connections, each HELLO'd and registered (CONNECT) in a
  group of its own, nothing routed: RSS per connection.

A benchmark, not a test: it prints figures and asserts nothing. ``--quick`` is the bounded
smoke run CI makes (tens of connections, seconds). Per-connection figures include what the
kernel charges to the process for nothing (it is the socket memory that is the kernel's, not
in RSS) and the router's share of Python's allocator arenas, so small counts are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.routers import free_port, wait_listening
from gossiprouter.protocol import native as wire

KIB = 1024
# What one case may take, start to end, before it is abandoned (a benchmark must end).
CASE_TIMEOUT = 300.0
IO_TIMEOUT = 60.0


def rss(pid: int) -> int:
    """The resident set size of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KIB
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextlib.contextmanager
def router(fast: str, *options: str) -> Iterator[tuple[int, int]]:
    """A router process on 127.0.0.1 with ``--fast-path fast``: (pid, port)."""
    port = free_port()
    cmd = [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1", "--port",
           str(port), "--fast-path", fast, "--idle-timeout", "0", "--log-level", "warning",
           "--max-connections", "30000", "--control-rate", "0", *options]
    env = dict(os.environ)
    env.pop("GOSSIPROUTER_FAST_PATH", None)
    p = subprocess.Popen(cmd, env=env)
    try:
        if not wait_listening(p, port, 30):
            raise RuntimeError(f"the router did not start: {cmd}")
        yield p.pid, port
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Conn:
    """One native connection over a blocking socket, frames decoded as they come."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
        self.decoder = wire.Decoder(max_frame=64 * 1024 * 1024)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, want: Callable[[wire.Frame], bool], n: int = 1) -> None:
        """Read until ``n`` frames for which ``want`` is true have come (others skipped)."""
        while n:
            f = self.decoder.next_frame()
            if f is None:
                data = self.sock.recv(256 * KIB)
                if not data:
                    raise RuntimeError("the router closed a benchmark connection")
                self.decoder.feed(data)
                continue
            if isinstance(f, wire.Error):
                raise RuntimeError(f"the router refused: {f}")
            if want(f):
                n -= 1

    def close(self) -> None:
        self.sock.close()


def hello() -> bytes:
    return wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-memory"))


def registered(port: int, group: str, addr: bytes) -> Conn:
    """A connection that said HELLO and CONNECTed ``addr`` in ``group`` (replies not read)."""
    c = Conn(port)
    c.send(hello() + wire.encode(wire.Connect(1, group, addr)))
    return c


def settle(conns: list[Conn]) -> None:
    """Wait for every connection's WELCOME and OK."""
    for c in conns:
        c.frames(lambda f: isinstance(f, wire.Welcome))
        c.frames(lambda f: isinstance(f, wire.Ok))


def route_of_size(group: str, dest: bytes | None, sender: bytes, size: int) -> bytes:
    """A ROUTE frame of exactly ``size`` bytes on the wire."""
    base = len(wire.encode_route(group, dest, sender, b""))
    pad = size - base
    for extra in range(0, 8):  # the bin's length field grows with the payload
        data = wire.encode_route(group, dest, sender, b"x" * (pad - extra))
        if len(data) == size:
            return data
    raise ValueError(f"no ROUTE frame of {size} bytes")


def quiet(pid: int) -> int:
    """The router's RSS once it has settled (freed memory, finished writes)."""
    time.sleep(0.5)
    return rss(pid)


def is_route(f: wire.Frame) -> bool:
    return isinstance(f, wire.Route)


# --------------------------------------------------------------------------- the cases


def multicast(pid: int, port: int, receivers: int) -> float:
    """Bytes retained after one 64 KiB multicast to ``receivers`` was read by all of them."""
    group = "mc"
    sender = registered(port, group, b"sender")
    rs = [registered(port, group, b"r%d" % i) for i in range(receivers)]
    settle([sender, *rs])
    small = wire.encode_route(group, None, b"sender", b"learn")
    sender.send(small)  # routed by Python once (the thread learns the route)
    for r in rs:
        r.frames(is_route)
    sender.send(small)
    for r in rs:
        r.frames(is_route)
    before = quiet(pid)
    sender.send(route_of_size(group, None, b"sender", 64 * KIB))
    for r in rs:
        r.frames(is_route)
    after = quiet(pid)
    for c in [sender, *rs]:
        c.close()
    return float(after - before)


def pairs_case(pid: int, port: int, pairs: int, frames: int, size: int) -> float:
    """Bytes per connection, idle, after each pair routed ``frames`` frames of ``size``."""
    base = quiet(pid)
    senders, receivers = [], []
    for i in range(pairs):
        g = f"p{i}"
        senders.append(registered(port, g, b"a"))
        receivers.append(registered(port, g, b"b"))
    settle(senders + receivers)
    for i in range(pairs):
        data = route_of_size(f"p{i}", b"b", b"a", size)
        s, r = senders[i], receivers[i]
        # One at a time, each read before the next is sent: what is measured is what stays
        # behind, not a burst queued for a receiver (the first frame goes through Python and
        # teaches the thread the route).
        for _ in range(frames):
            s.send(data)
            r.frames(is_route)
    after = quiet(pid)
    for c in senders + receivers:
        c.close()
    return (after - base) / (2 * pairs)


def preauth(pid: int, port: int, n: int) -> float:
    """Bytes per connection that sent 60,000 bytes of a 64 KiB HELLO and stopped."""
    base = quiet(pid)
    start = wire.PREAMBLE + struct.pack(">I", 64 * KIB - 4) + b"\x95" + b"\x00" * 59_995
    conns = []
    for _ in range(n):
        c = Conn(port)
        c.send(start)
        conns.append(c)
    # Everything sent was received by the router: a PING-less protocol state, so wait until
    # its RSS stops growing.
    after = quiet(pid)
    while True:
        time.sleep(0.5)
        now = rss(pid)
        if now <= after:
            break
        after = now
    for c in conns:
        c.close()
    return (after - base) / n


def idle(pid: int, port: int, n: int) -> float:
    """Bytes per idle registered native connection (a group each, nothing routed)."""
    base = quiet(pid)
    conns = []
    for i in range(n):
        conns.append(registered(port, f"i{i}", b"m"))
        if len(conns) % 500 == 0:
            settle(conns[-500:])
    settle(conns[len(conns) - len(conns) % 500:])
    after = quiet(pid)
    for c in conns:
        c.close()
    return (after - base) / n


# Router options by case: the default handshake timeout (its expired cancel scopes are
# trio's until then) except for connections kept before authentication, which must outlive
# the measurement; a cap on the fast path's holdings that lets its thread relay the fan-out.
OPTIONS = {
    "preauth": ("--handshake-timeout", str(CASE_TIMEOUT)),
    "multicast-relayed": ("--fast-path-max-bytes", str(1 << 30)),
}


@dataclass
class Sizes:
    receivers: int
    pairs: int
    frames: int
    preauth: int
    connections: int


def cases(sizes: Sizes) -> dict[str, tuple[str, Callable[[int, int], float]]]:
    """name -> (row label, run(pid, port) -> bytes)."""
    s = sizes
    return {
        "multicast": (f"one 64 KiB multicast to {s.receivers:,} receivers, after they read it "
                      "(retained)", lambda pid, port: multicast(pid, port, s.receivers)),
        "multicast-relayed": ("the same, fast_path_max_bytes 1 GiB (the thread relays it)",
                              lambda pid, port: multicast(pid, port, s.receivers)),
        "learned-64k": (f"idle connection after routing {s.frames} learned 64 KiB frames "
                        f"({s.pairs} pairs)",
                        lambda pid, port: pairs_case(pid, port, s.pairs, s.frames, 64 * KIB)),
        "frames-60k": (f"idle connection after routing {s.frames} 60 KB frames ({s.pairs} pairs)",
                       lambda pid, port: pairs_case(pid, port, s.pairs, s.frames, 60_000)),
        "preauth": (f"connection before authentication ({s.preauth:,} connections)",
                    lambda pid, port: preauth(pid, port, s.preauth)),
        "idle": (f"{s.connections:,} idle registered native connections (each)",
                 lambda pid, port: idle(pid, port, s.connections)),
    }


def fmt(case: str, value: float) -> str:
    if case.startswith("multicast"):
        return f"{value / KIB / KIB:+.1f} MiB"
    return f"{value / KIB:.1f} KiB"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--receivers", type=int, default=4000, help="multicast receivers")
    ap.add_argument("--pairs", type=int, default=1000, help="sender/receiver pairs")
    ap.add_argument("--frames", type=int, default=20, help="frames per pair")
    ap.add_argument("--preauth", type=int, default=1000, help="connections before HELLO")
    ap.add_argument("--connections", type=int, default=10_000, help="idle registered ones")
    ap.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                    help="multicast multicast-relayed learned-64k frames-60k preauth idle "
                         "(default: all)")
    ap.add_argument("--paths", nargs="+", choices=("off", "on"), default=["off", "on"],
                    help="fast path off (pure Python) and/or on")
    ap.add_argument("--quick", action="store_true",
                    help="bounded smoke run: a few dozen connections per case")
    args = ap.parse_args(argv)
    if args.quick:
        args.receivers, args.pairs, args.frames = 20, 4, 3
        args.preauth, args.connections = 20, 50
    sizes = Sizes(args.receivers, args.pairs, args.frames, args.preauth, args.connections)
    table = cases(sizes)
    chosen = args.cases or list(table)
    unknown = [c for c in chosen if c not in table]
    if unknown or min(sizes.receivers, sizes.pairs, sizes.preauth, sizes.connections) < 1 \
            or sizes.frames < 2:
        ap.error(f"unknown case {unknown[0]}" if unknown else "every size must be at least 1 "
                 "(--frames at least 2)")
    # One socket per connection here and one in the router (which inherits the limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(sizes.connections, sizes.receivers, sizes.preauth, 2 * sizes.pairs) + 256
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            ap.error(f"needs {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    print(f"{'case':<78} {'fast path on':>14} {'off':>10} {'on/off':>7}")
    for name in chosen:
        label, run = table[name]
        got: dict[str, float] = {}
        for path in args.paths:
            with router(path, *OPTIONS.get(name, ())) as (pid, port):
                got[path] = run(pid, port)
        on, off = got.get("on"), got.get("off")
        # A ratio of two growths of a few pages says nothing: the multicast rows compare MiB.
        ratio = f"{on / off:.2f}" if on is not None and off and not name.startswith(
            "multicast") else "-"
        print(f"{label:<78} {'-' if on is None else fmt(name, on):>14} "
              f"{'-' if off is None else fmt(name, off):>10} {ratio:>7}", flush=True)


if __name__ == "__main__":
    main()
