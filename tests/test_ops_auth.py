"""Authentication (tokens) and client-network allow-lists, over real sockets."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from gossiprouter.core.config import ConfigError
from gossiprouter.ops.auth import load_tokens
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from tests.conftest import RouterFactory, ops_of
from tests.ops_client import OpsClient, assert_closed, tokens_file
from tests.test_ops_metrics import scrape, v

BILLING = "billing-token-0123456789"
REPORTS = "reports-token-0123456789"


def _tokens(tmp_path: Path) -> Path:
    return tokens_file(tmp_path, f'''
[[token]]
identity = "billing"
token = "{BILLING}"
groups = ["billing", "billing-*", "shared"]

[[token]]
identity = "reports"
sha256 = "{hashlib.sha256(REPORTS.encode()).hexdigest()}"
groups = ["reports", "shared"]
''')


async def test_tokens(start_router: RouterFactory, tmp_path: Path) -> None:
    server = await start_router(tokens_file=str(_tokens(tmp_path)), metrics="127.0.0.1:0")
    assert server.address is not None
    host, port = server.address

    # Wrong token, no token: ERROR unauthorized, then close.
    for token in ("not-a-token", None):
        c = await OpsClient.open(host, port, hello=False)
        await c.send(wire.Hello((1,), "intruder", token))
        frames = await c.recv_until_closed()
        assert [type(f) for f in frames] == [wire.Error]
        assert isinstance(frames[0], wire.Error) and frames[0].code == "unauthorized"

    billing = await OpsClient.open(host, port, token=BILLING)
    reports = await OpsClient.open(host, port, token=REPORTS)  # listed by digest only
    assert await billing.connect("billing-eu", b"B1") == wire.Ok(1)
    assert await reports.connect("shared", b"R1") == wire.Ok(1)
    # A group outside the identity's patterns: forbidden, the connection stays open.
    reply = await billing.connect("reports", b"B2")
    assert isinstance(reply, wire.Error) and reply.code == "forbidden"
    reply = await billing.members("reports")
    assert isinstance(reply, wire.Error) and reply.code == "forbidden"
    # Hijack: another identity cannot take an address registered by billing.
    assert await billing.connect("shared", b"B1") == wire.Ok(4)
    reply = await reports.connect("shared", b"B1")
    assert isinstance(reply, wire.Error) and reply.code == "address_in_use"
    # ... while billing on a second connection may (the same identity).
    billing2 = await OpsClient.open(host, port, token=BILLING)
    assert await billing2.connect("shared", b"B1") == wire.Ok(1)
    await reports.send(wire.Route("shared", b"B1", b"R1", b"hi"))
    assert await billing2.recv() == wire.Route("shared", b"B1", b"R1", b"hi")

    s = await scrape(server)
    assert v(s, "gossiprouter_auth_failures_total", reason="unauthorized") == 2
    assert v(s, "gossiprouter_auth_failures_total", reason="forbidden") == 2

    # The tokens file is re-read on reload: billing loses 'shared' for new requests.
    _tokens(tmp_path).write_text(f'''
[[token]]
identity = "billing"
token = "{BILLING}"
groups = ["billing"]
''')
    ops_of(server).reload()
    reply = await billing.connect("shared", b"B3")
    assert isinstance(reply, wire.Error) and reply.code == "forbidden"
    c = await OpsClient.open(host, port, hello=False)
    await c.send(wire.Hello((1,), "reports", REPORTS))
    frames = await c.recv_until_closed()
    assert isinstance(frames[0], wire.Error) and frames[0].code == "unauthorized"


def test_tokens_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    cases = [
        ('[[token]]\nidentity = "a"\ngroups = ["x"]\n',
         "token[0]: expected exactly one of token"),
        ('[[token]]\nidentity = "a"\ntoken = "short"\n',
         "token[0].token = <hidden>: expected a string of at least 16 characters"),
        ('[[token]]\nidentity = ""\ntoken = "0123456789abcdef"\n',
         "token[0].identity = '': expected a non-empty string"),
        ('[[token]]\nidentity = "a"\ntoken = "0123456789abcdef"\ngroups = "x"\n',
         "token[0].groups = 'x': expected a list of group names or glob patterns"),
        ('[[token]]\nidentity = "a"\nsha256 = "abc"\n',
         "token[0].sha256 = 'abc': expected 64 hex digits"),
        ('[[token]]\nidentity = "a"\ntoken = "0123456789abcdef"\nrole = "admin"\n',
         "token[0].role: unknown key"),
        ('tokens = 1\n', "unknown key 'tokens'"),
        ('[[token]\n', "not valid TOML"),
    ]
    for text, message in cases:
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_tokens(path)
        assert message in str(e.value), (text, str(e.value))
    with pytest.raises(ConfigError, match="not found"):
        load_tokens(tmp_path / "missing.toml")


async def test_network_allow_lists(start_router: RouterFactory) -> None:
    # 127.0.0.1 is outside 10.0.0.0/8: the native client is told why, then closed.
    server = await start_router(allow_native=("10.0.0.0/8",), metrics="127.0.0.1:0")
    assert server.address is not None
    c = await OpsClient.open(*server.address, hello=False)
    frames = await c.recv_until_closed()
    assert len(frames) == 1 and isinstance(frames[0], wire.Error)
    assert frames[0].code == "unauthorized" and "10.0.0.0/8" in frames[0].message
    s = await scrape(server)
    assert v(s, "gossiprouter_connections_refused_total", protocol="native",
             reason="network") == 1

    # 127.0.0.0/8 allowed: served.
    ok = await start_router(allow_native=("10.0.0.0/8", "127.0.0.0/8"))
    assert ok.address is not None
    c = await OpsClient.open(*ok.address)
    assert await c.connect("g", b"A") == wire.Ok(1)

    # Every protocol denied to 127.0.0.1: cut at accept, before reading anything.
    none = await start_router(allow_native=("10.0.0.0/8",), allow_jgroups2=("10.0.0.0/8",),
                              jgroups=False, metrics="127.0.0.1:0")
    assert none.address is not None
    stream = await trio.open_tcp_stream(*none.address)
    await assert_closed(stream)
    await stream.aclose()
    s = await scrape(none)
    assert v(s, "gossiprouter_connections_refused_total", protocol="any", reason="network") == 1


async def test_jgroups_allow_list_and_switch(start_router: RouterFactory) -> None:
    server = await start_router(allow_jgroups2=("10.0.0.0/8",), jgroups=True,
                                metrics="127.0.0.1:0")
    assert server.address is not None
    streams = []
    for first in (b"\x04", b"\x00\x00\x00\x10"):  # a JGroups 2.12 and a 5.x opening
        stream = await trio.open_tcp_stream(*server.address)
        await stream.send_all(first)
        streams.append(stream)
    # Polled: an admitted JGroups connection stays open when a JGroups session serves it.
    with trio.fail_after(5):
        while True:
            s = await scrape(server)
            refused = v(s, "gossiprouter_connections_refused_total", protocol="jgroups2",
                        reason="network")
            if refused == 1 and v(s, "gossiprouter_connections_accepted_total",
                                  protocol="jgroups5") == 1:
                break
            await trio.sleep(0.02)
    await assert_closed(streams[0])  # the refused one is closed
    for stream in streams:
        await stream.aclose()

    off = await start_router(jgroups=False, metrics="127.0.0.1:0")
    assert off.address is not None
    stream = await trio.open_tcp_stream(*off.address)
    await stream.send_all(b"\x04")
    with trio.fail_after(5):
        assert await stream.receive_some(100) == b""
    await stream.aclose()
    # A refused 5.x client is closed as the router closes any 5.x connection: the -5 marker.
    stream5 = await trio.open_tcp_stream(*off.address)
    await stream5.send_all(b"\x00\x00\x00\x10")
    received = b""
    with trio.fail_after(5):
        while data := await stream5.receive_some(100):
            received += data
    assert received == j5.CLOSE_MARKER
    await stream5.aclose()
    s = await scrape(off)
    assert v(s, "gossiprouter_connections_refused_total", protocol="jgroups2",
             reason="disabled") == 1
    assert v(s, "gossiprouter_connections_refused_total", protocol="jgroups5",
             reason="disabled") == 1
    # Native still works with JGroups off.
    c = await OpsClient.open(*off.address)
    assert await c.connect("g", b"A") == wire.Ok(1)


async def test_no_hijack_during_reconnect_grace(start_router: RouterFactory,
                                                tmp_path: Path) -> None:
    server = await start_router(tokens_file=str(_tokens(tmp_path)), grace=30.0)
    assert server.address is not None
    billing = await OpsClient.open(*server.address, token=BILLING)
    assert await billing.connect("shared", b"B1") == wire.Ok(1)
    await billing.aclose()  # B1 is now in reconnect grace, its traffic held
    await trio.sleep(0.1)
    reports = await OpsClient.open(*server.address, token=REPORTS)
    reply = await reports.connect("shared", b"B1")
    assert isinstance(reply, wire.Error) and reply.code == "address_in_use"
