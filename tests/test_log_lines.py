"""What the router's log says to the person running it (issue 31's papercuts): a dead broker
is one WARNING naming its URL and the cause, then rate-limited; a peer router's death is a
WARNING; member addresses are written as the command line takes them.

Real sockets on 127.0.0.1, an in-process router, a real mosquitto for the peer. Every wait is
bounded by work the bridge counts (connection attempts), never by time: the rate limit's
clock is frozen by the test, so how fast the retries come cannot change what is logged.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import trio

from gossiprouter.client.cli import parse_addr as cli_parse_addr
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory
from tests.nclient import NativeClient
from tests.procs import free_port
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_stub import InProcessRouter, eventually

# The log lines do not depend on the read path: once is enough (tests/conftest.py).
pytestmark = pytest.mark.one_pass

BRIDGE_LOG = "gossiprouter.federation.bridge"


def lines(caplog: pytest.LogCaptureFixture, needle: str,
          level: int | None = None) -> list[logging.LogRecord]:
    return [r for r in caplog.records if needle in r.getMessage()
            and (level is None or r.levelno == level)]


async def test_a_dead_broker_is_one_warning_with_its_url_and_cause_then_rate_limited(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gossiprouter")
    dead = free_port()  # nothing listens there: every attempt is refused
    url = f"mqtt://127.0.0.1:{dead}"
    r = await InProcessRouter(nursery, bridge=url, bridge_reconnect_max=0.1,
                              federation_id="r0").start()
    b = bridge_of(r)
    # Frozen: however long the retries take, they all fall in one rate-limit interval (a
    # line logged before this, on the real clock, is later than 0 and so still the last).
    clock = [0.0]
    b._failure_log.clock = lambda: clock[0]
    await eventually(lambda: b.stats.failures >= 6, what="6 refused attempts")
    mentions = lines(caplog, url)
    assert [(m.levelno, m.getMessage()) for m in mentions] == [
        (logging.WARNING, f"bridge: cannot connect to {url}: Connection refused (retrying, "
                          "backoff up to 0.1s)")]
    # Once the interval is over, the next failure is one line that sums up the others.
    clock[0] = 1e9
    seen = b.stats.failures
    await eventually(lambda: len(lines(caplog, url)) == 2, what="the summary line")
    summary = lines(caplog, url)[1]
    assert summary.levelno == logging.WARNING
    m = re.search(r"\(and (\d+) more like this", summary.getMessage())
    assert m is not None and int(m.group(1)) >= seen - 1, summary.getMessage()


async def test_each_dead_broker_of_several_is_named_once_and_failovers_are_rate_limited(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gossiprouter")
    urls = [f"mqtt://127.0.0.1:{free_port()}", f"mqtt://127.0.0.1:{free_port()}"]
    r = await InProcessRouter(nursery, bridge=tuple(urls), bridge_reconnect_max=0.1,
                              federation_id="r0").start()
    b = bridge_of(r)
    b._failure_log.clock = lambda: 0.0
    await eventually(lambda: b.stats.failures >= 8 and b.stats.failovers >= 8,
                     what="4 rounds of both brokers")
    for url in urls:
        assert len(lines(caplog, f"cannot connect to {url}: Connection refused",
                         logging.WARNING)) == 1, url
        assert len(lines(caplog, f"failing over to {url}")) <= 1, url
    assert not [x for x in caplog.records if x.name == BRIDGE_LOG and x.levelno < logging.WARNING
                and "cannot connect" in x.getMessage()]


async def test_a_killed_peer_router_is_a_warning(nursery: trio.Nursery, broker: Mosquitto,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gossiprouter")
    fed: dict[str, Any] = {"bridge_reconnect_max": 0.3, "bridge_keepalive": 1}
    ra = await InProcessRouter(nursery, bridge=broker.url, router_id="ra", **fed).start()
    rb = await InProcessRouter(nursery, bridge=broker.url, router_id="rb", **fed).start()
    fa = bridge_of(ra).federation
    b_origin = bridge_of(rb).origin
    await eventually(lambda: fa.live_routers() == 1, what="A sees B")
    # Cancelled outright: its broker connection closes without DISCONNECT, as when killed.
    await rb.stop()
    await eventually(lambda: fa.stats.routers_graced + fa.stats.routers_lost >= 1,
                     what="A loses B")
    gone = lines(caplog, "is gone (Last Will)")
    assert [x.levelno for x in gone] == [logging.WARNING], [x.getMessage() for x in gone]
    # A's lines name B by its name and by the origin B's own log connected as ("bridge
    # connected to URL as ORIGIN"), the same way in each line.
    label = f"rb ({b_origin})"
    assert f"router {label} is gone" in gone[0].getMessage()
    assert any(f"router {label} is up" in x.getMessage() for x in lines(caplog, "is up"))
    assert any(f"as {b_origin} (" in x.getMessage() for x in lines(caplog, "bridge connected"))


async def test_a_router_gone_by_its_last_will_is_not_reported_unreachable_later(
        nursery: trio.Nursery, broker: Mosquitto, caplog: pytest.LogCaptureFixture) -> None:
    """A peer dropped after its Last Will is not logged again, a peer timeout later, as "not
    heard from ...: unreachable" (a second WARNING that reads like a second failure)."""
    caplog.set_level(logging.INFO, logger="gossiprouter")
    fed: dict[str, Any] = {"bridge_reconnect_max": 0.3, "bridge_keepalive": 1,
                           "federation_heartbeat": 0.1, "federation_peer_timeout": 0.5,
                           "federation_grace": 0}
    ra = await InProcessRouter(nursery, bridge=broker.url, router_id="ra", **fed).start()
    rb = await InProcessRouter(nursery, bridge=broker.url, router_id="rb", **fed).start()
    bridge = bridge_of(ra)
    fa = bridge.federation
    await eventually(lambda: fa.live_routers() == 1, what="A sees B")
    await eventually(lambda: any(p.beats for p in bridge.liveness.links.values()),
                     what="A hears B's heartbeats")
    await rb.stop()
    await eventually(lambda: fa.stats.routers_lost >= 1, what="A drops B")
    # The heartbeat task's own check has now seen B silent for the timeout (B's link is down):
    # what it logged, if anything, is in caplog.
    await eventually(lambda: not any(p.up for p in bridge.liveness.links.values()),
                     what="B's link timed out", timeout=30)
    assert lines(caplog, "not heard from") == []
    assert len(lines(caplog, "is gone (Last Will)")) == 1


