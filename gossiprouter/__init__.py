"""gossiprouter: a TCP GossipRouter on trio, and the RouterStub client for applications
(on asyncio or trio).

The client's public names (``gossiprouter.client.__all__``, the one list) are offered here
too, loaded on first use (PEP 562): a router process, or a command that does not use the
client, does not import it (nor AnyIO), and ``gossiprouter --help`` stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gossiprouter._version import __version__

if TYPE_CHECKING:
    from gossiprouter import client
    from gossiprouter.client import *  # noqa: F403  (the client's API, listed once: client.__all__)
    from gossiprouter.client.blocking import BlockingChannel, BlockingRouterStub

    __all__ = [*client.__all__, "BlockingChannel", "BlockingRouterStub", "__version__"]

# The blocking facade runs its own trio loop: an asyncio application importing RouterStub
# from here does not load trio.
_BLOCKING = frozenset({"BlockingChannel", "BlockingRouterStub"})


def _client_names() -> list[str]:
    names: list[str] = importlib.import_module("gossiprouter.client").__all__
    return names


def __getattr__(name: str) -> Any:
    if name == "__all__":  # `from gossiprouter import *`
        return [*_client_names(), *sorted(_BLOCKING), "__version__"]
    if name in _BLOCKING:
        module = importlib.import_module("gossiprouter.client.blocking")
    elif not name.startswith("_") and name in _client_names():
        module = importlib.import_module("gossiprouter.client")
    else:
        raise AttributeError(f"module 'gossiprouter' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_client_names(), *_BLOCKING})
