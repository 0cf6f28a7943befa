"""An authenticated, bounded federation (docs/federation.md, "Threat model"): what a client of
the broker that is not a router can try, against in-process routers and a real mosquitto on
127.0.0.1. The attacker is a plain paho client.

Every wait is bounded by work (the routers' counters), never by the clock.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trustme

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.federation import mqtt_topics, signing
from gossiprouter.federation.bridge import Bridge
from gossiprouter.federation.codec import encode_chunk, pack_member
from gossiprouter.federation.frames import check_routed
from gossiprouter.federation.mqtt_topics import escape_level
from gossiprouter.federation.signing import MAC_PROPERTY, Signer, Verifier
from gossiprouter.ops.metrics import federation_metrics
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from gossiprouter.stub import RouterStub
from tests.federation_routers import (
    FED,
    G,
    everywhere,
    federation,
    member,
    routes,
    table_members,
)
from tests.stubkit import drain
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_stub import FAST, InProcessRouter, eventually


def publish(broker: Mosquitto, msgs: list[tuple[str, bytes]], retain: bool = False,
            **auth: Any) -> None:
    """The attacker: a plain MQTT 5 client (not a router) publishes ``msgs``, QoS 1, in order."""
    from paho.mqtt import publish as paho_publish
    from paho.mqtt.client import MQTTv5

    paho_publish.multiple([{"topic": t, "payload": p, "qos": 1, "retain": retain}
                           for t, p in msgs],
                          hostname="127.0.0.1", port=broker.port, protocol=MQTTv5,
                          client_id="", **auth)


def route_to(victim: InProcessRouter, sender: str) -> str:
    """The topic where router ``sender`` sends routed frames to ``victim``."""
    return mqtt_topics.route_topic(bridge_of(victim).prefix, sender, bridge_of(victim).origin)


def route_message(origin: str, frames: bytes, count: int = 1) -> bytes:
    """A routed message with a well-formed header (codec.encode_route, written by hand)."""
    head: bytes = msgpack.packb([origin, G, None, count])
    return len(head).to_bytes(2, "big") + head + frames


def counters(r: InProcessRouter) -> dict[str, float]:
    return {x.name + "".join(x.labels.values()): x.value
            for m in federation_metrics(bridge_of(r)) for x in m.samples}


async def test_route_topic_injection_never_reaches_a_client_socket(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Raw bytes, a bogus 5-byte length prefix and a ROUTE spoofed "from" a member the
    origin router does not carry, published on a router's route topic: none of it reaches
    the member's socket, each is counted, and the member keeps receiving its peers' frames."""
    ra, rb = await federation(nursery, broker, 2)
    a = await member(ra, b"a")
    b = await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"b"})
    fb = bridge_of(rb).federation
    origin = bridge_of(ra).origin
    topic = route_to(rb, origin)
    await trio.to_thread.run_sync(publish, broker, [
        (topic, b"raw bytes, no header"),
        (topic, route_message(origin, b"\x00\x10\x00\x00\x01")),
        (topic, route_message(origin, wire.encode_route(G, None, b"zz", b"spoofed"))),
        (topic, route_message(origin, wire.encode_route(G, None, b"a", b"two?"), count=2)),
    ])
    await eventually(lambda: fb.stats.malformed == 1 and fb.stats.routed_in == 4,
                     what="the attack received")
    assert fb.stats.refused == 4 and fb.stats.delivered_in == 0
    assert counters(rb)["gossiprouter_federation_frames_totalrefused"] == 4
    # b's stream is whole: the next frames from a arrive, and only they.
    await a.send(wire.Route(G, None, b"a", b"m1"))
    await a.send(wire.Route(G, b"b", b"a", b"u1"))
    await eventually(lambda: fb.stats.routed_in == 6, what="a's frames received")
    assert [(r.sender, r.dest, r.payload) for r in await routes(b)] == [
        (b"a", None, b"m1"), (b"a", b"b", b"u1")]
    assert fb.stats.refused == 4


