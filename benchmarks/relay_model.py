"""What the relay harness (``benchmarks/relay_harness.py``) plays: the reference it checks the
compiled fast path against (the pure path in miniature, :class:`PurePath`), the connections
it opens (:class:`Sender`, :class:`Receiver`), and the frames its senders write
(:class:`Frames`: routes, control frames and hostile frames of all three framings).

Nothing here touches a relay: the harness drives ``gossiprouter.server._relay`` and checks each
receiver against what this module's reference decided.
"""

from __future__ import annotations

import collections
import fcntl
import random
import socket
import struct
import sys
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gossiprouter.protocol import jgroups2 as j2  # noqa: E402
from gossiprouter.protocol import jgroups2_scan as j2scan  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import jgroups5_scan as j5scan  # noqa: E402
from gossiprouter.protocol import jgroups_scan as jc  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from gossiprouter.protocol import native_scan as ns  # noqa: E402
from gossiprouter.protocol.errors import ProtocolError  # noqa: E402
from gossiprouter.protocol.jgroups_address import JAddress  # noqa: E402

KINDS = ("native", "jgroups2", "jgroups5")
# The framings whose routes the router learns with a remote share (fastpath.learn_*): 2.12's
# frames are re-wrapped per route, so a federated 2.12 group stays in Python.
REMOTE_KINDS = ("native", "jgroups5")
MAX_FRAME = 1 << 20
SMALL_HOLD = 512  # some senders' max_hold: their cut frames above it go to Python
U32 = struct.Struct(">I")


class Violation(Exception):
    """The run under test and the reference differ (or the relay broke its API contract)."""


def fionread(sock: socket.socket) -> int:
    """Bytes received on ``sock`` and not read yet."""
    buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    n: int = U32.unpack(buf[::-1] if sys.byteorder == "little" else buf)[0]
    return n


def split_frames(data: bytes, out_len: int, count: int) -> list[bytes]:
    """``count`` frames of ``data``, each ``out_len`` header bytes, a u32 length and that
    many bytes (length-prefixed frames: ``out_len`` 0)."""
    frames = []
    pos = 0
    for _ in range(count):
        n = U32.unpack_from(data, pos + out_len)[0]
        end = pos + out_len + 4 + n
        frames.append(data[pos:end])
        pos = end
    if pos != len(data):
        raise Violation(f"a run of {count} frames is {len(data)} bytes, its frames {pos}")
    return frames


# --------------------------------------------------------------------------- the pure path


@dataclass
class Run:
    """Frames the pure path routes with one decision: the destination's key (None: the
    group), what the thread is taught (``Relay.learn``'s key, out and skip), and what each
    receiver gets, frame by frame (2.12: re-wrapped)."""

    dest: bytes | None
    key: bytes | None
    out: bytes
    skip: int
    frames: list[bytes]


