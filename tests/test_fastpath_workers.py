"""Busy connections on threads of their own (gossiprouter/server/relay/workers.c, issue 30's
light-load latency).

A connection that reads often is read by a worker thread that waits on it alone; the idle ones
stay on the relay thread. The relay's promises hold whichever thread reads: a connection's
frames in order, the frames it cannot relay up to Python, a closed connection forgotten, and
no more threads than ``threads``. The tests promote at a connection's first read
(``promote_reads=1``: a count of reads alone; the default also asks for 20 within 100 ms), never
by timing.
"""

from __future__ import annotations

import functools
import os
import select
import socket
import threading
from typing import Any

import pytest

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.native_scan import NativeScanner
from gossiprouter.server import fastpath
from tests.nclient import NativeClient
from tests.test_fastpath import Start
from tests.test_ops_metrics import scrape, v

G = "g"


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Net:
    """A started Relay, a local receiver, and senders whose ROUTE frames it relays there."""

    def __init__(self, threads: int, promote_reads: int = 1, idle_ms: int = 600_000,
                 batch: bool = False) -> None:
        mod = fastpath._relay
        assert mod is not None, "the compiled extension is not built (scripts/setup)"
        self.mod = mod
        self.relay = mod.Relay(threads=threads, promote_reads=promote_reads, idle_ms=idle_ms,
                               batch=batch)
        self.socks: list[socket.socket] = []
        self.rx, self.rx_peer = self._pair()
        self.rx_peer.settimeout(10)
        self.local = self.relay.open(self.rx.fileno(), mod.NATIVE, 65536)
        assert self.relay.attach(self.local)
        self.scanner = NativeScanner(65536, relay=True)
        self.peers: dict[int, tuple[socket.socket, bytes]] = {}
        self.threads_before = os_threads()
        self.relay.start()

    def _pair(self) -> tuple[socket.socket, socket.socket]:
        a, b = socket.socketpair()
        self.socks += [a, b]
        return a, b

    def sender(self, name: bytes) -> int:
        """A connection whose ROUTE frames from ``name`` to the group go to the receiver."""
        tx, peer = self._pair()
        cid: int = self.relay.open(tx.fileno(), self.mod.NATIVE, 65536)
        frame = self.frame(name, 0)
        list(self.scanner.scan(frame))
        key = self.scanner.header(frame, 4)
        assert key is not None
        assert self.relay.learn(cid, key, b"", 0, 65536, [self.local], 1)
        self.relay.read(cid, False)
        self.peers[cid] = (peer, name)
        return cid

    @staticmethod
    def frame(name: bytes, i: int) -> bytes:
        return wire.encode(wire.Route(G, None, name, b"%06d" % i))

    def received(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            out += self.rx_peer.recv(65536)
        assert len(out) == n, "more bytes than were sent"
        return out

    def one_by_one(self, cid: int, first: int, count: int) -> None:
        """``count`` frames, each received before the next is sent (one read each)."""
        peer, name = self.peers[cid]
        for i in range(first, first + count):
            frame = self.frame(name, i)
            peer.sendall(frame)
            assert self.received(len(frame)) == frame

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.relay.info()
        return info

    def upcalls(self, cid: int) -> list[tuple[int, int, bytes]]:
        for _ in range(100):
            select.select([self.relay.fileno()], [], [], 0.1)
            ups = [u for u in self.relay.upcalls() if u[0] == cid]
            if ups:
                return ups
        raise AssertionError("no upcall")

    def close(self) -> None:
        self.relay.stop()
        for s in self.socks:
            s.close()


@pytest.fixture
def nets() -> Any:
    made: list[Net] = []

    def make(*args: Any, **kwargs: Any) -> Net:
        made.append(Net(*args, **kwargs))
        return made[-1]

    yield make
    for net in made:
        net.close()


def test_a_busy_connection_gets_a_thread_and_keeps_its_order(nets: Any) -> None:
    net = nets(threads=1)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 10)
    info = net.info()
    assert (info["promotions"], info["workers"], info["threads"]) == (1, 1, 1)
    assert net.relay.collect()[4] == 1  # the router's gauge gossiprouter_fast_path_threads
    assert os_threads() == net.threads_before + 2  # the relay thread and one worker
    # No worker left: another busy connection stays on the relay thread, and is relayed.
    b = net.sender(b"B")
    net.one_by_one(b, 0, 10)
    assert net.info()["promotions"] == 1
    assert os_threads() == net.threads_before + 2
    # Both at once, pipelined: each sender's frames arrive whole and in its order.
    (pa, _), (pb, _) = net.peers[a], net.peers[b]
    n = 300
    pa.sendall(b"".join(net.frame(b"A", i) for i in range(10, 10 + n)))
    pb.sendall(b"".join(net.frame(b"B", i) for i in range(10, 10 + n)))
    decoder = wire.Decoder()
    decoder.feed(net.received(2 * n * len(net.frame(b"A", 0))))
    frames = [decoder.next_frame() for _ in range(2 * n)]
    for name in (b"A", b"B"):
        mine = [f.payload for f in frames if isinstance(f, wire.Route) and f.sender == name]
        assert mine == [b"%06d" % i for i in range(10, 10 + n)]


