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

A Router is a whole router, as ``gossiprouter serve`` runs it: the server and its
operations hooks (TLS, allow-lists, tokens, metrics; ``router.ops``), built here from one
config. That is why this module sits above both in docs/architecture.md's layers.

Three ways to run it, all trio's own:

* ``async with Router(config) as router:`` or ``async with open_router(config) as router:``
  runs it in a nursery for the length of the block (listening when the block starts) and
  shuts it down gracefully when the block ends;
* ``address = await nursery.start(router.run)`` runs it in the caller's nursery and returns
  once it listens; :meth:`Router.shutdown` (or cancelling) ends it.

Errors (the policy; the server's own, for each connection, is in
:mod:`gossiprouter.server.listener`):

* **A session raises** (a router bug while serving one connection): confined to that
  connection, which is closed; logged, counted, and every other connection is served on.
  Nothing reaches the caller.
* **A listener fails**: opening the port (address in use, no permission) raises
  :class:`~gossiprouter.server.listener.ListenError`, bare, from ``nursery.start(router.run)`` and
  from entering the ``async with`` forms (the router's nursery has nothing else running
  then, so it ends cleanly and the error is raised outside it). Once the block runs, it
  runs inside the router's nursery: an exception leaving it (the block's own, a fatal
  accept error) comes out as from any nursery, in an ExceptionGroup.
* **The caller is cancelled**, or an exception leaves the ``async with`` block: the router
  stops at once: listeners and every connection close without the graceful
  ``shutting_down`` notice (that is :meth:`Router.shutdown`, which the end of the block
  calls), and the exception or cancellation propagates as usual.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import trio

from gossiprouter.core.addresses import format_addr
from gossiprouter.core.config import Config
from gossiprouter.ops.runtime import Operations
from gossiprouter.protocol import native as wire
from gossiprouter.routing.entries import Entry, Kind, RoutingError, is_reserved
from gossiprouter.server.listener import ListenError, Server
from gossiprouter.sessions.base import Hub

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


class _Inbox:
    """An in-process member's queue (its :attr:`Carrier.outbox <routing.entries.Carrier>`):
    the bounded memory channel the application reads.

    Routed frames reach every carrier in the native wire form, one bytes object shared by
    all receivers; they are decoded here once, by the protocol's own decoder. When the
    application does not keep up, messages are dropped and counted, as for a slow network
    consumer under the ``drop`` policy: a router never blocks on one receiver.
    """

    def __init__(self, hub: Hub, buffer: int) -> None:
        self.hub = hub
        self.dropped = 0
        self.send, self.recv = trio.open_memory_channel[Message | MemberEvent](buffer)

    def push(self, data: bytes) -> bool:
        decoder = wire.Decoder(max_frame=len(data))
        decoder.feed(data)
        for f in decoder.frames():
            # Only ROUTE is routed to members of the groups an in-process member can join
            # (no JGroups namespace, see Router.register; it cannot SUBSCRIBE to PUBLISH).
            if isinstance(f, wire.Route):
                self.put(Message(f.group, f.sender, f.dest, f.payload))
        return True  # taken (or dropped and counted): never left to a slow-consumer policy

    def put(self, item: Message | MemberEvent) -> None:
        try:
            self.send.send_nowait(item)
        except trio.WouldBlock:
            self.dropped += 1
            self.hub.counters.drop("in_process_full")
        except trio.ClosedResourceError:
            pass


