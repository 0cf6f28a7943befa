"""What the federation asks of the relay thread's broker link (the compiled fast path's
``server/broker_link.py``, over ``server/relay/broker.c``; docs/federation.md, "The routed
path on the relay thread"). Defined here so that the federation names no implementation: the
server hands one to the bridge (:meth:`gossiprouter.federation.peers.Peers.attach_link`) when
it runs the fast path.

While a broker session is up on a plain TCP socket, every byte for the broker goes through the
link (paho's included), so the relay thread can publish the remote share of the routes it has
learned itself, in order with Python's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gossiprouter.routing.entries import Carrier


class Link(Protocol):
    """The relay thread's side of the broker connection."""

    @property
    def routing(self) -> bool:
        """The thread publishes learned remote shares now (between :meth:`enable` and
        :meth:`disable`)."""
        ...

    def open(self, fd: int, feed: Callable[[str, bytes], None]) -> bool:
        """The broker socket ``fd`` is written through the link from now on. True when the
        thread reads it too: it hands up what it does not handle itself through ``feed``
        ("data", bytes; or how the stream ended: "eof", "error"), then reads no more until
        :meth:`resume`."""
        ...

    def resume(self, raw: bool) -> None:
        """Everything handed up was read: the thread reads on (``raw``: its next read goes up
        whole, the start of a packet waiting for its rest)."""
        ...

    def floor(self, run: str) -> int:
        """The last route message of another router's ``run`` the thread accepted (0: none
        known): signing.Verifier refuses what is not above it."""
        ...

    def seen(self, run: str, seq: int) -> None:
        """Python accepted route message ``seq`` of ``run``: the thread refuses it after."""
        ...

    def write(self, data: bytes | bytearray) -> int:
        """``data`` for the broker, after everything written before it: its length (the link
        takes it all), or the OSError that broke the connection."""
        ...

    def pending(self) -> int:
        """Bytes for the broker not written yet."""
        ...

    def close(self) -> None:
        """The socket is about to be closed: what waits is written if the socket takes it at
        once (at most a moment), the rest dropped; the thread writes it no more."""
        ...

    def enable(self, owner: object) -> None:
        """The broker session is up: the thread may publish the remote share of routes learned
        from now on (``owner``: the bridge, whose topics, bounds and counters they use)."""
        ...

    def disable(self) -> None:
        """The session is not up (or leaving): remote shares are Python's again."""
        ...

    def invalidate(self) -> None:
        """Something the remote shares depend on changed (a router's liveness, grace, a
        member's record): the routes learned before are Python's again until learned anew."""
        ...

    def learn_in(self, writer: str, group: str, dest: bytes | None, frames: bytes,
                 targets: list[Carrier]) -> None:
        """Routed ``frames`` router ``writer`` sent for ``dest`` of ``group`` (None: the group)
        were delivered here to ``targets`` (state.Federation.on_route): the thread delivers
        the next such ones itself while nothing they depend on changes."""
        ...

    def seed(self, n: int) -> None:
        """Fan-out numbers go on after ``n`` (what Python numbered before)."""
        ...

    def fanout(self) -> int:
        """The next fan-out number (:meth:`gossiprouter.federation.moves.Moves.number`): one
        sequence with the thread's."""
        ...
