"""The light-load read path: one dispatcher task reads every established plain-TCP connection.

Under light load each message arrives alone, and with one reader task per connection it pays
for a trio task switch, trio's ``receive_some`` (a ``recv`` that fails with EAGAIN, an
exception, an ``epoll_ctl`` to re-arm the one-shot registration, the wait, the ``recv`` again)
and the scheduler's bookkeeping. Here instead:

* the :class:`Dispatcher` owns an inner, level-triggered ``select.epoll``; trio waits on that
  epoll's own fd (``trio.lowlevel.wait_readable``), so trio re-arms one registration per
  wake-up, not one per message;
* a connection past its handshake (plain TCP only: TLS, the protocol sniffing and the first
  bytes stay on the connection's trio task) is registered once, by :meth:`Dispatcher.serve`;
* each wake-up is one *round* over every ready connection: one non-blocking ``recv`` of at most
  ``recv_size`` bytes (the fairness slice: what a connection has beyond it waits for the next
  round, level-triggered epoll reports it again), ``session.on_data`` and, through the outboxes,
  the direct sends as with the reader tasks. The next round starts only after the dispatcher
  has waited on trio again, which is a checkpoint, so other tasks run between rounds.

The connection's own task stays parked in :meth:`Dispatcher.serve` and takes the connection
back for everything that is not a plain read: end of stream or a socket error (it returns, and
the server's normal close path runs), a closed session, an exception from the session (raised
in the connection's task, where the server contains it as for a reader), and back-pressure (the
task pauses via the server's throttle while unregistered, then registers again).
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Awaitable, Callable

import trio

from gossiprouter.sessions.base import Hub, Session

# Ready connections handled per round at most; the rest are reported again next round.
MAX_EVENTS = 1024


class _Handback:
    """Why a connection's task got its connection back (besides an exception)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


DONE = _Handback("done")  # EOF, socket error or closed session: the reader is over
THROTTLE = _Handback("throttle")  # a receiver it fed is congested: pause, then come back


class _Slot:
    """One registered connection."""

    __slots__ = ("fd", "lot", "outcome", "recv_into", "session")

    def __init__(self, fd: int, sock: socket.socket, session: Session) -> None:
        self.fd = fd
        self.recv_into = sock.recv_into
        self.session = session
        self.lot = trio.lowlevel.ParkingLot()
        self.outcome: _Handback | BaseException | None = None


class Dispatcher:
    """Reads every registered connection from one task (:meth:`run`)."""

    def __init__(self, hub: Hub, recv_size: int,
                 throttle: Callable[[], Awaitable[None]]) -> None:
        self.hub = hub
        self.recv_size = recv_size
        self._throttle = throttle
        self._epoll = select.epoll()
        self._slots: dict[int, _Slot] = {}
        # One receive buffer for every connection, each read copied out at its own size.
        # A plain recv(recv_size) allocates recv_size bytes per call and shrinks them: above
        # glibc's mmap threshold that is an mmap, an mremap and an munmap per message (the
        # trio readers escape it only because their failed recv raises the threshold).
        self._buf = bytearray(recv_size)
        self._view = memoryview(self._buf)
        self._running = False
        # For tests and profiles: wake-ups of the dispatcher task and recv calls it made.
        self.wakeups = 0
        self.reads = 0

    def __len__(self) -> int:
        return len(self._slots)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dispatcher task: ``await nursery.start(dispatcher.run)`` in the server's nursery."""
        epoll = self._epoll
        fd = epoll.fileno()
        poll = epoll.poll
        self._running = True
        task_status.started()
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                events = poll(0, MAX_EVENTS)
                if events:
                    self.wakeups += 1
                    self._round(events)
        finally:
            # Cancelled (the server stops) or broken: no connection may stay parked on a
            # dispatcher that no longer reads it.
            self._running = False
            for slot in list(self._slots.values()):
                self._handback(slot, DONE)
            epoll.close()

    async def serve(self, sock: socket.socket, session: Session) -> None:
        """Read ``sock`` for ``session`` until the stream ends or the session closes.

        Called in the connection's task in place of its reader loop; returns when the reader
        would have returned (after ``session.on_eof()`` on EOF), and raises what
        ``session.on_data`` raised.
        """
        if not self._running:
            raise RuntimeError("the dispatcher task is not running")
        if session.outbox.closed:  # e.g. refused at the connection limit: nothing to read
            return
        fd = sock.fileno()
        slot = _Slot(fd, sock, session)
        while True:
            slot.outcome = None
            self._slots[fd] = slot
            self._epoll.register(fd, select.EPOLLIN)  # level-triggered, until handed back
            try:
                await slot.lot.park()
            finally:
                if self._slots.get(fd) is slot:  # cancelled while registered
                    self._unregister(slot)
            outcome = slot.outcome
            if outcome is THROTTLE:
                await self._throttle()
                if self._running:
                    continue
                return
            if isinstance(outcome, BaseException):
                raise outcome
            return

    # ------------------------------------------------------------------ inside a round

    def _round(self, events: list[tuple[int, int]]) -> None:
        hub = self.hub
        counters = hub.counters
        congestion = hub.congestion
        slots = self._slots
        view = self._view
        now = trio.current_time()
        for fd, _ in events:
            slot = slots.get(fd)
            if slot is None:  # handed back earlier in this round
                continue
            session = slot.session
            if session.outbox.closed:
                self._handback(slot, DONE)
                continue
            try:
                n = slot.recv_into(view)
            except BlockingIOError:
                continue
            except OSError:
                # Reset or similar: as trio's BrokenResourceError ends a reader, silently.
                self._handback(slot, DONE)
                continue
            self.reads += 1
            if not n:
                try:
                    session.on_eof()
                except Exception as e:  # raised in the connection's task
                    self._handback(slot, e)
                    continue
                self._handback(slot, DONE)
                continue
            counters.bytes_in += n
            try:
                session.on_data(bytes(view[:n]), now)
            except Exception as e:  # raised in the connection's task
                self._handback(slot, e)
                continue
            if session.outbox.closed:
                self._handback(slot, DONE)
            elif congestion.pending:
                congestion.pending = False
                self._handback(slot, THROTTLE)

    def _unregister(self, slot: _Slot) -> None:
        del self._slots[slot.fd]
        with contextlib.suppress(OSError, ValueError):  # fd already closed, or the epoll is
            self._epoll.unregister(slot.fd)

    def _handback(self, slot: _Slot, outcome: _Handback | BaseException) -> None:
        self._unregister(slot)
        slot.outcome = outcome
        slot.lot.unpark_all()
