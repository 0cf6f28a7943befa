"""What every hostile client shares: its counters and its connections to the router.

An :class:`Attack` opens connections to the router, writes what its kind sends and reads
(and counts) whatever comes back; when the router closes a connection it is counted and
opened again after :data:`RECONNECT_DELAY`, until the attack's deadline cancels it. Each kind
is a subclass with its own :meth:`Attack.run`, in a file of its own beside this one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import trio

from gossiprouter.loadtest.attacks.spec import AttackSpec
from gossiprouter.protocol import native as wire

__all__ = ["RECONNECT_DELAY", "Attack", "Counters", "native_hello"]

log = logging.getLogger("gossiprouter.loadtest.attacks")

RECONNECT_DELAY: Final = 0.5  # before an attacker whose connection was closed tries again


@dataclass
class Counters:
    opened: int = 0
    closed_by_router: int = 0
    connect_failures: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    refused: int = 0  # ERROR / OP_FAIL answers (a limit, a bad name, ...)
    answers: int = 0  # admin-poll: 200 answers
    failures: int = 0  # admin-poll: anything else
    slowest_s: float = 0.0  # admin-poll: the slowest answer


class _Closed(Exception):
    """The router closed (or reset) the attacker's connection."""


class Attack:
    def __init__(self, spec: AttackSpec, host: str, port: int, metrics: str | None) -> None:
        self.spec, self.host, self.port, self.metrics = spec, host, port, metrics
        self.c = Counters()

    async def open(self) -> trio.SocketStream:
        try:
            s = await trio.open_tcp_stream(self.host, self.port)
        except OSError:
            self.c.connect_failures += 1
            raise _Closed from None
        self.c.opened += 1
        return s

    async def send(self, s: trio.SocketStream, data: bytes) -> None:
        try:
            await s.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise _Closed from None
        if not self.c.bytes_out:
            log.info("%s: first bytes sent", self.spec.kind)  # the attack is under way
        self.c.bytes_out += len(data)

    async def drain(self, s: trio.SocketStream, on_data: Callable[[bytes], None] | None = None
                    ) -> None:
        """Read and count what the router sends until it closes the connection."""
        try:
            while data := await s.receive_some(1 << 20):
                self.c.bytes_in += len(data)
                if on_data is not None:
                    on_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        raise _Closed

    async def session(self, body: Callable[[trio.SocketStream], Awaitable[None]],
                      on_data: Callable[[bytes], None] | None = None) -> None:
        """Open a connection and run ``body`` while reading; again after the router closes
        it (until the attack's deadline cancels everything)."""
        while True:
            try:
                s = await self.open()
                try:
                    async with trio.open_nursery() as n:
                        async def reader(s: trio.SocketStream = s) -> None:
                            await self.drain(s, on_data)

                        n.start_soon(reader)
                        await body(s)
                        await trio.sleep_forever()
                finally:
                    await trio.aclose_forcefully(s)
            except* _Closed:
                self.c.closed_by_router += 1
            await trio.sleep(RECONNECT_DELAY)

    async def run(self) -> None:
        raise NotImplementedError

def native_hello() -> bytes:
    return wire.PREAMBLE + wire.encode(wire.Hello((1,), "loadtest-attacker"))
