"""Federation through a real MQTT broker: two in-process routers and Debian's mosquitto.

The broker is started on 127.0.0.1 on a free port with a generated config; the
routers bridge to it with ``bridge = mqtt://127.0.0.1:PORT``. Every "nothing
else arrived" check is backed by the routers' and the bridges' counters.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.core.topics import pattern, topic_id
from gossiprouter.federation.bridge import Bridge
from gossiprouter.federation.mqtt_topics import (
    escape_level,
    mqtt_filter,
    mqtt_topic,
    parse_mqtt_topic,
    unescape_level,
)
from gossiprouter.sessions.base import Hub
from gossiprouter.stub import Channel, Publication, RouterStub
from tests.procs import free_port, wait_listening
from tests.test_stub import FAST, InProcessRouter, connected, drain, eventually

MOSQUITTO = "/usr/sbin/mosquitto"
G = "fleet"
TOPIC = ("vehicle-17", "position", ["eu", "de", "munich"])


# --------------------------------------------------------------------------- mapping (pure)


@pytest.mark.parametrize(("level", "encoded"), [
    ("eu", "eu"), ("a/b", "a%2Fb"), ("+", "%2B"), ("#", "%23"), ("", "%"), ("50%", "50%25"),
    ("a\0b", "a%00b"), ("münchen", "münchen"), ("x+y#z", "x%2By%23z"), ("a\nb", "a%0Ab"),
    ("c1\x85", "c1%C2%85"), ("\ufffe", "%EF%BF%BE"), ("東京", "東京"), ("%", "%25"),
])
def test_levels_are_escaped_into_one_mqtt_level(level: str, encoded: str) -> None:
    assert escape_level(level) == encoded
    assert unescape_level(encoded) == level


def test_topic_and_filter_mapping() -> None:
    tid = topic_id("vehicle-17", "position", ["eu", "de/at", "+x"])
    assert mqtt_topic("gr", "my/group", tid) == "gr/my%2Fgroup/vehicle-17/position/eu/de%2Fat/%2Bx"
    assert parse_mqtt_topic("gr", mqtt_topic("gr", "my/group", tid)) == ("my/group", tid)
    assert mqtt_filter("gr", "g", pattern("+", "position", ["eu", "+", "*"])) == \
        "gr/g/+/position/eu/+/#"
    assert mqtt_filter("gr", "g", pattern("p", "b", ["*"])) == "gr/g/p/b/#"
    assert mqtt_filter("gr", "g", pattern("p", "b", [])) == "gr/g/p/b"
    for bad in ("other/g/p/b", "gr/g/p", "gr/g/p/b/%zz", "gr/g/p/b/%2B", "gr/g/p/b/%2f",
                "gr/g/p/b/%41", "gr/g/p/b/%FF", "gr/g/p/b/a%"):
        with pytest.raises(ValueError):
            parse_mqtt_topic("gr", bad)


@pytest.mark.parametrize(("options", "message"), [
    ({"bridge": "http://x:1"}, "mqtt://HOST:PORT"),
    ({"bridge": "mqtt://u:p@x:1"}, "bridge_username"),
    ({"bridge": "mqtt://x:1", "bridge_qos": 2}, "expected 0 or 1"),
    ({"bridge": "mqtt://x:1", "bridge_username": "u",
      "bridge_password_file": "/nonexistent/pw"}, "cannot read a password"),
    ({"bridge": "mqtt://x:1", "bridge_prefix": "a/b"}, "one MQTT topic level"),
])
def test_bad_bridge_options_fail_at_start(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg = Config(**options)
        Bridge(Hub(cfg), cfg)


# --------------------------------------------------------------------------- with mosquitto


class Mosquitto:
    def __init__(self, tmp: Path, extra: str = "allow_anonymous true\n") -> None:
        self.port = free_port()
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\n{extra}persistence false\n")
        self.log = tmp / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=out,
                                         stderr=out)
        wait_listening(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path)
    b.start()
    yield b
    b.stop()


def bridge_of(r: InProcessRouter) -> Bridge:
    """``r``'s bridge, its counters up to date with what the relay thread published for it
    (Hub.sync, as the operations layer reads them)."""
    assert r.server is not None and r.server.bridge is not None
    r.server.hub.sync()
    return r.server.bridge


async def federation(nursery: trio.Nursery, broker: Mosquitto
                     ) -> tuple[InProcessRouter, InProcessRouter]:
    a = await InProcessRouter(nursery, bridge=broker.url, bridge_reconnect_max=0.3).start()
    b = await InProcessRouter(nursery, bridge=broker.url, bridge_reconnect_max=0.3).start()
    await eventually(lambda: bridge_of(a).state == bridge_of(b).state == "connected",
                     what="bridges connected")
    return a, b


async def subscribed(r: InProcessRouter, before: int = 0) -> None:
    """Wait until the broker acknowledged a SUBSCRIBE of ``r``'s bridge (after ``before``)."""
    await eventually(lambda: bridge_of(r).stats.subacks > before, what="SUBACK")


