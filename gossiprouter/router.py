"""The embedding API: run a router inside a trio program, with in-process members.

::

    async with Router(Config(port=12001)) as router:
        member = await router.register("demo", b"svc-1", name="service")
        await member.send(b"hello, group")
        async for item in member:           # Message or MemberEvent
            ...

An in-process member is an entry of kind ``in-process``: it outranks any
network registration of the same address (a client CONNECT for it gets ERROR
``address_in_use``) and receives through a bounded memory channel.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import trio

from gossiprouter.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.routing import Entry, Kind, RoutingError
from gossiprouter.server import Server
from gossiprouter.sessions.native import NativeSession

log = logging.getLogger("gossiprouter")


@dataclass(frozen=True, slots=True)
class Message:
    """A message delivered to an in-process member."""

    group: str
    sender: bytes
    dest: bytes | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """join / leave / suspect of ``addr`` in ``group``."""

    group: str
    kind: str
    addr: bytes
    name: str | None
    physical: wire.Physical


class LocalMember(NativeSession):
    """A member living inside the router's process.

    It is a routing-table carrier like a connection's session; what the
    router would write to a socket is decoded and put on a bounded memory
    channel instead. When the application does not keep up, messages are
    dropped and counted (``dropped``), as for a slow network consumer under
    the ``drop`` policy: a router never blocks on one receiver.
    """

    protocol = "in-process"

    def __init__(self, router: Router, group: str, addr: bytes, buffer: int) -> None:
        super().__init__(router.server.hub, f"in-process:{group}")
        self.ready = True
        self.group = group
        self.addr = addr
        self.router = router
        self.dropped = 0
        self._send, self._recv = trio.open_memory_channel[Message | MemberEvent](buffer)
        self._errors: list[tuple[str, str]] = []

    # carrier interface
    def push(self, data: bytes, count: int = 1) -> None:
        decoder = wire.Decoder(max_frame=len(data))
        decoder.feed(data)
        for f in decoder.frames():
            if isinstance(f, wire.Route):
                self._put(Message(f.group, f.sender, f.dest, f.payload))

    def notify(self, kind: str, entry: Entry) -> None:
        self._put(MemberEvent(entry.group, kind, entry.addr, entry.name, entry.physical))

    def _put(self, item: Message | MemberEvent) -> None:
        try:
            self._send.send_nowait(item)
        except trio.WouldBlock:
            self.dropped += 1
            self.hub.counters.drop("in_process_full")
        except trio.ClosedResourceError:
            pass

    def _error(self, req: int | None, code: str, message: str) -> None:
        self._errors.append((code, message))

    # application interface
    async def send(self, payload: bytes, dest: bytes | None = None) -> None:
        """Route ``payload`` to ``dest`` (or the whole group when None)."""
        frame = wire.encode_route(self.group, dest, self.addr, payload)
        self._errors.clear()
        found = self._lookup(frame, 4, len(frame))
        if found is not None:
            self._forward(found[1], frame, 1)
        if self._errors:
            code, message = self._errors[0]
            raise RoutingError(code, message)
        await trio.lowlevel.checkpoint()

    async def receive(self) -> Message | MemberEvent:
        return await self._recv.receive()

    def __aiter__(self) -> AsyncIterator[Message | MemberEvent]:
        return self._recv.__aiter__()

    async def leave(self) -> None:
        """Remove this member (a clean leave: watchers see ``leave``)."""
        self.hub.deliver(self.hub.table.remove(self.group, self.addr))
        self._send.close()
        await trio.lowlevel.checkpoint()


class Router:
    """A gossiprouter running inside a trio program (``async with Router(config)``)."""

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        cfg = config or Config()
        self.config = cfg.with_(**overrides) if overrides else cfg
        self.server = Server(self.config)
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server.address is not None, "router not started"
        return self.server.address

    async def __aenter__(self) -> Router:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            await self._nursery.start(self.server.serve)
        except BaseException:
            await self._nursery_cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self.server.shutdown()
        return bool(await self._nursery_cm.__aexit__(et, e, tb))

    async def register(
        self,
        group: str,
        addr: bytes,
        name: str | None = None,
        physical: wire.Physical = (),
        *,
        ttl: float | None = None,
        buffer: int = 10_000,
    ) -> LocalMember:
        """Add an in-process member; ``ttl`` (seconds) makes it expire unless renewed."""
        member = LocalMember(self, group, addr, buffer)
        expires = None if ttl is None or math.isinf(ttl) else trio.current_time() + ttl
        _, notices, _ = self.server.hub.table.connect(
            member, group, addr, name, physical, kind=Kind.IN_PROCESS, expires_at=expires
        )
        self.server.hub.deliver(notices)
        await trio.lowlevel.checkpoint()
        return member

    def members(self, group: str) -> list[Entry]:
        return self.server.hub.table.members(group)

    def shutdown(self) -> None:
        self.server.shutdown()