async def test_a_message_about_a_router_is_read_only_from_its_own_subtree(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Router A's Last Will and record forged where the pre-issue-29 layout kept them (one
    shared ``router/`` and ``members/`` level that anyone wrote), and A's routed frames
    published in another router's subtree: B drops none of A's members and delivers nothing."""
    ra, rb = await federation(nursery, broker, 2)
    a = await member(ra, b"a")
    b = await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"b"})
    fb = bridge_of(rb).federation
    prefix, origin = bridge_of(ra).prefix, bridge_of(ra).origin
    await trio.to_thread.run_sync(lambda: publish(broker, [
        (f"{prefix}/%fed/router/{escape_level(origin)}", b""),  # A's Last Will
        (f"{prefix}/%fed/members/{escape_level(origin)}/{G}", b""),  # A's record, emptied
        (mqtt_topics.presence_topic(prefix, "evil"), b""),  # a Last Will of nobody
    ], retain=True))
    await trio.to_thread.run_sync(publish, broker, [
        # A's frames (from a, whom A carries), written in the subtree of a router "evil".
        (route_to(rb, "evil"), route_message(origin, wire.encode_route(G, None, b"a", b"x"))),
    ])
    await eventually(lambda: fb.stats.malformed == 1, what="the attack received")
    assert fb.stats.routed_in == 0 and fb.stats.routers_lost == 0
    assert fb.live_routers() == 1 and table_members(rb) == {b"a", b"b"}
    assert await routes(b) == [] and await routes(a) == []


async def test_the_federation_id_is_configured_and_is_the_mqtt_user_name(
        nursery: trio.Nursery, broker: Mosquitto, caplog: pytest.LogCaptureFixture) -> None:
    """The router id is the MQTT user name (or federation_id), the same at every start, and
    names the router's subtree and MQTT client id; a router with neither warns."""
    ra = await InProcessRouter(nursery, bridge=broker.url, bridge_username="router-a",
                               **FED).start()
    rb = await InProcessRouter(nursery, bridge=broker.url, federation_id="router-b",
                               **FED).start()
    with caplog.at_level(logging.WARNING, "gossiprouter.federation.bridge"):
        rc = await InProcessRouter(nursery, bridge=broker.url, **FED).start()
    assert (bridge_of(ra).origin, bridge_of(rb).origin) == ("router-a", "router-b")
    assert "random federation id" in caplog.text and bridge_of(rc).origin in caplog.text
    fc = bridge_of(rc).federation
    await eventually(lambda: fc.synced and fc.live_routers() == 2, what="federation up")
    assert [p["origin"] for p in fc.peers()] == ["router-a", "router-b"]
    log = broker.log.read_text()
    assert "as gossiprouter-router-a (p5" in log and "u'router-a'" in log
    assert "as gossiprouter-router-b (p5" in log
    for bad in ("a/b", "a b", "#", "x%y"):
        with pytest.raises(ConfigError, match="federation_id"):
            Bridge(Hub(Config(bridge=(broker.url,), federation_id=bad)),
                   Config(bridge=(broker.url,), federation_id=bad))
    with pytest.raises(ConfigError, match="set federation_id"):
        Bridge(Hub(Config(bridge=(broker.url,), bridge_username="a/b")),
               Config(bridge=(broker.url,), bridge_username="a/b"))


def signed(value: str) -> Any:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [(MAC_PROPERTY, value)]
    return props