def test_what_a_worker_cannot_relay_goes_up_and_it_reads_on_after(nets: Any) -> None:
    net = nets(threads=2)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 5)
    assert net.info()["workers"] == 1
    peer, _ = net.peers[a]
    unknown = net.frame(b"Z", 0)  # a header the relay never learned for this connection
    peer.sendall(unknown)
    assert net.upcalls(a) == [(a, 0, unknown)]  # UP_DATA, the bytes as sent
    net.relay.read(a, False)  # Python hands the reading back: to the same worker
    net.one_by_one(a, 5, 5)
    info = net.info()
    assert (info["promotions"], info["workers"]) == (1, 1)


def test_a_worker_gives_back_a_connection_that_floods(nets: Any) -> None:
    """Reads that find a backlog (a flood) are served better by the relay thread's rounds
    than by a thread contending for the mutex: four in a row send the connection back."""
    net = nets(threads=1)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 5)
    assert net.info()["workers"] == 1
    assert net.relay.unread(a) == b""  # paused: what comes next waits in its socket
    peer, _ = net.peers[a]
    # Room for all of it on both sides: the receiver's socket must take every send (or the
    # relay would evict it to Python, which this test does not play), however late it drains.
    for sock in (peer, net.rx):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    flood = b"".join(wire.encode(wire.Route(G, None, b"A", b"%06d" % i + b"x" * 1000))
                     for i in range(5, 5 + 270))  # 280 kB: four reads of 64 KiB and more
    peer.sendall(flood)
    got: list[bytes] = []
    drain = threading.Thread(target=lambda: got.append(net.received(len(flood))))
    drain.start()
    net.relay.read(a, False)
    drain.join(timeout=30)
    assert got == [flood]
    # All of it was waiting: four reads of 64 KiB on the worker send it back, and the relay
    # thread's read of the rest (under 32 KiB) promotes it again (promote_reads=1).
    info = net.info()
    assert (info["promotions"], info["demotions"], info["workers"]) == (2, 1, 1)


def test_a_closed_connection_parks_its_thread_for_the_next(nets: Any) -> None:
    net = nets(threads=1)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 5)
    assert net.info()["workers"] == 1
    threads = os_threads()
    assert net.relay.close(a) == b""
    assert net.info()["workers"] == 0
    assert net.relay.collect()[4] == 0
    b = net.sender(b"B")
    net.one_by_one(b, 0, 5)
    info = net.info()
    assert (info["promotions"], info["workers"]) == (2, 1)
    assert os_threads() == threads  # the parked thread took it: none started


def test_a_quiet_connection_goes_back_to_the_relay_thread(nets: Any) -> None:
    net = nets(threads=1, idle_ms=20)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 5)
    assert net.info()["promotions"] == 1
    for _ in range(1000):  # quiet now: given back within idle_ms or so (10 s at most)
        if net.info()["demotions"] == 1:
            break
        select.select([], [], [], 0.01)
    info = net.info()
    assert (info["demotions"], info["workers"]) == (1, 0)
    net.one_by_one(a, 5, 5)  # read by the relay thread, then promoted again
    assert net.info()["promotions"] == 2


def test_stop_and_start_keep_a_promoted_connection_read(nets: Any) -> None:
    net = nets(threads=2)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 5)
    assert net.info()["workers"] == 1
    net.relay.stop()
    info = net.info()
    assert (info["workers"], info["demotions"]) == (0, 1)  # back on the relay thread's epoll
    net.relay.start()
    net.one_by_one(a, 5, 5)
    assert net.info()["promotions"] == 2


def test_without_threads_every_connection_stays_on_the_relay_thread(nets: Any) -> None:
    net = nets(threads=0, promote_reads=1)
    a = net.sender(b"A")
    net.one_by_one(a, 0, 20)
    info = net.info()
    assert (info["promotions"], info["workers"], info["threads"]) == (0, 0, 0)
    assert os_threads() == net.threads_before + 1


def test_bad_thread_settings_are_refused() -> None:
    mod = fastpath._relay
    assert mod is not None
    for kwargs in ({"threads": -1}, {"threads": 257}, {"promote_reads": 0}, {"idle_ms": 0}):
        with pytest.raises(ValueError):
            mod.Relay(**kwargs)
    assert mod.Relay(threads=256).info()["threads"] == 256
    with pytest.raises(ConfigError, match=r"fast_path_threads = 257: expected a value <= 256"):
        Config(fast_path_threads=257)
    assert Config().fast_path_threads == 16


async def test_the_router_reads_a_busy_client_on_a_thread_and_says_so(
        start_router: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """A router with fast_path_threads: a client's round trips, one message at a time, move
    its connection to a thread of its own (at its first read the thread relays here: a count,
    not a rate); every message arrives, and the gauge says so."""
    mod = fastpath._relay
    assert mod is not None
    monkeypatch.setattr(mod, "Relay", functools.partial(mod.Relay, promote_reads=1))
    router = await start_router(fast_path="on", fast_path_threads=2, metrics="127.0.0.1:0")
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    for i in range(20):
        await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
        assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
    samples = await scrape(router)
    assert v(samples, "gossiprouter_fast_path_threads") == 1
    assert v(samples, "gossiprouter_fast_path_relayed_frames_total") >= 16
