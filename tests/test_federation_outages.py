"""The federation on its bad days (issue 29, "Availability"): a real mosquitto stopped and
started again on the same port, with members on two in-process routers. Each test is bound by
what the routers count and what the members receive, never by how long anything took."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from gossiprouter.loadtest.processes import MOSQUITTO
from gossiprouter.ops.metrics import peer_metrics
from gossiprouter.protocol import native as wire
from tests.federation_routers import G, everywhere, federation, member, table_members
from tests.nclient import NativeClient
from tests.procs import BrokerProcess, wait_bridged
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_stub import InProcessRouter, eventually

# The default grace (tens of seconds): far longer than any outage below.
GRACED: dict[str, Any] = {"federation_grace": 30.0}
FAST_BACKOFF: dict[str, Any] = {"bridge_reconnect_max": 0.3, "bridge_keepalive": 1}


def events_in(frames: list[wire.Frame]) -> list[tuple[str, bytes]]:
    return [(f.kind, f.addr) for f in frames if isinstance(f, wire.Event)]


async def traffic_flows(src: NativeClient, src_addr: bytes, dst: InProcessRouter,
                        payload: bytes) -> None:
    """Unicasts from ``src`` to member b on ``dst`` until one crosses (the first ones after a
    reconnect may reach a broker before the other router subscribed again)."""
    fed = bridge_of(dst).federation
    with trio.fail_after(15):
        while True:
            before = fed.stats.routed_in
            await src.send(wire.Route(G, b"b", src_addr, payload))
            with trio.move_on_after(0.3):
                await eventually(lambda b=before: fed.stats.routed_in > b)  # type: ignore[misc]
                return


async def test_a_short_broker_restart_makes_no_member_leave_or_suspected(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Acceptance 4: a 2 s broker restart (SIGTERM: mosquitto publishes every Last Will as it
    stops, then starts again empty). Within the grace, no watcher on either router sees a
    leave, a join or a suspect, the remote members never leave the tables, and a unicast
    crosses again once both routers are back."""
    ra, rb = await federation(nursery, broker, 2, **GRACED)
    a, b = await member(ra, b"a"), await member(rb, b"b")
    wa, wb = await member(ra, b"wa"), await member(rb, b"wb")
    for w in (wa, wb):
        assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    everyone = {b"a", b"b", b"wa", b"wb"}
    await everywhere([ra, rb], everyone)
    for c in (a, b, wa, wb):
        await c.round_trip()  # the joins so far: read and forgotten
    fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
    resyncs = (fa.stats.resyncs, fb.stats.resyncs)

    broker.stop()
    await eventually(lambda: bridge_of(ra).state != "connected"
                     and bridge_of(rb).state != "connected", what="both cut off")
    await trio.sleep(2.0)  # the outage itself (nothing is asserted on how long anything took)
    assert table_members(ra) == table_members(rb) == everyone
    broker.start()
    await eventually(lambda: fa.stats.resyncs > resyncs[0] and fb.stats.resyncs > resyncs[1]
                     and fa.graced_routers() == fb.graced_routers() == 0
                     and fa.live_routers() == fb.live_routers() == 1,
                     timeout=15, what="both back, nobody in grace")
    await traffic_flows(a, b"a", rb, b"after")
    got = [f for f in await b.round_trip() if isinstance(f, wire.Route)]
    assert [r.payload for r in got][-1:] == [b"after"]

    assert table_members(ra) == table_members(rb) == everyone
    for c in (a, b, wa, wb):
        assert events_in(await c.round_trip()) == []
    assert fa.stats.routers_lost == fb.stats.routers_lost == 0
    assert fa.stats.routers_revived >= 1 and fb.stats.routers_revived >= 1


async def watched_pair(ra: InProcessRouter, rb: InProcessRouter
                       ) -> tuple[NativeClient, NativeClient, list[NativeClient]]:
    """Member a on ``ra``, b on ``rb``, and a watcher on each; every join so far read."""
    a, b = await member(ra, b"a"), await member(rb, b"b")
    wa, wb = await member(ra, b"wa"), await member(rb, b"wb")
    for w in (wa, wb):
        assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    await everywhere([ra, rb], {b"a", b"b", b"wa", b"wb"})
    for c in (a, b, wa, wb):
        await c.round_trip()
    return a, b, [a, b, wa, wb]


