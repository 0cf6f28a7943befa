"""Issue 12, items 1, 2, 5 and 10: no client can crash the router or make it store what it
cannot write back; bounded names; safe logs; member lists longer than a frame; clear errors
for bad settings and missing TLS files.

Every attack runs over real sockets while two honest members exchange sequenced messages
(:func:`honest_traffic`), which must all arrive in order; afterwards the router must still
serve a new client (:func:`still_serving`).
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import pytest
import trio
import trustme

from gossiprouter.core.config import OPTIONS, Config, ConfigError, build
from gossiprouter.ops.runtime import check_startup
from gossiprouter.ops.tls import ServerTLS
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from gossiprouter.protocol.jgroups_reader import write_string
from gossiprouter.server.listener import Server
from gossiprouter.stub import RouterStub
from tests.conftest import RouterFactory
from tests.jgroups_clients import J2Client, J5Client, ip, uuid
from tests.nclient import NativeClient
from tests.procs import RouterProcess
from tests.test_ops_tls import _server_files


def _addr(server: Server) -> tuple[str, int]:
    assert server.address is not None
    return server.address


@asynccontextmanager
async def honest_traffic(server: Server) -> AsyncIterator[None]:
    """Honest members of every protocol, each pair (A -> B: native, JGroups 2.12, JGroups 5.x)
    sending numbered unicasts for as long as the body runs; on exit every message sent must
    have reached its receiver, in order."""
    host, port = _addr(server)
    a = await NativeClient.open(host, port)
    b = await NativeClient.open(host, port)
    assert await a.connect("honest", b"A") == wire.Ok(1)
    assert await b.connect("honest", b"B") == wire.Ok(1)
    a2, b2 = await J2Client.open(host, port), await J2Client.open(host, port)
    assert (await a2.connect("honest", uuid(101, V2), "A2", [ip(7901, V2)])).ok
    assert (await b2.connect("honest", uuid(102, V2), "B2", [ip(7902, V2)])).ok
    a5, b5 = await J5Client.open(host, port), await J5Client.open(host, port)
    await a5.register("honest", uuid(101, V5), "A5", ip(7901, V5))
    await b5.register("honest", uuid(102, V5), "B5", ip(7902, V5))
    await a5.sync()
    await b5.sync()

    async def send_native(i: bytes) -> None:
        await a.send(wire.Route("honest", b"B", b"A", i))

    async def send_j2(i: bytes) -> None:
        await a2.message("honest", uuid(102, V2), i)

    async def send_j5(i: bytes) -> None:
        await a5.message("honest", uuid(102, V5), uuid(101, V5), i)

    async def recv_native() -> bytes | None:
        f = await b.recv(timeout=10)
        assert isinstance(f, wire.Route), f
        return f.payload

    async def recv_j2() -> bytes | None:
        ev = await b2.recv(timeout=10)
        assert isinstance(ev, j2.Message), ev
        return ev.payload

    async def recv_j5() -> bytes | None:
        ev = await b5.recv(timeout=10)
        if isinstance(ev, j5.Heartbeat):
            return None
        assert isinstance(ev, j5.Message), ev
        return ev.payload

    pairs = {"native": (send_native, recv_native), "jgroups2": (send_j2, recv_j2),
             "jgroups5": (send_j5, recv_j5)}
    sent = dict.fromkeys(pairs, 0)
    got: dict[str, list[int]] = {k: [] for k in pairs}
    stop = trio.Event()

    async def send(kind: str) -> None:
        while not stop.is_set() or sent[kind] < 20:
            await pairs[kind][0](sent[kind].to_bytes(4, "big"))
            sent[kind] += 1
            await trio.sleep(0.003)

    async def receive(kind: str) -> None:
        mine = got[kind]
        while not (stop.is_set() and len(mine) == sent[kind] and sent[kind] >= 20):
            with trio.move_on_after(0.05):
                payload = await pairs[kind][1]()
                if payload is not None:
                    mine.append(int.from_bytes(payload, "big"))

    async with trio.open_nursery() as n:
        for kind in pairs:
            n.start_soon(send, kind)
            n.start_soon(receive, kind)
        try:
            yield
        finally:
            stop.set()
            n.cancel_scope.deadline = trio.current_time() + 10
    for kind in pairs:
        assert got[kind] == list(range(sent[kind])), (
            f"honest {kind} member lost messages: {len(got[kind])} of {sent[kind]}")
    for c in (a, b):
        await c.aclose()
    for j in (a2, b2, a5, b5):
        await j.aclose()


async def still_serving(server: Server) -> None:
    """A new client is welcomed and can register: the router survived."""
    c = await NativeClient.open(*_addr(server))
    assert await c.connect("after", b"X") == wire.Ok(1)
    await c.aclose()


# =========================================================================== item 1: containment


def _boom(*args: object, **kwargs: object) -> bytes:
    # What the router raised before: a reply that cannot be encoded.
    raise ProtocolError("string too long for writeUTF: 70000 bytes")


def _bug(*args: object, **kwargs: object) -> bytes:
    raise RuntimeError("a bug in the router")


async def _closed_after(c: J2Client | J5Client | NativeClient) -> list[object]:
    return list(await c.recv_until_closed(timeout=5))


@pytest.mark.parametrize("protocol", ["native", "jgroups2", "jgroups5"])
async def test_an_exception_closes_only_its_connection(
        start_router: RouterFactory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, protocol: str) -> None:
    """Encoding a member-list reply fails (as writeUTF did for a long name): the asking
    connection is closed (native: ERROR internal_error), logged once with the traceback and
    counted; the honest members lose nothing and the router serves on."""
    caplog.set_level(logging.INFO, logger="gossiprouter")
    server = await start_router()
    async with honest_traffic(server):
        await trio.sleep(0.05)
        if protocol == "native":
            monkeypatch.setattr(wire, "encode_members", _boom)
            nc = await NativeClient.open(*_addr(server))
            await nc.send(wire.GetMembers(7, "honest"))
            frames = await _closed_after(nc)
            assert frames == [wire.Error(None, "internal_error",
                                         "internal router error; see the router's log")]
        elif protocol == "jgroups2":
            monkeypatch.setattr(j2, "gossip_get_reply", _boom)
            c2 = await J2Client.open(*_addr(server))
            assert (await c2.connect("g", uuid(1, V2), "a", [ip(7800, V2)])).ok
            await c2.send_raw(j2.gossip_get("g"))
            assert await _closed_after(c2) == []  # 2.12 has no error frame
        else:
            # A ProtocolError from this reply is a query skipped (test below); any other
            # exception is a bug, contained to this connection.
            monkeypatch.setattr(j5, "get_members_reply", _bug)
            c5 = await J5Client.open(*_addr(server))
            await c5.send_raw(j5.get_members("g"))
            assert await _closed_after(c5) == [j5.CloseMarker()]
        await trio.sleep(0.05)
    monkeypatch.undo()
    assert server.hub.counters.internal_errors == 1
    errors = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None
    await still_serving(server)


async def test_a_failing_event_target_is_closed_alone(
        start_router: RouterFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Membership events are delivered on behalf of whoever caused them: a target whose
    delivery fails is closed; the other watchers are still told; the member that joined is
    not blamed."""
    server = await start_router()
    async with honest_traffic(server):
        bad = await NativeClient.open(*_addr(server))
        good = await NativeClient.open(*_addr(server))
        assert await bad.request(wire.Watch(bad.req(), "w")) == wire.Ok(1)
        assert await good.request(wire.Watch(good.req(), "w")) == wire.Ok(1)
        [bad_session] = server.hub.table.group("w").watchers[:1]  # type: ignore[union-attr]

        def fail(data: bytes, count: int = 1) -> None:
            raise RuntimeError("push failed")

        monkeypatch.setattr(bad_session, "push", fail)
        joiner = await NativeClient.open(*_addr(server))
        assert await joiner.connect("w", b"J") == wire.Ok(1)
        ev = await good.recv()
        assert isinstance(ev, wire.Event) and ev.kind == "join" and ev.addr == b"J"
        assert [f for f in await bad.recv_until_closed() if isinstance(f, wire.Error)] == [
            wire.Error(None, "internal_error", "internal router error; see the router's log")]
        # The joiner's connection is fine.
        assert await joiner.connect("w2", b"J") == wire.Ok(2)
    assert server.hub.counters.internal_errors == 1
    await still_serving(server)


