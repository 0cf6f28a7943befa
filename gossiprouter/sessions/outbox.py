"""A connection's outbound queue, bounded in bytes and in frames, and what shapes its sends.

:class:`Outbox` is what a session queues routed frames and farewells in, and what the
server's writer (or a direct send) drains; :class:`WriteBatch` holds a dispatcher round's
small sends to one receiver for a single send; :class:`Congestion` pauses the senders of a
receiver above its high-water mark while it still drains. No I/O: the server sets the
callbacks that write.
"""

from __future__ import annotations

from collections.abc import Callable


def _no_bytes() -> bytes:
    return b""


def _nothing() -> None:
    pass


# Bytes one receiver may have held back in a WriteBatch before they are written at once,
# before the end of the round: the batch must not grow a healthy receiver's queue towards its
# bounds (outbound_queue_bytes) or its high-water mark (which pauses senders).
BATCH_HOLD_BYTES = 64 * 1024
# A push this large or larger is never held: a send per push costs little next to its bytes,
# and under flood load (runs of many frames per push) holding delays the receivers and
# copies the runs into joins: fan-out flood delivered 10-30 % less with 256 KiB here.
BATCH_MAX_PUSH = 16 * 1024
# What one direct send writes at most; more is left to the writer task, in order.
DIRECT_BATCH = 1 << 20
# Outbox.shed frees 1/SHED_SLACK of a full queue's bounds beyond what the new chunk needs, so
# that a stalled receiver's full queue costs one move of its chunk list per that many pushes,
# not one per push (45 us a push with 100,000 chunks queued).
SHED_SLACK = 64


class Reply(bytes):
    """A queued chunk that :meth:`Outbox.shed` never drops: a JGroups 2.12 reply, which its
    client tells from other objects only by its place in the stream."""

    __slots__ = ()