class PurePath:
    """One connection's side of the pure path, in miniature: the protocol's scanner, the cut
    frame carried to the next chunk, and the session's policy (see the module docstring)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.carry = b""
        self.need = 0  # the carried frame's whole length (0: unknown)
        self.closed = ""  # why the connection was closed
        self.scanner: Any
        if kind == "native":
            self.scanner = ns.NativeScanner(MAX_FRAME, relay=True)
        elif kind == "jgroups2":
            self.scanner = j2scan.Scanner("jgroups2:", MAX_FRAME)
            self.scanner.registered(MAX_FRAME)
        else:
            self.scanner = j5scan.Scanner("jgroups5:", MAX_FRAME)
            self.scanner.registered(MAX_FRAME)

    @property
    def holding(self) -> bool:
        """What the next chunk continues cannot be handed to the thread (a 2.12 object in the
        scanner's decoder)."""
        return bool(getattr(self.scanner, "holding", False))

    def feed(self, data: bytes) -> list[Run]:
        """The runs the pure path routes from ``data`` (after any carried bytes), in order."""
        if self.closed:
            return []
        data = self.carry + data
        self.carry = b""
        self.need = 0
        runs: list[Run] = []
        if self.kind == "native":
            self._native(data, runs)
        else:
            self._jgroups(data, runs)
        return runs

    def _native(self, data: bytes, runs: list[Run]) -> None:
        sc = self.scanner
        for kind, start, end, count, head in sc.scan(data):
            if kind == ns.RUN:
                frames = split_frames(data[start:end], 0, count)
                runs.append(Run(head[1], sc.header(data, start + 4), b"", 0, frames))
            elif kind == ns.CONTROL:
                try:
                    wire.frame_from_body(data[start + 4:end])
                except ProtocolError as e:  # the session answers ERROR and closes
                    self.closed = f"native control frame: {e}"
                    return
            elif kind == ns.PARTIAL:
                self.carry = data[start:]
                self.need = count if count > 4 else 0
            elif kind != ns.PUBLICATIONS:
                self.closed = f"native item {kind}"
                return

    def _jgroups(self, data: bytes, runs: list[Run]) -> None:
        sc = self.scanner
        v2 = self.kind == "jgroups2"

        def on_run(head: Any, frames: bytes, count: int) -> bool:
            if v2:  # (hlen, group, dest, the header re-wrapped, key)
                runs.append(Run(head[2], head[4], head[3], head[0],
                                split_frames(frames, len(head[3]), count)))
            else:  # (hlen, group, dest, (group, sender), key): relayed as received
                runs.append(Run(head[2], head[4], b"", 0, split_frames(frames, 0, count)))
            return False

        for kind, start, end, _count, _head in sc.scan(data, on_run):
            if kind == jc.CONTROL or kind == jc.HELD:
                continue  # a 5.x control frame that does not decode is skipped, as there
            if kind == jc.PARTIAL:
                self.carry = data[start:]
                self.need = end - start
                return
            self.closed = f"{self.kind} item {kind}"
            return


# --------------------------------------------------------------------------- connections


@dataclass
class Receiver:
    kind: str
    addr: bytes  # its routing key: native address, JGroups address key
    csock: socket.socket  # the client's end: the harness reads it
    rsock: socket.socket  # the router's end: the relay and the outbox write it
    cid: int
    lock: threading.RLock = field(default_factory=threading.RLock)
    attached: bool = False
    chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    paused: bool = False
    inbuf: bytearray = field(default_factory=bytearray)
    # source -> the frames it must still receive from that source, in order
    expected: dict[str, collections.deque[bytes]] = field(default_factory=dict)
    received: int = 0
    # A JGroups sender is a receiver of its own group's multicasts (the router's
    # Group.targets()): one connection read by the thread and written by it and by Python.
    twin_of: str = ""
    closed: bool = False

    def expect(self, source: str, frame: bytes) -> None:
        self.expected.setdefault(source, collections.deque()).append(frame)

    def waiting(self) -> int:
        return sum(len(q) for q in self.expected.values())


@dataclass
class Sender:
    kind: str
    name: str
    addr: Any  # native: bytes; JGroups: JAddress
    csock: socket.socket
    rsock: socket.socket
    cid: int
    hold: int
    py: PurePath  # Python's half of the run under test
    ref: PurePath  # the reference
    reading: bool = False  # the thread reads it (read() called, no upcall since)
    pending: bytes = b""
    pos: int = 0
    cuts: list[int] = field(default_factory=list)  # offsets where a write stops and waits
    eof: bool = False  # shut down its side once everything is written
    ending: bool = False  # shut down: waits for the EOF upcall
    written: int = 0
    upcalled: int = 0  # bytes handed up (DATA)
    handed_back: int = 0  # bytes given back with read(held)
    closed: str = ""
    trace: list[str] = field(default_factory=list)  # the last events, for a report
    # Native multicasts model a federated group: each frame must also reach "the other
    # routers" once, in order: sent by Python when it routes the frame, or handed up by the
    # thread (REMOTE) when it relays it on a route learned with a remote share.
    remote: collections.deque[bytes] = field(default_factory=collections.deque)


# --------------------------------------------------------------------------- frames


class Frames:
    """The frames a harness's senders write, drawn from its ``rng`` (shared: a seed replays
    the same frames in the same order) and tagged with their source and a sequence number."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seq = 0

    def payload(self, source: str, size: int) -> bytes:
        self.seq += 1
        tag = b"%s|%d|" % (source.encode(), self.seq)
        return tag + self.rng.randbytes(max(0, size - len(tag)))

    def size(self) -> int:
        x = self.rng.random()
        if x < 0.80:
            return self.rng.randrange(0, 200)
        if x < 0.97:
            return self.rng.randrange(200, 6000)
        if x < 0.995:
            return self.rng.randrange(60_000, 140_000)  # past RECV_SIZE: several reads
        return self.rng.randrange(250_000, 300_000)  # past MAX_HOLD: Python holds it

    def route(self, s: Sender, dest: Any, size: int) -> bytes:
        p = self.payload(s.name, size)
        if s.kind == "native":
            return wire.encode_route("g", dest, s.addr, p)
        if s.kind == "jgroups2":
            return j2.message("cluster", dest, p)
        return j5.message("cluster", dest, s.addr, p)

    def control(self, kind: str) -> bytes:
        if kind == "native":
            return wire.encode(wire.Ping(self.rng.randrange(1 << 30)))
        return j2.ping() if kind == "jgroups2" else j5.heartbeat()

    def a_dest(self, s: Sender) -> Any:
        x = self.rng.random()
        if x < 0.7:
            return None
        i = self.rng.randrange(4)  # 3: nobody has that address
        return (b"R%d" % i) if s.kind == "native" else address(s.kind, i)

    def hostile(self, s: Sender) -> bytes:
        """A frame the thread must not relay, built on a route frame it may have learned."""
        f = self.route(s, None, self.rng.randrange(0, 40))
        if s.kind == "jgroups2":
            hdr = j2_header(f)
            choices = [
                hdr + U32.pack(0),  # an empty buffer: not a relayed MESSAGE
                hdr + U32.pack(0xFFFFFFFF),  # negative
                hdr + U32.pack(0x80000000),
                hdr + U32.pack(MAX_FRAME + 1),  # oversized
                b"\xee" + f[1:],  # no such type
                hdr[:-1],  # a header cut short, then the next frame
            ]
            return self.rng.choice(choices)
        n = U32.unpack_from(f)[0]
        choices = [
            U32.pack(0xFFFFFFFF) + f[4:],  # negative (5.x: an error; native: too large)
            U32.pack(0xFFFFFFFB),  # 5.x's close marker
            U32.pack(MAX_FRAME + 1) + f[4:],  # past max_frame
            U32.pack(3) + f[4:7],  # shorter than the learned header
            U32.pack(n - 1) + f[4:-1],  # the payload's length now ends past the frame
            U32.pack(n + 1) + f[4:] + b"\0",  # ... or before it
        ]
        if s.kind == "native":
            mark = len(f) - n + native_payload_at(f)
            g = bytearray(f)
            g[mark] = 0xD9  # a str where the payload's bin must be
            choices.append(bytes(g))
        else:
            g = bytearray(f)
            plen_at = len(f) - 4 - (len(f) - j5_payload_at(f))
            g[plen_at:plen_at + 4] = U32.pack(0xFFFFFFF0)  # the payload's length lies
            choices.append(bytes(g))
        return self.rng.choice(choices)


def j2_header(f: bytes) -> bytes:
    """A 2.12 MESSAGE's bytes before its buffer's length."""
    sc = j2scan.Scanner("jgroups2:", MAX_FRAME)
    hit = sc._learn(f, 0, len(f), MAX_FRAME)
    assert isinstance(hit, tuple), hit
    return f[: hit[0]]


def j5_payload_at(f: bytes) -> int:
    """Where a 5.x MESSAGE's payload starts (after its u32 length)."""
    sc = j5scan.Scanner("jgroups5:", MAX_FRAME)
    hit = sc._learn(f, 4, len(f))
    assert hit is not None
    return 4 + hit[0] + 4


def native_payload_at(f: bytes) -> int:
    """Where a native ROUTE's payload (its bin marker) starts, from the frame's body."""
    return ns.route_header(f, 4, len(f))[3]


def address(kind: str, i: int) -> JAddress:
    return JAddress.from_uuid(0x0102030405060700 + i, 0x1112131415161700 + i,
                              version=2 if kind == "jgroups2" else 5)


def index_of(kind: str, key: bytes) -> int:
    return next(i for i in range(8) if address(kind, i).key == key)


KIND_CODE: dict[str, Callable[[ModuleType], int]] = {
    "native": lambda m: int(m.NATIVE),
    "jgroups2": lambda m: int(m.JG2),
    "jgroups5": lambda m: int(m.JG5),
}
