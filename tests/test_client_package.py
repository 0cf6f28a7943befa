"""The deprecation path of issue 14 item 3: gossiprouter.stub still offers every public name
it had before the client became a package, as the very objects the package defines."""

from __future__ import annotations

import importlib

import pytest

import gossiprouter
from gossiprouter import stub

# Every public module-level name of stub.py before the split (its module-private T and log
# aside), and where it lives now.
MOVED = {
    "errors": ["AddressInUseError", "ChannelClosedError", "ConnectionLostError",
               "ForbiddenError", "FrameTooLargeError", "LimitError", "ModeError",
               "NotConnectedError", "NotMemberError", "RequestTimeoutError", "RouterError",
               "StubError", "UnknownDestinationError", "router_error"],
    "model": ["CLIENT_NAME", "GroupEvent", "Key", "Member", "Message", "Mode", "Physical",
              "Policy", "Publication", "RECV_SIZE", "StubStats", "SUSPECT_DEDUPE_WINDOW",
              "parse_router"],
    "status": ["ConnectionState", "RouterAddress", "RouterStatus", "StubEvent"],
    "streams": ["EventStream", "Watch"],
    "channel": ["Channel"],
    "connection": ["FOREIGN", "describe_error"],
    "front": ["RouterStub"],
}


@pytest.mark.parametrize(("module", "name"),
                         [(m, n) for m, names in MOVED.items() for n in names])
def test_old_import_path_gives_the_same_object(module: str, name: str) -> None:
    home = importlib.import_module(f"gossiprouter.client.{module}")
    assert getattr(stub, name) is getattr(home, name)


def test_star_import_and_package_front_unchanged() -> None:
    # __all__ of the old module, and the package's re-exports, still resolve.
    for name in stub.__all__:
        assert getattr(stub, name) is not None
    assert gossiprouter.RouterStub is stub.RouterStub


def test_the_public_api_is_listed_once_and_offered_everywhere() -> None:
    # gossiprouter and gossiprouter.stub re-export client.__all__ (the one list), unchanged.
    from gossiprouter import client

    for name in client.__all__:
        assert getattr(gossiprouter, name) is getattr(client, name)
        assert getattr(stub, name) is getattr(client, name)
    assert set(client.__all__) <= set(gossiprouter.__all__) & set(stub.__all__)