async def test_reaper_survives_an_exception(start_router: RouterFactory,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in the reaper is logged and counted; it carries on (idle connections are
    still closed afterwards)."""
    server = await start_router(idle_timeout=0.5)
    calls = 0
    real = server.hub.table.expire

    def flaky(now: float) -> list[object]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("reaper bug")
        return real(now)  # type: ignore[return-value]

    monkeypatch.setattr(server.hub.table, "expire", flaky)
    # Two idle clients closed one after the other: the second only by a round after the
    # one that raised.
    for _ in range(2):
        idle = await NativeClient.open(*_addr(server))
        frames = await idle.recv_until_closed(timeout=5)
        assert frames == [wire.Error(None, "idle_timeout", "nothing received for 0.5s")]
    assert calls >= 2 and server.hub.counters.internal_errors == 1


# =========================================================================== item 1: refusal

# Bounds raised out of the way so that only "can it be written back" is left to refuse.
_NO_BOUNDS = {"max_name_bytes": 1 << 20, "max_group_bytes": 1 << 20}


def _raw_nul_name(frame: bytes, n: int) -> bytes:
    """``frame``, encoded with the name ``"N" * n``, with that name sent as ``n`` raw NUL
    bytes: valid for writeUTF's reader, but twice as long when written back (modified UTF-8
    writes NUL as C0 80). The length of the frame does not change."""
    return frame.replace(write_string("N" * n), b"\x01" + n.to_bytes(2, "big") + b"\x00" * n)


async def test_j2_name_that_cannot_be_written_back_is_refused(
        start_router: RouterFactory) -> None:
    """The original crash: a 2.12 name of 40,000 raw NULs was accepted, and the next honest
    GOSSIP_GET raised 'string too long for writeUTF' and killed the router. Now CONNECT gets
    OP_FAIL, the connection stays usable, and honest queries work."""
    server = await start_router(**_NO_BOUNDS)
    honest = await J2Client.open(*_addr(server))
    assert (await honest.connect("g", uuid(1, V2), "honest", [ip(7801, V2)])).ok
    async with honest_traffic(server):
        bad = await J2Client.open(*_addr(server))
        bad.decoder.expect_connect_reply()
        await bad.send_raw(_raw_nul_name(
            j2.connect("g", uuid(9, V2), "N" * 40_000, [ip(7809, V2)]), 40_000))
        assert await bad.recv() == j2.ConnectReply(j2.OP_FAIL)
        assert [m.name for m in await honest.gossip_get("g")] == ["honest"]
        # The refused client's connection still works.
        assert (await bad.connect("g", uuid(2, V2), "fine", [ip(7802, V2)])).ok
        assert sorted(m.name or "" for m in await honest.gossip_get("g")) == ["fine", "honest"]
    assert server.hub.counters.drops["refused_registration"] == 1
    # By code, for metric refusals{code} (the native CONNECT of the same kind counts there too).
    assert server.hub.counters.refusals == {"too_long": 1}
    assert server.hub.counters.internal_errors == 0
    await still_serving(server)


async def test_j5_group_too_long_for_the_all_groups_reply_is_refused(
        start_router: RouterFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A 5.x group of 65,530 bytes fits writeUTF, but the all-groups reply writes
    '<<all-groups>>:' before it. The REGISTER is skipped with a log line; the honest
    all-groups GET_MBRS works."""
    caplog.set_level(logging.INFO, logger="gossiprouter")
    server = await start_router(**_NO_BOUNDS)
    honest = await J5Client.open(*_addr(server))
    await honest.register("g", uuid(1, V5), "honest", ip(7801, V5))
    await honest.sync()
    async with honest_traffic(server):
        bad = await J5Client.open(*_addr(server))
        # Registered first: before that, preauth_max_frame (64 KiB) refuses the long frame
        # outright, which is a different defence (tests/test_partial_frames.py).
        await bad.register("g2", uuid(5, V5), "ok", ip(7805, V5))
        await bad.register("x" * 65_530, uuid(2, V5), "bad", ip(7802, V5))
        await bad.sync()
        replies = await honest.get_members(None)
        assert sorted((r.group, [m.name for m in r.members]) for r in replies) == [
            (f"{j5.ALL_GROUPS}:g", ["honest"]), (f"{j5.ALL_GROUPS}:g2", ["ok"]),
            (f"{j5.ALL_GROUPS}:honest", ["A5", "B5"])]
        # NUL in a name doubles too: refused the same way.
        await bad.send_raw(_raw_nul_name(
            j5.register("g", uuid(3, V5), "N" * 40_000, ip(7803, V5)), 40_000))
        await bad.sync()
        [rep] = await honest.get_members("g")
        assert [m.name for m in rep.members] == ["honest"]
        # A lone surrogate is a valid Java string but no UTF-8 (native) one: refused too, and
        # a native client can still list the group.
        await bad.register("g", uuid(4, V5), "\ud800", ip(7804, V5))
        await bad.sync()
        n = await NativeClient.open(*_addr(server))
        listed = await n.members("jgroups5:g")
        assert isinstance(listed, wire.Ok) and [m.name for m in listed.members or ()] == [
            "honest"]
    assert server.hub.counters.drops["refused_registration"] == 3
    assert server.hub.counters.refusals == {"too_long": 3}
    assert any("refused" in r.getMessage() and "cannot be written back" in r.getMessage()
               for r in caplog.records)
    await still_serving(server)


