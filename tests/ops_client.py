"""Test helpers for the operations tests: a raw native client that can speak TLS and
send a token (a copy of tests/nclient.py's client), and a tiny HTTP GET."""

from __future__ import annotations

import itertools
import ssl

import trio

from gossiprouter.ops.tls import wrap_client
from gossiprouter.protocol import native as wire


class OpsClient:
    """Sends frames and reads frames over plain TCP or TLS; nothing else."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = wire.Decoder(max_frame=64 * 1024 * 1024)
        self._req = itertools.count(1)
        self.welcome: wire.Welcome | None = None

    @classmethod
    async def open(cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                   token: str | None = None, hello: bool = True) -> OpsClient:
        """Connect (TLS when ``ssl_context``), send the preamble and HELLO, await WELCOME."""
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            try:
                stream = await wrap_client(stream, ssl_context, host)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        c = cls(stream)
        await stream.send_all(wire.PREAMBLE)
        if hello:
            await c.send(wire.Hello((1,), "ops-test", token))
            w = await c.recv()
            assert isinstance(w, wire.Welcome), w
            c.welcome = w
        return c

    def req(self) -> int:
        return next(self._req)

    async def send(self, frame: wire.Frame) -> None:
        await self.stream.send_all(wire.encode(frame))

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

    async def recv_until_closed(self, timeout: float = 5.0) -> list[wire.Frame]:
        """Every frame until the router closes the connection (a TLS reset counts as closed)."""
        out: list[wire.Frame] = []
        try:
            while True:
                out.append(await self.recv(timeout))
        except (EOFError, trio.BrokenResourceError):
            return out

    async def request(self, frame: wire.Connect | wire.Disconnect | wire.GetMembers
                      | wire.Watch | wire.Unwatch) -> wire.Frame:
        await self.send(frame)
        while True:
            f = await self.recv()
            if isinstance(f, (wire.Ok, wire.Error)) and f.req == frame.req:
                return f

    async def connect(self, group: str, addr: bytes, name: str | None = None,
                      physical: wire.Physical = ()) -> wire.Frame:
        return await self.request(wire.Connect(self.req(), group, addr, name, physical))

    async def members(self, group: str) -> wire.Frame:
        return await self.request(wire.GetMembers(self.req(), group))

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def http_get(address: tuple[str, int], path: str, method: str = "GET",
                   timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request; returns (status, headers with lower-case names, body)."""
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            raw = b""
            while data := await stream.receive_some(65536):
                raw += data
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


async def assert_closed(stream: trio.abc.ReceiveStream, timeout: float = 5.0) -> None:
    """Read until the peer closes (EOF, or a reset: both are a clean close here)."""
    with trio.fail_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