async def test_with_a_federation_key_nothing_unsigned_badly_signed_or_replayed_is_read(
        nursery: trio.Nursery, broker: Mosquitto, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """On an anonymous broker, routers sharing a key: a forged Last Will, a fake router, a
    record and frames unsigned or signed with another key, and a replayed genuine message
    are all refused and counted; the routers' own traffic goes on."""
    key = tmp_path / "fed.key"
    key.write_text("0123456789abcdef-shared\n")
    with caplog.at_level(logging.WARNING, "gossiprouter.federation.bridge"):
        ra, rb = await federation(nursery, broker, 2, federation_key_file=str(key))
    assert "no broker credentials" not in caplog.text
    a = await member(ra, b"a")
    b = await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"b"})
    fb = bridge_of(rb).federation
    prefix, origin = bridge_of(ra).prefix, bridge_of(ra).origin
    frames = wire.encode_route(G, None, b"a", b"forged")
    route = route_message(origin, frames)
    topic = route_to(rb, origin)
    wrong = Signer(b"another key, 16+ bytes", "run").sign(topic, route, "route")
    signer = bridge_of(ra)._signer
    assert signer is not None
    genuine = signer.sign(topic, route, "route")

    def attack() -> None:
        from paho.mqtt import publish as paho_publish
        from paho.mqtt.client import MQTTv5

        msgs: list[dict[str, Any]] = [
            {"topic": mqtt_topics.presence_topic(prefix, origin), "payload": b"",
             "retain": True},  # A's Last Will, unsigned
            {"topic": mqtt_topics.presence_topic(prefix, "0-fake"),
             "payload": bridge_of(ra).federation.presence(), "retain": True},
            {"topic": mqtt_topics.members_topic(prefix, origin, G), "payload": b"",
             "retain": True, "properties": signed(wrong)},
            {"topic": topic, "payload": route, "properties": signed(wrong)},
            {"topic": topic, "payload": route, "properties": signed(genuine)},  # accepted
            {"topic": topic, "payload": route, "properties": signed(genuine)},  # replayed
        ]
        batch: Any = [{"qos": 1, **m} for m in msgs]
        paho_publish.multiple(batch, hostname="127.0.0.1", port=broker.port, protocol=MQTTv5,
                              client_id="")

    await trio.to_thread.run_sync(attack)
    await eventually(lambda: fb.stats.unauthenticated == 5, what="the attack refused")
    assert counters(rb)["gossiprouter_federation_unauthenticated_total"] == 5
    assert fb.live_routers() == 1 and fb.stats.routers_lost == 0
    assert table_members(rb) == {b"a", b"b"}
    await a.send(wire.Route(G, b"b", b"a", b"u1"))
    await eventually(lambda: fb.stats.routed_in == 2, what="a's frame")
    assert [(r.sender, r.payload) for r in await routes(b)] == [(b"a", b"forged"),
                                                                 (b"a", b"u1")]
    assert fb.stats.unauthenticated == 5
    # A router without the key is not heard.
    with caplog.at_level(logging.WARNING, "gossiprouter.federation.bridge"):
        rc = await InProcessRouter(nursery, bridge=broker.url, **FED).start()
    assert "no broker credentials and no federation_key_file" in caplog.text
    fc = bridge_of(rc).federation
    await eventually(lambda: fc.synced and fb.stats.unauthenticated == 6,
                     what="the keyless router refused")
    assert fb.live_routers() == 1
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        (tmp_path / "short").write_text("short")
        Bridge(Hub(Config()), Config(bridge=(broker.url,), federation_key_file=str(
            tmp_path / "short")))


def test_the_verifier_refuses_old_state_and_wills_of_other_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sans-IO: retained state never goes back in time on a topic (a deletion included), a
    Last Will counts only for the run whose presence is current, a changed byte fails."""
    clock = iter(range(10**12, 10**12 + 100))  # a millisecond clock that moves at each call
    monkeypatch.setattr(signing, "_now_ms", lambda: next(clock))
    key = b"k" * 16
    old, new = Signer(key, "run1"), Signer(key, "run2")
    v = Verifier(key)
    p, r = "%fed/p/a/presence", "%fed/p/a/members/g"

    def check(topic: str, payload: bytes, sig: str, kind: str, **kw: Any) -> str | None:
        return v.check(topic, payload, sig, writer="a", kind=kind, **kw)

    will_1 = old.sign(p, b"", "presence")
    rec_1 = old.sign(r, b"rec1", "members")
    assert check(p, b"pres", old.sign(p, b"pres", "presence"), "presence") is None
    assert check(r, b"rec1", rec_1, "members") is None
    assert check(r, b"rec1", rec_1, "members") is None  # the broker's copy at a resync
    assert check(r, b"rec2", rec_1, "members") == "bad signature"
    assert check(p, b"pres", new.sign(p, b"pres", "presence"), "presence") is None
    assert check(p, b"", will_1, "presence", last_will=True) == "a Last Will of another run"
    assert check(p, b"", new.sign(p, b"", "presence"), "presence", last_will=True) is None
    deletion = new.sign(r, b"", "members")
    assert check(r, b"", deletion, "members") is None
    assert check(r, b"", deletion, "members") == "replayed"
    assert check(r, b"rec1", rec_1, "members") == (
        "older than the state accepted before on this topic")
    assert check(r, b"x", None, "members") == "unsigned"  # type: ignore[arg-type]


def publication(prefix: str, payload: bytes, origin: str | None = None,
                seq: int | None = None) -> dict[str, Any]:
    """A global publication to ("p", "b", ["eu"]) in G as a plain MQTT client writes it,
    optionally with a router's origin and sequence number."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from gossiprouter.federation.publications import ORIGIN_PROPERTY, SEQ_PROPERTY

    msg: dict[str, Any] = {"topic": mqtt_topics.mqtt_topic(prefix, G, ("p", "b", ("eu",))),
                           "payload": payload, "qos": 1}
    if origin is not None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(ORIGIN_PROPERTY, origin), (SEQ_PROPERTY, str(seq))]
        msg["properties"] = props
    return msg