# --------------------------------------------------------------------------- member addresses

# The router's log lines that name a member: "joined NAME (ADDR ...)", "ADDR left ...
# (DISCONNECT)", "NAME (ADDR) left ...: connection ... closed".
ADDR_IN_LOG = [re.compile(r"^joined \S+ \(([^\s)]+)"), re.compile(r"^(\S+) left .*\(DISCONNECT\)"),
               re.compile(r"^\S+ \((\S+)\) left .*: connection .* closed")]


def logged_addresses(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = []
    for r in caplog.records:
        for pattern in ADDR_IN_LOG:
            if m := pattern.search(r.getMessage()):
                out.append(m.group(1))
    return out


async def test_logged_member_addresses_paste_into_send_to(
        start_router: RouterFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gossiprouter")
    server: Server = await start_router()
    text, binary = b"node-a", bytes(range(250, 256)) + b"\x00\x01"
    for addr in (text, binary):
        c = await NativeClient.to(server)
        assert isinstance(await c.connect("g", addr, "n"), wire.Ok)
        # A clean leave logs one line, a connection closed another.
        assert isinstance(await c.request(wire.Disconnect(c.req(), "g", addr)), wire.Ok)
        assert isinstance(await c.connect("g", addr, "n"), wire.Ok)
        await c.aclose()
    # Each: joined, left (DISCONNECT), joined, left (connection closed).
    await eventually(lambda: len(logged_addresses(caplog)) == 8, what="8 address lines")
    shown = logged_addresses(caplog)
    assert shown == ["node-a"] * 4 + ["hex:" + binary.hex()] * 4
    # What the log shows is what `gossiprouter send --to` reads back as the same member.
    assert [cli_parse_addr(s, "--to ADDR") for s in shown] == [text] * 4 + [binary] * 4
