"""bench_federation's interleaved and burst cases (issue 30): JGroups-like traffic, each
message to its own destination, from raw native members (no Python stub in the way).

A sender on one router writes ``messages`` ROUTE frames whose destinations take turns: the
group (a multicast), then each receiver in turn (unicasts), then the group again... Each
payload carries the message's sequence number; the sender thread notes when it handed each
frame to its socket, the receivers (one selector in the main thread) when it arrived.

* **interleaved**: ``rate`` messages per second, in ticks of ``per_tick`` messages written
  at once (as a JGroups bundler sends them; late ticks go out together);
* **burst**: every message at once, in writes of ``BURST_WRITE`` frames, as fast as the
  router reads them.

What the routers (and the broker) spent is read from /proc over the run, in all and per
process role (``roles``: the sending router, the receiving routers, the broker).
"""

from __future__ import annotations

import resource
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from benchmarks.bench_topics import _recv_frames
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from tests.procs import proc_cpu_split

BURST_WRITE = 512
_SEQ = struct.Struct(">Q")
_LEN = struct.Struct(">I")
_PAYLOAD = 100
_PAD = bytes(_PAYLOAD - _SEQ.size)  # 100-byte payloads


@dataclass
class MixOut:
    """Seconds from write to arrival, by the receivers' label (``run_mix``'s ``rx``); CPU
    seconds of the processes measured, in all and by role (``cpu_by``: role -> (seconds,
    processes of that role)), and of that the kernel's (system time: ``sys_by``, role ->
    seconds; ``sys_s`` in all), which no implementation of the relay in user space
    removes."""

    lat: dict[str, list[float]] = field(default_factory=dict)
    messages: int = 0
    expected: int = 0
    delivered: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    cpu_by: dict[str, tuple[float, int]] = field(default_factory=dict)
    sys_by: dict[str, float] = field(default_factory=dict)

    @property
    def sys_s(self) -> float:
        return sum(self.sys_by.values())

    def per_message_us(self, role: str | None = None) -> str:
        """CPU µs per message of each process of ``role`` (None: of all of them), its system
        part in parentheses; "-" when no process of ``role`` was measured."""
        per = max(self.messages, 1) / 1e6
        if role is None:
            return f"{self.cpu_s / per:,.1f} ({self.sys_s / per:,.0f})"
        secs, n = self.cpu_by.get(role, (0.0, 0))
        system = self.sys_by.get(role, 0.0)
        return f"{secs / n / per:,.1f} ({system / n / per:,.0f})" if n else "-"

    def add(self, other: MixOut) -> None:
        for k, v in other.lat.items():
            self.lat.setdefault(k, []).extend(v)
        self.messages += other.messages
        self.expected += other.expected
        self.delivered += other.delivered
        self.cpu_s += other.cpu_s
        self.wall_s += other.wall_s
        for role, (secs, n) in other.cpu_by.items():
            mine = self.cpu_by.get(role, (0.0, n))
            self.cpu_by[role] = (mine[0] + secs, n)
        for role, secs in other.sys_by.items():
            self.sys_by[role] = self.sys_by.get(role, 0.0) + secs


def member(port: int, group: str, addr: bytes) -> socket.socket:
    """A raw native member of ``group`` on 127.0.0.1:``port``."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-mix", None))
              + wire.encode(wire.Connect(1, group, addr)))
    for f in _recv_frames(s, wire.Decoder(), 2):
        if isinstance(f, wire.Error):
            raise RuntimeError(f"router refused: {f.code}: {f.message}")
    s.setblocking(False)
    return s


class _NativeSeqs:
    """The sequence numbers of the ROUTE frames of a native member's stream."""

    def __init__(self) -> None:
        self.dec = wire.Decoder()

    def feed(self, data: bytes) -> list[int]:
        self.dec.feed(data)
        out = []
        while (f := self.dec.next_frame()) is not None:
            if isinstance(f, wire.Route):
                out.append(_SEQ.unpack_from(f.payload)[0])
        return out