class Outbox:
    """A connection's outbound queue, bounded in bytes and in frames.

    ``push`` never blocks: fan-out must never wait for one receiver. When a
    frame would overflow the queue, the policy decides: ``drop`` drops it for
    this receiver and counts it; ``disconnect`` discards the queue, queues the
    session's farewell (e.g. ERROR ``slow_consumer``) and asks for the
    connection to be closed. A JGroups session under ``drop`` sets ``oldest_first``:
    it makes room with :meth:`shed` (the oldest whole chunks go) and keeps its queue
    however long its socket takes nothing (docs/operations.md, "A stalled JGroups member").
    """

    __slots__ = (
        "batch",
        "busy",
        "chunks",
        "close_reason",
        "closed",
        "congestion",
        "direct",
        "dropped",
        "flagged",
        "held",
        "hwm",
        "last_progress",
        "max_bytes",
        "max_frames",
        "nbytes",
        "oldest_first",
        "on_close",
        "policy",
        "reclaim",
        "stall_noted",
        "unfinished",
        "wake",
    )

    def __init__(
        self, max_bytes: int, max_frames: int, policy: str, congestion: Congestion | None = None,
        batch: WriteBatch | None = None,
    ) -> None:
        self.chunks: list[bytes] = []
        self.nbytes = 0
        self.max_bytes = max_bytes
        self.max_frames = max_frames
        # Above this many queued bytes the receiver is congested: whoever
        # pushes to it is briefly paused (see Congestion).
        self.hwm = max_bytes // 4
        self.policy = policy
        self.dropped = 0
        self.closed = False
        self.close_reason = ""
        self.congestion = congestion or Congestion()
        self.flagged = False
        self.last_progress = 0.0
        # Over its bounds, drop the oldest whole chunks (shed) rather than the new one, and
        # drop nothing by time (write_timeout): JGroups sessions under policy drop.
        self.oldest_first = False
        # The last_progress of a stall already counted as a write timeout (the reaper counts
        # each stall of an oldest_first queue once, and does not wake for it again).
        self.stall_noted = -1.0
        # Set by the server: wake the writer / bound the final flush / send
        # without blocking (None when not possible, e.g. TLS); busy while the
        # writer is sending.
        self.direct: Callable[[bytes], int] | None = None
        self.busy = False
        self.wake: Callable[[], None] = _nothing
        self.on_close: Callable[[], None] = _nothing
        # While batch is open (a dispatcher round), a frame for an idle receiver is held in
        # chunks (held: this outbox is on the batch's list) and written when the round ends.
        self.batch = batch or WriteBatch()
        self.held = False
        # Set by the compiled fast path while it writes this connection (server.fastpath):
        # takes back the bytes its thread holds for the socket, which go before anything queued
        # here, and stops its writes.
        self.reclaim: Callable[[], bytes] = _no_bytes
        # chunks[0] holds the rest of a frame whose start is on the wire (a partial send, or
        # what the relay thread had not sent): it goes out before anything else, even the
        # farewell of a close that discards the queue.
        self.unfinished = False

    def push(self, data: bytes) -> bool:
        """Queue ``data``; False if it was not queued (dropped, or closing).

        When the queue is empty and the writer idle, the bytes are first
        offered to ``direct`` (a non-blocking send set by the server): most
        of the time the socket takes them all and no writer task needs to
        wake up, which is most of a light-loaded router's cost per message.
        While a :class:`WriteBatch` is open the send is held until it closes, so that what
        one round routes to this receiver goes out in one send.
        """
        if self.closed:
            return False
        chunks = self.chunks
        if not chunks and self.direct is not None and not self.busy:
            batch = self.batch
            if batch.open and len(data) < BATCH_MAX_PUSH:
                chunks.append(data)
                self.nbytes = len(data)
                if not self.held:
                    self.held = True
                    batch.held.append(self)
                return True
            try:
                sent = self.direct(data)
            except OSError:
                sent = 0  # the writer will meet the error and close the connection
            if sent == len(data):
                return True
            if sent:
                # Part of a frame is on the wire: the rest must follow whatever
                # the bounds say, or the stream would be corrupt.
                chunks.append(data[sent:])
                self.unfinished = True
                self.nbytes += len(data) - sent
                self.wake()
                return True
        n = self.nbytes + len(data)
        if self.held:
            # Held for the batch: an idle receiver, where these frames would have been sent
            # at once; the queue's bounds are not its business, only how much is held.
            if n < BATCH_HOLD_BYTES and len(data) < BATCH_MAX_PUSH:
                chunks.append(data)
                self.nbytes = n
                return True
            # Past the hold limit: what is held goes out now, then this push as without
            # a batch (held again if small and the socket took everything). Large pushes are
            # never joined to others: copying them would cost more than the saved send.
            self.held = False
            self.send_queued()
            return self.push(data)
        # An empty queue takes one frame whatever its size: a JGroups frame may be larger than
        # half the queue bound (jgroups_max_frame), and it must not be dropped for every
        # receiver that is merely not idle at that instant.
        if chunks and (n > self.max_bytes or len(chunks) >= self.max_frames):
            return False
        chunks.append(data)
        self.nbytes = n
        if len(chunks) == 1:
            self.wake()
        elif n > self.hwm:
            self.congestion.hit(self)
        return True

    def shed(self, size: int) -> list[bytes] | None:
        """Make room for one more chunk of ``size`` bytes within the bounds by dropping the
        oldest whole queued chunks; the chunks dropped, in order, or None (and nothing
        dropped) when even every chunk that may go would not make room. Never dropped: the
        rest of a frame whose start is on the wire (``chunks[0]`` when ``unfinished``) and
        :class:`Reply` chunks. Called only when :meth:`push` refused ``size`` bytes.

        It drops SHED_SLACK of the bound more than it must (or what is left): removing from
        the front of the list moves the rest, so a full queue of many small frames would
        otherwise cost a move of the whole list per push."""
        chunks = self.chunks
        start = 1 if self.unfinished else 0
        over = self.nbytes + size - self.max_bytes
        extra = len(chunks) + 1 - self.max_frames
        goal = over + self.max_bytes // SHED_SLACK if over > 0 else 0
        goal_chunks = extra + self.max_frames // SHED_SLACK if extra > 0 else 0
        dropped: list[bytes] = []
        kept: list[bytes] = []
        freed = 0
        i = start
        end = len(chunks)
        while (freed < goal or len(dropped) < goal_chunks) and i < end:
            c = chunks[i]
            i += 1
            if type(c) is Reply:
                kept.append(c)
            else:
                dropped.append(c)
                freed += len(c)
        if freed < over or len(dropped) < extra:
            return None
        chunks[start:i] = kept
        self.nbytes -= freed
        return dropped

    def flush(self) -> None:
        """Write what is queued (:meth:`send_queued`), or while a batch is open, the writer
        idle and what is queued small, hold it for the batch's single send (it may get more
        this round)."""
        if (self.batch.open and self.chunks and self.nbytes < BATCH_MAX_PUSH and not self.busy
                and self.direct is not None and not self.closed):
            if not self.held:
                self.held = True
                self.batch.held.append(self)
            return
        self.send_queued()

    def send_queued(self) -> None:
        """Write what is queued with one direct send when the writer is idle (what the socket
        does not take, and anything beyond DIRECT_BATCH, goes to the writer, in order);
        otherwise wake the writer. Nothing to do when closed (close() woke the writer)."""
        chunks = self.chunks
        if self.closed or not chunks:
            return
        direct = self.direct
        if self.busy or direct is None:  # the writer is sending, or must (TLS)
            self.wake()
            return
        if self.nbytes > DIRECT_BATCH:
            self.wake()
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.nbytes = 0
        unfinished, self.unfinished = self.unfinished, False
        try:
            sent = direct(data)
        except OSError:
            sent = 0  # the writer will meet the error and close the connection
        if sent < len(data):
            self.chunks.append(data[sent:] if sent else data)
            self.nbytes += len(data) - sent  # after what a claim put first, if any
            if (sent or unfinished) and len(self.chunks) == 1:
                self.unfinished = True
            self.wake()

    def claim(self) -> None:
        """The writer task is about to own this socket's byte stream: the compiled fast path's
        thread stops writing it (``reclaim``), and the bytes it had not sent yet (possibly the
        rest of a frame already started on the wire) go before everything queued here. Called
        when the writer is woken, before anything else may run: from then on frames for this
        connection queue behind what the writer has, in order (docs/architecture.md,
        "One writer per stream")."""
        pending = self.reclaim()
        if pending:
            self.chunks.insert(0, pending)
            self.nbytes += len(pending)
            self.unfinished = True  # it may start with the rest of a frame the thread began

    def take(self, limit: int = 1 << 20) -> list[bytes]:
        """The oldest queued chunks, about ``limit`` bytes (at least one chunk), in order."""
        chunks = self.chunks
        self.unfinished = False  # the writer sends what it takes whole
        if self.nbytes <= limit:
            self.chunks = []
            self.nbytes = 0
            return chunks
        size = 0
        i = 0
        for i, c in enumerate(chunks):  # noqa: B007 - i is used after the loop
            size += len(c)
            if size >= limit:
                break
        out = chunks[: i + 1]
        del chunks[: i + 1]
        self.nbytes -= size
        return out

    def detach(self) -> None:
        """The connection is over: drop what is queued and the server's callbacks.

        The callbacks are closures over the connection and its session, and the session holds
        this outbox: a reference cycle that would keep the session, its receive buffers and
        its queue alive until the cycle collector happens to run.
        """
        self.closed = True
        self.chunks = []
        self.nbytes = 0
        self.direct = None
        self.wake = _nothing
        self.on_close = _nothing
        self.reclaim = _no_bytes

    def close(self, reason: str, farewell: bytes = b"", *, discard: bool = False) -> None:
        """Stop accepting frames; queue ``farewell`` last; ask for the connection to close."""
        if self.closed:
            return
        self.direct = None
        self.claim()
        if discard:
            # Never a farewell inside a frame: the rest of one already started stays first.
            self.chunks = self.chunks[:1] if self.unfinished else []
            self.nbytes = sum(map(len, self.chunks))
        if farewell:
            self.chunks.append(farewell)
            self.nbytes += len(farewell)
        self.closed = True
        self.close_reason = reason
        self.wake()
        self.on_close()


