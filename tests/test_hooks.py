"""The server's hooks (server.hooks): what the server calls, when, and what it does with
the answers, with hooks of the test's own (no gossiprouter.ops), over real 127.0.0.1 sockets.
Also the read-only snapshots (gossiprouter.server.snapshot) the hooks are given, and how peers are
named (IPv6 in brackets)."""

from __future__ import annotations

import dataclasses
import socket
import warnings

import pytest
import trio

from gossiprouter.core.config import OPTIONS, Config, ConfigError
from gossiprouter.ops.access import peer_host, peer_ip
from gossiprouter.protocol import native as wire
from gossiprouter.routing.table import RoutingTable
from gossiprouter.server.hooks import HOOK_OPTIONS, ByteStream, NoHooks, ServerHooks, needs_hooks
from gossiprouter.server.listener import ListenError, Server
from gossiprouter.server.snapshot import RouterView, group_page, member_page, membership
from gossiprouter.sessions.base import Authority
from tests.carriers import named
from tests.nclient import NativeClient
from tests.ops_client import assert_closed


class RefuseAll:
    """A token authority that knows no token (counts what it was asked)."""

    def __init__(self) -> None:
        self.asked = 0

    def identify(self, token: str | None, who: object) -> str | None:
        self.asked += 1
        return None

    def permits(self, identity: str | None, group: str) -> bool:
        return True


class Recorder:
    """Hooks that record every call and answer as the test says."""

    def __init__(self, *, accept: bool = True, refuse: str | None = None,
                 auth: Authority | None = None) -> None:
        self.allow, self.refusal, self.auth = accept, refuse, auth
        self.calls: list[tuple[str, ...]] = []
        self.view: RouterView | None = None

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        self.view = view
        task_status.started(None)

    async def accept(self, stream: trio.SocketStream, peer: str) -> ByteStream | None:
        self.calls.append(("accept", peer))
        return stream if self.allow else None

    async def admit(self, peer: str, protocol: str) -> str | None:
        self.calls.append(("admit", peer, protocol))
        return self.refusal

    def refused(self, peer: str, reason: str) -> None:
        self.calls.append(("refused", peer, reason))


async def _serve(nursery: trio.Nursery, hooks: ServerHooks | None, **options: object
                 ) -> Server:
    cfg = Config(host="127.0.0.1", port=0, **options)  # type: ignore[arg-type]
    server = Server(cfg, hooks=hooks)
    await nursery.start(server.serve)
    return server


def _address(server: Server) -> tuple[str, int]:
    assert server.address is not None
    return server.address


# ---------------------------------------------------------------------- without hooks


def test_a_server_without_hooks_refuses_what_only_hooks_serve() -> None:
    """tls_cert & co. are not silently ignored when nobody implements them."""
    assert needs_hooks(Config()) == []
    assert isinstance(Server(Config()).hooks, NoHooks)
    for option, value in [("tls_cert", "router.pem"), ("metrics", "127.0.0.1:0"),
                          ("tokens_file", "tokens.toml"), ("jgroups", False),
                          ("allow_native", ("10.0.0.0/8",))]:
        cfg = Config(**{option: value})  # type: ignore[arg-type]
        assert needs_hooks(cfg) == [option]
        with pytest.raises(ConfigError, match=f"{option}: served by the operations layer"):
            Server(cfg)
        Server(cfg, hooks=NoHooks())  # whoever passes hooks takes the responsibility
    assert set(HOOK_OPTIONS) <= {o.name for o in OPTIONS}


async def test_a_plain_server_serves_without_ops(nursery: trio.Nursery) -> None:
    server = await _serve(nursery, None)
    c = await NativeClient.open(*_address(server))
    assert await c.connect("g", b"A") == wire.Ok(1)
    assert server.hub.auth is None


def test_server_ops_is_a_deprecated_alias_of_hooks() -> None:
    server = Server(Config())
    with pytest.warns(DeprecationWarning, match="Server.hooks"):
        assert server.ops is server.hooks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert server.hooks is not None


# ---------------------------------------------------------------------- the calls


