"""The client package: :class:`RouterStub` and what it is made of.

Read bottom-up (each module imports only those listed before it):

* :mod:`~gossiprouter.client.status`: each router's address and the state of the stub's
  connection to it (ConnectionState, StubEvent, RouterStatus);
* :mod:`~gossiprouter.client.errors` and :mod:`~gossiprouter.client.model`: the exceptions
  and the values applications see (Member, Message, Publication, GroupEvent);
* :mod:`~gossiprouter.client.streams`: bounded streams (EventStream, Watch);
* :mod:`~gossiprouter.client.channel`: one logical address in one group (Channel);
* :mod:`~gossiprouter.client.registrar`: the pure plan of the re-CONNECTs and
  re-SUBSCRIBEs a fresh connection needs;
* :mod:`~gossiprouter.client.merge`: the pure merge of member lists over several routers;
* :mod:`~gossiprouter.client.local`: the stub's own side, no I/O: its channels and watches,
  and the delivery of what the routers send to them;
* :mod:`~gossiprouter.client.tls`: the client's TLS set-up;
* :mod:`~gossiprouter.client.connection`: one connection's I/O (open_connection: TCP, TLS,
  HELLO/WELCOME; Connection: one live connection; RouterSlot: what the stub keeps about a
  router across reconnects);
* :mod:`~gossiprouter.client.link`: every router's connection kept up: reconnect with
  backoff, and each connection's reader (with the dispatch of received frames), heartbeat
  and registrar tasks;
* :mod:`~gossiprouter.client.lifecycle`: StubLifecycle, RouterStub's base: running and
  closing the stub, its routers' connection states, and the error policy;
* :mod:`~gossiprouter.client.front`: RouterStub and open_router_stub: the options and the
  calls applications make.

Channel and Watch reach their stub through what they declare they need of it
(:class:`~gossiprouter.client.channel.ChannelOwner`,
:class:`~gossiprouter.client.streams.WatchOwner`; RouterStub is both), so nothing imports a
module above it.

The public API is listed once, here (:data:`__all__`); ``gossiprouter`` re-exports it, and
``gossiprouter.stub`` too, for older imports.
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
    StubTaskError,
    UnknownDestinationError,
)
from gossiprouter.client.front import RouterStub, open_router_stub
from gossiprouter.client.model import GroupEvent, Member, Message, Publication
from gossiprouter.client.status import ConnectionState, RouterStatus, StubEvent
from gossiprouter.client.streams import Watch

__all__ = [
    "AddressInUseError",
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
    "StubTaskError",
    "UnknownDestinationError",
    "Watch",
    "open_router_stub",
]