async def test_j5_query_for_a_group_that_cannot_be_written_back_is_skipped(
        start_router: RouterFactory) -> None:
    """Found by scripts/fuzz: a 5.x GET_MBRS naming a group of 40,000 raw NULs (80,000 bytes
    when written back). The reply repeats the group name, so it cannot be encoded: the query
    is skipped and counted (no such group can exist), the connection keeps working, and no
    internal error is raised."""
    server = await start_router(**_NO_BOUNDS)
    async with honest_traffic(server):
        c = await J5Client.open(*_addr(server))
        await c.register("g", uuid(6, V5), "q", ip(7806, V5))
        await c.sync()
        query = j5.get_members("N" * 40_000)
        await c.send_raw(query.replace(
            write_string("N" * 40_000), b"\x01" + (40_000).to_bytes(2, "big") + b"\x00" * 40_000))
        await c.sync()
        [rep] = await c.get_members("g")
        assert [m.name for m in rep.members] == ["q"]
    counters = server.hub.counters
    assert counters.drops["unanswerable_query"] == 1
    assert counters.internal_errors == 0
    await still_serving(server)


async def test_native_member_that_does_not_fit_a_frame_is_refused(
        start_router: RouterFactory) -> None:
    """A native member whose entry alone would not fit in max_frame gets ERROR too_long."""
    server = await start_router(max_frame=4096, outbound_queue_bytes=8192, **_NO_BOUNDS)
    async with honest_traffic(server):
        c = await NativeClient.open(*_addr(server))
        # The CONNECT fits in max_frame; the EVENT announcing it and the list entry do not.
        r = await c.connect("g", b"M", "n" * 4080)
        assert isinstance(r, wire.Error) and r.code == "too_long", r
        assert "does not fit in one frame" in r.message
        assert await c.connect("g", b"M", "n" * 100) == wire.Ok(2)
        members = await c.members("g")
        assert isinstance(members, wire.Ok) and [m.name for m in members.members or ()] == [
            "n" * 100]
    await still_serving(server)


