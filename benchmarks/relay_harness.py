"""In-process differential harness of the compiled fast path (``gossiprouter/server/relay/``).

    python benchmarks/relay_harness.py [--seed N] [--steps N] [--seconds S]

This process plays the router's Python half around one ``gossiprouter.server._relay.Relay``, over
socketpairs: senders and receivers of all three framings (native, JGroups 2.12, 5.x) in one
relay. Each sender's stream is decided twice. The *reference* is the pure path alone: the
protocol's own scanner (``gossiprouter.protocol``) over the stream, with the session's policy
in miniature (a run is routed to its group or destination, a control frame is checked and
consumed, a malformed, oversized or negative frame closes the connection). The *run under
test* is the thread reading the socket and relaying what was learned, and this process
handling its upcalls with the same scanner and policy, learning routes as the sessions do
(``fastpath.learn_native`` / ``learn_jgroups``) and writing receivers as ``fastpath.py`` does
(``Relay.send`` while attached, the receiver's own queue and raw socket once evicted, attach
again when the queue is empty). After each step every receiver must hold exactly the
reference's frames, byte for byte and, per sender, in order, and nothing else (a
receiver-side framing check: every byte belongs to one whole expected frame); every byte a
sender wrote was handled exactly once (relayed by the thread, or handed up to Python); no
connection is handed up twice without being read again; nothing is dropped.

What it plays, chosen by ``random.Random(seed)``: batches of learned and unlearned routes,
control frames and hostile frames (lengths past ``max_frame``, negative, shorter than a learned
header, payload lengths that do not end the frame) written in pieces cut at random offsets,
and for one stream per framing at *every* offset, each cut read by the thread alone; frames
larger than ``RECV_SIZE`` and than ``max_hold``; a receiver that stops reading (evicted, then
written by its queue); a JGroups sender that receives its group's multicasts on its own
connection (read by the thread and written by it and by Python, as ``Group.targets()``
makes it); direct sends from two Python threads at once while the thread relays,
``invalidate``, a sender's EOF, and receivers and senders closed and opened again on the same
fd (the stale id must be refused by ``send``, ``take`` and ``learn``).

It drives only the Relay's Python API (what ``gossiprouter/server/fastpath.py`` calls), so it runs
unchanged against any build: ``scripts/sanitize`` runs it under ASAN+UBSAN and TSAN builds
(``GOSSIPROUTER_RELAY_SO``), ``tests/test_relay_harness.py`` a short bounded run of the
normal build. It exits 1 with the first violation and the seed.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import random
import select
import socket
import struct
import sys
import termios
import threading
import time
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
from gossiprouter.server import fastpath  # noqa: E402

KINDS = ("native", "jgroups2", "jgroups5")
MAX_FRAME = 1 << 20
SMALL_HOLD = 512  # some senders' max_hold: their cut frames above it go to Python
U32 = struct.Struct(">I")
# Consecutive waits of WAIT seconds with nothing happening before a step is called stalled:
# a hang guard (a relay that stopped reading a connection), not a timing assertion.
WAIT = 0.001
STALL_WAITS = 30_000


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


class Harness:
    def __init__(self, seed: int, mod: ModuleType | None = None, twins: bool = True) -> None:
        self.rng = random.Random(seed)
        self.twins = twins
        self.seed = seed
        mod = mod or fastpath._relay
        if mod is None:
            raise SystemExit("relay_harness: the fast path is not built (scripts/setup)")
        self.mod = mod
        self.relay = mod.Relay()
        self.senders: list[Sender] = []
        self.receivers: list[Receiver] = []
        self.bytes_in: collections.Counter[int] = collections.Counter()
        self.stats: collections.Counter[str] = collections.Counter()
        self.seq = 0
        self.step = 0
        self.last_fds: dict[str, int] = {}

    # ------------------------------------------------------------------ set-up

    def start(self) -> None:
        self.relay.start()
        for kind in KINDS:
            for i in range(3):
                self.receivers.append(self._open_receiver(kind, i))
            for i in range(2):
                self.senders.append(self._open_sender(kind, i))
                if self.twins and kind != "native" and i == 0:
                    self._twin(self.senders[-1])

    def _twin(self, s: Sender) -> None:
        """``s``'s connection as a receiver too."""
        r = Receiver(s.kind, s.addr.key, s.csock, s.rsock, s.cid, twin_of=s.name)
        with r.lock:
            self._attach(r)
        self.receivers.append(r)
        self.relay.invalidate()  # a member joined its group: RoutingTable.changed

    def close(self) -> None:
        self.relay.stop()
        for s in self.senders:
            s.csock.close()
            s.rsock.close()
        for r in self.receivers:
            r.csock.close()
            r.rsock.close()

    def _pair(self) -> tuple[socket.socket, socket.socket]:
        c, r = socket.socketpair()
        c.setblocking(False)
        r.setblocking(False)
        return c, r

    def _open_receiver(self, kind: str, i: int) -> Receiver:
        c, r = self._pair()
        addr = b"R%d" % i if kind == "native" else address(kind, i).key
        cid = self._open(r, kind, self.mod.MAX_HOLD)
        rec = Receiver(kind, addr, c, r, cid)
        with rec.lock:
            self._attach(rec)
        return rec

    def _open_sender(self, kind: str, i: int) -> Sender:
        c, r = self._pair()
        hold = SMALL_HOLD if i == 1 else self.mod.MAX_HOLD
        cid = self._open(r, kind, hold)
        addr: Any = b"S%d" % i if kind == "native" else address(kind, 100 + i)
        s = Sender(kind, f"{kind}/S{i}", addr, c, r, cid, hold, PurePath(kind), PurePath(kind))
        self._read(s, False, b"")
        return s

    def _open(self, sock: socket.socket, kind: str, hold: int) -> int:
        code = KIND_CODE[kind](self.mod)
        # The thread's bound is router-wide (Relay(max_bytes)), not per receiver.
        cid: int = self.relay.open(sock.fileno(), code, hold)
        return cid

    def _attach(self, r: Receiver) -> None:
        if not r.attached and not r.chunks and self.relay.attach(r.cid):
            r.attached = True

    def _read(self, s: Sender, raw: bool, held: bytes) -> None:
        try:
            if held:
                self.relay.read(s.cid, False, held)
            else:
                self.relay.read(s.cid, raw)
        except (KeyError, OSError) as e:
            raise Violation(f"{s.name}: read({raw}, {len(held)} held bytes): {e!r}") from None
        s.handed_back += len(held)
        s.reading = True
        s.trace.append(f"read(raw={raw},held={len(held)})")

    # ------------------------------------------------------------------ frames

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
            hdr = _j2_header(f)
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
            mark = len(f) - n + _native_payload_at(f)
            g = bytearray(f)
            g[mark] = 0xD9  # a str where the payload's bin must be
            choices.append(bytes(g))
        else:
            g = bytearray(f)
            plen_at = len(f) - 4 - (len(f) - _j5_payload_at(f))
            g[plen_at:plen_at + 4] = U32.pack(0xFFFFFFF0)  # the payload's length lies
            choices.append(bytes(g))
        return self.rng.choice(choices)

    # ------------------------------------------------------------------ a step's traffic

    def batch(self, s: Sender, n: int, hostile: float) -> bytes:
        parts = []
        for _ in range(n):
            x = self.rng.random()
            if x < hostile:
                parts.append(self.hostile(s))
                self.stats["hostile frames"] += 1
            elif x < 0.1:
                parts.append(self.control(s.kind))
            else:
                parts.append(self.route(s, self.a_dest(s), self.size()))
        return b"".join(parts)

    def send(self, s: Sender, data: bytes, cuts: list[int], eof: bool = False) -> None:
        """``s`` writes ``data``, stopping at each of ``cuts`` until the relay read it all; the
        reference decides now what the receivers must get."""
        for run in s.ref.feed(data):
            for r in self.dests(s.kind, run.dest):
                for f in run.frames:
                    r.expect(s.name, f)
            if s.kind == "native" and run.dest is None:
                s.remote.extend(run.frames)
        s.pending = data
        s.pos = 0
        s.trace.append(f"batch:{len(data)}{'+eof' if eof else ''}")
        s.cuts = sorted(set(c for c in cuts if 0 < c < len(data)))
        s.eof = eof

    def dests(self, kind: str, dest: bytes | None) -> list[Receiver]:
        return [r for r in self.receivers if r.kind == kind and (dest is None or r.addr == dest)]

    # ------------------------------------------------------------------ the Python half

    def pump(self) -> bool:
        """One round of everything this process does; True if anything happened."""
        busy = self._upcalls()
        for row in self.relay.collect()[0]:
            cid, bytes_in, frames = row[:3]
            self.bytes_in[cid] += bytes_in
            self.stats["frames relayed by the thread"] += frames
        for r in self.receivers:
            with r.lock:
                busy |= self._flush(r)
            if not r.paused:
                busy |= self._drain(r)
        for s in self.senders:
            busy |= self._write(s)
        return busy

    def _upcalls(self) -> bool:
        items = self.relay.upcalls()
        mod = self.mod
        for cid, kind, data in items:
            self.stats["upcalls"] += 1
            if kind == mod.EVICT:
                r = self._receiver(cid)
                if r is not None:
                    self.stats["evictions"] += 1
                    with r.lock:
                        if r.attached:
                            self._reclaim(r)
                continue
            s = self._sender(cid)
            if kind == mod.REMOTE:
                if s is None or not s.reading:
                    raise Violation(f"REMOTE upcall of {len(data)} bytes for connection {cid}, "
                                    "not a sender the thread reads")
                self.stats["remote share frames"] += self._remote(s, data)
                continue
            if s is None:
                if self._receiver(cid) is not None and kind == mod.DATA and data:
                    raise Violation(f"a receiver's connection {cid} handed up {len(data)} bytes")
                continue
            if not s.reading:
                raise Violation(f"{s.name}: an upcall ({kind}) while the thread was not "
                                "reading it (handed up twice)")
            s.reading = False
            s.trace.append(f"up{kind}:{len(data)}")
            if kind == mod.DATA:
                s.upcalled += len(data)
                self._route(s, s.py.feed(data))
                if s.py.closed:
                    self._close_sender(s, s.py.closed)
                elif s.py.holding:
                    self._read(s, True, b"")
                elif s.py.carry and s.py.need and s.py.need <= self._room(s):
                    held, s.py.carry, s.py.need = s.py.carry, b"", 0
                    self._read(s, False, held)
                else:
                    self._read(s, bool(s.py.carry), b"")
            else:  # EOF, or a failed read
                self._close_sender(s, "eof" if kind == mod.EOF else "read error")
        return bool(items)

    def _remote(self, s: Sender, data: bytes) -> int:
        """The remote share ``data`` must be the next whole frames ``s`` owes the other
        routers; how many."""
        n = pos = 0
        while pos < len(data):
            if not s.remote or not data.startswith(s.remote[0], pos):
                raise Violation(f"{s.name}: a remote share that is not its next multicast "
                                f"frames at {pos} of {len(data)} bytes")
            pos += len(s.remote.popleft())
            n += 1
        return n

    def _route(self, s: Sender, runs: list[Run]) -> None:
        """What a session does with the runs of an upcall: route them, then maybe teach the
        thread (every receiver attached, as fastpath._ids requires)."""
        for run in runs:
            targets = self.dests(s.kind, run.dest)
            n = len(run.frames)
            self.stats["frames routed by Python"] += n
            blob = b"".join(run.frames)
            for r in targets:
                self._push(r, blob)
            remote = s.kind == "native" and run.dest is None
            if remote and self._remote(s, blob) != n:
                raise Violation(f"{s.name}: Python's remote share is not whole frames")
            if run.key is not None and targets and self.rng.random() < 0.9:
                ids = []
                for r in targets:
                    with r.lock:
                        self._attach(r)
                        if not r.attached:
                            break
                        ids.append(r.cid)
                else:
                    args = (s.cid, run.key, run.out, run.skip, s.py.scanner.max_frame, ids)
                    if self.relay.learn(*args, *self._slot(s.kind), remote):
                        self.stats["routes learned"] += 1

    def _slot(self, kind: str) -> tuple[int, ...]:
        """learn's group slot: one per framing (its group)."""
        return (KINDS.index(kind),)

    def _room(self, s: Sender) -> int:
        """The largest cut frame that may be handed back to the thread (fastpath._read)."""
        return min(s.hold, int(self.relay.room()))

    def invalidate(self) -> None:
        """The routing table changed: everything, or one group (its slot)."""
        if self.rng.random() < 0.5:
            self.relay.invalidate(self.rng.randrange(len(KINDS)))
            self.stats["invalidations of one group"] += 1
        else:
            self.relay.invalidate()
            self.stats["invalidations"] += 1

    def _push(self, r: Receiver, data: bytes) -> None:
        """As the outbox with the fast path: a direct send through the relay while attached,
        else the queue (written by _flush on the raw socket)."""
        with r.lock:
            if not r.attached or r.chunks:
                r.chunks.append(data)
                return
            n = self.relay.send(r.cid, data)
            if n == -1:  # the thread holds bytes for it: they go first
                self._reclaim(r)
                r.chunks.append(data)
            elif n == -2:
                raise Violation(f"send -2 to {r.kind}/{r.addr!r}, attached")
            elif n < len(data):
                r.attached = False
                r.chunks.append(data[n:])

    def _reclaim(self, r: Receiver) -> None:
        pending = self.relay.take(r.cid)
        r.attached = False
        if pending:
            r.chunks.appendleft(pending)

    def _flush(self, r: Receiver) -> bool:
        busy = False
        while r.chunks:
            data = r.chunks[0]
            try:
                n = r.rsock.send(data)
            except BlockingIOError:
                return busy
            busy = True
            if n < len(data):
                r.chunks[0] = data[n:]
                return busy
            r.chunks.popleft()
        self._attach(r)
        return busy

    def _drain(self, r: Receiver) -> bool:
        got = False
        while True:
            try:
                data = r.csock.recv(65536)
            except BlockingIOError:
                break
            if not data:
                raise Violation(f"receiver {r.kind}/{r.addr!r} saw EOF")
            r.inbuf += data
            r.received += len(data)
            got = True
        if got:
            with r.lock:
                self._match(r)
        return got

    def _match(self, r: Receiver) -> None:
        """Every byte received must start the next expected frame of one source."""
        buf = r.inbuf
        pos = 0
        while pos < len(buf):
            for q in r.expected.values():
                if q and buf.startswith(q[0], pos):
                    pos += len(q[0])
                    q.popleft()
                    self.stats["frames checked at receivers"] += 1
                    break
            else:
                rest = bytes(buf[pos:pos + 256])
                if any(q and q[0].startswith(rest) for q in r.expected.values()):
                    break  # the rest of a frame is on its way
                heads = {k: q[0][:48].hex() for k, q in r.expected.items() if q}
                raise Violation(f"receiver {r.kind}/{r.addr!r} got bytes that are not the next "
                                f"frame of any source at offset {r.received - len(buf) + pos}: "
                                f"{rest[:48].hex()}; expected one of {heads}")
        del buf[:pos]

    def _write(self, s: Sender) -> bool:
        if s.closed or s.pos >= len(s.pending):
            if s.eof and not s.closed and s.pending:
                s.csock.shutdown(socket.SHUT_WR)
                s.eof = False
                s.ending = True
                return True
            return False
        stop = len(s.pending)
        while s.cuts and s.cuts[0] <= s.pos:
            s.cuts.pop(0)
        if s.cuts:
            # A cut: the next bytes wait until the thread read everything before it alone.
            if fionread(s.rsock):
                return False
            self.relay.info()  # its mutex: the chunk it read is handled
            stop = s.cuts[0]
        try:
            n = s.csock.send(s.pending[s.pos:stop])
        except BlockingIOError:
            return False
        except (BrokenPipeError, ConnectionResetError):  # closed by Python: the rest is moot
            s.pos = len(s.pending)
            return True
        s.pos += n
        s.written += n
        s.trace.append(f"wrote:{n}")
        return True

    def _sender(self, cid: int) -> Sender | None:
        return next((s for s in self.senders if s.cid == cid and not s.closed), None)

    def _receiver(self, cid: int) -> Receiver | None:
        return next((r for r in self.receivers if r.cid == cid), None)

    def _close_sender(self, s: Sender, why: str) -> None:
        s.closed = why
        s.reading = False
        for r in [r for r in self.receivers if r.twin_of == s.name]:
            with r.lock:  # what was routed to it is gone with it
                r.closed = True
                self.receivers.remove(r)
        self.relay.close(s.cid)
        self.stats[f"senders closed ({why.split(':')[0]})"] += 1

    # ------------------------------------------------------------------ steps

    def settle(self, what: str) -> None:
        """Pump until every byte written was handled and every receiver has what it must."""
        waits = 0
        while True:
            busy = self.pump()
            if not busy and self._settled():
                self.relay.info()  # the thread's mutex: it handled all it read
                if not self.pump() and self._settled():
                    break
                continue
            if busy:
                waits = 0
                continue
            waits += 1
            if waits > STALL_WAITS:
                raise Violation(f"stalled ({what}): {self._diagnose()}")
            fds = [r.csock for r in self.receivers if not r.paused]
            ws = [s.csock for s in self.senders if not s.closed and s.pos < len(s.pending)]
            select.select([self.relay.fileno(), *fds], ws, [], WAIT)
        for s in self.senders:
            if s.closed or s.ref.carry or s.ref.holding:
                continue  # a cut frame (a hostile one) waits in the thread or in Python
            python = s.upcalled - s.handed_back
            if self.bytes_in[s.cid] + python != s.written:
                raise Violation(
                    f"{s.name}: {s.written} bytes written, {self.bytes_in[s.cid]} relayed by "
                    f"the thread and {python} handled by Python ({what})")
        for s in self.senders:
            if s.remote and not s.closed:
                raise Violation(f"{s.name}: {len(s.remote)} multicast frames never reached "
                                f"the other routers ({what})")
        for r in self.receivers:
            if r.inbuf or r.waiting():
                raise Violation(f"receiver {r.kind}/{r.addr!r}: {len(r.inbuf)} unmatched bytes, "
                                f"{r.waiting()} frames missing ({what})")

    def _settled(self) -> bool:
        for s in self.senders:
            if s.closed:
                continue
            if s.pos < len(s.pending) or s.eof or s.ending or fionread(s.rsock):
                return False
        return all(not (r.chunks or r.waiting() or r.inbuf) for r in self.receivers)

    def _diagnose(self) -> str:
        out = [f"info {self.relay.info()}"]
        for s in self.senders:
            out.append(f"{s.name} closed={s.closed!r} reading={s.reading} "
                       f"written={s.written}/{len(s.pending)} unread={fionread(s.rsock)} "
                       f"carry={len(s.py.carry)} trace={' '.join(s.trace[-30:])}")
        for r in self.receivers:
            out.append(f"{r.kind}/{r.addr!r} attached={r.attached} queued={len(r.chunks)} "
                       f"paused={r.paused} missing={r.waiting()} inbuf={len(r.inbuf)}"
                       + "".join(f" first missing from {k}: {q[0][:40]!r}"
                                 for k, q in r.expected.items() if q))
        return "; ".join(out)

    def reopen_closed(self) -> None:
        for n, s in enumerate(self.senders):
            if s.closed:
                fd = s.rsock.fileno()
                s.csock.close()
                s.rsock.close()
                t = self._open_sender(s.kind, int(s.name[-1]))
                self.senders[n] = t
                if self.twins and s.kind != "native" and t.hold != SMALL_HOLD:
                    self._twin(t)
                self._stale(s.cid, fd, t.rsock.fileno())

    def _stale(self, old: int, fd: int, new_fd: int) -> None:
        """The id of a closed connection is refused, even when its fd (and slot) is reused."""
        if fd == new_fd:
            self.stats["fds reused"] += 1
        if self.relay.send(old, b"x") != -2 or self.relay.take(old) != b"":
            raise Violation(f"the closed connection {old} still takes sends")
        live = [r.cid for r in self.receivers[:1]]
        s = self.senders[0]
        if self.relay.learn(s.cid, b"k", b"", 0, MAX_FRAME, [old, *live]):
            raise Violation(f"learn accepted the closed connection {old} as a receiver")
        if self.relay.learn(old, b"k", b"", 0, MAX_FRAME, live):
            raise Violation(f"learn accepted the closed connection {old} as a sender")

    def reopen_receiver(self) -> None:
        r = self.rng.choice([r for r in self.receivers if not r.twin_of])
        with r.lock:
            r.closed = True
        self.relay.invalidate()  # the routing table changes: RoutingTable.changed
        self.relay.close(r.cid)
        fd = r.rsock.fileno()
        r.csock.close()
        r.rsock.close()
        i = self.receivers.index(r)
        idx = int(r.addr[-1:]) if r.kind == "native" else _index_of(r.kind, r.addr)
        self.receivers[i] = self._open_receiver(r.kind, idx)
        self.relay.invalidate()  # and joined again
        self.stats["receivers reopened"] += 1
        self._stale(r.cid, fd, self.receivers[i].rsock.fileno())

    def traffic(self) -> None:
        rng = self.rng
        live = [s for s in self.senders if not s.closed]
        for s in rng.sample(live, rng.randint(1, len(live))):
            data = self.batch(s, rng.randint(1, 32), hostile=0.04 if rng.random() < 0.25 else 0)
            # Written in pieces, each read alone: the first frames of a header go up and
            # teach the thread, which relays the next pieces' frames.
            cuts = [rng.randrange(1, len(data)) for _ in range(rng.randint(0, 8))]
            self.send(s, data, cuts, eof=rng.random() < 0.02)
        paused = victim = None
        sndbuf = 0
        if rng.random() < 0.3:
            paused = victim = rng.choice(self.receivers)
            paused.paused = True
            # Its socket fills at once: evicted as soon as anything is routed to it.
            sndbuf = victim.rsock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            victim.rsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            self.stats["receivers paused"] += 1
        threads = []
        if rng.random() < 0.3:
            for t in range(2):
                seed = rng.randrange(1 << 30)
                threads.append(threading.Thread(target=self._direct, args=(t, seed)))
            for th in threads:
                th.start()
        waits = 0
        while any(s.pos < len(s.pending) and not s.closed for s in self.senders):
            if not self.pump():
                waits += 1
                if paused is not None and waits > 200:  # its socket is full: read it again
                    paused.paused = False
                    paused = None
                if waits > STALL_WAITS:
                    raise Violation(f"stalled writing: {self._diagnose()}")
                select.select([self.relay.fileno()], [], [], WAIT)
            else:
                waits = 0
        for th in threads:
            th.join()
        if victim is not None:
            victim.paused = False
            if victim.rsock.fileno() >= 0:
                victim.rsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf // 2)
        self.settle("traffic")

    def _direct(self, t: int, seed: int) -> None:
        """A Python thread sending to receivers (replies, events) while the thread relays."""
        rng = random.Random(seed)
        source = f"T{t}"
        for i in range(rng.randint(20, 60)):
            r = rng.choice(self.receivers)
            p = b"%s|%d|" % (source.encode(), i) + rng.randbytes(rng.randrange(0, 300))
            if r.kind == "native":
                f = wire.encode_route("g", None, source.encode(), p)
            elif r.kind == "jgroups2":
                f = j2.message_to_client(None, p)
            else:
                f = j5.message("cluster", None, address("jgroups5", 200 + t), p)
            with r.lock:
                if r.closed:
                    continue
                r.expect(source, f)
                self._push(r, f)
            self.stats["direct sends from threads"] += 1

    def sweep(self, kind: str) -> None:
        """One short stream of ``kind`` cut at every offset: the thread reads each cut alone."""
        s = next(s for s in self.senders if s.kind == kind and s.hold != SMALL_HOLD)
        dest = None
        for _ in range(2):  # taught: the first goes up and is learned (90 %)
            self.send(s, self.route(s, dest, 10), [])
            self.settle(f"sweep {kind}: learning")
        cut = 1
        while True:  # the streams' lengths vary with their tags: cut until one is shorter
            stream = b"".join([self.route(s, dest, 10), self.control(kind),
                               self.route(s, dest, 30)])
            if cut >= len(stream):
                break
            self.send(s, stream, [cut])
            self.settle(f"sweep {kind}: cut at {cut}")
            self.stats["cuts swept"] += 1
            if s.closed:
                self.reopen_closed()
                s = next(s for s in self.senders if s.kind == kind and s.hold != SMALL_HOLD)
            cut += 1


