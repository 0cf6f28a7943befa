"""Issue 29, acceptance 1: the fake-router and address-squat attacks, each against two routers
and a real mosquitto on 127.0.0.1, in both protected deployments of docs/federation.md
("Threat model"):

* ``acl``: the shipped locked-down broker (docs/mosquitto/: TLS, no anonymous client, the
  ``%u`` ACL), the attacker with credentials of its own (user ``mallory``);
* ``key``: an anonymous broker, the routers sharing a ``federation_key_file``, the attacker
  an anonymous plain MQTT client.

Before the trust work both attacks succeeded on an anonymous broker (the issue measured
them): every router believed any presence and record. Each wait is bounded by work (the
victim router's counters), never by the clock.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from gossiprouter.federation import mqtt_topics
from gossiprouter.federation.codec import encode_chunk, pack_member
from gossiprouter.protocol import native as wire
from gossiprouter.routing.entries import RemoteCarrier
from gossiprouter.stub import RouterStub
from tests.federation_routers import FED, G, everywhere, member, routes
from tests.nclient import NativeClient
from tests.ops_client import tokens_file
from tests.stubkit import drain
from tests.test_bridge import MOSQUITTO, Mosquitto, bridge_of
from tests.test_federation_trust import locked_down, mqtt_client, publication, route_message
from tests.test_stub import FAST, InProcessRouter, eventually

FAKE = "0-fake"  # sorts before every real router id
TOKEN = "holder-token-0123456789"


@dataclass
class Deployment:
    """Two routers, ``ra`` and ``rb``, and how the attacker publishes on their broker."""

    kind: str
    broker: Mosquitto
    ra: InProcessRouter
    rb: InProcessRouter
    ca: Path | None

    def client(self) -> Any:
        """The attacker's plain MQTT 5 client, connected: with its own credentials over TLS
        on the locked-down broker, anonymous on the other."""
        from paho.mqtt.client import Client, MQTTv5
        from paho.mqtt.enums import CallbackAPIVersion

        if self.ca is not None:
            c = mqtt_client(self.broker, self.ca, "mallory")
        else:
            c = Client(CallbackAPIVersion.VERSION2, client_id="mallory", protocol=MQTTv5)
        c.connect("127.0.0.1", self.broker.port)
        c.loop_start()
        return c

    def publish(self, msgs: list[tuple[str, bytes, bool]]) -> None:
        """The attacker: a plain MQTT 5 client, QoS 1, one connection, in order; then a
        marker in the attacker's own subtree, routed to rb (refused there: no router
        ``mallory`` carries anyone), so rb has read everything the broker let through."""
        c = self.client()
        prefix = bridge_of(self.rb).prefix
        marker = (mqtt_topics.route_topic(prefix, "mallory", bridge_of(self.rb).origin),
                  route_message("mallory", wire.encode_route(G, None, b"m", b"marker")), False)
        try:
            for topic, payload, retain in [*msgs, marker]:
                c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
        finally:
            c.loop_stop()
            c.disconnect()

    async def attack(self, msgs: list[tuple[str, bytes, bool]]) -> None:
        """Publish ``msgs`` and wait until rb has read what reached it: with the ACL, the
        marker only; with the key, every message, each refused as unauthenticated."""
        fb = bridge_of(self.rb).federation
        await trio.to_thread.run_sync(self.publish, msgs)
        heard: Callable[[], bool] = (
            (lambda: fb.stats.refused == 1) if self.kind == "acl"
            else (lambda: fb.stats.unauthenticated == len(msgs) + 1))
        await eventually(heard, what="the attack read")


@pytest.fixture(params=["acl", "key"])
async def deployment(request: pytest.FixtureRequest, nursery: trio.Nursery,
                     tmp_path: Path) -> Any:
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    holder = tokens_file(tmp_path, f'[[token]]\nidentity = "holder"\ntoken = "{TOKEN}"\n'
                                   f'groups = ["{G}"]\n')
    opts: dict[str, Any] = {**FED, "max_frame": 65536}
    ca: Path | None = None
    if request.param == "acl":
        b, ca = locked_down(tmp_path, ["router-a", "router-b", "mallory"])
        opts |= {"bridge": f"mqtts://127.0.0.1:{b.port}", "bridge_tls_ca": str(ca)}
    else:
        b = Mosquitto(tmp_path)
        key = tmp_path / "fed.key"
        key.write_text("0123456789abcdef-shared\n")
        opts |= {"bridge": b.url, "federation_key_file": str(key)}
    b.start()
    try:
        routers = []
        for user in ("router-a", "router-b"):
            if request.param == "acl":
                (tmp_path / f"{user}.pw").write_text(f"{user}-pw\n")
                who: dict[str, Any] = {"bridge_username": user,
                       "bridge_password_file": str(tmp_path / f"{user}.pw")}
            else:
                who = {"federation_id": user}
            extra: dict[str, Any] = {"tokens_file": str(holder)} if user == "router-b" else {}
            routers.append(await InProcessRouter(nursery, **who, **extra, **opts).start())
        ra, rb = routers
        await eventually(lambda: all(bridge_of(r).federation.synced
                                     and bridge_of(r).federation.live_routers() == 1
                                     for r in routers), what="federation up")
        yield Deployment(request.param, b, ra, rb, ca)
    finally:
        b.stop()


def fake_router(d: Deployment, member_data: list[Any]) -> list[tuple[str, bytes, bool]]:
    """A router ``0-fake`` (its id sorts first) announced with a presence, carrying one
    member in G: what the attacker publishes, retained like a real router's state."""
    prefix = bridge_of(d.ra).prefix
    return [(mqtt_topics.presence_topic(prefix, FAKE), bridge_of(d.ra).federation.presence(),
             True),
            (mqtt_topics.members_topic(prefix, FAKE, G),
             encode_chunk(b"fake-run", 1, 1, 0, [pack_member(member_data)]), True)]


