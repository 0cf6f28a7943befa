"""Routers' Federation objects wired to each other by hand, for tests without a broker
(tests/test_federation*.py): every record, presence and routed message is a call, delivered
at once and in call order (:class:`Net`)."""

from __future__ import annotations

from collections.abc import Callable

from gossiprouter.core.config import Config
from gossiprouter.federation.codec import encode_chunk, pack_member
from gossiprouter.federation.state import Federation
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from tests.carriers import Named

G = "g"


def F(sender: bytes, payload: bytes, dest: bytes | None = None) -> bytes:
    """A native ROUTE frame of group G: what routed messages carry (they are checked)."""
    return wire.encode_route(G, dest, sender, payload)


class Net:
    """Routers whose federations deliver to each other at once, in call order."""

    def __init__(self, *origins: str) -> None:
        self.feds: dict[str, Federation] = {}
        self.lost: list[str] = []
        for o in origins:
            hub = Hub(Config())
            self.feds[o] = Federation(hub, o, o.upper(), self._sender(o), lambda: None)
        for f in self.feds.values():
            f.begin_sync()
            for other in self.feds:
                f.on_presence(other, f.presence() if other != f.origin else b"")
            f.end_sync()

    def _sender(self, origin: str) -> Callable[[str, bytes], bool]:
        def send(to: str, payload: bytes) -> bool:
            if to in self.lost or origin in self.lost:
                return False
            self.feds[to].on_route(payload, origin)
            return True
        return send

    def sync(self) -> None:
        """Publish every router's dirty records to every other router."""
        for o, f in self.feds.items():
            for group, tag, rec in f.flush():
                for other, g in self.feds.items():
                    if other != o and other not in self.lost:
                        g.on_record(o, group, rec, tag)

    def connect(self, o: str, carrier: Named, addr: bytes, **kw: object) -> None:
        self.feds[o].table.connect(carrier, G, addr, addr.decode(), (("10.0.0.1", 7800),),
                                   **kw)  # type: ignore[arg-type]
        self.sync()


_seqs = iter(range(1, 1 << 30))


def record(members: list[list[object]], run: bytes = b"test") -> bytes:
    """A one-chunk snapshot of ``members`` (each a newer version than the last)."""
    return encode_chunk(run, next(_seqs), 1, 0, [pack_member(m) for m in members])


def kinds(f: Federation, addr: bytes) -> list[str]:
    e = f.table.entry(G, addr)
    return [] if e is None else [type(c).__name__ for c in e.carriers]
