"""Deprecated import path: the client now lives in the :mod:`gossiprouter.client` package.

``from gossiprouter.stub import X`` keeps working for every public name it offered; new code
imports from ``gossiprouter`` (the public API) or from the module that defines the name:

* errors (StubError, RouterError and its subclasses, ...): :mod:`gossiprouter.client.errors`;
* the routers' connection states (RouterAddress, ConnectionState, StubEvent, RouterStatus):
  :mod:`gossiprouter.client.status`;
* the model (Member, Message, Publication, GroupEvent, StubStats, parse_router):
  :mod:`gossiprouter.client.model`; describe_error: :mod:`gossiprouter.client.connection`;
* EventStream, Watch: :mod:`gossiprouter.client.streams`; Channel:
  :mod:`gossiprouter.client.channel`; RouterStub: :mod:`gossiprouter.client.front`.
"""

from __future__ import annotations

from gossiprouter import client
from gossiprouter.client import *  # noqa: F403  (the public API, listed once: client.__all__)

# Names imported 'as' themselves were public outside __all__; they stay importable here.
from gossiprouter.client.connection import FOREIGN as FOREIGN
from gossiprouter.client.connection import describe_error
from gossiprouter.client.errors import router_error as router_error
from gossiprouter.client.model import CLIENT_NAME as CLIENT_NAME
from gossiprouter.client.model import RECV_SIZE as RECV_SIZE
from gossiprouter.client.model import SUSPECT_DEDUPE_WINDOW as SUSPECT_DEDUPE_WINDOW
from gossiprouter.client.model import Key as Key
from gossiprouter.client.model import Mode as Mode
from gossiprouter.client.model import Physical as Physical
from gossiprouter.client.model import Policy as Policy
from gossiprouter.client.model import StubStats, parse_router
from gossiprouter.client.status import RouterAddress as RouterAddress
from gossiprouter.client.streams import EventStream, WouldBlock

__all__ = [*client.__all__, "EventStream", "StubStats", "WouldBlock", "describe_error",
           "parse_router"]
