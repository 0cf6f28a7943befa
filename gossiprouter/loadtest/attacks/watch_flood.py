"""``watch-flood``: one native connection WATCHing ``groups`` distinct groups, paced."""

from __future__ import annotations

import trio

from gossiprouter.loadtest.attacks.base import Attack, native_hello
from gossiprouter.loadtest.attacks.spec import MiB
from gossiprouter.protocol import native as wire

__all__ = ["WatchFlood"]


class WatchFlood(Attack):
    async def run(self) -> None:
        rate, groups = self.spec["watches_per_s"], self.spec["groups"]
        dec = wire.Decoder(max_frame=64 * MiB)

        def answers(data: bytes) -> None:
            dec.feed(data)
            for f in dec.frames():
                if isinstance(f, wire.Error):
                    self.c.refused += 1

        async def body(s: trio.SocketStream) -> None:
            await self.send(s, native_hello())
            start, batch = trio.current_time(), 1000
            for first in range(0, groups, batch):
                if rate != "max":
                    await trio.sleep_until(start + first / rate)
                await self.send(s, b"".join(
                    wire.encode(wire.Watch(i + 1, f"watched-{i}"))
                    for i in range(first, min(groups, first + batch))))

        await self.session(body, answers)