# =========================================================================== item 5: bounds


async def test_native_bounds(start_router: RouterFactory) -> None:
    """Default bounds: a 256-byte name, a 256-byte host, 17 physical addresses are each
    refused with ERROR too_long naming the option; the connection stays open."""
    server = await start_router()
    async with honest_traffic(server):
        c = await NativeClient.open(*_addr(server))
        cases = [
            ("n" * 256, (), "max_name_bytes"),
            ("é" * 128, (), "max_name_bytes"),  # 256 bytes of UTF-8
            ("ok", (("h" * 256, 1),), "max_name_bytes"),
            ("ok", tuple(("10.0.0.1", p) for p in range(17)), "max_physical_addresses"),
        ]
        for name, physical, option in cases:
            r = await c.connect("g", b"M", name, physical)
            assert isinstance(r, wire.Error) and r.code == "too_long", r
            assert option in r.message
        # At the bounds: accepted.
        ok = await c.connect("g", b"M", "n" * 255, tuple(("h" * 255, p) for p in range(16)))
        assert isinstance(ok, wire.Ok), ok
    await still_serving(server)


async def test_jgroups_bounds(start_router: RouterFactory) -> None:
    """Default bounds on JGroups registrations: 2.12 gets OP_FAIL, 5.x is skipped (not
    listed), for a long name, a long group, and a long address encoding."""
    server = await start_router(max_address_bytes=64)
    async with honest_traffic(server):
        c2 = await J2Client.open(*_addr(server))
        assert not (await c2.connect("g", uuid(1, V2), "n" * 256, [ip(7801, V2)])).ok
        assert not (await c2.connect("g" * 1025, uuid(1, V2), "a", [ip(7801, V2)])).ok
        assert not (await c2.connect("g", uuid(1, V2), "a",
                                     [ip(7000 + i, V2) for i in range(17)])).ok
        # A 2.12 PayloadUUID carries its payload string in its encoding: 100 bytes here.
        payload = JAddress.parse(b"\x00\x00\x52" + uuid(1, V2).raw[1:]
                                 + write_string("p" * 80), version=V2)
        assert not (await c2.connect("g", payload, "a", [ip(7801, V2)])).ok
        assert (await c2.connect("g", uuid(1, V2), "n" * 255, [ip(7801, V2)])).ok
        c5 = await J5Client.open(*_addr(server))
        await c5.register("g", uuid(2, V5), "n" * 256, ip(7802, V5))
        await c5.register("g" * 1025, uuid(3, V5), "a", ip(7803, V5))
        # A 5.x ExtendedUUID carries its key/value pairs in its encoding: 150 bytes here.
        ext = JAddress.parse(b"\x00\x00\x0c" + uuid(4, V5).raw[1:] + b"\x01\x05\x01"
                             + b"\x40" + b"k" * 64 + b"\x40" + b"v" * 64, version=V5)
        await c5.register("g", ext, "a", ip(7804, V5))
        await c5.register("g", uuid(5, V5), "fine", ip(7805, V5))
        await c5.sync()
        [rep] = await c5.get_members("g")
        assert [m.name for m in rep.members] == ["fine"]
    assert server.hub.counters.drops["refused_registration"] == 7
    await still_serving(server)


