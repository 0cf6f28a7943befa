"""The light-load path layer by layer, in one process (docs/performance.md, "Light load").

Under light load a message costs the router a wake-up (the kernel's, then trio's) and the
Python that reads, routes and writes it. ``scripts/bench-vs-jgroups`` measures the whole; this
separates the parts, with no other process involved (so no wake-ups of anyone, and hot
caches; CPU from getrusage):

* ``trio``: one wake-up of the dispatcher's wait (``trio.lowlevel.wait_readable`` on an inner
  epoll's fd, then the round's ``poll(0)``) against the same wait in a plain epoll loop: what
  trio's scheduler adds per wake-up (user and system CPU).
* ``unicast``: one paced message through the real code (``Dispatcher._round``, the
  ``Feeder``, the session's ``on_data``, ``Outbox.push`` and the direct send) against the same
  system calls in a bare loop (``poll(0)``, ``recv_into``, a copy, ``send``): what our Python
  adds per message.
* ``fanout``: two senders multicast into a group of 8 and both are ready in the same round,
  with the hub's WriteBatch (``coalesce_writes``) and without: CPU and sends per message.

A benchmark, not a test: it prints figures and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import select
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vs_jgroups_load import JGroups212, Native, payload
from gossiprouter.core.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.server.dispatch import READ, Dispatcher
from gossiprouter.server.feeder import RECV_SIZE, Feeder
from gossiprouter.sessions.base import Hub, Session
from gossiprouter.sessions.jgroups2 import JGroups2Session
from gossiprouter.sessions.native import NativeSession


def _cpu() -> tuple[float, float]:
    """User and system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


# --------------------------------------------------------------------------- trio's wake-up


def trio_wakeup(n: int) -> dict[str, float]:
    """µs of user and system CPU per wake-up: a plain epoll loop, and trio's wait."""

    def pipe() -> tuple[int, int, select.epoll]:
        r, w = os.pipe()
        os.set_blocking(r, False)
        ep = select.epoll()
        ep.register(r, select.EPOLLIN)
        return r, w, ep

    r, w, ep = pipe()
    u0, s0 = _cpu()
    for _ in range(n):
        os.write(w, b"x")
        ep.poll(-1, 1024)
        os.read(r, 100)
    u1, s1 = _cpu()
    for fd in (r, w):
        os.close(fd)
    ep.close()

    async def via_trio() -> tuple[float, float, float, float]:
        r, w, ep = pipe()
        fd = ep.fileno()
        u0, s0 = _cpu()
        for _ in range(n):
            os.write(w, b"x")
            await trio.lowlevel.wait_readable(fd)
            ep.poll(0, 1024)
            os.read(r, 100)
        u1, s1 = _cpu()
        for f in (r, w):
            os.close(f)
        ep.close()
        return u0, s0, u1, s1

    tu0, ts0, tu1, ts1 = trio.run(via_trio)
    k = 1e6 / n
    return {"plain_user": (u1 - u0) * k, "plain_sys": (s1 - s0) * k,
            "trio_user": (tu1 - tu0) * k, "trio_sys": (ts1 - ts0) * k}


# --------------------------------------------------------------------------- a router in-process


class _Conn:
    handshake_deadline = math.inf


