"""The exceptions the stub raises (all :class:`StubError`), and the ERROR code -> type map.
"""

from __future__ import annotations

from collections.abc import Sequence

from gossiprouter.client.status import RouterAddress, RouterStatus

# --------------------------------------------------------------------------- exceptions


class StubError(Exception):
    """Base class of every error the stub raises."""


class RouterError(StubError):
    """The router refused a request with ERROR ``code``; subclasses name the common codes."""

    def __init__(self, code: str, message: str, router: RouterAddress | None = None) -> None:
        where = f" (router {router[0]}:{router[1]})" if router else ""
        super().__init__(f"{code}: {message}{where}")
        self.code = code
        self.message = message
        self.router = router


class NotMemberError(RouterError):
    """``not_member``: the address is not registered in that group on this connection."""


class ForbiddenError(RouterError):
    """``forbidden``: e.g. CONNECT in a JGroups namespace, or touching a provisioned member."""


class AddressInUseError(RouterError):
    """``address_in_use``: the address is held by another identity or a provisioned member."""


class LimitError(RouterError):
    """``limit``: too many groups/addresses on this connection (or connections on the router)."""


class UnknownDestinationError(RouterError):
    """``unknown_destination``: a unicast went to an address the router does not know."""


_ERROR_TYPES: dict[str, type[RouterError]] = {
    "not_member": NotMemberError,
    "forbidden": ForbiddenError,
    "address_in_use": AddressInUseError,
    "limit": LimitError,
    "unknown_destination": UnknownDestinationError,
}


def router_error(code: str, message: str, router: RouterAddress | None = None) -> RouterError:
    """The typed exception for an ERROR ``code``."""
    return _ERROR_TYPES.get(code, RouterError)(code, message, router)


class NotConnectedError(StubError):
    """No router connection was usable in time. ``routers`` is each router's status then,
    ``last_error`` the most recent reason a connection failed (None if none failed)."""

    def __init__(self, message: str, routers: Sequence[RouterStatus] = (),
                 last_error: str | None = None) -> None:
        super().__init__(message)
        self.routers = tuple(routers)
        self.last_error = last_error


class ConnectionLostError(StubError):
    """The connection carrying a request broke before the router answered it."""


class RequestTimeoutError(StubError, TimeoutError):
    """The router did not answer a request within ``request_timeout``."""


class ChannelClosedError(StubError):
    """The channel (or its stub) is closed: nothing more can be sent or received."""


class FrameTooLargeError(StubError, ValueError):
    """The message does not fit in one frame of the router's ``max_frame``."""


class ModeError(StubError):
    """The operation is not available in this stub's mode (e.g. send in discovery mode)."""


class StubTaskError(StubError):
    """A task of the stub failed: a bug, since the tasks handle every network failure
    themselves. The stub is closed; ``__cause__`` is the ExceptionGroup of what the tasks
    raised (see the error policy in :mod:`gossiprouter.client.lifecycle`)."""


class LinkDown(Exception):
    """Internal: the connection a write or request needed is gone."""
