"""A raw native-protocol test client: frames over a real socket, no stub logic."""

from __future__ import annotations

import itertools
import ssl
from typing import TYPE_CHECKING

import trio

from gossiprouter.client.tls import wrap_client
from gossiprouter.protocol import native as wire

if TYPE_CHECKING:
    from gossiprouter.server.listener import Server


class NativeClient:
    """Sends frames and reads frames, nothing else; tests drive the protocol by hand.

    ``stream`` is what frames go through (TLS when asked for); ``raw`` is the TCP
    stream under it, for socket options and abrupt closes.
    """

    def __init__(self, stream: trio.abc.Stream, raw: trio.SocketStream) -> None:
        self.stream = stream
        self.raw = raw
        self.decoder = wire.Decoder(max_frame=64 * 1024 * 1024)
        self._req = itertools.count(1)
        self.welcome: wire.Welcome | None = None

    @classmethod
    async def open(cls, host: str, port: int, *, hello: bool = True,
                   ssl_context: ssl.SSLContext | None = None,
                   token: str | None = None) -> NativeClient:
        """Connect (TLS when ``ssl_context``), send the preamble and HELLO, await WELCOME."""
        raw = await trio.open_tcp_stream(host, port)
        stream: trio.abc.Stream = raw
        if ssl_context is not None:
            try:
                stream = await wrap_client(raw, ssl_context, host)
            except BaseException:
                await trio.aclose_forcefully(raw)
                raise
        c = cls(stream, raw)
        await stream.send_all(wire.PREAMBLE)
        if hello:
            await c.send(wire.Hello((1,), "test", token))
            w = await c.recv()
            assert isinstance(w, wire.Welcome), w
            c.welcome = w
        return c

    @classmethod
    async def to(cls, router: Server) -> NativeClient:
        """A client of the in-process ``router`` (started: its address is known)."""
        assert router.address is not None
        return await cls.open(*router.address)

    @classmethod
    async def several(cls, router: Server, n: int) -> list[NativeClient]:
        """``n`` clients of the in-process ``router``, opened one after the other."""
        return [await cls.to(router) for _ in range(n)]

    @classmethod
    async def joined(cls, router: Server, group: str,
                     *addrs: bytes | tuple[bytes, ...]) -> list[NativeClient]:
        """One client of ``router`` per entry of ``addrs``, all opened first, then each
        registered in ``group`` in turn with its address (or, for a tuple, its addresses one
        after the other: a connection that carries several members)."""
        clients = await cls.several(router, len(addrs))
        for c, entry in zip(clients, addrs, strict=True):
            for addr in (entry,) if isinstance(entry, bytes) else entry:
                await c.connect(group, addr)
        return clients

    def req(self) -> int:
        return next(self._req)

    async def send(self, frame: wire.Frame) -> None:
        await self.stream.send_all(wire.encode(frame))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self, timeout: float = 5.0) -> wire.Frame:
        with trio.fail_after(timeout):
            while True:
                f = self.decoder.next_frame()
                if f is not None:
                    return f
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("router closed the connection")
                self.decoder.feed(data)

    async def round_trip(self) -> list[wire.Frame]:
        """A PING and its PONG; the frames that came before the PONG."""
        nonce = self.req()
        await self.send(wire.Ping(nonce))
        before: list[wire.Frame] = []
        while (f := await self.recv()) != wire.Pong(nonce):
            before.append(f)
        return before

    async def recv_until_closed(self, timeout: float = 5.0) -> list[wire.Frame]:
        """Every frame until the router closes the connection (a reset counts as closed)."""
        out: list[wire.Frame] = []
        try:
            while True:
                out.append(await self.recv(timeout))
        except (EOFError, trio.BrokenResourceError):
            return out

    async def request(
        self,
        frame: wire.Connect | wire.Disconnect | wire.GetMembers | wire.Watch | wire.Unwatch,
    ) -> wire.Frame:
        """Send a request and return its OK/ERROR, skipping routed traffic and events."""
        await self.send(frame)
        req = frame.req
        while True:
            f = await self.recv()
            if isinstance(f, (wire.Ok, wire.Error)) and f.req == req:
                return f

    async def connect(self, group: str, addr: bytes, name: str | None = None,
                      physical: wire.Physical = ()) -> wire.Frame:
        return await self.request(wire.Connect(self.req(), group, addr, name, physical))

    async def members(self, group: str) -> wire.Frame:
        return await self.request(wire.GetMembers(self.req(), group))

    async def member_list(self, group: str) -> tuple[wire.MemberInfo, ...]:
        """The members of ``group``, asserting that the router answered with a list."""
        reply = await self.members(group)
        assert isinstance(reply, wire.Ok) and reply.members is not None, reply
        return reply.members

    async def member_addrs(self, group: str) -> list[bytes]:
        return [m.addr for m in await self.member_list(group)]

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
