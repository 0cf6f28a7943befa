"""The deprecation path of issue 14 item 3: gossiprouter.stub still offers every public name
it had before the client became a package, as the very objects the package defines."""

from __future__ import annotations

import importlib
import subprocess
import sys

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


def test_a_router_does_not_load_the_client() -> None:
    """The package's front loads the client's names on first use: a router process (which
    imports ``gossiprouter.*`` modules) carries neither the client nor AnyIO."""
    code = ("import sys, gossiprouter.server.listener, gossiprouter.cli.serve; "
            "print(sorted(m for m in sys.modules if m == 'anyio' "
            "or m.startswith('gossiprouter.client')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip() == "[]", r.stdout
    # ...and the names are still there, the very objects of the client, star import included.
    names: dict[str, object] = {}
    exec("from gossiprouter import *", names)
    from gossiprouter import client

    assert set(client.__all__) | {"BlockingChannel", "BlockingRouterStub", "__version__"} \
        == {n for n in names if n != "__builtins__"}
    assert names["RouterStub"] is client.RouterStub
    assert set(client.__all__) <= set(dir(gossiprouter))