async def test_accept_and_admit_are_called_once_per_connection(nursery: trio.Nursery) -> None:
    hooks = Recorder()
    server = await _serve(nursery, hooks)
    c = await NativeClient.open(*_address(server))
    assert await c.connect("g", b"A") == wire.Ok(1)
    local = c.raw.socket.getsockname()
    peer = f"127.0.0.1:{local[1]}"
    assert hooks.calls == [("accept", peer), ("admit", peer, "native")]


async def test_a_refused_accept_closes_before_reading(nursery: trio.Nursery) -> None:
    hooks = Recorder(accept=False)
    server = await _serve(nursery, hooks)
    stream = await trio.open_tcp_stream(*_address(server))
    await stream.send_all(wire.PREAMBLE)
    await assert_closed(stream)
    assert [c[0] for c in hooks.calls] == ["accept"]  # never asked to admit a protocol
    assert server.hub.counters.bytes_in == 0


async def test_a_refused_protocol_is_told_why_by_the_server(nursery: trio.Nursery) -> None:
    """The hook only says why; the server writes the ERROR and closes (hooks do no I/O)."""
    hooks = Recorder(refuse="native is allowed only from 10.0.0.0/8")
    server = await _serve(nursery, hooks)
    c = await NativeClient.open(*_address(server), hello=False)
    await c.send(wire.Hello((1,), "test", None))
    frames = await c.recv_until_closed()
    assert frames == [wire.Error(None, "unauthorized", "native is allowed only from 10.0.0.0/8")]
    assert server.hub.table.groups == {}


async def test_limit_refusals_at_accept_reach_the_hooks(nursery: trio.Nursery) -> None:
    hooks = Recorder()
    server = await _serve(nursery, hooks, max_connections_per_ip=1)
    first = await NativeClient.open(*_address(server))
    second = await trio.open_tcp_stream(*_address(server))
    await assert_closed(second)
    port = second.socket.getsockname()[1]
    assert ("refused", f"127.0.0.1:{port}", "limit_per_ip") in hooks.calls
    assert await first.connect("g", b"A") == wire.Ok(1)  # the first one is served on


async def test_the_sessions_ask_the_hooks_authority(nursery: trio.Nursery) -> None:
    authority = RefuseAll()
    server = await _serve(nursery, Recorder(auth=authority))
    assert server.hub.auth is authority
    c = await NativeClient.open(*_address(server), hello=False)
    await c.send(wire.Hello((1,), "test", "no-such-token"))
    [error] = await c.recv_until_closed()
    assert isinstance(error, wire.Error) and error.code == "unauthorized"
    assert authority.asked == 1


async def test_the_view_counts_connections_by_protocol(nursery: trio.Nursery) -> None:
    hooks = Recorder()
    server = await _serve(nursery, hooks)
    assert hooks.view is not None and hooks.view.hub is server.hub
    assert hooks.view.bridge is None
    a = await NativeClient.open(*_address(server))
    b = await NativeClient.open(*_address(server))
    assert await a.connect("g", b"A") == wire.Ok(1) and await b.connect("g", b"B") == wire.Ok(1)
    census = await hooks.view.census()
    assert census.by_protocol == {"native": 2} and census.queued_bytes == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        census.queued_bytes = 1  # type: ignore[misc]


# ---------------------------------------------------------------------- peers


async def test_an_ipv6_peer_is_named_in_brackets(nursery: trio.Nursery) -> None:
    """What the server calls a peer pastes back as HOST:PORT: [::1]:port, not ::1:port. The
    connection is a real one on 127.0.0.1 whose socket says it comes from ::1 (tests use no
    other address)."""
    hooks = Recorder(accept=False)
    server = Server(Config(host="127.0.0.1", port=0), hooks=hooks)
    [real] = await trio.open_tcp_listeners(0, host="127.0.0.1")

    class FromV6(trio.abc.Listener[trio.SocketStream]):
        async def accept(self) -> trio.SocketStream:
            stream = await real.accept()
            stream.socket.getpeername = lambda: ("::1", 40123, 0, 0)  # type: ignore[method-assign]
            return stream

        async def aclose(self) -> None:
            await real.aclose()

    nursery.start_soon(server._accept_loop, FromV6(), nursery)
    client = await trio.open_tcp_stream(*real.socket.getsockname()[:2])
    await assert_closed(client)
    assert hooks.calls == [("accept", "[::1]:40123")]
    assert peer_host("[::1]:40123") == "::1"