async def test_a_router_fails_over_to_the_next_broker_and_nobody_is_suspected(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Acceptance 3: brokers A and B joined by a mosquitto bridge; router ra lists both (A
    first), rb only B. A is killed (SIGKILL): ra moves to B, and no member anywhere sees a
    suspect, a leave or a join; a unicast crosses again afterwards."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    with BrokerProcess(tmp_path) as ba, BrokerProcess(tmp_path, bridge_to=ba.port) as bb:
        wait_bridged(ba, bb)
        ra = await InProcessRouter(nursery, bridge=(ba.url, bb.url), router_id="ra",
                                   **FAST_BACKOFF, **GRACED).start()
        rb = await InProcessRouter(nursery, bridge=bb.url, router_id="rb",
                                   **FAST_BACKOFF, **GRACED).start()
        fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
        await eventually(lambda: fa.live_routers() == fb.live_routers() == 1 and fa.synced
                         and fb.synced, timeout=10, what="federation up across the bridge")
        assert bridge_of(ra).port == ba.port
        a, _, clients = await watched_pair(ra, rb)

        assert ba.proc is not None
        ba.proc.kill()
        ba.proc.wait()
        await eventually(lambda: bridge_of(ra).state == "connected"
                         and bridge_of(ra).port == bb.port and fa.stats.resyncs >= 2
                         and fa.graced_routers() == fb.graced_routers() == 0,
                         timeout=15, what="ra on broker B, nobody in grace")
        assert bridge_of(ra).stats.failovers >= 1
        await traffic_flows(a, b"a", rb, b"after")
        assert table_members(ra) == table_members(rb) == {b"a", b"b", b"wa", b"wb"}
        for c in clients:
            assert events_in(await c.round_trip()) == []
        assert fa.stats.routers_lost == fb.stats.routers_lost == 0


def test_bridge_takes_one_url_or_a_list_of_one_scheme(tmp_path: Path) -> None:
    """``bridge`` as one URL (as before), comma-separated, a TOML array, or --bridge
    repeated; several URLs of mixed schemes are refused with the cause."""
    from click.testing import CliRunner

    from gossiprouter.cli.main import main
    from gossiprouter.core.config import Config, ConfigError, load_file
    from gossiprouter.federation.bridge import Bridge
    from gossiprouter.sessions.base import Hub

    one, two = "mqtt://127.0.0.1:1", "mqtt://127.0.0.1:2"
    assert Config(bridge=one).bridge == (one,)  # type: ignore[arg-type]
    assert Config(bridge=f"{one}, {two}").bridge == (one, two)  # type: ignore[arg-type]
    f = tmp_path / "r.toml"
    f.write_text(f'bridge = ["{one}", "{two}"]\n')
    assert load_file(f)["bridge"] == (one, two)
    f.write_text(f'bridge = "{one}"\n')
    assert Config(**load_file(f)).bridge == (one,)
    cfg = Config(bridge=(one, two))
    b = Bridge(Hub(cfg), cfg)
    assert [e[2] for e in b.endpoints] == [1, 2] and b.port == 1
    assert b._failover() and b.port == 2 and not b._failover() and b.port == 1
    mixed = Config(bridge=(one, "mqtts://127.0.0.1:3"))
    with pytest.raises(ConfigError, match="mixes mqtt:// and mqtts://"):
        Bridge(Hub(mixed), mixed)
    res = CliRunner().invoke(main, ["serve", "--bridge", one, "--bridge", "ftp://x",
                                    "--port", "0"])
    assert res.exit_code == 2 and "ftp://x" in res.output


def rss() -> int:
    """This process's resident set, in bytes (the in-process routers live here)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


MIB = 1024 * 1024


async def test_a_stalled_broker_cannot_grow_the_router_beyond_its_queue_bound(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Acceptance 7: the broker is stopped (SIGSTOP: its socket stays open, it reads nothing)
    while a member sends 64 unicasts of 1 MiB to a member on the other router. The bytes
    waiting for the broker never exceed bridge_queue_bytes (4 MiB), the rest is dropped and
    counted, and this process (the routers') grows by less than the bound and a margin for
    the allocator, where the 64 MiB sent would otherwise all wait in the MQTT client."""
    bound = 4 * MIB
    ra, rb = await federation(nursery, broker, 2, bridge_keepalive=600,
                              bridge_queue_bytes=bound, **GRACED)
    a, _b = await member(ra, b"a"), await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"b"})
    await traffic_flows(a, b"a", rb, b"warm-up")
    bridge, fed = bridge_of(ra), bridge_of(ra).federation
    payload = b"x" * MIB
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:
        before, out_before = rss(), fed.stats.routed_out
        most = 0
        for _ in range(64):
            await a.send(wire.Route(G, b"b", b"a", payload))
            await a.round_trip()  # the router has handled it
            most = max(most, bridge.queued_bytes())
        grown = rss() - before
        assert bridge.state == "connected"  # stalled, not cut off
        assert most <= bound
        assert bridge.stats.queue_full > 0
        assert fed.stats.not_forwarded >= bridge.stats.queue_full
        assert fed.stats.routed_out - out_before + fed.stats.not_forwarded == 64
        assert grown < bound + 24 * MIB, f"RSS grew by {grown / MIB:.1f} MiB"
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)


