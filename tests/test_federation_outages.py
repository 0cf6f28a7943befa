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
from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.procs import BrokerProcess, wait_bridged
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_federation_sockets import G, everywhere, federation, member, table_members
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
