"""gossiprouter: a TCP GossipRouter on trio, and the RouterStub client for applications."""

from __future__ import annotations

from gossiprouter import client
from gossiprouter._version import __version__
from gossiprouter.blocking import BlockingChannel, BlockingRouterStub
from gossiprouter.client import *  # noqa: F403  (the client's API, listed once: client.__all__)

__all__ = [*client.__all__, "BlockingChannel", "BlockingRouterStub", "__version__"]