def _j2_header(f: bytes) -> bytes:
    """A 2.12 MESSAGE's bytes before its buffer's length."""
    sc = j2scan.Scanner("jgroups2:", MAX_FRAME)
    hit = sc._learn(f, 0, len(f), MAX_FRAME)
    assert isinstance(hit, tuple), hit
    return f[: hit[0]]


def _j5_payload_at(f: bytes) -> int:
    """Where a 5.x MESSAGE's payload starts (after its u32 length)."""
    sc = j5scan.Scanner("jgroups5:", MAX_FRAME)
    hit = sc._learn(f, 4, len(f))
    assert hit is not None
    return 4 + hit[0] + 4


def _native_payload_at(f: bytes) -> int:
    """Where a native ROUTE's payload (its bin marker) starts, from the frame's body."""
    return ns.route_header(f, 4, len(f))[3]


def address(kind: str, i: int) -> JAddress:
    return JAddress.from_uuid(0x0102030405060700 + i, 0x1112131415161700 + i,
                              version=2 if kind == "jgroups2" else 5)


def _index_of(kind: str, key: bytes) -> int:
    return next(i for i in range(8) if address(kind, i).key == key)


KIND_CODE: dict[str, Callable[[ModuleType], int]] = {
    "native": lambda m: int(m.NATIVE),
    "jgroups2": lambda m: int(m.JG2),
    "jgroups5": lambda m: int(m.JG5),
}