async def test_global_reaches_the_other_router_once_and_local_never(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        pub = await sa.connect(G, b"P")
        near = await sa.connect(G, b"N")
        far = await sb.connect(G, b"F")
        await near.subscribe("vehicle-17", "position", ["eu", "*"])
        await pub.subscribe("vehicle-17", "position", ["*"])
        await far.subscribe("vehicle-17", "position", ["eu", "+", "*"])
        await subscribed(rb)
        await subscribed(ra)

        await pub.publish(TOPIC, b"g1", scope="global", echo=True)
        await pub.publish(TOPIC, b"l1", scope="local", echo=True)
        await pub.publish(TOPIC, b"g2", scope="global")

        with trio.fail_after(5):
            m = await far.receive()
        assert isinstance(m, Publication)
        assert (m.payload, m.scope, m.sender, m.topic) == (
            b"g1", "global", b"P", ("vehicle-17", "position", ("eu", "de", "munich")))
        with trio.fail_after(5):
            assert (await far.receive()).payload == b"g2"
        # Router A: the local subscriber got each once; the publisher (echo) its own once.
        assert [x.payload for x in await drain(near, 0.3)] == [b"g1", b"l1", b"g2"]
        assert [x.payload for x in await drain(pub, 0)] == [b"g1", b"l1"]
        assert await drain(far, 0) == []
        a, b = bridge_of(ra), bridge_of(rb)
        assert (a.stats.forwarded, a.stats.not_forwarded) == (2, 0)
        # B got exactly the two global ones; A got nothing back (No Local), nothing looped.
        assert (b.stats.received, b.stats.forwarded) == (2, 0)
        assert (a.stats.received, a.stats.echo_dropped) == (0, 0)
        assert rb.server is not None and rb.server.hub.table.stats.federated_in == 2


async def test_a_publication_from_the_federation_is_never_sent_out_again(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Three routers, all subscribed: one global publication is received once by each other
    router and forwarded by none of them (no loop, whatever the topology)."""
    ra, rb = await federation(nursery, broker)
    rc = await InProcessRouter(nursery, bridge=broker.url).start()
    await eventually(lambda: bridge_of(rc).state == "connected")
    routers = (ra, rb, rc)
    async with RouterStub([r.address for r in routers], **FAST) as s:
        # One stub on all three routers: it is subscribed on each.
        ch = await s.connect(G, b"S")
        await ch.subscribe("p", "b", ["*"])
        for r in routers:
            await subscribed(r)
        async with RouterStub([ra.address], **FAST) as sa:
            pub = await sa.connect(G, b"P")
            await pub.publish(("p", "b", ["x"]), b"once", scope="global")
            await eventually(lambda: bridge_of(rb).stats.received
                             == bridge_of(rc).stats.received == 1)
            await trio.sleep(0.3)
            assert [bridge_of(r).stats.forwarded for r in routers] == [1, 0, 0]
            assert [bridge_of(r).stats.received for r in routers] == [0, 1, 1]
            assert [bridge_of(r).stats.echo_dropped for r in routers] == [0, 0, 0]


async def test_broker_restart(nursery: trio.Nursery, broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        pub = await sa.connect(G, b"P")
        near = await sa.connect(G, b"N")
        far = await sb.connect(G, b"F")
        await near.subscribe("p", "b", ["*"])
        await far.subscribe("p", "b", ["*"])
        await subscribed(rb)
        a, b = bridge_of(ra), bridge_of(rb)

        broker.stop()
        await eventually(lambda: a.state != "connected" and b.state != "connected",
                         what="bridges noticed the broker is gone")
        for i in range(5):
            await pub.publish(("p", "b", ["x"]), b"lost %d" % i, scope="global")
        # Local delivery goes on meanwhile; what could not be forwarded is counted.
        assert [x.payload for x in await drain(near, 0.3)] == [b"lost %d" % i for i in range(5)]
        assert a.stats.not_forwarded == 5 and a.stats.forwarded == 0
        subacks_before = b.stats.subacks

        broker.start()
        await eventually(lambda: a.state == b.state == "connected", timeout=10,
                         what="bridges reconnected")
        await subscribed(rb, subacks_before)  # B re-subscribed on its new connection
        await pub.publish(("p", "b", ["x"]), b"after", scope="global")
        with trio.fail_after(5):
            m = await far.receive()
        # The five lost ones are exactly the five counted; nothing else arrived at B.
        assert m.payload == b"after"
        assert await drain(far, 0.2) == []
        assert b.stats.received == 1 and a.stats.forwarded == 1
        assert a.stats.connects == 2 and b.stats.connects == 2


async def test_router_restart_stubs_resubscribe(nursery: trio.Nursery,
                                                broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        pub = await sa.connect(G, b"P")
        far: Channel = await sb.connect(G, b"F")
        await far.subscribe("p", "b", ["+"])
        await subscribed(rb)
        await rb.stop()
        await eventually(lambda: not connected(sb))
        await rb.start()
        await eventually(lambda: connected(sb))
        # The stub re-subscribed, so the new router's bridge subscribed the broker again.
        await eventually(lambda: bridge_of(rb).state == "connected")
        await subscribed(rb)
        await pub.publish(("p", "b", ["x"]), b"after router restart", scope="global")
        with trio.fail_after(5):
            m = await far.receive()
        assert m.payload == b"after router restart"


async def test_bridge_state_in_groups_view_and_metrics(nursery: trio.Nursery,
                                                       broker: Mosquitto) -> None:
    from gossiprouter.ops.admin import bridge_view
    from gossiprouter.ops.metrics import topic_metrics
    from gossiprouter.server import snapshot

    ra, rb = await federation(nursery, broker)
    assert ra.server is not None and rb.server is not None
    view = bridge_view(ra.server.bridge)["bridge"]
    assert view["state"] == "connected" and view["broker"] == broker.url
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        far = await sb.connect(G, b"F")
        await far.subscribe("p", "b", ["*"])
        await subscribed(rb)
        pub = await sa.connect(G, b"P")
        await pub.publish(("p", "b", []), b"m", scope="global")
        await pub.publish(("p", "b", []), b"m")
        with trio.fail_after(5):
            await far.receive()
        # A request answered on the same connection: ra has handled both publications before
        # it (far's copy of the global one can arrive before ra has read the local one).
        await sa.members(G)

        async def samples(r: InProcessRouter
                          ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            assert r.server is not None
            table = r.server.hub.table
            members = await snapshot.membership(table)
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for m in topic_metrics(table.stats, members, r.server.bridge)
                    for s in m.samples}

        a, b = await samples(ra), await samples(rb)
    assert a[("gossiprouter_bridge_state", (("kind", "connected"),))] == 1
    assert a[("gossiprouter_bridge_not_forwarded_total", ())] == 0
    assert a[("gossiprouter_bridge_forwarded_total", ())] == 1
    assert a[("gossiprouter_topic_publications_total", (("kind", "global"),))] == 1
    assert a[("gossiprouter_topic_publications_total", (("kind", "local"),))] == 1
    assert b[("gossiprouter_topic_publications_total", (("kind", "federation"),))] == 1
    assert b[("gossiprouter_topic_deliveries_total", ())] == 1
    assert b[("gossiprouter_topic_subscriptions", ())] == 1
    assert b[("gossiprouter_bridge_subscriptions", ())] == 1
    broker.stop()
    await eventually(lambda: bridge_of(ra).state != "connected")
    assert bridge_view(ra.server.bridge)["bridge"]["state"] in ("disconnected", "connecting")


async def test_a_run_of_global_publications_is_forwarded_one_by_one(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    from gossiprouter.protocol import native as wire
    from tests.nclient import NativeClient

    ra, rb = await federation(nursery, broker)
    async with RouterStub([rb.address], **FAST) as sb:
        far = await sb.connect(G, b"F")
        await far.subscribe("p", "b", ["*"])
        await subscribed(rb)
        c = await NativeClient.open(*ra.address)
        await c.send(wire.Connect(1, G, b"P"))
        assert isinstance(await c.recv(), wire.Ok)
        frames = [wire.Publish(G, b"P", "p", "b", ("x",), wire.PUB_GLOBAL, b"m%02d" % i)
                  for i in range(20)]
        await c.send_raw(b"".join(wire.encode(f) for f in frames))
        with trio.fail_after(5):
            got = [(await far.receive()).payload for _ in frames]
        assert got == [f.payload for f in frames]
        assert bridge_of(ra).stats.forwarded == 20
        await c.aclose()


async def test_serve_bridge_from_the_command_line_and_the_config_file(
        broker: Mosquitto, tmp_path: Path) -> None:
    """``serve --bridge URL`` and the config-file keys (with a user name and password file,
    which mosquitto with allow_anonymous ignores) start a connected bridge; /groups shows it."""
    import json

    from tests.ops_client import http_get
    from tests.procs import RouterProcess

    (tmp_path / "pw").write_text("secret\n")
    conf = tmp_path / "router.toml"
    conf.write_text(f'bridge = "{broker.url}"\nbridge_username = "router"\n'
                    f'bridge_password_file = "{tmp_path / "pw"}"\nbridge_prefix = "fed"\n')
    for args in (("--bridge", broker.url), ("--config", str(conf))):
        mport = free_port()
        with RouterProcess(None, *args, "--metrics", f"127.0.0.1:{mport}"):
            with trio.fail_after(10):
                while True:
                    try:  # the metrics port opens a moment after the router port
                        status, _, body = await http_get(("127.0.0.1", mport), "/groups")
                    except OSError:
                        status, body = 0, b""
                    view = json.loads(body)["bridge"] if status == 200 else {}
                    if view.get("state") == "connected":
                        break
                    await trio.sleep(0.05)
            assert view["broker"] == broker.url
            _, _, metrics = await http_get(("127.0.0.1", mport), "/metrics")
            assert b'gossiprouter_bridge_state{kind="connected"} 1.0' in metrics


async def test_serve_refuses_a_bad_bridge_url_with_one_line() -> None:
    import sys

    r = await trio.run_process([sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
                                "--bridge", "http://127.0.0.1:1"], capture_stdout=True,
                               capture_stderr=True, check=False)
    assert r.returncode != 0
    assert b"mqtt://HOST:PORT" in r.stderr and b"Traceback" not in r.stderr


async def test_bridge_credentials_reach_the_broker(nursery: trio.Nursery, tmp_path: Path) -> None:
    """A broker that wants a password: the right one from bridge_password_file connects,
    a wrong one is refused and reported in the bridge state (and retried, not fatal)."""
    if not shutil.which("mosquitto_passwd"):
        pytest.fail("mosquitto_passwd is not installed")
    pwfile = tmp_path / "mosquitto.passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "router", "s3cret"],
                   check=True, capture_output=True)
    # As root, mosquitto would switch to its own user, who cannot read pytest's tmp dir.
    stay = "user root\n" if os.geteuid() == 0 else ""
    b = Mosquitto(tmp_path, f"{stay}allow_anonymous false\npassword_file {pwfile}\n")
    b.start()
    try:
        good, bad = tmp_path / "good", tmp_path / "bad"
        good.write_text("s3cret\n")
        bad.write_text("wrong\n")
        ok = await InProcessRouter(nursery, bridge=b.url, bridge_username="router",
                          bridge_password_file=str(good)).start()
        refused = await InProcessRouter(nursery, bridge=b.url, bridge_username="router",
                               bridge_password_file=str(bad),
                               bridge_reconnect_max=0.2).start()
        await eventually(lambda: bridge_of(ok).state == "connected")
        await eventually(lambda: "refused" in (bridge_of(refused).last_error or ""))
        assert bridge_of(refused).stats.connects == 0
    finally:
        b.stop()


async def test_publications_beyond_the_unwritten_bound_are_counted_not_queued(
        nursery: trio.Nursery, broker: Mosquitto, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that reads too slowly must not grow the router's memory: past MAX_UNWRITTEN
    packets waiting in paho, global publications are counted as not forwarded."""
    import gossiprouter.federation.broker as bridge_mod

    ra, _ = await federation(nursery, broker)
    a = bridge_of(ra)
    monkeypatch.setattr(bridge_mod, "MAX_UNWRITTEN", 0)
    monkeypatch.setattr(a, "_unwritten", lambda: 1)  # as if one packet were still queued
    tid = topic_id("p", "b", [])
    a.forward(G, b"P", tid, b"x")
    a.forward(G, b"P", tid, b"y")
    assert (a.stats.forwarded, a.stats.not_forwarded) == (0, 2)
    monkeypatch.setattr(a, "_unwritten", lambda: 0)
    a.forward(G, b"P", tid, b"z")
    assert (a.stats.forwarded, a.stats.not_forwarded) == (1, 2)


def test_dedup_remembers_a_window_per_origin() -> None:
    from gossiprouter.federation.publications import DEDUP_WINDOW, _Dedup

    d = _Dedup()
    assert d.first("a", 1) and not d.first("a", 1)
    assert d.first("b", 1)  # another origin, its own numbers
    assert d.first("a", 3) and d.first("a", 2)  # a late one inside the window still counts
    assert not d.first("a", 2)
    assert d.first("a", 10**19)  # a forged huge number (issue 29) ...
    assert d.first("a", 4) and not d.first("a", 4)  # ... poisons none of the later ones
    for n in range(5, 5 + DEDUP_WINDOW):
        assert d.first("a", n)
    assert d.first("a", 1)  # out of the window again: remembered no more


async def test_overlapping_filters_deliver_once(nursery: trio.Nursery,
                                                broker: Mosquitto) -> None:
    """Two members of router B with overlapping patterns: the broker sends B two copies,
    B delivers one to each member and drops the extra copy."""
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        x = await sb.connect(G, b"X")
        y = await sb.connect(G, b"Y")
        await x.subscribe("p", "b", ["*"])
        await y.subscribe("p", "+", ["eu"])
        await eventually(lambda: bridge_of(rb).stats.subacks >= 2)
        pub = await sa.connect(G, b"P")
        await pub.publish(("p", "b", ["eu"]), b"once", scope="global")
        await eventually(lambda: bridge_of(rb).stats.received == 1)
        await eventually(lambda: bridge_of(rb).stats.duplicates_dropped == 1)
        assert [m.payload for m in await drain(x, 0.2)] == [b"once"]
        assert [m.payload for m in await drain(y, 0)] == [b"once"]


async def test_control_characters_in_ids_do_not_break_the_bridge(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """MQTT brokers refuse topics with control characters (mosquitto disconnects the client):
    such levels are escaped, so the publication crosses and the bridge stays connected."""
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        far = await sb.connect(G, b"F")
        await far.subscribe("p", "b", ["*"])
        await subscribed(rb)
        pub = await sa.connect(G, b"P")
        odd = ["line\nbreak", "tab\there", "c1\x85", "del\x7f", "nonchar\ufffe"]
        await pub.publish(("p", "b", odd), b"odd", scope="global")
        await pub.publish(("p", "b", ["plain"]), b"after", scope="global")
        with trio.fail_after(5):
            got = [await far.receive(), await far.receive()]
        assert isinstance(got[0], Publication) and got[0].topic == ("p", "b", tuple(odd))
        assert got[1].payload == b"after"
        assert bridge_of(ra).stats.connects == 1


async def test_a_broker_that_never_answers_connect_is_given_up_and_retried(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    import gossiprouter.federation.broker as bridge_mod

    monkeypatch.setattr(bridge_mod, "CONNACK_TIMEOUT", 0.3)
    accepted: list[trio.SocketStream] = []

    async def mute(stream: trio.SocketStream) -> None:
        accepted.append(stream)  # accept, read nothing, answer nothing
        await trio.sleep_forever()

    listeners = await nursery.start(partial(trio.serve_tcp, mute, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    r = await InProcessRouter(nursery, bridge=f"mqtt://127.0.0.1:{port}",
                     bridge_reconnect_max=0.2).start()
    b = bridge_of(r)
    await eventually(lambda: len(accepted) >= 2, what="a second attempt")
    assert "no CONNACK" in (b.last_error or "")
    assert b.stats.failures >= 1 and b.stats.connects == 0 and b.state != "connected"


async def test_a_stub_on_several_routers_of_one_federation_gets_global_once(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker)
    async with RouterStub([ra.address, rb.address], **FAST) as s, \
            RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        await s.wait_connected(all_routers=True)
        ch = await s.connect(G, b"S")
        await ch.subscribe("p", "b", ["*"])
        await subscribed(ra)
        await subscribed(rb)
        pa, pb = await sa.connect(G, b"PA"), await sb.connect(G, b"PB")
        await pa.publish(("p", "b", []), b"global via A", scope="global")
        await pb.publish(("p", "b", []), b"global via B", scope="global")
        await pb.publish(("p", "b", []), b"local via B")
        await eventually(lambda: s.stats.federated_duplicates == 2)
        got = sorted(m.payload for m in await drain(ch, 0.3))
        assert got == [b"global via A", b"global via B", b"local via B"]
