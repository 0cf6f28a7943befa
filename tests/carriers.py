"""A routing-table carrier for tests of the pure table (routing.py, topics).

The table only hashes and compares its carriers, so a test carrier is a name: a
``str`` that also implements :class:`gossiprouter.routing.entries.Carrier`, which lets the
table-driven cases keep writing and comparing carriers as plain strings. What the hub
would deliver to it is recorded, should a test need it.
"""

from __future__ import annotations

from typing import ClassVar

from gossiprouter.routing.entries import Entry


class _Refuse:
    """An outbound queue that takes nothing, so every delivery goes through push()."""

    def push(self, data: bytes) -> bool:
        return False


class Named(str):
    """A carrier that is its own name: ``Named("c1") == "c1"``."""

    protocol: ClassVar[str] = "test"
    events_by_call: ClassVar[bool] = True
    outbox: ClassVar[_Refuse] = _Refuse()

    def __init__(self, name: str) -> None:
        super().__init__()
        self.peer = name
        self.pushed: list[tuple[bytes, int]] = []
        self.events: list[tuple[str, bytes]] = []

    def push(self, data: bytes, count: int = 1) -> None:
        self.pushed.append((data, count))

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        return None

    def notify(self, kind: str, entry: Entry) -> None:
        self.events.append((kind, entry.addr))


_INTERNED: dict[str, Named] = {}


def named(name: str) -> Named:
    """The test carrier called ``name``: the same object every time, as a connection is
    (the table compares carriers by identity in places)."""
    c = _INTERNED.get(name)
    if c is None:
        c = _INTERNED[name] = Named(name)
    return c
