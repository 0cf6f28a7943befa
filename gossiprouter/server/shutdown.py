"""The server's stop and its housekeeping: :meth:`ShutdownPart.shutdown`, the reaper (idle
connections, handshake and write deadlines, expired entries, ended reconnect graces) and the
notifier (membership events told in batches).

The second part of :class:`gossiprouter.server.listener.Server`, over
:class:`~gossiprouter.server.connection.ConnectionsPart`. The reaper and notifier tasks log,
count and carry on after an exception (the error policy: :mod:`gossiprouter.server.listener`,
"Errors").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from gossiprouter.core.addresses import format_addr
from gossiprouter.core.cadence import HOUSEKEEPING, until_beat
from gossiprouter.server.connection import Connection, ConnectionsPart
from gossiprouter.sessions.base import Session

if TYPE_CHECKING:
    from gossiprouter.core.ratelog import RateLimitedLog
    from gossiprouter.federation.bridge import Bridge

log = logging.getLogger("gossiprouter")

# Membership events wait this long so that a burst of closes is seen whole
# before anyone is told (see Hub.deliver).
NOTICE_DELAY = 0.005
NOTICE_MAX_DELAY = 1.0


class ShutdownPart(ConnectionsPart):
    """The part of :class:`~gossiprouter.server.listener.Server` that stops it, and closes
    and expires what has outlived its time while it runs. The attributes are the server's."""

    connections: set[Connection]
    bridge: Bridge | None
    _accept_scope: trio.CancelScope
    # Refusals, write timeouts with policy drop, rate-limited closes: rate-limited WARNINGs.
    _refusals: RateLimitedLog

    def shutdown(self) -> None:
        """Stop accepting, tell every client (ERROR ``shutting_down``), flush, stop."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down: %d connections", len(self.connections))
        if self.bridge is not None:
            # First, so the federation sees this router's members leave (not suspected) and
            # the connections closing below publish nothing more.
            self.bridge.leave()
        self._accept_scope.cancel()
        deadline = trio.current_time() + self.config.shutdown_timeout
        for conn in list(self.connections):
            if conn.session is not None:
                conn.session.close("shutting_down", "router is shutting down")
            conn.limit(deadline)

    # ------------------------------------------------------------------ notices

    async def _notifier(self) -> None:
        """Deliver membership events a few milliseconds late, in batches (Hub.deliver)."""
        hub = self.hub
        lot = trio.lowlevel.ParkingLot()

        def wake() -> None:
            lot.unpark_all()

        hub.defer = wake
        try:
            while True:
                if not hub.pending:
                    await lot.park()
                # Wait while members keep dropping (a mass disconnect), at most
                # NOTICE_MAX_DELAY, then tell only those still connected.
                start = trio.current_time()
                seen = -1
                while len(hub.pending) != seen and (
                        trio.current_time() - start < NOTICE_MAX_DELAY):
                    seen = len(hub.pending)
                    await trio.sleep(NOTICE_DELAY)
                try:  # failures per target are contained inside; this is the last resort
                    hub.flush_notices(hub.take_pending())
                except Exception as exc:
                    self._task_error("notifier", exc)
        finally:
            hub.defer = None

    # ------------------------------------------------------------------ reaper

    def _task_error(self, task: str, exc: Exception) -> None:
        """An exception in a router-wide task: logged and counted; the task carries on."""
        self.hub.counters.internal_errors += 1
        log.error("internal error in the %s (it carries on)", task, exc_info=exc)

    async def _reaper(self) -> None:
        """Idle connections, expired entries, ended reconnect graces."""
        cfg = self.config
        idle = cfg.idle_timeout
        write_timeout = cfg.write_timeout
        while True:
            try:
                await self._reap(idle, write_timeout)
            except Exception as exc:
                self._task_error("reaper", exc)
                await trio.sleep(until_beat(HOUSEKEEPING))

    async def _reap(self, idle: float, write_timeout: float) -> None:
        """One round of the reaper, then sleep until the next thing to reap."""
        self.hub.sync()  # what the relay thread received counts for the idle timeout
        now = trio.current_time()
        # Nothing due sooner: the next beat of the housekeeping grid (core/cadence.py), with
        # the router's other chores.
        wake = now + until_beat(HOUSEKEEPING)
        for conn in list(self.connections):
            s = conn.session
            if s is None or s.outbox.closed:
                continue
            if not s.established:
                if now >= conn.handshake_deadline:
                    self._handshake_expired(conn, s)
                    continue
                wake = min(wake, conn.handshake_deadline)
            if idle > 0:
                if now - s.last_recv >= idle:
                    log.info("closing %r: idle for %.1fs", s, now - s.last_recv)
                    s.close("idle_timeout", f"nothing received for {idle:g}s")
                    continue
                wake = min(wake, s.last_recv + idle)
            ob = s.outbox
            # A stall of a queue kept whatever its age (oldest_first) is counted once.
            if write_timeout > 0 and ob.chunks and ob.stall_noted != ob.last_progress:
                if now - ob.last_progress >= write_timeout:
                    self._write_timeout(s, now)
                else:
                    wake = min(wake, ob.last_progress + write_timeout)
        notices = self.hub.table.expire(now)
        if notices:
            self.hub.deliver(notices)
            for e in {id(n.entry): n.entry for n in notices}.values():
                log.info("%s (%s) left %r: %s", e.name or "-", format_addr(e.addr), e.group,
                         "reconnect grace ended" if e.kind.label == "connection"
                         else "registration expired")
        nd = self.hub.table.next_deadline()
        if nd is not None:
            wake = min(wake, nd)
        await trio.sleep_until(max(wake, now + 0.01))  # (finite: at most the next beat)

    def _write_timeout(self, s: Session, now: float) -> None:
        """NATS' write deadline: data queued for ``s`` and its socket took nothing for
        write_timeout seconds. Its slow-consumer policy applies: ``disconnect`` closes it
        (ERROR slow_consumer); ``drop`` discards what is queued (counted in
        drops{reason="write_timeout"}) and keeps the connection, which the idle timeout
        still covers. A JGroups receiver under ``drop`` (``oldest_first``) keeps its queue:
        the stall is counted and logged, nothing is dropped by time; its queue's byte bound
        drops its oldest frames (JGroupsSession.make_room), the idle timeout closes a peer
        that is gone (docs/operations.md, "A stalled JGroups member")."""
        ob = s.outbox
        counters = self.hub.counters
        counters.write_timeouts += 1
        stalled = now - ob.last_progress
        if ob.oldest_first:
            ob.stall_noted = ob.last_progress
            self._refusals.warning("%r: socket took nothing for %.1fs (write_timeout): its "
                                   "queue is kept (%d bytes, at most outbound_queue_bytes)",
                                   s, stalled, ob.nbytes)
            return
        if ob.policy == "drop":
            # The first chunk may be the tail of a frame whose start is on the wire: it
            # stays, so the stream remains whole.
            dropped = len(ob.chunks) - 1
            if dropped:
                ob.dropped += dropped
                counters.drop("write_timeout", dropped, ob.nbytes - len(ob.chunks[0]))
                ob.nbytes = len(ob.chunks[0])
                del ob.chunks[1:]
            ob.last_progress = now
            self._refusals.warning("%r: socket took nothing for %.1fs (write_timeout): "
                                   "%d queued chunks dropped", s, stalled, dropped)
            return
        counters.slow_consumer_disconnects += 1
        log.warning("closing %r: slow consumer (socket took nothing for %.1fs, "
                    "write_timeout %gs)", s, stalled, self.config.write_timeout)
        ob.close("slow_consumer",
                 s.farewell("slow_consumer", f"nothing written for {stalled:.1f}s "
                            f"(write_timeout {self.config.write_timeout:g}s)"),
                 discard=True)

    def _handshake_expired(self, conn: Connection, session: Session) -> None:
        log.info("closing %r: handshake not done within %.1fs", session,
                 self.config.handshake_timeout)
        session.close("handshake_timeout",
                      f"handshake not done within {self.config.handshake_timeout:g}s")
