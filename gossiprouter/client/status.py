"""How the stub's connection to each router is doing: the router's address, the connection's
state, its changes (StubEvent) and a snapshot of it (RouterStatus).

Plain values with no I/O, below everything else of the client: the exceptions
(:mod:`~gossiprouter.client.errors`: a NotConnectedError carries every router's status) and
the rest of the data (:mod:`~gossiprouter.client.model`) build on them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

RouterAddress = tuple[str, int]


class ConnectionState(enum.Enum):
    """The state of the stub's connection to one router."""

    CONNECTING = "connecting"  # a connection attempt is under way
    CONNECTED = "connected"  # handshake done and every channel (re-)registered
    RECONNECTING = "reconnecting"  # down: waiting ``delay`` before the next attempt
    CLOSED = "closed"  # the stub is closed


@dataclass(frozen=True, slots=True)
class StubEvent:
    """A connection state change of one router.

    ``attempt`` counts connection attempts to that router since the stub
    started; ``error`` says why the connection failed or broke; ``delay`` is
    the backoff before the next attempt (RECONNECTING only).
    """

    router: RouterAddress
    state: ConnectionState
    attempt: int
    error: str | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class RouterStatus:
    """A snapshot of one router connection (:meth:`RouterStub.status`)."""

    router: RouterAddress
    state: ConnectionState
    attempts: int
    connections: int
    last_error: str | None
    router_id: str | None