def hub_broker(tmp_path: Path, a: BrokerProcess, b: BrokerProcess) -> BrokerProcess:
    """Broker C bridging A and B (one ``connection`` section to each): stopping C cuts A
    from B while each router keeps its own broker."""
    from gossiprouter.loadtest.processes import mosquitto_config

    c = BrokerProcess(tmp_path, bridge_to=a.port)
    to_b = mosquitto_config(c.port, bridge_to=b.port).split("\n", 3)[3]
    c.conf.write_text(c.conf.read_text() + to_b)
    return c


async def test_a_cut_between_bridged_brokers_is_seen_and_nothing_arrives_late(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Acceptance 6: routers ra (broker A) and rb (broker B); A and B are joined by broker C,
    which is stopped (SIGSTOP) while both routers keep their own broker. Each router reports
    the other unreachable (heartbeats on the traffic's path), holds its members in grace,
    and after C continues, the unicasts sent during the cut, older than the frame-age limit
    by then, are dropped and counted: only what is sent after the heal is delivered."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    opts: dict[str, Any] = {**FAST_BACKOFF, **GRACED, "federation_heartbeat": 0.2,
                            "federation_peer_timeout": 1.5, "federation_frame_age": 0.5}
    with BrokerProcess(tmp_path) as ba, BrokerProcess(tmp_path) as bb, \
            hub_broker(tmp_path, ba, bb) as bc:
        wait_bridged(ba, bb)
        ra = await InProcessRouter(nursery, bridge=ba.url, router_id="ra", **opts).start()
        rb = await InProcessRouter(nursery, bridge=bb.url, router_id="rb", **opts).start()
        xa, xb = bridge_of(ra), bridge_of(rb)
        await eventually(lambda: xa.federation.live_routers() == xb.federation.live_routers()
                         == 1, timeout=10, what="federation up across the bridge")
        a, b, clients = await watched_pair(ra, rb)
        await traffic_flows(a, b"a", rb, b"before")
        await eventually(lambda: all(p.beats and p.up for x in (xa, xb)
                                     for p in x.liveness.links.values()), what="heartbeats")

        os.kill(bc.pid, signal.SIGSTOP)
        try:
            for i in range(5):
                await a.send(wire.Route(G, b"b", b"a", b"cut-%d" % i))
            await eventually(lambda: not any(p.up for x in (xa, xb)
                                             for p in x.liveness.links.values()),
                             timeout=15, what="each side sees the other unreachable")
            assert xa.federation.graced_routers() == xb.federation.graced_routers() == 1
            samples = {(m.name, tuple(s.labels.values())): s.value
                       for m in peer_metrics(xa) for s in m.samples}
            assert samples[("gossiprouter_federation_peer_up", (xb.origin,))] == 0
        finally:
            os.kill(bc.pid, signal.SIGCONT)
        await eventually(lambda: all(p.up for x in (xa, xb) for p in x.liveness.links.values())
                         and xa.federation.graced_routers() == 0
                         and xb.federation.graced_routers() == 0,
                         timeout=15, what="reachable again, out of grace")
        await traffic_flows(a, b"a", rb, b"after")
        got = [r.payload for r in await b.round_trip() if isinstance(r, wire.Route)]
        assert got and set(got) <= {b"before", b"after"}
        assert xb.liveness.links[xa.origin].expired >= 1
        assert table_members(ra) == table_members(rb) == {b"a", b"b", b"wa", b"wb"}
        for c in clients:
            assert events_in(await c.round_trip()) == []


def test_liveness_times_out_silent_peers_and_ages_frames_against_their_clock() -> None:
    """The sans-IO half: a peer whose heartbeats stop is unreachable once, after the
    timeout; a frame's age is measured against the peer's heartbeats, so a clock 100 s ahead
    makes nothing look old, and a frame held 3 s is too old for a 2 s limit; the round trip
    comes from the echoed heartbeat."""
    from gossiprouter.federation.liveness import Liveness

    live = Liveness(timeout=10.0, frame_age=2.0)
    skew = 100.0  # the peer's wall clock is 100 s ahead of this one's
    assert live.beat_in("p", b"%d 0 0" % ((1000.0 + skew) * 1000), now=5.0, wall=1000.0)\
        is False
    out = live.beat_out("p", now=5.25, wall=1000.25)
    assert out.split()[1:] == [b"%d" % ((1000.0 + skew) * 1000), b"250"]
    # Its next heartbeat echoes ours, held 0.1 s there, back 0.4 s after we sent it.
    live.beat_in("p", b"%d %d 100" % ((1000.5 + skew) * 1000, 1000250), now=5.65, wall=1000.65)
    assert live.links["p"].rtt is not None and abs(live.links["p"].rtt - 0.3) < 1e-6
    assert not live.too_old("p", round((1001.0 + skew) * 1000), wall=1001.1, count=1)
    assert live.too_old("p", round((1001.0 + skew) * 1000), wall=1004.0, count=3)
    assert live.links["p"].expired == 3
    assert live.check(15.0) == [] and live.check(15.7) == ["p"] and live.check(20.0) == []
    assert live.heard("p", now=21.0, wall=1016.0) is True and live.links["p"].up