class WriteBatch:
    """Coalesces a dispatcher round's sends per receiver (after NATS's ``flushClients``).

    Under medium load one wake-up of the dispatcher may route several messages to the same
    receiver (several senders into one group): with a direct send each, that is a system call
    (and a wake-up of the receiving client) per message. While the batch is open, a small push
    (under BATCH_MAX_PUSH) to an idle receiver is queued instead and the receiver put on the
    batch's list; :meth:`close` writes each listed receiver's frames in one send, in the order
    they were pushed (earlier if its held bytes would reach BATCH_HOLD_BYTES). A receiver that
    had a queue already (its writer busy) is not held: its frames queue behind the others as
    without the batch, under the queue's bounds and slow-consumer policy. Opened by the
    dispatcher when the option ``coalesce_writes`` is on (docs/performance.md, Light load).
    """

    __slots__ = ("held", "merged", "open")

    def __init__(self) -> None:
        self.open = False
        self.held: list[Outbox] = []
        # For tests and profiles: pushes that shared a send with an earlier one of the round.
        self.merged = 0

    def close(self) -> None:
        """End of the round: write what each held receiver got, one send each."""
        self.open = False
        held = self.held
        if not held:
            return
        self.held = []
        for ob in held:
            if ob.held:
                ob.held = False
                if ob.chunks and not ob.closed:
                    self.merged += len(ob.chunks) - 1
                    ob.send_queued()


class Congestion:
    """Back-pressure without head-of-line blocking (after the NATS server's stall).

    When a push leaves a receiver's queue above its high-water mark, the
    connection whose input caused it is paused for a few milliseconds before
    its next read, as long as that receiver is still draining (its writer
    made progress recently). A healthy but slower receiver thus slows the
    senders to its pace instead of being cut off, while a receiver that has
    stopped reading stops slowing anyone and is cut off (or has its frames
    dropped) when its queue is full.
    """

    __slots__ = ("outboxes", "pending")

    def __init__(self) -> None:
        self.pending = False
        self.outboxes: list[Outbox] = []

    def hit(self, ob: Outbox) -> None:
        self.pending = True
        if not ob.flagged:
            ob.flagged = True
            self.outboxes.append(ob)

    def draining(self, now: float, stalled_after: float) -> bool:
        """True while a flagged receiver is above its high-water mark and still reading."""
        keep = []
        for ob in self.outboxes:
            if ob.nbytes > ob.hwm and not ob.closed:
                keep.append(ob)
            else:
                ob.flagged = False
        self.outboxes = keep
        return any(now - ob.last_progress < stalled_after for ob in keep)
