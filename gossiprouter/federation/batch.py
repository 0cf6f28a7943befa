"""Routed messages batched per destination router (issue 30; docs/federation.md, "Routed
frames: batches, QoS and flow control").

Interleaved traffic (each frame to its own destination, as JGroups sends it) made one MQTT
publish per frame, and the publish, the broker and the receiving router's callback cost far
more than the frame. So what one read, or one scheduler tick, routes to router R leaves as
one broker message: :class:`Batches` collects the route payloads
(:func:`gossiprouter.federation.codec.encode_route`, one per run of frames, unchanged) per
destination router until the I/O side (:mod:`gossiprouter.federation.peers`) takes them at
the end of the tick, each batch within ``limit`` bytes (the broker's Maximum Packet Size,
less room for the topic and the properties; and the bridge's queue bound).

The envelope is the payloads, each behind its length (4 bytes, big-endian); the receiver
hands each one to the routing state as if it had come alone, so every check of a routed
message (its header, its frames, its sender) is made per payload. A batch of one payload is
sent as that payload alone, as before batches: a message with the batch property is an
envelope, one without it a single route payload.

Sans-IO: payloads in, messages out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# The user property that marks an envelope (its value: the envelope's format).
BATCH_PROPERTY = "gossiprouter-batch"
FORMAT = "1"
# The largest envelope when the broker announces no Maximum Packet Size (bytes).
DEFAULT_LIMIT = 256 * 1024
# Room left in the broker's Maximum Packet Size for the topic, the packet's header and the
# properties (sender, send time, batch mark, signature).
ROOM = 1024
_LEN = struct.Struct(">I")


@dataclass
class BatchStats:
    """Broker messages of routed frames, and the route payloads they carried."""

    messages_out: int = 0
    payloads_out: int = 0
    messages_in: int = 0
    payloads_in: int = 0


class Batches:
    """Route payloads waiting for the end of the tick, per destination router."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.stats = BatchStats()
        self._pending: dict[str, list[bytes]] = {}
        self.bytes = 0  # bytes waiting here, in every batch

    def set_limit(self, max_packet: int | None, queue_limit: int) -> None:
        """The envelope's bound from the broker's Maximum Packet Size (None: not announced)
        and the bridge's queue bound (bridge_queue_bytes)."""
        limit = DEFAULT_LIMIT if max_packet is None else max_packet - ROOM
        self.limit = max(1, min(limit, queue_limit))

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, origin: str, payload: bytes) -> None:
        """``payload`` for router ``origin``, after those queued before it."""
        self._pending.setdefault(origin, []).append(payload)
        self.bytes += len(payload) + _LEN.size

    def clear(self) -> dict[str, int]:
        """Drop what waits (the broker session ended): the payloads dropped, per router."""
        n = {origin: len(payloads) for origin, payloads in self._pending.items()}
        self._pending.clear()
        self.bytes = 0
        return n

    def take(self) -> list[tuple[str, bytes, int]]:
        """Every waiting payload as messages: (router, message, payloads in it), in the order
        they were added per router. A message is one payload alone (no envelope) or an
        envelope of several within ``limit``; a payload larger than ``limit`` goes alone."""
        out: list[tuple[str, bytes, int]] = []
        for origin, payloads in self._pending.items():
            run: list[bytes] = []
            size = 0
            for p in payloads:
                n = len(p) + _LEN.size
                if run and size + n > self.limit:
                    out.append((origin, *_message(run)))
                    run, size = [], 0
                run.append(p)
                size += n
            out.append((origin, *_message(run)))
        self._pending.clear()
        self.bytes = 0
        self.stats.messages_out += len(out)
        self.stats.payloads_out += sum(n for _, _, n in out)
        return out


def _message(run: list[bytes]) -> tuple[bytes, int]:
    if len(run) == 1:
        return run[0], 1
    return b"".join(_LEN.pack(len(p)) + p for p in run), len(run)


def decode_batch(message: bytes) -> list[bytes]:
    """The route payloads of an envelope (ValueError: not whole payloads, or fewer than 2)."""
    out: list[bytes] = []
    pos, end = 0, len(message)
    view = memoryview(message)
    while pos < end:
        if end - pos < _LEN.size:
            raise ValueError("a cut length in a batch")
        (n,) = _LEN.unpack_from(message, pos)
        pos += _LEN.size
        if n == 0 or n > end - pos:
            raise ValueError(f"a payload of {n} bytes with {end - pos} left in a batch")
        out.append(bytes(view[pos:pos + n]))
        pos += n
    if len(out) < 2:
        raise ValueError("a batch of fewer than 2 payloads")
    return out
