"""The one "nothing arrives" check, for every test client (native, JGroups 2.12, JGroups 5).

A short wait alone passes when a frame is merely late. So after the wait the client makes a
round trip through the router (a request the router answers on the same connection), and
counts what arrived before the answer: the router queues a connection's replies behind the
frames already routed to it, so any frame decided for the client before the round trip is
counted and fails the check, however late it would have arrived.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import trio


class QuietClient(Protocol):
    async def recv(self, timeout: float = ...) -> object: ...

    async def round_trip(self) -> Sequence[object]:
        """Send a request the router answers; return every frame that came before the answer."""
        ...


async def nothing_more(c: QuietClient, wait: float = 0.2) -> None:
    """Assert that nothing arrives on ``c`` within ``wait`` seconds, nor is queued for it."""
    with trio.move_on_after(wait):
        f = await c.recv(timeout=wait + 1)
        raise AssertionError(f"unexpected frame {f!r}")
    late = await c.round_trip()
    assert len(late) == 0, f"{len(late)} frame(s) arrived late: {late!r}"
