"""gossiprouter: a TCP GossipRouter on trio, and the RouterStub client for applications."""

from __future__ import annotations

__version__ = "0.1.0"
