"""``partial-frames``: connections that start a frame of ``size`` bytes and never finish it.

Each holds all of the frame but its last byte for ``hold`` seconds, then closes and starts
again: what the router's read budget and frame limits must bear without a stall.
"""

from __future__ import annotations

import struct

import trio

from gossiprouter.loadtest.attacks.base import Attack, native_hello
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5

__all__ = ["PartialFrames"]


class PartialFrames(Attack):
    async def run(self) -> None:
        size = self.spec["size"]
        protos = (["native", "jgroups2", "jgroups5"] if self.spec["protocol"] == "mixed"
                  else [self.spec["protocol"]])
        # Each: the start of one frame of exactly ``size`` bytes (what max_frame is checked
        # against: the body after the length for native and 5.x, the GossipData for 2.12),
        # all but its last byte.
        over2 = len(j2.message("hostile", None, b""))
        over5 = len(j5.message("hostile", None, None, b"")) - 4
        starts = {
            "native": native_hello()[:4] + struct.pack(">I", size) + bytes(size - 1),
            "jgroups2": j2.message("hostile", None, bytes(max(0, size - over2)))[:-1],
            "jgroups5": j5.message("hostile", None, None, bytes(max(0, size - over5)))[:-1],
        }
        piece = 1 << 20

        async def one(proto: str) -> None:
            async def body(s: trio.SocketStream) -> None:
                data = starts[proto]
                for i in range(0, len(data), piece):  # counted as it goes
                    await self.send(s, data[i:i + piece])
                await trio.sleep(self.spec["hold"])
                raise _Hold

            while True:
                try:
                    await self.session(body)
                except* _Hold:
                    pass  # held long enough: close it ourselves and start again

        async with trio.open_nursery() as n:
            for i in range(self.spec["connections"]):
                n.start_soon(one, protos[i % len(protos)])


class _Hold(Exception):
    """A partial-frame connection was held for its time: close it and open another."""