async def test_remote_state_is_bounded_like_local_state(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """A router announced by a plain client (anonymous broker, no key: the records are
    believed) cannot grow a router past max_groups or federation_members_per_router; a
    retained publication beyond max_frame reaches no subscriber (who stays connected); one
    huge sequence number does not make the origin's later publications duplicates."""
    rb = await InProcessRouter(nursery, bridge=broker.url, max_groups=5, max_frame=65536,
                               federation_members_per_router=10, **FED).start()
    fb, prefix = bridge_of(rb).federation, bridge_of(rb).prefix
    await eventually(lambda: fb.synced, what="router up")

    def member_of(i: int) -> list[Any]:
        return [b"m%d" % i, None, [["10.0.0.1", 7800]], 1, None, True, None]

    def record(members: list[list[Any]], seq: int = 1) -> bytes:  # a one-chunk snapshot
        return encode_chunk(b"fake", seq, 1, 0, [pack_member(m) for m in members])

    records = [(f"g{i}", record([member_of(i)])) for i in range(20)]
    records.append(("big", record([member_of(100 + i) for i in range(50)])))
    async with RouterStub([rb.address], **FAST) as sb:
        x = await sb.connect(G, b"X")  # a local group: 1 of the 5
        await x.subscribe("p", "b", ["*"])
        st = bridge_of(rb).stats
        await eventually(lambda: st.subacks >= 1, what="subscribed")
        await trio.to_thread.run_sync(lambda: publish(broker, [
            (mqtt_topics.presence_topic(prefix, "fake"), fb.presence()),
            *((mqtt_topics.members_topic(prefix, "fake", g), r) for g, r in records)],
            retain=True))
        await eventually(lambda: fb.stats.records_in == 21, what="the records")
        assert rb.server is not None
        assert len(rb.server.hub.table.groups) == 5 and fb.remote_members() == 4
        assert fb.stats.conflicts == 16 + 50
        # The 10-member cap, alone: the big group's first 10 only, once there is room.
        for g in ("g0", "g1", "g2", "g3"):
            await trio.to_thread.run_sync(lambda g=g: publish(  # type: ignore[misc]
                broker, [(mqtt_topics.members_topic(prefix, "fake", g), b"")], retain=True))
        await trio.to_thread.run_sync(lambda: publish(broker, [
            (mqtt_topics.members_topic(prefix, "fake", "big"),
             record([member_of(100 + i) for i in range(50)], 2))], retain=True))
        await eventually(lambda: fb.stats.records_in == 26, what="the big record again")
        assert fb.remote_members() == 10

        def attack() -> None:
            from paho.mqtt import publish as paho_publish
            from paho.mqtt.client import MQTTv5

            batch: Any = [{**publication(prefix, b"x" * 100_000), "retain": True},
                          publication(prefix, b"poison", "o/run", 10**19),
                          publication(prefix, b"after", "o/run", 1)]
            paho_publish.multiple(batch, hostname="127.0.0.1", port=broker.port,
                                  protocol=MQTTv5, client_id="")

        await trio.to_thread.run_sync(attack)
        await eventually(lambda: st.received == 2 and st.too_large == 1, what="publications")
        assert [m.payload for m in await drain(x, 0.2)] == [b"poison", b"after"]
        assert st.duplicates_dropped == 0
        # The retained one again, at a new subscription: never delivered either.
        await x.subscribe("p", "+", ["eu"])
        await eventually(lambda: st.too_large == 2, what="the retained copy")
        y = await sb.connect(G, b"Y")
        await y.publish(("p", "b", ["eu"]), b"still connected", scope="local")
        assert [m.payload for m in await drain(x, 0.2)] == [b"still connected"]


SHIPPED = Path(__file__).parent.parent / "docs" / "mosquitto"


def locked_down(tmp: Path, users: list[str]) -> tuple[Mosquitto, Path]:
    """mosquitto with the shipped docs/mosquitto/ configuration, on 127.0.0.1: only its paths
    and port replaced (and, as root, the user it runs as). The password file is made by
    mosquitto_passwd (password = user name + "-pw"), the TLS certificates by trustme.
    Returns the broker and the CA's PEM."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp / "server.pem"))
    server.private_key_pem.write_to_path(str(tmp / "server.key"))
    passwd = tmp / "passwd"
    for i, user in enumerate(users):
        subprocess.run([shutil.which("mosquitto_passwd") or "mosquitto_passwd", "-b",
                        *(["-c"] if i == 0 else []), str(passwd), user, f"{user}-pw"],
                       check=True, capture_output=True)
    (tmp / "acl").write_text((SHIPPED / "acl").read_text())
    b = Mosquitto(tmp)
    conf = (SHIPPED / "mosquitto.conf").read_text()
    conf = conf.replace("/etc/mosquitto/gossiprouter/", f"{tmp}/")
    conf = conf.replace("listener 8883", f"listener {b.port} 127.0.0.1")
    conf = conf.replace("persistence true", "persistence false")
    assert "allow_anonymous false" in conf and "acl_file" in conf and "certfile" in conf
    if os.geteuid() == 0:
        # Started as root, mosquitto reads these files as the user "mosquitto", who cannot
        # enter pytest's private temporary directories.
        conf += "user root\n"
    b.conf.write_text(conf)
    return b, tmp / "ca.pem"


def mqtt_client(b: Mosquitto, ca: Path, user: str | None) -> Any:
    """A plain paho client over TLS, as ``user`` (None: anonymous); CONNACK's reason code."""
    from paho.mqtt.client import Client, MQTTv5
    from paho.mqtt.enums import CallbackAPIVersion

    c = Client(CallbackAPIVersion.VERSION2, client_id=f"attacker-{user}", protocol=MQTTv5)
    c.tls_set(ca_certs=str(ca))
    if user is not None:
        c.username_pw_set(user, f"{user}-pw")
    return c


def connack(b: Mosquitto, ca: Path, user: str | None) -> str:
    import threading

    c = mqtt_client(b, ca, user)
    result: list[str] = []
    done = threading.Event()

    def on_connect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        result.append(str(rc))
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    done.wait(10)
    c.loop_stop()
    c.disconnect()
    return result[0] if result else "no CONNACK"


async def test_the_shipped_locked_down_broker_confines_each_router_to_its_subtree(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """The shipped mosquitto configuration (TLS, no anonymous client, a password per router,
    the %u ACL): two routers federate through it; an anonymous client cannot connect; router
    A's credentials cannot write router B's Last Will, record or routed frames."""
    b, ca = locked_down(tmp_path, ["router-a", "router-b"])
    b.start()
    try:
        assert await trio.to_thread.run_sync(connack, b, ca, None) == "Not authorized"
        opts: dict[str, Any] = {**FED, "bridge": f"mqtts://127.0.0.1:{b.port}",
                                "bridge_tls_ca": str(ca)}
        routers = []
        for user in ("router-a", "router-b"):
            (tmp_path / f"{user}.pw").write_text(f"{user}-pw\n")
            routers.append(await InProcessRouter(
                nursery, bridge_username=user, bridge_password_file=str(tmp_path / f"{user}.pw"),
                **opts).start())
        ra, rb = routers
        fa = bridge_of(ra).federation
        await eventually(lambda: fa.synced and fa.live_routers() == 1, what="federation up")
        a = await member(ra, b"a")
        bm = await member(rb, b"b")
        await everywhere([ra, rb], {b"a", b"b"})
        prefix = bridge_of(ra).prefix

        def attack() -> None:
            c = mqtt_client(b, ca, "router-a")
            c.connect("127.0.0.1", b.port)
            c.loop_start()
            forged = [  # everything of router B's, written with A's credentials
                (mqtt_topics.presence_topic(prefix, "router-b"), b"", True),
                (mqtt_topics.members_topic(prefix, "router-b", G), b"", True),
                (mqtt_topics.route_topic(prefix, "router-b", "router-a"),
                 route_message("router-b", wire.encode_route(G, None, b"b", b"forged")),
                 False),
                # A marker that A's credentials may write and A reads: to itself, refused.
                (mqtt_topics.route_topic(prefix, "router-a", "router-a"),
                 route_message("router-a", b"marker"), False),
            ]
            for topic, payload, retain in forged:
                c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
            c.loop_stop()
            c.disconnect()

        await trio.to_thread.run_sync(attack)
        # The marker, in A's own subtree, is allowed: A reads it after whatever of the
        # forged messages the broker let through (one connection, in order).
        await eventually(lambda: fa.stats.refused == 1, what="the marker")
        assert fa.stats.routers_lost == 0 and fa.stats.routed_in == 1
        assert table_members(ra) == {b"a", b"b"} and fa.live_routers() == 1
        assert await routes(a) == []
        await bm.send(wire.Route(G, b"a", b"b", b"real"))
        await eventually(lambda: fa.stats.routed_in == 2, what="B's real frame")
        assert [r.payload for r in await routes(a)] == [b"real"]
    finally:
        b.stop()


def test_routed_frames_are_read_as_the_receivers_protocol() -> None:
    """Sans-IO (frames.check_routed), per protocol family: whole messages only, exactly as
    many as announced, within max_frame, from a sender the sending router carries."""
    from gossiprouter.protocol import jgroups2 as j2
    from gossiprouter.protocol import jgroups5 as j5
    from gossiprouter.protocol.jgroups_address import JAddress

    src = JAddress.from_uuid(1, 2, version=5)
    other = JAddress.from_uuid(3, 4, version=5)
    ok5 = j5.message("g", None, src, b"hello")
    senders = {src.key}
    assert check_routed("jgroups5:g", ok5 * 2, 2, 1 << 20, senders) is None
    for bad, count in ((ok5, 2), (ok5[:-1], 1), (ok5 + b"\x00", 1), (j5.heartbeat(), 1),
                       (j5.message("g", None, other, b"spoof"), 1)):
        assert check_routed("jgroups5:g", bad, count, 1 << 20, senders) is not None
    # A member of g, on its router, with a MESSAGE of another cluster: not g's members' to get.
    assert check_routed("jgroups5:g", j5.message("h", None, src, b"x"), 1, 1 << 20,
                        senders) == "a MESSAGE of group 'h'"
    assert check_routed("jgroups5:g", ok5, 1, len(ok5) - 5, senders) is not None
    ok2 = j2.message_to_client(None, b"hello")
    assert check_routed("jgroups2:g", ok2, 1, 1 << 20, ()) is None
    for bad in (ok2[:-2], ok2 + b"\x01", j2.suspect(None)):
        assert check_routed("jgroups2:g", bad, 1, 1 << 20, ()) is not None
    ok = wire.encode_route(G, None, b"a", b"x")
    assert check_routed(G, ok, 1, 1 << 20, {b"a"}) is None
    assert check_routed(G, wire.encode_route("other", None, b"a", b"x"), 1, 1 << 20,
                        {b"a"}) == "a ROUTE of group 'other'"
    assert check_routed(G, ok, 1, len(ok) - 5, {b"a"}) is not None


def test_routed_native_frames_are_checked_alike_with_the_scanner_kept() -> None:
    """The native check keeps its scanner (and its header cache) across routed messages
    (frames._scanner): a header seen before is still checked against this message's group,
    senders and bound, never taken as accepted."""
    from gossiprouter.federation.frames import _scanner

    ok = wire.encode_route(G, None, b"a", b"x") * 3
    for _ in range(2):  # the second time from the cache
        assert check_routed(G, ok, 3, 1 << 20, {b"a"}) is None
    assert _scanner(1 << 20).header(ok, 4) is not None  # learned once, kept
    assert _scanner(1 << 20) is _scanner(1 << 20)
    assert check_routed(G, ok, 3, 1 << 20, {b"b"}) is not None  # no longer carried
    assert check_routed(G, ok, 2, 1 << 20, {b"a"}) is not None  # not as announced
    assert check_routed(G, ok, 3, 8, {b"a"}) is not None  # another bound: its own scanner
    assert check_routed(G, ok + ok[:5], 3, 1 << 20, {b"a"}) is not None  # a cut frame