# =========================================================================== item 5: member lists


def test_member_list_parts_fit_max_frame() -> None:
    members = [wire.MemberInfo(i.to_bytes(4, "big"), f"member-{i}", (("10.0.0.1", i),))
               for i in range(5000)]
    frames = wire.encode_members(3, members, 4096)
    assert len(frames) > 20
    dec = wire.Decoder(max_frame=4096)
    for f in frames:
        dec.feed(f)
    parts = dec.frames()
    assert all(isinstance(p, wire.Ok) and p.req == 3 for p in parts)
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]  # type: ignore[union-attr]
    got = [m for p in parts for m in p.members or ()]  # type: ignore[union-attr]
    assert got == members
    # A list that fits stays one frame, in the original 3-element form.
    [one] = wire.encode_members(4, members[:3], 4096)
    assert one == wire.encode(wire.Ok(4, tuple(members[:3])))
    # The flag is a boolean, and only on a member list.
    for bad in ([7, 1, None, True], [7, 1, [], "yes"]):
        with pytest.raises(ProtocolError):
            wire.frame_from_body(msgpack.packb(bad))
    assert wire.frame_from_body(msgpack.packb([7, 1, [], False])) == wire.Ok(1, ())


async def test_100k_members_through_the_stub(start_router: RouterFactory) -> None:
    """100,000 members with 100-byte names (12 MB of member list, above the default 8 MiB
    max_frame) are listed whole through RouterStub, which reassembles the parts."""
    # One connection registers them all (the per-connection limits would refuse that).
    server = await start_router(addresses_per_connection=0, groups_per_connection=0,
                                # 100,000 CONNECTs in one burst: no control budget here
                                control_rate=0,
                                # Slow consumers are not what this tests: on a loaded machine
                                # this process may take longer than any fixed write_timeout
                                # to read 12 MB, and the router must not drop it for that.
                                write_timeout=0)
    n = 100_000
    async with honest_traffic(server):
        reg = await NativeClient.open(*_addr(server))
        batch = b"".join(
            wire.encode(wire.Connect(i + 1, "big", i.to_bytes(4, "big"), f"{i:0100d}"))
            for i in range(n))
        oks = 0

        async def read_oks() -> None:
            # Read while the batch is written, so the router never waits on this client;
            # done when all n answers are in (the work), not after some seconds.
            nonlocal oks
            while oks < n:
                f = await reg.recv(timeout=math.inf)
                assert isinstance(f, wire.Ok), f
                oks += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_oks)
            await reg.send_raw(batch)
        assert oks == n
        host, port = _addr(server)
        async with RouterStub([(host, port)], request_timeout=math.inf) as stub:
            await stub.wait_connected(math.inf)
            members = await stub.members("big")
    assert len(members) == n
    assert [m.name for m in members[:3]] == [f"{i:0100d}" for i in range(3)]
    assert {m.addr for m in members} == {i.to_bytes(4, "big") for i in range(n)}
    await still_serving(server)


