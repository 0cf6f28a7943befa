"""Deprecated import path: the client now lives in the :mod:`gossiprouter.client` package.

``from gossiprouter.stub import X`` keeps working for every public name it offered; new code
imports from ``gossiprouter`` (the public API) or from the module that defines the name:

* errors (StubError, RouterError and its subclasses, ...): :mod:`gossiprouter.client.errors`;
* the model (Member, Message, Publication, GroupEvent, StubEvent, RouterStatus, StubStats,
  ConnectionState, parse_router, describe_error): :mod:`gossiprouter.client.model`;
* EventStream, Watch: :mod:`gossiprouter.client.streams`; Channel:
  :mod:`gossiprouter.client.channel`; RouterStub: :mod:`gossiprouter.client.front`.
"""

from __future__ import annotations

from gossiprouter.client.channel import Channel
from gossiprouter.client.errors import (
    AddressInUseError,
    ChannelClosedError,
    ConnectionLostError,
    ForbiddenError,
    FrameTooLargeError,
    LimitError,
    ModeError,
    NotConnectedError,
    NotMemberError,
    RequestTimeoutError,
    RouterError,
    StubError,
    UnknownDestinationError,
)
from gossiprouter.client.front import RouterStub
from gossiprouter.client.model import (
    ConnectionState,
    GroupEvent,
    Member,
    Message,
    Publication,
    RouterStatus,
    StubEvent,
    StubStats,
    describe_error,
    parse_router,
)
from gossiprouter.client.streams import EventStream, Watch

__all__ = [
    "AddressInUseError",
    "Channel",
    "ChannelClosedError",
    "ConnectionLostError",
    "ConnectionState",
    "EventStream",
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
    "StubStats",
    "UnknownDestinationError",
    "Watch",
    "describe_error",
    "parse_router",
]
