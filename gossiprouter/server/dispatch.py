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
  has waited on trio again, which is a checkpoint, so other tasks run between rounds;
* with a :class:`Batch` (the hub's WriteBatch, option ``coalesce_writes``), a round with more
  than one ready connection holds its direct sends and writes what it routed to each receiver
  in one send when it ends (NATS's ``flushClients``): several senders into one group share a
  system call per receiver. A round with one ready connection sends as it routes.

What a received chunk does to its session is not decided here: the dispatcher hands every
chunk to the connection's ``Feeder`` (server.listener), the same object the connection's
own reader task uses, which counts it, slices it, flushes the session's replies to itself,
honours the session's pause and control budget, contains its exceptions and checks the
handshake deadline. The Feeder never waits; when a wait is due (a spent turn or budget,
back-pressure) it returns a step other than READ, and the dispatcher hands the connection back
to its own task, parked in :meth:`Dispatcher.serve`: that task does the wait (``settle``),
lets the Feeder finish the chunk, and registers the connection again. End of stream, a socket
error or a closed session end ``serve`` (the server's normal close path runs); an exception
that escapes the Feeder is raised in the connection's task, never in the dispatcher's.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

# Ready connections handled per round at most; the rest are reported again next round.
MAX_EVENTS = 1024

# Steps returned by Feed.feed: READ, the chunk is done (read the next one); END, the reader is
# over. Any other step is a wait the connection's task does (gossiprouter.server.feeder.Feeder).
READ = 0
END = 1


class Feed(Protocol):
    """What the dispatcher needs of a connection (gossiprouter.server.feeder.Feeder)."""

    @property
    def closed(self) -> bool: ...

    def feed(self, data: bytes) -> int: ...

    def eof(self) -> None: ...


F = TypeVar("F", bound=Feed)


class Batch(Protocol):
    """Held sends, written when a round ends (gossiprouter.sessions.outbox.WriteBatch)."""

    open: bool

    def close(self) -> None: ...


current_task = trio.lowlevel.current_task
# Where a reader waits (with a Parked's task set): Parked.park without its frame.
wait_in = trio.lowlevel.wait_task_rescheduled


class Parked:
    """Where one task waits for its connection's turn: a ParkingLot for exactly one task.

    Every idle connection has a task parked (its reader, here or in the fast path), so this is
    per-connection memory: a ParkingLot (an attrs object and its OrderedDict) and the abort
    closure it makes per wait cost about 700 bytes, this about 130 (issue 24). As with
    ParkingLot, ``unpark`` with nobody parked does nothing. The readers wait with
    :func:`wait_in` rather than ``await lot.park()``: one coroutine frame less per idle
    connection."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None

    async def park(self) -> None:
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self.abort)

    def abort(self, _: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def unpark(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)


class _Slot:
    """One registered connection."""

    __slots__ = ("fd", "feeder", "lot", "outcome", "recv_into")

    def __init__(self, fd: int, sock: socket.socket, feeder: Feed) -> None:
        self.fd = fd
        self.recv_into = sock.recv_into
        self.feeder = feeder
        self.lot = Parked()
        self.outcome: int | BaseException = READ


class Dispatcher:
    """Reads every registered connection from one task (:meth:`run`)."""

    def __init__(self, recv_size: int, batch: Batch | None = None) -> None:
        self.recv_size = recv_size
        # Opened around each round: what the round routes to one receiver goes out in one
        # send when the round ends (None: a direct send per push).
        self.batch = batch
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
        # Connections handed back to their task for a wait (a spent turn or control budget,
        # back-pressure): the Feeder's steps other than READ and END.
        self.handbacks = 0

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
                self._handback(slot, END)
            epoll.close()

    async def serve(self, sock: socket.socket, feeder: F,
                    settle: Callable[[F, int], Awaitable[bool]]) -> None:
        """Read ``sock`` for ``feeder`` until the stream ends or the session closes.

        Called in the connection's task in place of its reader loop; returns when the reader
        would have returned (after ``feeder.eof()`` on EOF). A step other than READ or END
        is passed to ``settle`` here, in the connection's task, which waits and finishes
        the chunk (False: the reader is over); an exception that escaped the feeder is
        raised here.
        """
        if not self._running:
            raise RuntimeError("the dispatcher task is not running")
        fd = sock.fileno()
        slot = _Slot(fd, sock, feeder)
        lot = slot.lot
        while not feeder.closed:
            slot.outcome = READ
            self._slots[fd] = slot
            self._epoll.register(fd, select.EPOLLIN)  # level-triggered, until handed back
            lot.task = current_task()
            try:
                await wait_in(lot.abort)
            finally:
                if self._slots.get(fd) is slot:  # cancelled while registered
                    self._unregister(slot)
            outcome = slot.outcome
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome == END or not await settle(feeder, outcome) or not self._running:
                return

    # ------------------------------------------------------------------ inside a round

    def _round(self, events: list[tuple[int, int]]) -> None:
        batch = self.batch
        if batch is None or len(events) == 1:
            # One ready connection (most rounds under light load): its chunk is usually one
            # message, so holding its sends would only delay them.
            self._read(events)
            return
        batch.open = True
        try:
            self._read(events)
        finally:
            batch.close()

    def _read(self, events: list[tuple[int, int]]) -> None:
        slots = self._slots
        view = self._view
        for fd, _ in events:
            slot = slots.get(fd)
            if slot is None:  # handed back earlier in this round
                continue
            feeder = slot.feeder
            if feeder.closed:  # e.g. closed by another connection's frames this round
                self._handback(slot, END)
                continue
            try:
                n = slot.recv_into(view)
            except BlockingIOError:
                continue
            except OSError:
                # Reset or similar: as trio's BrokenResourceError ends a reader, silently.
                self._handback(slot, END)
                continue
            self.reads += 1
            try:
                if n:
                    step = feeder.feed(bytes(view[:n]))
                else:
                    feeder.eof()
                    step = END
            except Exception as e:  # raised in the connection's task, not here
                self._handback(slot, e)
                continue
            if step != READ:
                if step != END:
                    self.handbacks += 1
                self._handback(slot, step)

    def _unregister(self, slot: _Slot) -> None:
        del self._slots[slot.fd]
        with contextlib.suppress(OSError, ValueError):  # fd already closed, or the epoll is
            self._epoll.unregister(slot.fd)

    def _handback(self, slot: _Slot, outcome: int | BaseException) -> None:
        self._unregister(slot)
        slot.outcome = outcome
        slot.lot.unpark()