def test_peers_are_parsed_by_addresses() -> None:
    assert peer_host("127.0.0.1:5000") == "127.0.0.1"
    assert str(peer_ip("[::1]:5000")) == "::1"
    assert str(peer_ip("[::ffff:10.0.0.1]:5000")) == "10.0.0.1"  # mapped: counts as IPv4
    assert peer_ip("::1:5000") is None  # unbracketed IPv6 is ambiguous: never produced
    assert peer_ip("not a peer") is None


# ---------------------------------------------------------------------- snapshots


async def test_snapshots_are_copies_with_a_stable_shape() -> None:
    table = RoutingTable(grace=30.0)
    a, b, w = named("a"), named("b"), named("w")
    table.connect(a, "g1", b"A", "alpha", (("::1", 7800),))
    table.connect(b, "g1", b"B", None, ())
    table.connect(b, "g2", b"C", None, ())
    table.watch(w, "g1")
    m = await membership(table)
    assert (m.groups, m.kinds["connection"], m.watchers, m.graced) == (2, 3, 1, 0)
    page = await group_page(table, "", 1)
    assert [(g.name, g.members, g.watchers) for g in page.groups] == [("g1", 2, 1)]
    assert (page.total, page.next) == (2, "g1")
    members = await member_page(table, "g1", 0.0, 0, 10)
    assert members is not None and members.next_offset is None
    alpha = members.members[0]
    assert (alpha.addr, alpha.name, alpha.physical, alpha.kind) == (
        b"A", "alpha", (("::1", 7800),), "connection")
    assert [(c.peer, c.protocol, c.active) for c in alpha.connections] == [("a", "test", True)]
    table.drop_carrier(a, 0.0)  # the table changes; the snapshots taken do not
    assert alpha.connections[0].active and (await membership(table)).graced == 1
    assert m.graced == 0
    assert await member_page(table, "nope", 0.0, 0, 10) is None


class _Probe(NoHooks):
    """Hooks whose endpoint, as it starts, tries the router's port."""

    def __init__(self) -> None:
        self.server: Server | None = None
        self.port_accepted: bool | None = None

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.server is not None
        try:
            stream = await trio.open_tcp_stream(*_address(self.server))
        except OSError:
            self.port_accepted = False
        else:
            self.port_accepted = True
            await stream.aclose()
        task_status.started(None)


async def test_the_port_accepts_only_once_the_hooks_endpoint_is_up(
        nursery: trio.Nursery) -> None:
    """Whoever finds the router's port accepting finds its metrics and admin endpoint up
    too (a load test's admin poll was refused once in CI: the port listened first)."""
    probe = _Probe()
    probe.server = Server(Config(host="127.0.0.1", port=0), hooks=probe)
    await nursery.start(probe.server.serve)
    assert probe.port_accepted is False  # bound while the endpoint started, not listening
    c = await NativeClient.open(*_address(probe.server))
    assert await c.connect("g", b"A") == wire.Ok(1)


class _Squatter(NoHooks):
    """Hooks whose endpoint, as it starts, takes the router's port: another socket that
    may share its address (SO_REUSEADDR) binds it and listens first."""

    def __init__(self) -> None:
        self.server: Server | None = None
        self.taken: socket.socket | None = None

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.server is not None
        self.taken = socket.socket()
        self.taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.taken.bind(_address(self.server))
        self.taken.listen()
        task_status.started(None)


async def test_a_port_taken_between_bind_and_listen_fails_as_a_taken_port_does() -> None:
    """listen() comes after the hooks start; if it fails, the error is the bind's kind,
    bare (Router.run's promise), not wrapped in the nursery's exception group."""
    squatter = _Squatter()
    squatter.server = Server(Config(host="127.0.0.1", port=0), hooks=squatter)
    port = None
    try:
        async with trio.open_nursery() as nursery:
            with pytest.raises(ListenError, match="already in use") as refused:
                await nursery.start(squatter.server.serve)
            port = _address(squatter.server)[1]
        assert port != 0 and f"127.0.0.1:{port}:" in str(refused.value)  # the bound port
        with trio.fail_after(30):  # a guard against a hang, not a timing
            await squatter.server.wait_closed()  # the server ended: nothing left running
    finally:
        assert squatter.taken is not None
        squatter.taken.close()
