"""gossiprouter: a TCP GossipRouter on trio, and the RouterStub client for applications
(on asyncio or trio)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gossiprouter import client
from gossiprouter._version import __version__
from gossiprouter.client import *  # noqa: F403  (the client's API, listed once: client.__all__)

if TYPE_CHECKING:
    from gossiprouter.client.blocking import BlockingChannel, BlockingRouterStub

__all__ = [*client.__all__, "BlockingChannel", "BlockingRouterStub", "__version__"]

_BLOCKING = frozenset({"BlockingChannel", "BlockingRouterStub"})


def __getattr__(name: str) -> Any:
    # The blocking facade runs its own trio loop: loaded on first use, so that an asyncio
    # application importing RouterStub from here does not load trio.
    if name in _BLOCKING:
        from gossiprouter.client import blocking

        return getattr(blocking, name)
    raise AttributeError(f"module 'gossiprouter' has no attribute {name!r}")
