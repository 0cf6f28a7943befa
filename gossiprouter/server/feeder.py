"""Feeding a session what its connection's socket delivers: the :class:`Feeder`, the waits it
asks for, and the connection's own reader loop.

Whoever reads a connection (its own task, the dispatcher or the compiled fast path) hands
every received chunk to the connection's :class:`Feeder`, the one place that keeps the reader
fair to everyone else (slices and turns), holds a session to its control budget, confines a
session's exceptions to its own connection (the error policy: :mod:`gossiprouter.server.listener`,
"Errors") and checks the handshake deadline. The Feeder never waits: the connection's task
does, in :class:`ReadPart`, the third part of :class:`gossiprouter.server.listener.Server`
(:meth:`ReadPart._settle`: a checkpoint, the control budget's pause, back-pressure).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import trio

from gossiprouter.server.connection import Connection, nothing_to_wake
from gossiprouter.server.dispatch import END, READ, Dispatcher
from gossiprouter.server.hooks import ByteStream
from gossiprouter.server.shutdown import ShutdownPart
from gossiprouter.sessions.base import TURN_CONTROLS, Session

if TYPE_CHECKING:
    from gossiprouter.server.fastpath import FastPath

RECV_SIZE = 256 * 1024
# Back-pressure (see sessions.outbox.Congestion): a reader that fed a congested
# receiver pauses in steps of STALL_STEP, at most MAX_STALL per chunk; a
# receiver whose writer made no progress for STALLED_AFTER slows nobody.
STALL_STEP = 0.002
MAX_STALL = 0.05
STALLED_AFTER = 0.25
# Fairness (issue 12): a reader hands a received chunk to its session in slices of at most
# SLICE bytes, and lets every other task run (a checkpoint) once it has used TURN seconds
# since its last one, or when its session paused (its share of control frames per turn, or
# its control budget, is spent: see Session.spend_control).
SLICE = 64 * 1024
TURN = 0.001

# What Feeder.feed / Feeder.run ask of the connection's task (besides READ: read the next
# chunk, and END: the reader is over, from gossiprouter.server.dispatch). The dispatcher handles
# READ itself and hands the connection back to its task for everything else (Server._settle).
YIELD = 2  # the turn's time (TURN) is used: a checkpoint, then Feeder.run
PAUSE = 3  # the session paused and must wait (Server._pause), then Feeder.run
THROTTLE = 4  # a receiver it fed is congested: Server._throttle, then the next chunk


class ReadPart(ShutdownPart):
    """The part of :class:`~gossiprouter.server.listener.Server` that reads its connections:
    who reads a connection, and the waits its :class:`Feeder` asks for. The attributes are
    the server's."""

    # Reads established plain-TCP connections from one task (gossiprouter.server.dispatch).
    dispatcher: Dispatcher
    # The compiled fast path (server.fastpath), when built and not switched off.
    fast: FastPath | None
    # The run's clock, shared by every Feeder (set by serve).
    clock: Callable[[], float]

    def _reader(self, conn: Connection, session: Session, feeder: Feeder
                ) -> Coroutine[Any, Any, None]:
        """What feeds the session what the socket delivers, until EOF or the session closes:
        the dispatcher's (or the fast path's) ``serve`` for plain TCP, else :meth:`_receive`.

        A plain function returning the coroutine that :meth:`_handle` awaits, so that an
        idle connection keeps no frame of its own here: only :meth:`_handle`'s and the
        dispatcher's (issue 24)."""
        stream = conn.stream
        if self.config.dispatcher and isinstance(stream, trio.SocketStream):
            fast = self.fast
            if fast is not None and fast.reads(session):
                return fast.serve(session, feeder, self._settle)
            raw = getattr(stream.socket, "_sock", None)
            if raw is not None:
                return self.dispatcher.serve(raw, feeder, self._settle)
        return self._receive(stream, feeder)

    async def _receive(self, stream: trio.SocketStream | ByteStream, feeder: Feeder) -> None:
        """The connection's own reader loop (TLS, or ``dispatcher`` off)."""
        while not feeder.closed:
            try:
                chunk = await stream.receive_some(RECV_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                feeder.eof()
                return
            step = feeder.feed(chunk)
            del chunk  # not held while waiting for the next one (thousands of idle readers)
            if not await self._settle(feeder, step):
                return

    async def _settle(self, feeder: Feeder, step: int) -> bool:
        """Do the wait ``feeder`` asked for (see the steps above Feeder), feeding on after
        it until the chunk is done. True: read the next chunk; False: the reader is over."""
        while True:
            if step == READ:
                return True
            if step == END:
                return False
            if step == THROTTLE:
                await self._throttle()
                return not feeder.closed
            if step == YIELD:
                await trio.lowlevel.checkpoint()
                feeder.turn = trio.current_time()
            else:
                assert step == PAUSE
                feeder.turn = await self._pause(feeder.session, feeder.turn)
            step = feeder.run()

    async def _pause(self, session: Session, turn: float) -> float:
        """The session paused and must wait: its share of this turn was spent after the
        turn's time (a checkpoint), or its control budget is spent (wait for the bucket,
        or close it when it stays over). Returns when its new turn starts."""
        counters = self.hub.counters
        if session.tokens >= 0:
            counters.turns_cut += 1
            await trio.lowlevel.checkpoint()
            return trio.current_time()
        counters.throttled_turns += 1
        cfg = self.config
        now = trio.current_time()
        since = session.over_since if session.over_since is not None else now
        if now - since >= cfg.control_grace:
            counters.rate_limited += 1
            self._refusals.warning(
                "closing %r: over its control budget (%g frames/s, burst %d) for %.1fs",
                session, cfg.control_rate, cfg.control_burst, now - since)
            session.close("rate_limited",
                          f"more than {cfg.control_rate:g} control frames per second "
                          f"(burst {cfg.control_burst}) for {cfg.control_grace:g}s")
            return now
        # Read nothing more from it until the bucket holds a turn's share again: TCP then
        # slows the client down to its budget.
        refill = min(TURN_CONTROLS, session.control_burst) - session.tokens
        await trio.sleep(refill / session.control_rate)
        return trio.current_time()

    async def _throttle(self) -> None:
        """Pause this reader while a receiver it fed is congested but still draining."""
        congestion = self.hub.congestion
        end = trio.current_time() + MAX_STALL
        while True:
            now = trio.current_time()
            if now >= end or not congestion.draining(now, STALLED_AFTER):
                return
            await trio.sleep(STALL_STEP)

class Feeder:
    """The one place that processes a received chunk for a session, whoever read it (the
    connection's reader task or the dispatcher): it counts the bytes, feeds the session in
    slices of SLICE bytes within a turn of TURN seconds, withholds the session's replies to
    itself and flushes them once per slice (:meth:`_flush_own`), honours the session's pause
    (its share of control frames per turn, or its control budget), contains the session's
    exceptions (Hub.contain) and checks the handshake deadline. It never waits: where a
    wait is due it returns a step (YIELD, PAUSE, THROTTLE) and keeps its place; the
    connection's task waits (Server._settle) and calls :meth:`run` to go on."""

    __slots__ = ("clock", "conn", "data", "hub", "outbox", "pos", "resume", "server", "session",
                 "turn")

    def __init__(self, server: ReadPart, conn: Connection, session: Session) -> None:
        self.server = server
        self.hub = server.hub
        self.conn = conn
        self.session = session
        self.outbox = session.outbox
        self.data = b""  # the chunk being fed, from pos on
        self.pos = 0
        self.turn = 0.0  # when the current turn started (after the last checkpoint)
        self.resume = False  # the session paused: go on with on_data(b"")
        # The run's clock itself: trio.current_time() is two more calls to reach it, and
        # a light-load message reads the clock twice (issue 16, Step 3). The server's, one
        # bound method for every connection (issue 24).
        self.clock = server.clock

    @property
    def closed(self) -> bool:
        return self.outbox.closed

    def feed(self, data: bytes) -> int:
        """A chunk was received (right after a read, which was a checkpoint)."""
        self.hub.counters.bytes_in += len(data)
        self.data = data
        self.pos = 0
        now = self.turn = self.clock()
        return self.run(now)

    def eof(self) -> None:
        """The peer closed its side."""
        try:
            self.session.on_eof()
        except Exception as exc:  # see "Errors" (server.listener): this connection only
            self.hub.contain(self.session, exc, "handling its end of stream")

    def run(self, now: float = -1.0) -> int:
        """Feed the chunk on from where it stopped, until it is done or a wait is due
        (``now``: the time, when the caller just read the clock)."""
        session = self.session
        ob = self.outbox
        if ob.closed:
            self.data = b""
            return END
        clock = self.clock
        data = self.data
        size = len(data)
        pos = self.pos
        resume = self.resume
        self.resume = False
        # The session's replies to itself (PONG, OK, echoed HEARTBEATs, its own
        # multicasts) are queued while it runs and written once afterwards, not
        # with one send() each.
        held = ob.direct, ob.wake
        ob.direct, ob.wake = None, nothing_to_wake
        try:
            while True:
                session.new_turn()
                if resume:
                    resume = False
                    session.on_data(b"", clock())
                else:
                    piece = data if size <= SLICE else data[pos:pos + SLICE]
                    pos += SLICE
                    session.on_data(piece, now if now >= 0.0 else clock())
                    now = -1.0
                if session.paused and not ob.closed:
                    # Its share of this turn's control frames is spent: it goes on at once
                    # while the turn's time is not used up; otherwise it waits.
                    if session.tokens >= 0 and clock() - self.turn < TURN:
                        resume = True
                        continue
                    self.pos, self.resume = pos, True
                    self._flush_own(held)
                    return PAUSE
                if ob.closed or pos >= size:
                    break
                if clock() - self.turn >= TURN:
                    self.hub.counters.turns_cut += 1
                    self.pos = pos
                    self._flush_own(held)
                    return YIELD
        except Exception as exc:  # see "Errors" (server.listener): this connection only
            self.hub.contain(session, exc, "handling received data")
            self.data = b""
            self._flush_own(held)  # gives back the wake-up: the farewell goes out
            return END
        self.data = b""
        if ob.chunks or ob.closed:
            self._flush_own(held)
        else:  # nothing for itself (most chunks under light load): no call
            ob.direct, ob.wake = held
        if not session.established and not ob.closed and clock() >= (
                self.conn.handshake_deadline):
            self.server._handshake_expired(self.conn, session)
        congestion = self.hub.congestion
        if congestion.pending:
            congestion.pending = False
            return THROTTLE
        return END if ob.closed else READ

    def _flush_own(self, held: tuple[Callable[[bytes], int] | None, Callable[[], None]]
                   ) -> None:
        """Give the outbox back the direct send and the wake-up withheld while the session
        ran, and write what the session queued for its own connection meanwhile (PONG, OK,
        echoed HEARTBEATs, its own multicasts) in one send instead of one per reply.
        Outbox.push sends directly when the writer is idle, else wakes it."""
        ob = self.outbox
        ob.direct, ob.wake = held
        if ob.closed:
            ob.wake()  # the farewell queued by close() must be written
            return
        ob.flush()  # held for the round's WriteBatch, if one is open
