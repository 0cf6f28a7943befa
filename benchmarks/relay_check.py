"""The relay harness's machinery (``benchmarks/relay_harness.py`` has the whole story and runs
it): one ``gossiprouter.server._relay.Relay`` and its connections over socketpairs, the
router's Python half around it (upcalls handled with the reference's scanner and policy,
routes learned as the sessions learn them, receivers written as ``fastpath.py`` writes them),
and the checks after each step (:meth:`Harness.settle`): every receiver holds exactly the
reference's frames, in order, and every byte a sender wrote was handled exactly once."""

from __future__ import annotations

import collections
import random
import select
import socket
from types import ModuleType
from typing import Any

from benchmarks.relay_model import (
    KIND_CODE,
    KINDS,
    REMOTE_KINDS,
    SMALL_HOLD,
    Frames,
    PurePath,
    Receiver,
    Run,
    Sender,
    Violation,
    address,
    fionread,
)
from gossiprouter.server import fastpath

# Consecutive waits of WAIT seconds with nothing happening before a step is called stalled:
# a hang guard (a relay that stopped reading a connection), not a timing assertion.
WAIT = 0.001
STALL_WAITS = 30_000


class Harness:
    def __init__(self, seed: int, mod: ModuleType | None = None, twins: bool = True,
                 threads: int | None = None, promote_reads: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.twins = twins
        self.seed = seed
        mod = mod or fastpath._relay
        if mod is None:
            raise SystemExit("relay_harness: the fast path is not built (scripts/setup)")
        self.mod = mod
        # Worker threads (workers.c) or none; promoted at once or after a few reads, and given
        # back soon: every connection moves between threads while the checks run.
        # (Drawn whatever is given, so that a seed replays the same run.)
        drawn = self.rng.choice((0, 1, 4)), self.rng.choice((1, 3)), self.rng.choice((5, 50))
        self.threads = drawn[0] if threads is None else threads
        # Its threads as SCHED_BATCH or not (fast_path_sched): the policy changes no result,
        # but the sanitizers see its start-up handshake.
        self.sched_batch = self.rng.random() < 0.5
        self.relay = mod.Relay(threads=self.threads,
                               promote_reads=drawn[1] if promote_reads is None else promote_reads,
                               idle_ms=drawn[2], batch=self.sched_batch)
        self.senders: list[Sender] = []
        self.receivers: list[Receiver] = []
        self.bytes_in: collections.Counter[int] = collections.Counter()
        self.stats: collections.Counter[str] = collections.Counter()
        self.frames = Frames(self.rng)  # the same rng: a seed replays the same run
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

    # ------------------------------------------------------------------ a step's traffic

    def batch(self, s: Sender, n: int, hostile: float) -> bytes:
        parts = []
        for _ in range(n):
            x = self.rng.random()
            if x < hostile:
                parts.append(self.frames.hostile(s))
                self.stats["hostile frames"] += 1
            elif x < 0.1:
                parts.append(self.frames.control(s.kind))
            else:
                parts.append(self.frames.route(s, self.frames.a_dest(s), self.frames.size()))
        return b"".join(parts)

    def send(self, s: Sender, data: bytes, cuts: list[int], eof: bool = False) -> None:
        """``s`` writes ``data``, stopping at each of ``cuts`` until the relay read it all; the
        reference decides now what the receivers must get."""
        for run in s.ref.feed(data):
            for r in self.dests(s.kind, run.dest):
                for f in run.frames:
                    r.expect(s.name, f)
            if s.kind in REMOTE_KINDS and run.dest is None:
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
            if kind in (mod.REMOTE, mod.REMOTE_J5):
                if s is None or not s.reading:
                    raise Violation(f"REMOTE upcall of {len(data)} bytes for connection {cid}, "
                                    "not a sender the thread reads")
                if (kind == mod.REMOTE_J5) != (s.kind == "jgroups5"):
                    raise Violation(f"{s.name}: a remote share upcall of kind {kind}")
                self.stats[f"remote share frames ({s.kind})"] += self._remote(s, data)
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
            remote = s.kind in REMOTE_KINDS and run.dest is None
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