class _Server:
    """What a Feeder needs of the server."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        # The run's clock, shared by every Feeder (as Server.serve sets it).
        self.clock = trio.lowlevel.current_clock().current_time

    def _handshake_expired(self, conn: object, session: object) -> None:
        raise AssertionError("no handshake deadline here")


async def _settle(feeder: Feeder, step: int) -> bool:
    return step == READ


class Bench:
    """Members on socket pairs (router end, client end); senders are read by a Dispatcher."""

    def __init__(self, protocol: str, batch: bool) -> None:
        self.hub = Hub(Config(port=0))
        self.proto: JGroups212 | Native = Native() if protocol == "native" else JGroups212()
        self.cls: type[Session] = NativeSession if protocol == "native" else JGroups2Session
        self.dispatcher = Dispatcher(RECV_SIZE, self.hub.batch if batch else None)
        self.sessions: list[Session] = []
        self.clients: list[socket.socket] = []
        self.router_ends: list[socket.socket] = []
        self.feeders: dict[int, Feeder] = {}

    def member(self, i: int) -> Session:
        r, c = socket.socketpair()
        r.setblocking(False)
        c.setblocking(False)
        s = self.cls(self.hub, f"m{i}")
        reg = self.proto.register(i)[0]
        if reg.startswith(wire.PREAMBLE):  # the server reads the preamble, not the session
            reg = reg[len(wire.PREAMBLE):]
        s.on_data(reg, 0.0)
        s.outbox.take()  # the registration's reply
        counters = self.hub.counters
        send = r.send

        def direct(data: bytes) -> int:  # as Server._run installs it
            n: int = send(data)
            counters.bytes_out += n
            counters.writes += 1
            return n

        s.outbox.direct = direct
        s.outbox.wake = _no_writer
        self.sessions.append(s)
        self.clients.append(c)
        self.router_ends.append(r)
        return s

    def drain(self) -> None:
        for c in self.clients:
            try:
                while c.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        for s in self.clients + self.router_ends:
            s.close()


def _no_writer() -> None:
    raise AssertionError("a direct send left bytes for a writer task")


async def _serve(nursery: trio.Nursery, b: Bench, senders: list[int]) -> None:
    await nursery.start(b.dispatcher.run)
    for i in senders:
        feeder = Feeder(_Server(b.hub), _Conn(), b.sessions[i])  # type: ignore[arg-type]
        nursery.start_soon(b.dispatcher.serve, b.router_ends[i], feeder, _settle)
    while len(b.dispatcher) < len(senders):
        await trio.sleep(0.001)


def _timed(fn: Callable[[], None]) -> float:
    u0, s0 = _cpu()
    fn()
    u1, s1 = _cpu()
    return (u1 - u0) + (s1 - s0)


def unicast(protocol: str, n: int, pairs: int = 4) -> dict[str, float]:
    """µs per message: the bare system calls, and the dispatcher's round over the real code."""

    async def main() -> dict[str, float]:
        b = Bench(protocol, batch=True)
        for i in range(2 * pairs):
            b.member(i)
        frames = [b.proto.send_frame(2 * p, 2 * p + 1, payload(100, p)) for p in range(pairs)]
        async with trio.open_nursery() as nursery:
            await _serve(nursery, b, [2 * p for p in range(pairs)])
            ep = b.dispatcher._epoll
            view = memoryview(bytearray(RECV_SIZE))
            bare = select.epoll()
            ends = {}
            for p in range(pairs):
                src, dst = b.router_ends[2 * p], b.router_ends[2 * p + 1]
                ends[src.fileno()] = (src, dst)

            def bare_loop() -> None:
                for k in range(n):
                    p = k % pairs
                    b.clients[2 * p].send(frames[p])
                    for fd, _ in bare.poll(0, 1024):
                        src, dst = ends[fd]
                        got = src.recv_into(view)
                        dst.send(bytes(view[:got]))
                    if k % 64 == 63:
                        b.drain()

            def round_loop() -> None:
                for k in range(n):
                    p = k % pairs
                    b.clients[2 * p].send(frames[p])
                    b.dispatcher._round(ep.poll(0, 1024))
                    if k % 64 == 63:
                        b.drain()

            for fd in ends:  # the bare loop has them to itself meanwhile
                ep.unregister(fd)
                bare.register(fd, select.EPOLLIN)
            t_bare = _timed(bare_loop)
            for fd in ends:
                bare.unregister(fd)
                ep.register(fd, select.EPOLLIN)
            delivered = b.hub.counters.delivered
            t_round = _timed(round_loop)
            b.drain()
            assert b.hub.counters.delivered - delivered == n
            nursery.cancel_scope.cancel()
        bare.close()
        b.close()
        return {"bare": t_bare / n * 1e6, "round": t_round / n * 1e6}

    return trio.run(main)


def fanout(protocol: str, n: int, batch: bool, members: int = 8) -> dict[str, float]:
    """µs and sends per message when 2 senders' multicasts are ready in the same round."""

    async def main() -> dict[str, float]:
        b = Bench(protocol, batch)
        for i in range(members):
            b.member(i)
        frames = [b.proto.send_frame(i, None, payload(100, i)) for i in range(2)]
        async with trio.open_nursery() as nursery:
            await _serve(nursery, b, [0, 1])
            ep = b.dispatcher._epoll
            writes = b.hub.counters.writes

            def loop() -> None:
                for k in range(n):
                    b.clients[0].send(frames[0])
                    b.clients[1].send(frames[1])
                    b.dispatcher._round(ep.poll(0, 1024))
                    if k % 32 == 31:
                        b.drain()

            t = _timed(loop)
            sends = b.hub.counters.writes - writes
            nursery.cancel_scope.cancel()
        b.close()
        return {"us": t / (2 * n) * 1e6, "sends": sends / (2 * n)}

    return trio.run(main)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("-n", type=int, default=40_000, help="messages (wake-ups) per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="repeat each measurement")
    args = ap.parse_args(argv)
    for _ in range(args.repeat):
        t = trio_wakeup(args.n)
        print(f"trio wake-up: plain epoll loop {t['plain_user']:.2f} user + {t['plain_sys']:.2f} "
              f"sys µs; trio's wait {t['trio_user']:.2f} user + {t['trio_sys']:.2f} sys µs",
              flush=True)
    for protocol in ("jgroups2", "native"):
        for _ in range(args.repeat):
            u = unicast(protocol, args.n)
            print(f"unicast {protocol}: bare system calls {u['bare']:.2f} µs/msg, dispatcher "
                  f"round {u['round']:.2f} µs/msg, our Python {u['round'] - u['bare']:.2f} µs/msg",
                  flush=True)
        for _ in range(args.repeat):
            for batch in (True, False):
                f = fanout(protocol, args.n // 2, batch)
                print(f"fan-out {protocol} coalesce_writes={'on ' if batch else 'off'}: "
                      f"{f['us']:.2f} µs/msg, {f['sends']:.2f} sends/msg", flush=True)


if __name__ == "__main__":
    main()
