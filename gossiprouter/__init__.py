"""gossiprouter: a TCP GossipRouter on trio, and the RouterStub client for applications."""

from __future__ import annotations

from gossiprouter.blocking import BlockingChannel, BlockingRouterStub
from gossiprouter.stub import (
    AddressInUseError,
    Channel,
    ChannelClosedError,
    ConnectionLostError,
    ConnectionState,
    ForbiddenError,
    FrameTooLargeError,
    GroupEvent,
    LimitError,
    Member,
    Message,
    ModeError,
    NotConnectedError,
    NotMemberError,
    Publication,
    RequestTimeoutError,
    RouterError,
    RouterStatus,
    RouterStub,
    StubError,
    StubEvent,
    UnknownDestinationError,
    Watch,
)

__version__ = "0.1.0"

__all__ = [
    "AddressInUseError",
    "BlockingChannel",
    "BlockingRouterStub",
    "Channel",
    "ChannelClosedError",
    "ConnectionLostError",
    "ConnectionState",
    "ForbiddenError",
    "FrameTooLargeError",
    "GroupEvent",
    "LimitError",
    "Member",
    "Message",
    "ModeError",
    "NotConnectedError",
    "NotMemberError",
    "Publication",
    "RequestTimeoutError",
    "RouterError",
    "RouterStatus",
    "RouterStub",
    "StubError",
    "StubEvent",
    "UnknownDestinationError",
    "Watch",
    "__version__",
]