class _J5Seqs:
    """The same for a JGroups 5.x member's stream: every frame is length-prefixed, and a
    MESSAGE of this benchmark ends with its 100-byte payload."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[int]:
        buf = self.buf + data
        out, pos = [], 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            if buf[pos + 4] == j5.MESSAGE and n >= _PAYLOAD:
                out.append(_SEQ.unpack_from(buf, pos + 4 + n - _PAYLOAD)[0])
            pos += 4 + n
        self.buf = buf[pos:]
        return out


class _J2Seqs:
    """The same for a JGroups 2.12 member's stream, after its CONNECT's reply: every object
    is a MESSAGE (2.12 objects have no length prefix: the client decoder cuts them)."""

    def __init__(self) -> None:
        self.dec = j2.ClientDecoder(max_frame=1 << 24)

    def feed(self, data: bytes) -> list[int]:
        self.dec.feed(data)
        out = []
        while (ev := self.dec.next_event()) is not None:
            if isinstance(ev, j2.Message) and len(ev.payload) == _PAYLOAD:
                out.append(_SEQ.unpack_from(ev.payload)[0])
        return out


@dataclass(frozen=True)
class Framing:
    """How the members of a case speak: native (raw ROUTE frames), JGroups 5.x (a RouterStub's
    REGISTER and MESSAGEs, as a real 5.x member writes them) or JGroups 2.12 (CONNECT, then
    MESSAGEs)."""

    name: str

    def member(self, port: int, group: str, i: int) -> socket.socket:
        if self.name == "native":
            return member(port, group, _name(i))
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.name == "jgroups5":
            s.sendall(j5.register(group, _jaddr(i, V5), f"m{i}",
                                  JAddress.from_ip("127.0.0.1", 7800 + i, version=V5)))
        else:
            s.sendall(j2.connect(group, _jaddr(i, V2), f"m{i}",
                                 [JAddress.from_ip("127.0.0.1", 7800 + i, version=V2)]))
            s.settimeout(10)
            if s.recv(1) != j2.connect_ok():  # CONNECT's one-byte reply, before any message
                raise RuntimeError("router refused a 2.12 CONNECT")
        s.setblocking(False)
        return s

    def frame(self, group: str, dest: int | None, seq: int) -> bytes:
        """Message ``seq`` from member 0 to member ``dest`` (None: the group)."""
        payload = _SEQ.pack(seq) + _PAD
        if self.name == "native":
            return wire.encode_route(group, None if dest is None else _name(dest), _name(0),
                                     payload)
        if self.name == "jgroups2":
            return j2.message(group, None if dest is None else _jaddr(dest, V2), payload)
        return j5.message(group, None if dest is None else _jaddr(dest, V5), _jaddr(0, V5),
                          payload)

    def seqs(self) -> _NativeSeqs | _J5Seqs | _J2Seqs:
        if self.name == "native":
            return _NativeSeqs()
        return _J5Seqs() if self.name == "jgroups5" else _J2Seqs()


NATIVE, JGROUPS5, JGROUPS2 = Framing("native"), Framing("jgroups5"), Framing("jgroups2")


def _name(i: int) -> bytes:
    return b"tx" if i == 0 else b"rx%d" % (i - 1)


def _jaddr(i: int, version: int) -> JAddress:
    return JAddress.from_uuid(0x0B0B0B0B00000000 + i, 0x0C0C0C0C00000000 + i, version=version)


class _Receivers:
    def __init__(self, framing: Framing) -> None:
        self.sel = selectors.DefaultSelector()
        self.framing = framing
        self.decs: dict[socket.socket, tuple[_NativeSeqs | _J5Seqs | _J2Seqs, str | None]] = {}

    def add(self, s: socket.socket, label: str | None) -> None:
        """``label``: None for the sender (what it gets is read and dropped)."""
        self.sel.register(s, selectors.EVENT_READ)
        self.decs[s] = (self.framing.seqs(), label)

    def pump(self, timeout: float, sent_at: list[float], out: MixOut | None,
             seen: set[int] | None = None) -> None:
        for key, _ in self.sel.select(timeout):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            dec, label = self.decs[s]
            seqs: list[int] = []
            try:
                while True:
                    data = s.recv(1 << 20)
                    if not data:
                        raise RuntimeError("a router closed a member's connection")
                    seqs += dec.feed(data)
                    if len(data) < 1 << 20:
                        break
            except BlockingIOError:
                pass
            now = time.perf_counter()
            if label is None:
                continue
            for seq in seqs:
                if seen is not None:
                    seen.add(id(s))
                if out is not None and seq < len(sent_at):
                    out.lat.setdefault(label, []).append(now - sent_at[seq])
                    out.delivered += 1

    def close(self) -> None:
        for s in self.decs:
            self.sel.unregister(s)
            s.close()
        self.sel.close()


def run_mix(group: str, tx_port: int, rx: Sequence[tuple[int, str]], messages: int,
            rate: float, pids: Sequence[int], wait: float, per_tick: int = 1,
            roles: Sequence[str] = (), framing: Framing = NATIVE) -> MixOut | None:
    """``messages`` interleaved messages from a member on ``tx_port`` to receivers ``rx``
    (port, label: the latencies are kept by label); ``rate`` messages per second, in ticks
    of ``per_tick`` messages written at once (0: a burst). ``roles``: the role of each of
    ``pids`` (the CPU is kept per role too; empty: "all").
    None when some receiver is not reachable within ``wait`` seconds (no federated
    membership). ``framing``: how the members speak (native or JGroups 5.x)."""
    recv = _Receivers(framing)
    try:
        for i, (port, label) in enumerate(rx, 1):
            recv.add(framing.member(port, group, i), label)
        tx = framing.member(tx_port, group, 0)
        recv.add(tx, None)
        # Every receiver reachable? (A multicast probe until each one has one.)
        probe = framing.frame(group, None, 1 << 62)
        seen: set[int] = set()
        deadline = time.monotonic() + wait
        while len(seen) < len(rx):
            if time.monotonic() > deadline:
                return None
            tx.setblocking(True)
            tx.sendall(probe)
            tx.setblocking(False)
            recv.pump(0.05, [], None, seen)
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            recv.pump(0.05, [], None)
        dests: list[int | None] = [None, *range(1, len(rx) + 1)]
        frames = [framing.frame(group, dests[i % len(dests)], i) for i in range(messages)]
        expected = sum(len(rx) if dests[i % len(dests)] is None else 1
                       for i in range(messages))
        out = MixOut(messages=messages, expected=expected)
        sent_at = [0.0] * messages
        sock = tx

        def send() -> None:
            sock.setblocking(True)
            t0 = time.perf_counter()
            i = 0
            while i < messages:
                if rate > 0:
                    ticks = int((time.perf_counter() - t0) * rate / per_tick) + 1
                    due = min(messages, ticks * per_tick)
                    if due <= i:
                        time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
                        continue
                else:
                    due = min(messages, i + BURST_WRITE)
                now = time.perf_counter()
                for k in range(i, due):
                    sent_at[k] = now
                sock.sendall(b"".join(frames[i:due]))
                i = due

        cpu0 = [proc_cpu_split(p) for p in pids]
        t0 = time.perf_counter()
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        deadline = time.monotonic() + messages / (rate or 1e4) + wait + 30
        while out.delivered < expected and time.monotonic() < deadline:
            recv.pump(0.05, sent_at, out)
        out.wall_s = time.perf_counter() - t0
        spent = [(u1 - u0, s1 - s0) for (u0, s0), (u1, s1)
                 in zip(cpu0, map(proc_cpu_split, pids), strict=True)]
        out.cpu_s = sum(u + s for u, s in spent)
        for role, (user, system) in zip(roles or ["all"] * len(pids), spent, strict=True):
            total, n = out.cpu_by.get(role, (0.0, 0))
            out.cpu_by[role] = (total + user + system, n + 1)
            out.sys_by[role] = out.sys_by.get(role, 0.0) + system
        sender.join(5)
        return out
    finally:
        recv.close()


def wake_floor(wakes: int = 2000, rate: float = 1000.0) -> tuple[float, float]:
    """(CPU µs per wake-up of a trio task, of a plain epoll loop in Python): each waits on a
    socket that a thread writes one byte to ``rate`` times a second, reads it and waits again
    (nothing else), ``wakes`` times. The first is the floor of every wake-up of a router's
    Python (its trio loop: the broker reader of a receiving router, the upcalls of a sending
    one), the second what the system's part of it costs. Not in a trio run. (Unlike
    bench_lightpath.trio_wakeup, which times back-to-back wake-ups of a busy loop, each of
    these wakes a thread that was asleep, as a router's Python is at 1,000 messages a
    second.)"""
    out: list[float] = []
    for use_trio in (True, False):
        a, b = socket.socketpair()
        a.setblocking(False)

        def write(b: socket.socket = b) -> None:
            for _ in range(wakes):
                time.sleep(1 / rate)
                b.send(b"x")
            b.send(b"q")

        def cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_THREAD)
            return r.ru_utime + r.ru_stime

        async def trio_loop(a: socket.socket = a) -> int:
            n = 0
            while True:
                await trio.lowlevel.wait_readable(a)
                n += 1
                if b"q" in a.recv(4096):
                    return n

        def epoll_loop(a: socket.socket = a) -> int:
            n = 0
            with select.epoll() as ep:
                ep.register(a.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
                while True:
                    ep.poll()
                    n += 1
                    if b"q" in a.recv(4096):
                        return n
                    ep.modify(a.fileno(), select.EPOLLIN | select.EPOLLONESHOT)

        writer = threading.Thread(target=write, daemon=True)
        try:
            c0 = cpu()
            writer.start()
            n = trio.run(trio_loop) if use_trio else epoll_loop()
            out.append((cpu() - c0) / max(n, 1) * 1e6)
            writer.join(5)
        finally:
            a.close()
            b.close()
    return out[0], out[1]
