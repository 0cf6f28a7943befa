"""The router-wide counters every session and the server add to, and the operations layer
exports as metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from gossiprouter.protocol.errors import ERROR_CODES

# Outbox close reasons that record the peer's end, not a decision of the router: EOF, a
# socket that failed under the writer, the JGroups goodbyes (2.12 CLOSE, 5.x close marker).
# Every other reason is the router's and is counted (Counters.closed).
PEER_CLOSES = frozenset({"eof", "write failed", "close", "close_marker"})


@dataclass
class Counters:
    """Router-wide counters (exported as metrics by the operations layer)."""

    frames_in: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    # Counted by the server's writer per socket write (not per frame): every frame type.
    bytes_out: int = 0
    writes: int = 0
    routed: int = 0
    delivered: int = 0
    # Of ``routed``: frames the compiled fast path's thread relayed without Python.
    fast_relayed: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    # Bytes of those frames, by reason, where the dropper knows them (a receiver's queue:
    # slow_consumer, write_timeout): what a stalled receiver cost.
    dropped_bytes: dict[str, int] = field(default_factory=dict)
    slow_consumer_disconnects: int = 0
    protocol_errors: int = 0
    # Unexpected exceptions contained by the server (see the error policy in server.py).
    internal_errors: int = 0
    # Membership events queued for clients (one per event per receiving connection).
    events_out: int = 0
    # Bytes reserved right now by incomplete frames across all connections (a gauge; see
    # Session._reserve): bounded by Config.partial_frames_budget beyond the small frames.
    partial_bytes: int = 0
    # What the compiled fast path's thread holds (set by FastPath.collect; in the gauges
    # beside the above and the outboxes' bytes): the starts of frames cut between reads, and
    # bytes receivers' sockets did not take (until their outboxes take them). Bounded by
    # Config.fast_path_max_bytes together.
    fast_partial_bytes: int = 0
    fast_pending_bytes: int = 0
    # Its connections read by threads of their own now (Config.fast_path_threads at most).
    fast_threads: int = 0
    # Fairness (issue 12): turns a reader ended early to let others run (its share of the
    # loop used up), turns it waited because its connection's control budget was spent, and
    # connections closed for staying over that budget (ERROR rate_limited).
    turns_cut: int = 0
    throttled_turns: int = 0
    rate_limited: int = 0
    # Receivers whose socket took nothing for write_timeout with data queued.
    write_timeouts: int = 0
    # Connections the router closed, by reason, and requests it refused (the connection
    # kept), by code: keys are ERROR_CODES or "other" (see closed / refused).
    closes: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1, nbytes: int = 0) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n
        if nbytes:
            self.dropped_bytes[reason] = self.dropped_bytes.get(reason, 0) + nbytes

    def closed(self, reason: str) -> None:
        """A connection ended with ``reason`` (its outbox's close reason, or the server's for
        one closed before it had a session). Called once per connection, by the server when
        the connection is over; the peer's own ends (PEER_CLOSES, or no reason) are not
        counted."""
        if reason and reason not in PEER_CLOSES:
            key = reason if reason in ERROR_CODES else "other"
            self.closes[key] = self.closes.get(key, 0) + 1

    def refused(self, code: str) -> None:
        """A request refused with ``code``, the connection kept (native ERROR, JGroups
        registration refused)."""
        key = code if code in ERROR_CODES else "other"
        self.refusals[key] = self.refusals.get(key, 0) + 1
