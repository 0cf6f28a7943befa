"""``huge-names``: members that register with names of ``name_bytes`` and ask for the group.

With ``raw_nul``, JGroups names of raw NUL bytes, which the router writes back twice as long.
"""

from __future__ import annotations

import trio

from gossiprouter.loadtest.attacks.base import Attack, native_hello
from gossiprouter.loadtest.attacks.spec import MiB
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress

__all__ = ["HugeNames"]


class HugeNames(Attack):
    def frames(self, i: int) -> tuple[bytes, bytes]:
        """Member ``i``'s registration (after the native HELLO) and its member query."""
        proto, group, nbytes = self.spec["protocol"], self.spec["group"], self.spec["name_bytes"]
        if proto == "native":
            reg = native_hello() + wire.encode(wire.Connect(
                1, group, b"hostile-%d" % i, chr(0x41 + i % 26) * nbytes, ()))
            return reg, wire.encode(wire.GetMembers(2, group))
        # The codec writes NUL as C0 80; a placeholder swapped for raw 00 bytes afterwards
        # gives a name the router reads as NULs and must write back twice as long.
        nul = self.spec["raw_nul"]
        name = "\x1a" * nbytes if nul else chr(0x41 + i % 26) * nbytes
        if proto == "jgroups2":
            addr = JAddress.from_uuid(0x686F7374 + i, 0x696C65 + i, version=V2)
            reg, query = j2.connect(group, addr, name, []), j2.gossip_get(group)
        else:
            addr = JAddress.from_uuid(0x686F7374 + i, 0x696C65 + i, version=V5)
            reg = j5.register(group, addr, name, None)
            query = j5.get_members(group) + j5.get_members(None)
        if nul:
            reg = reg.replace(b"\x1a" * nbytes, bytes(nbytes))
        return reg, query

    async def run(self) -> None:
        proto = self.spec["protocol"]
        dec = wire.Decoder(max_frame=64 * MiB)

        def count_refusals(data: bytes) -> None:
            # 2.12 answers a refused CONNECT with the OP_FAIL status byte, native with ERROR
            # (5.x has no answer to REGISTER).
            if proto == "jgroups2" and data[:1] == bytes([j2.OP_FAIL]):
                self.c.refused += 1
            elif proto == "native":
                dec.feed(data)
                self.c.refused += sum(isinstance(f, wire.Error) for f in dec.frames())

        async def member(i: int) -> None:
            reg, query = self.frames(i)

            async def body(s: trio.SocketStream) -> None:
                await self.send(s, reg)
                while True:
                    await trio.sleep(self.spec["query_interval"])
                    await self.send(s, query)

            await self.session(body, count_refusals)

        async with trio.open_nursery() as n:
            for i in range(self.spec["members"]):
                n.start_soon(member, i)