class LocalMember:
    """A member living inside the router's process.

    It is a routing-table carrier (:class:`~gossiprouter.routing.entries.Carrier`) of its own, not
    a session: it sends through the hub's routing operations, as a connection's session
    does, and receives on a bounded memory channel (see :class:`_Inbox`).
    """

    protocol: ClassVar[str] = "in-process"
    # Events are handed over as MemberEvent objects: there is no wire form to share.
    events_by_call: ClassVar[bool] = True

    def __init__(self, hub: Hub, group: str, addr: bytes, buffer: int) -> None:
        self.hub = hub
        self.group = group
        self.addr = addr
        self.peer = f"in-process:{group}"
        self.outbox = _Inbox(hub, buffer)

    def __repr__(self) -> str:
        return f"<{self.protocol} {self.group!r} {format_addr(self.addr)}>"

    @property
    def dropped(self) -> int:
        """Messages and events dropped because the application did not keep up."""
        return self.outbox.dropped

    # carrier interface (called by the hub and the sessions)
    def push(self, data: bytes, count: int = 1) -> None:
        self.outbox.push(data)

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        return None  # events_by_call: the hub calls notify() instead

    def notify(self, kind: str, entry: Entry) -> None:
        self.outbox.put(MemberEvent(entry.group, kind, entry.addr, entry.name, entry.physical))

    # application interface
    async def send(self, payload: bytes, dest: bytes | None = None) -> None:
        """Route ``payload`` to ``dest`` (or the whole group when None).

        Raises :class:`RoutingError`: ``not_member`` after :meth:`leave` (or expiry, or a
        take-over), ``unknown_destination`` when ``dest`` is not a member of the group,
        ``too_long`` for a ``dest`` longer than the protocol allows.
        """
        if dest is not None and len(dest) > wire.MAX_ADDR:
            raise RoutingError("too_long", f"destination address longer than {wire.MAX_ADDR} "
                                           "bytes")
        hub = self.hub
        if not hub.table.holds(self, self.group, self.addr):
            raise RoutingError("not_member", f"{format_addr(self.addr)} is not registered in "
                                             f"{self.group!r} any more")
        frame = wire.encode_route(self.group, dest, self.addr, payload)
        if not hub.forward(self, self.group, dest, self.addr, frame):
            assert dest is not None
            raise RoutingError("unknown_destination",
                               f"no member {format_addr(dest)} in {self.group!r}; dropped")
        await trio.lowlevel.checkpoint()

    async def receive(self) -> Message | MemberEvent:
        return await self.outbox.recv.receive()

    def __aiter__(self) -> AsyncIterator[Message | MemberEvent]:
        return self.outbox.recv.__aiter__()

    async def leave(self) -> None:
        """Remove this member (a clean leave: watchers see ``leave``)."""
        if self.hub.table.holds(self, self.group, self.addr):
            self.hub.deliver(self.hub.table.remove(self.group, self.addr))
        self.outbox.send.close()
        await trio.lowlevel.checkpoint()


class Router:
    """A gossiprouter running inside a trio program (``async with Router(config)``)."""

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        cfg = config or Config()
        self.config = cfg.with_(**overrides) if overrides else cfg
        # TLS, allow-lists, tokens, the metrics/admin port: reload() them on SIGHUP, if
        # wanted (a library installs no signal handler).
        self.ops = Operations(self.config)
        self.server = Server(self.config, hooks=self.ops)
        self._context: AbstractAsyncContextManager[Router] | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server.address is not None, "router not started"
        return self.server.address

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until :meth:`shutdown` or cancellation: ``address = await
        nursery.start(router.run)`` returns ``(host, port)`` once listening, and raises
        :class:`~gossiprouter.server.listener.ListenError` if it cannot listen."""
        await self.server.serve(task_status=task_status)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Router]:
        failed: ListenError | None = None
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(self.run)
            except ListenError as e:
                # start() raises it bare and nothing else runs in the nursery yet: leave the
                # nursery cleanly and raise it outside, so the caller gets it bare too.
                failed = e
            else:
                yield self
                # Graceful (the nursery waits for it) when the block ends normally; an
                # exception or a cancellation leaving the block cancels the nursery, stopping
                # it at once.
                self.server.shutdown()
        if failed is not None:
            raise failed

    async def __aenter__(self) -> Router:
        self._context = self._running()
        return await self._context.__aenter__()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        # A thin wrapper: the caller's exception goes to the context manager as it came.
        assert self._context is not None
        return await self._context.__aexit__(et, e, tb)

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
        """Add an in-process member; ``ttl`` (seconds) makes it expire unless renewed.

        Raises :class:`RoutingError` when the table refuses it (``address_in_use``,
        ``too_long``, ...) or ``group`` is a JGroups namespace (``forbidden``).
        """
        if is_reserved(group):
            raise RoutingError("forbidden", f"{group!r} is a JGroups namespace: its members "
                                            "speak JGroups, which an in-process member does not")
        member = LocalMember(self.server.hub, group, addr, buffer)
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


@asynccontextmanager
async def open_router(config: Config | None = None, **overrides: Any) -> AsyncIterator[Router]:
    """``async with open_router(config, **overrides) as router:``: a :class:`Router` (same
    arguments) running in a nursery for the length of the block; what ``async with
    Router(...)`` does."""
    async with Router(config, **overrides)._running() as router:
        yield router