async def test_a_fake_router_that_sorts_first_takes_no_members_traffic(
        deployment: Deployment) -> None:
    """A fake router whose id sorts first claims real member b (live): had it been believed,
    it would be b's preferred carrier on ra and take a's unicasts and multicasts to b.
    ra knows no such router, b stays carried by rb there, and b gets all of a's traffic."""
    d = deployment
    fa = bridge_of(d.ra).federation
    a = await member(d.ra, b"a")
    b = await NativeClient.open(*d.rb.address, token=TOKEN)
    assert isinstance(await b.connect(G, b"b", "b", (("10.0.0.1", 7800),)), wire.Ok)
    await everywhere([d.ra, d.rb], {b"a", b"b"})
    await d.attack(fake_router(d, [b"b", "b", [["10.0.0.1", 7800]], 1, None, True, None]))
    assert FAKE not in fa.routers and fa.live_routers() == 1 and fa.stats.routers_lost == 0
    assert d.ra.server is not None
    entry = d.ra.server.hub.table.entry(G, b"b")
    assert entry is not None and [c.router for c in entry.carriers
                                  if isinstance(c, RemoteCarrier)] == ["router-b"]
    fb = bridge_of(d.rb).federation
    before = fb.stats.routed_in
    await a.send(wire.Route(G, b"b", b"a", b"u1"))
    await a.send(wire.Route(G, None, b"a", b"m1"))
    await eventually(lambda: fb.stats.routed_in == before + 2, what="a's frames at rb")
    assert [(r.dest, r.payload) for r in await routes(b)] == [(b"b", b"u1"), (None, b"m1")]


async def test_an_address_of_a_token_protected_group_cannot_be_squatted(
        deployment: Deployment) -> None:
    """A fake router announces address t in G (whose tokens give it to identity "holder")
    under another identity: had it been believed, the real token holder's CONNECT for t on
    rb would get ``address_in_use``. It gets OK, and t is a member on both routers."""
    d = deployment
    await d.attack(fake_router(d, [b"t", "t", [["10.0.0.9", 7800]], 1, "squatter", True, None]))
    fb = bridge_of(d.rb).federation
    assert FAKE not in fb.routers and fb.live_routers() == 1
    holder = await NativeClient.open(*d.rb.address, token=TOKEN)
    reply = await holder.connect(G, b"t", "t", (("10.0.0.1", 7800),))
    assert isinstance(reply, wire.Ok), reply
    await everywhere([d.ra, d.rb], {b"t"})


async def test_publications_cannot_poison_the_dedup_nor_deliver_an_oversized_retained_one(
        deployment: Deployment) -> None:
    """Topic publications are open to plain MQTT clients by design (no ACL confines them, the
    key does not cover them), so the routers' own checks are what holds, in both deployments:
    a retained publication above max_frame reaches no subscriber, at its subscription or a
    later one, and one huge sequence number does not make the origin's later ones duplicates.
    (tests/test_federation_trust.py shows the same on an anonymous broker without a key.)"""
    d = deployment
    st, prefix = bridge_of(d.ra).stats, bridge_of(d.ra).prefix
    async with RouterStub([d.ra.address], **FAST) as sa:
        x = await sa.connect(G, b"X")
        await x.subscribe("p", "b", ["*"])
        await eventually(lambda: st.subacks >= 1, what="subscribed")

        def attack() -> None:
            c = d.client()
            try:
                for m in [{**publication(prefix, b"x" * 100_000), "retain": True},
                          publication(prefix, b"poison", "o/run", 10**19),
                          publication(prefix, b"after", "o/run", 1)]:
                    c.publish(m["topic"], m["payload"], qos=1, retain=m.get("retain", False),
                              properties=m.get("properties")).wait_for_publish(10)
            finally:
                c.loop_stop()
                c.disconnect()

        await trio.to_thread.run_sync(attack)
        await eventually(lambda: st.received == 2 and st.too_large == 1, what="publications")
        assert [m.payload for m in await drain(x, 0.2)] == [b"poison", b"after"]
        assert st.duplicates_dropped == 0
        await x.subscribe("p", "+", ["eu"])  # the retained copy again: never delivered
        await eventually(lambda: st.too_large == 2, what="the retained copy")
        y = await sa.connect(G, b"Y")
        await y.publish(("p", "b", ["eu"]), b"still connected", scope="local")
        assert [m.payload for m in await drain(x, 0.2)] == [b"still connected"]
