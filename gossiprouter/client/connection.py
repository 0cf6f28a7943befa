"""One router's connection I/O.

:class:`Connection` is one live TCP (or TLS) connection: a new object for every
reconnect, dead for good once killed. :class:`RouterSlot` is what the stub keeps about
one router across all its connections (state, attempts, the current Connection).
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections import deque
from collections.abc import Sequence

import anyio
from anyio.abc import ByteStream

from gossiprouter.client.channel import Channel
from gossiprouter.client.errors import (
    ConnectionLostError,
    LinkDown,
    NotConnectedError,
    StubError,
)
from gossiprouter.client.model import (
    MAX_REPLY_BYTES,
    MAX_REPLY_MEMBERS,
    RECV_SIZE,
    fmt_router,
)
from gossiprouter.client.registrar import Held
from gossiprouter.client.status import ConnectionState, RouterAddress, RouterStatus
from gossiprouter.client.tls import start_tls
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_state import NativeState, Role, State

log = logging.getLogger("gossiprouter.stub")

# What a broken or closed stream raises, on either loop (OSError covers ssl.SSLError).
STREAM_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                 OSError)

def describe_error(e: BaseException) -> str:
    """A short lower-case reason for a failed connection ("connection refused", ...)."""
    if isinstance(e, TimeoutError):  # anyio.fail_after
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host ({e.strerror})"
    if isinstance(e, OSError) and e.errno is None and isinstance(e.__cause__, BaseExceptionGroup):
        # anyio.connect_tcp wraps the per-address errors; the first one says it all.
        leaves = [x for x in e.__cause__.exceptions if isinstance(x, OSError)]
        if leaves:
            return describe_error(leaves[0])
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError) and e.errno is None and isinstance(e.__cause__, OSError):
        return describe_error(e.__cause__)  # anyio.connect_tcp, one address
    if isinstance(e, anyio.BrokenResourceError) and isinstance(e.__cause__, OSError):
        e = e.__cause__  # an SSLError, a reset: say which, not the wrapper's class name
    if isinstance(e, anyio.BrokenResourceError | anyio.EndOfStream):
        return "the connection was closed"
    if isinstance(e, ssl.SSLError):
        return f"TLS handshake failed ({e.reason or e})"
    if isinstance(e, OSError) and e.strerror:
        s = e.strerror
        return s[:1].lower() + s[1:]
    return str(e) or type(e).__name__


class ReplyTooLarge(Exception):
    """A router's answer past :data:`~gossiprouter.client.model.MAX_REPLY_MEMBERS` or
    :data:`~gossiprouter.client.model.MAX_REPLY_BYTES`: a protocol violation, which ends the
    connection (the message is the reason)."""


def _member_bytes(m: wire.MemberInfo) -> int:
    """About what one member costs on the wire (address, name, physical addresses)."""
    return 8 + len(m.addr) + len(m.name or "") + sum(len(h) + 4 for h, _ in m.physical)


class PendingRequest:
    __slots__ = ("event", "parts", "parts_bytes", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: wire.Ok | StubError | None = None
        # The members of the OK parts received so far (a list longer than one frame), and
        # about how many bytes they took on the wire: both bounded (ReplyTooLarge).
        self.parts: list[wire.MemberInfo] = []
        self.parts_bytes = 0

    def set(self, result: wire.Ok | StubError) -> None:
        if self.result is None:
            self.result = result
            self.event.set()

    def ok(self, f: wire.Ok) -> None:
        """One OK frame: a part of a member list (``more``), or the answer, whole or last."""
        if f.members is not None and (f.more or self.parts):
            self.parts += f.members
            self.parts_bytes += sum(_member_bytes(m) for m in f.members)
            if len(self.parts) > MAX_REPLY_MEMBERS or self.parts_bytes > MAX_REPLY_BYTES:
                raise ReplyTooLarge(
                    f"router sent a member list of more than {len(self.parts) - len(f.members)}"
                    f" members ({self.parts_bytes} bytes) in one answer, past the client's "
                    f"bound of {MAX_REPLY_MEMBERS} members or {MAX_REPLY_BYTES} bytes")
            if f.more:
                return
            f = wire.Ok(f.req, tuple(self.parts))
            self.parts = []
        self.set(f)



class WriteLock:
    """The lock that keeps frames whole on a connection shared by many tasks: FIFO, handed
    to the next waiter on release (the heartbeat's PING never starves behind a sending
    loop), and free of any loop call when nobody holds it, the common case: anyio.Lock
    looks the task up on acquire and release, which on asyncio is a system call each
    (asyncio.current_task checks the process id), measured in bench_stub_loops."""

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[anyio.Event] = deque()

    async def __aenter__(self) -> None:
        if not self._held:
            self._held = True  # no checkpoint: the write that follows has its own
            return
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            await turn.wait()  # set by __aexit__, which hands the lock over as held
        except BaseException:
            if turn.is_set():
                self._release()  # handed over while being cancelled: pass it on
            else:
                self._waiters.remove(turn)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self._held = False


class Connection:
    """One live TCP connection to a router (a new object for every reconnect)."""

    def __init__(self, transport: RouterSlot, stream: ByteStream, welcome: wire.Welcome,
                 decoder: wire.Decoder, write_timeout: float, proto: NativeState,
                 max_frame: int = wire.DEFAULT_MAX_FRAME) -> None:
        assert proto.state is State.OPEN, proto  # made only after WELCOME (open_connection)
        self.transport = transport
        self.router = transport.address
        self.stream = stream  # TLS over the TCP stream, or the TCP stream itself
        self.welcome = welcome
        settings = welcome.settings
        mf = settings.get("max_frame")
        # What the router announced, capped at the stub's own ``max_frame`` option: a router
        # announcing 2**40 must not make the client buffer gigabytes for one frame.
        self.announced_max_frame = mf if isinstance(mf, int) and mf > 0 \
            else wire.DEFAULT_MAX_FRAME
        self.max_frame = min(self.announced_max_frame, max_frame)
        hb = settings.get("heartbeat_ms")
        self.router_heartbeat = hb / 1000 if isinstance(hb, int) and hb > 0 else 0.0
        idle = settings.get("idle_timeout_ms")
        self.router_idle = idle / 1000 if isinstance(idle, int) and idle > 0 else 0.0
        self.decoder = decoder
        decoder.max_frame = self.max_frame
        self.write_timeout = write_timeout
        self.lock = WriteLock()
        self.scope = anyio.CancelScope()
        # The write under way: kill() cancels it (it is shielded from everything else);
        # the heartbeat's watch_write notes when it first saw it.
        self.writing: anyio.CancelScope | None = None
        self._seen: anyio.CancelScope | None = None
        self._seen_at = 0.0
        self.dead = False
        # The protocol state (protocol/native_state.py): every frame the router sends is run
        # through it by the reader, so one the table refuses (a second WELCOME, a CONNECT) is
        # a bad frame. Not to be confused with ``ready`` below, the stub's own "registrations
        # replayed" flag.
        self.proto = proto
        self.ready = False
        self.error: str | None = None
        self.farewell: str | None = None  # a connection-closing ERROR the router sent
        self.last_recv = anyio.current_time()
        self.pending: dict[int, PendingRequest] = {}
        # What this connection holds on the router, kept in step with the stub by the
        # registrar (registrar.plan updates it; the answers refine it).
        self.held: Held[Channel] = Held()
        self.kick = anyio.Event()
        self.wake = anyio.Event()
        # The PONGs owed to the router's PINGs, written by the heartbeat; bounded
        # (MAX_QUEUED_PONGS): a router that pings without reading is a protocol violation.
        self.pongs: list[int] = []

    def too_large(self, e: ProtocolError) -> str:
        """The reason for ending the connection on a frame longer than :attr:`max_frame`."""
        if self.max_frame < self.announced_max_frame:
            return (f"router sent a frame longer than this client's max_frame of "
                    f"{self.max_frame} bytes ({e}); the router announced max_frame "
                    f"{self.announced_max_frame}: raise the RouterStub max_frame option to "
                    f"take such frames")
        return f"router sent an unframed stream: {e}"

    def __repr__(self) -> str:
        return f"<link {fmt_router(self.router)}>"

    def kill(self, reason: str) -> None:
        """Declare the connection dead: abort its tasks and any blocked read or write."""
        if self.dead:
            return
        self.dead = True
        self.ready = False
        self.proto.close()
        self.error = self.farewell or reason
        log.info("connection to %s lost: %s", fmt_router(self.router), self.error)
        self.scope.cancel()
        # A write blocked on a router that stopped reading ends at once, half-written or
        # not: the connection is dead. (The reader is in ``scope``; the stream is closed
        # by the task that ran the connection.)
        if self.writing is not None:
            self.writing.cancel()
        lost = ConnectionLostError(f"connection to {fmt_router(self.router)} lost: {self.error}")
        for p in self.pending.values():
            p.set(lost)

    async def write(self, data: bytes, *, bounded: bool = False) -> None:
        """Write whole frames. The write itself is shielded (a cancelled half-written frame
        would corrupt the stream); a router that stopped reading for ``write_timeout`` is
        dead. With ``bounded`` (the heartbeat's own writes) this call ends the connection
        itself after ``write_timeout``, waiting for the lock included; otherwise the
        heartbeat does (:meth:`watch_write`), so an application's write costs no timer."""
        if self.dead:
            raise LinkDown(self.error)
        if not bounded:
            await self._write(data, math.inf)
            return
        deadline = anyio.current_time() + self.write_timeout
        with anyio.CancelScope(deadline=deadline) as waiting:
            await self._write(data, deadline)
        if waiting.cancelled_caught:  # the lock's holder is blocked in its write
            self.kill(f"write blocked for {self.write_timeout:g}s")
            raise LinkDown(self.error)

    async def _write(self, data: bytes, deadline: float) -> None:
        async with self.lock:
            if self.dead:
                raise LinkDown(self.error)
            with anyio.CancelScope(shield=True, deadline=deadline) as cs:
                self.writing = cs
                try:
                    await self.stream.send(data)
                except STREAM_ERRORS as e:
                    self.kill(f"write failed: {describe_error(e)}")
                    raise LinkDown(self.error) from None
                finally:
                    self.writing = None
            if cs.cancelled_caught:
                # By its deadline, or by kill() (watch_write, the stub closing).
                self.kill(f"write blocked for {self.write_timeout:g}s")
                raise LinkDown(self.error)

    def watch_write(self, now: float) -> float:
        """The heartbeat's check of the write under way: a write first seen at an earlier
        check and still going ``write_timeout`` later kills the connection (so a write is
        ended within ``write_timeout`` plus the time between two checks). Returns when to
        check next."""
        w = self.writing
        if w is None:
            self._seen = None
            return now + self.write_timeout
        if w is not self._seen:
            self._seen, self._seen_at = w, now
        elif now - self._seen_at >= self.write_timeout:
            self.kill(f"write blocked for {self.write_timeout:g}s")
            return math.inf
        return self._seen_at + self.write_timeout


class RouterSlot:
    """Everything the stub keeps about one router across reconnects."""

    def __init__(self, address: RouterAddress) -> None:
        self.address = address
        self.state = ConnectionState.CONNECTING
        self.link: Connection | None = None
        self.attempts = 0
        self.failures = 0
        self.connections = 0
        self.last_error: str | None = None
        self.router_id: str | None = None
        # When the current attempt sent HELLO (None before that): a peer that accepts
        # TCP but never answers is named as such when the caller stops waiting.
        self.hello_sent_at: float | None = None

    def status(self) -> RouterStatus:
        return RouterStatus(self.address, self.state, self.attempts, self.connections,
                            self.last_error, self.router_id)


class HandshakeError(Exception):
    pass


FOREIGN = "does not speak the gossiprouter protocol"
# A peer that closed (or reset) the connection before WELCOME: an MQTT broker, a server that
# takes the HELLO for garbage. (A gossiprouter closes at once too when its allow-list
# refuses the client, or when it expects TLS.)
CLOSED = ("closed the connection during the handshake: is this a gossiprouter or JGroups "
          "router port? (a gossiprouter also closes at once when its allow-list refuses "
          "this client, or when it expects TLS)")
HTTP = "an HTTP server answered"


def _foreign(got: bytes | str) -> HandshakeError:
    """The peer answered HELLO with something else than a gossiprouter would."""
    if isinstance(got, str):
        return HandshakeError(f"{FOREIGN} ({got})")
    if got.startswith(b"HTTP/"):
        status = got[:48].split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
        return HandshakeError(f"{FOREIGN}: {HTTP} ({status!r}): is this the metrics port?")
    if got[:1] in (b"\x15", b"\x16") and got[1:2] == b"\x03":
        return HandshakeError(f"{FOREIGN} (got a TLS record: the port expects TLS)")
    line = got[:48].split(b"\n", 1)[0].rstrip(b"\r")
    if line and all(32 <= c < 127 for c in line):
        more = "..." if len(line) < len(got) else ""
        return HandshakeError(f"{FOREIGN} (got {line.decode()!r}{more})")
    return HandshakeError(f"{FOREIGN} (got bytes {got[:16].hex(' ')}"
                           f"{' ...' if len(got) > 16 else ''})")


def _peer_error(address: RouterAddress, error: str) -> str:
    """``the peer at H:P does not speak ...`` or ``H:P: connection refused``."""
    if error.startswith((FOREIGN, CLOSED)):
        return f"the peer at {fmt_router(address)} {error}"
    return f"{fmt_router(address)}: {error}"


def not_connected(slots: Sequence[RouterSlot], waited: float | None) -> NotConnectedError:
    """The error for a caller who found no connected router (after ``waited`` seconds, or at
    once when None), naming every router that is down and why."""
    down = [t for t in slots if t.state is not ConnectionState.CONNECTED]
    why = [_peer_error(t.address, t.last_error or _pending_error(t)) for t in down]
    if len(down) == 1:
        msg = why[0] if why[0].startswith("the peer at") else f"cannot reach router at {why[0]}"
    else:
        msg = "cannot reach any router (" + "; ".join(why) + ")"
    if waited is not None and not msg.startswith("the peer at"):
        msg = f"no router connection within {waited:g}s: {msg}"
    errors = [t.last_error for t in down if t.last_error]
    return NotConnectedError(msg, [t.status() for t in slots], errors[-1] if errors else None)


def _pending_error(t: RouterSlot) -> str:
    """Why a router whose first attempt is still under way is not connected."""
    if t.hello_sent_at is None:
        return "not connected yet"
    waited = anyio.current_time() - t.hello_sent_at
    return f"{FOREIGN} (got no reply to HELLO in {waited:.1f}s)"


# --------------------------------------------------------------------------- connecting


async def open_connection(t: RouterSlot, *, connect_timeout: float,
                          ssl_context: ssl.SSLContext | None, server_hostname: str | None,
                          client_name: str, token: str | None,
                          write_timeout: float,
                          max_frame: int = wire.DEFAULT_MAX_FRAME) -> Connection:
    """Open one connection to ``t``'s router: TCP, TLS if ``ssl_context``, HELLO, WELCOME.

    Raises HandshakeError when the peer refuses HELLO or is no gossiprouter (named from the
    start of its reply), OSError / anyio stream errors (:data:`STREAM_ERRORS`) when TCP or
    TLS fail, TimeoutError after ``connect_timeout``. ``t.hello_sent_at`` is set while
    WELCOME is awaited.
    """
    host, port = t.address
    t.hello_sent_at = None
    with anyio.fail_after(connect_timeout):
        raw = await anyio.connect_tcp(host, port)
        stream: ByteStream = raw
        try:
            if ssl_context is not None:
                stream = await start_tls(raw, ssl_context, server_hostname or host)
            proto = NativeState(Role.CLIENT)
            hello = wire.Hello(wire.SUPPORTED_VERSIONS, client_name, token)
            proto.send(type(hello))
            try:
                await stream.send(wire.PREAMBLE + wire.encode(hello))
            except (anyio.BrokenResourceError, OSError) as e:
                if isinstance(e, ssl.SSLError) or isinstance(e.__cause__, ssl.SSLError):
                    raise
                raise HandshakeError(CLOSED) from None
            t.hello_sent_at = anyio.current_time()
            decoder = wire.Decoder(max_frame=64 * 1024)
            got = b""  # the start of the reply, to show a peer that is no router
            while True:
                try:
                    f = decoder.next_frame()
                except Exception:
                    raise _foreign(got) from None
                if f is None:
                    try:
                        data = await stream.receive(RECV_SIZE)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as e:
                        if isinstance(e, ssl.SSLError) or isinstance(e.__cause__, ssl.SSLError):
                            raise
                        data = b""  # closed, or reset (it did not read all of HELLO)
                    if not data:
                        if got:
                            raise _foreign(got)
                        raise HandshakeError(CLOSED)
                    got += data[: 64 - len(got)]
                    decoder.feed(data)
                    continue
                try:
                    # WELCOME (then OPEN) or ERROR (then CLOSED); the table refuses the rest.
                    proto.receive(type(f))
                except ProtocolError as e:
                    raise _foreign(str(e)) from None
                if isinstance(f, wire.Error):
                    raise HandshakeError(f"router refused HELLO: {f.code}: {f.message}")
                assert isinstance(f, wire.Welcome)
                break
        except BaseException:
            await anyio.aclose_forcefully(stream)
            raise
    t.router_id = f.router_id
    t.hello_sent_at = None
    return Connection(t, stream, f, decoder, write_timeout, proto, max_frame)