# =========================================================================== item 5: logs


def test_client_text_in_logs_is_escaped_and_cut(tmp_path: Path) -> None:
    """A name with a newline and ANSI escapes cannot forge a log line or colour the log; a
    refused 5,000-byte group is logged cut short."""
    log = tmp_path / "router.log"
    with RouterProcess(None, "--log-level", "info", log=log) as proc:
        async def attack() -> None:
            c = await NativeClient.open("127.0.0.1", proc.port)
            assert await c.connect("g\nFORGED group", b"A",
                                   "x\nFORGED 2026-01-01 ERROR fake\x1b[31mred\r") == wire.Ok(1)
            j = await J5Client.open("127.0.0.1", proc.port)
            await j.register("G" * 5000 + "\nFORGED", uuid(1, V5), "a", ip(7801, V5))
            await j.sync()
            j2c = await J2Client.open("127.0.0.1", proc.port)
            assert (await j2c.connect("g2", uuid(1, V2), "y\nFORGED-212 \x1b[32mgreen",
                                      [ip(7801, V2)])).ok
            await c.aclose()
            await j.aclose()
            await j2c.aclose()
            await trio.sleep(0.2)

        trio.run(attack)
        assert proc.proc is not None and proc.proc.poll() is None  # still running
    text = log.read_text(encoding="utf-8")
    assert "FORGED" in text  # the lines are there...
    assert not any(line.startswith("FORGED") for line in text.splitlines())  # ...not forged
    assert "\x1b" not in text and "\r" not in text
    assert "\\x1b[31mred" in text
    assert "\\nFORGED-212 \\x1b[32mgreen" in text  # a JGroups 2.12 name, logged escaped
    assert max(len(line) for line in text.splitlines()) < 1000
    assert "more]" in text


# =========================================================================== item 2: config


_FLOATS = [o.name for o in OPTIONS if o.type is float]


@pytest.mark.parametrize("name", _FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(tmp_path: Path, name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} = .*: expected a finite number$"):
        build(None, **{name: value})
    toml = {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
    f = tmp_path / "router.toml"
    f.write_text(f"{name} = {toml}\n")
    with pytest.raises(ConfigError, match=rf"^config file {f}: {name} = .*finite number$"):
        build(f)


def test_non_finite_float_on_the_command_line_and_in_a_file(tmp_path: Path) -> None:
    """One line on stderr, no traceback, non-zero exit; the file is named."""
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
                        "--idle-timeout", "nan"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # a bad option value
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        "gossiprouter: error: invalid value for '--idle-timeout': nan: expected a finite "
        "number (see 'python -m gossiprouter serve --help')"]
    f = tmp_path / "router.toml"
    f.write_text("heartbeat_interval = inf\n")
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
                        "--config", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        f"gossiprouter: error: config file {f}: heartbeat_interval = inf: expected a finite "
        "number"]


# =========================================================================== item 10: TLS


def test_missing_key_file_is_named(tmp_path: Path) -> None:
    """At start-up and on reload (SIGHUP), a missing key is reported as tls_key."""
    cert, key = _server_files(tmp_path, trustme.CA())
    missing = str(tmp_path / "missing.key")
    with pytest.raises(ConfigError, match=rf"^tls_key = '{missing}': file not found$"):
        check_startup(Config(tls_cert=str(cert), tls_key=missing))
    with pytest.raises(ConfigError, match=r"^tls_cert = '.*nope.pem': file not found$"):
        check_startup(Config(tls_cert=str(tmp_path / "nope.pem"), tls_key=str(key)))
    tls = ServerTLS(Config(tls_cert=str(cert), tls_key=str(key)))
    key.unlink()
    with pytest.raises(ConfigError, match=rf"^tls_key = '{key}': file not found$"):
        tls.reload()
