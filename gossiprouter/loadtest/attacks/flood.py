"""``ping-flood`` and ``heartbeat-flood``: keep-alives at a byte rate, the answers read."""

from __future__ import annotations

import trio

from gossiprouter.loadtest.attacks.base import Attack, native_hello
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire

__all__ = ["Flood"]


class Flood(Attack):
    """PINGs (native) or HEARTBEATs (5.x) at bytes_per_s, in writes of ``burst`` bytes."""

    async def run(self) -> None:
        if self.spec.kind == "ping-flood":
            head, frame = native_hello(), wire.encode(wire.Ping(1))
        else:
            head, frame = b"", j5.heartbeat()
        chunk = frame * max(1, self.spec["burst"] // len(frame))
        rate = self.spec["bytes_per_s"]

        async def body(s: trio.SocketStream) -> None:
            if head:
                await self.send(s, head)
            start, sent = trio.current_time(), 0
            while True:
                if rate != "max":
                    await trio.sleep_until(start + sent / rate)
                await self.send(s, chunk)
                sent += len(chunk)

        async with trio.open_nursery() as n:
            for _ in range(self.spec["connections"]):
                n.start_soon(self.session, body)