def run(seed: int, steps: int, seconds: float, sweep: bool = True,
        say: Callable[[str], None] = print, twins: bool = True) -> collections.Counter[str]:
    """A run of at most ``steps`` steps and about ``seconds`` (the sweeps first); its
    counters. Raises Violation."""
    h = Harness(seed, twins=twins)
    h.start()
    deadline = time.monotonic() + seconds
    try:
        if sweep:
            for kind in KINDS:
                h.sweep(kind)
        while h.step < steps and time.monotonic() < deadline:
            h.step += 1
            x = h.rng.random()
            try:
                if x < 0.06:
                    h.reopen_receiver()
                elif x < 0.10:
                    h.invalidate()
                else:
                    h.traffic()
                h.reopen_closed()
            except Violation as e:
                raise Violation(f"step {h.step}: {e}") from None
        h.stats["steps"] = h.step
        return h.stats
    finally:
        h.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="relay_harness", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    ap.add_argument("--steps", type=int, default=1_000_000, help="at most this many steps")
    ap.add_argument("--seconds", type=float, default=20.0, help="about this long at most")
    ap.add_argument("--no-sweep", action="store_true", help="skip the every-offset sweeps")
    ap.add_argument("--no-twins", action="store_true",
                    help="no sender receives its group's multicasts on its own connection")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    mod = fastpath._relay
    where = getattr(mod, "__file__", "?")
    print(f"relay harness: seed {seed}, module {where}", flush=True)
    try:
        stats = run(seed, args.steps, args.seconds, sweep=not args.no_sweep,
                    twins=not args.no_twins)
    except Violation as e:
        print(f"relay harness: FAILED (seed {seed}): {e}", flush=True)
        return 1
    keys = sorted(stats)
    print("relay harness: " + ", ".join(f"{k} {stats[k]}" for k in keys), flush=True)
    if not stats["frames relayed by the thread"]:
        print("relay harness: FAILED: the thread relayed nothing", flush=True)
        return 1
    print(f"relay harness: OK (seed {seed}, {stats['steps']} steps)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
