"""The admin/metrics endpoint never stalls routing, answers in bounded pages, and can require a
bearer token (issue 12, item 7). Real sockets; the stall itself is measured by
``benchmarks/bench_admin_stall.py``, not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.ops.admin import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    group_view,
    groups_view,
)
from gossiprouter.ops.runtime import check_startup
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory as Start
from tests.conftest import ops_of
from tests.hostile import during
from tests.nclient import NativeClient
from tests.ops_client import http_get

N_GROUPS = 2500


async def _many_groups(router: Server, n: int) -> NativeClient:
    """One client watching ``n`` groups g00000.. (pipelined WATCHes)."""
    assert router.address is not None
    c = await NativeClient.open(*router.address)
    await c.send_raw(b"".join(wire.encode(wire.Watch(i + 1, f"g{i:05d}")) for i in range(n)))
    for i in range(n):
        assert await c.recv(timeout=30) == wire.Ok(i + 1)
    return c


def _admin(router: Server) -> tuple[str, int]:
    address = ops_of(router).admin_address
    assert address is not None
    return address


async def test_groups_are_paged_by_name(start_router: Start) -> None:
    router = await start_router(metrics="127.0.0.1:0", watches_per_connection=0,
                                control_rate=0)
    watcher = await _many_groups(router, N_GROUPS)  # noqa: F841 - kept open
    admin = _admin(router)
    names: list[str] = []
    after = None
    pages = 0
    while True:
        path = "/groups" + ("" if after is None else f"?after={after}")
        status, _, body = await http_get(admin, path)
        assert status == 200
        view = json.loads(body)
        assert len(view["groups"]) <= DEFAULT_LIMIT and view["total"] == N_GROUPS
        names += [g["name"] for g in view["groups"]]
        pages += 1
        after = view["next"]
        if after is None:
            break
    assert names == sorted(f"g{i:05d}" for i in range(N_GROUPS))
    assert pages == -(-N_GROUPS // DEFAULT_LIMIT)
    status, _, body = await http_get(admin, "/groups?limit=10&after=g00100")
    assert [g["name"] for g in json.loads(body)["groups"]] == [f"g{i:05d}" for i in
                                                               range(101, 111)]
    for bad in ("limit=0", f"limit={MAX_LIMIT + 1}", "limit=x", "offset=-1"):
        status, _, body = await http_get(admin, "/groups?" + bad)
        assert status == 400 and "limit" in json.loads(body)["error"]


async def test_members_are_paged(start_router: Start) -> None:
    router = await start_router(metrics="127.0.0.1:0", addresses_per_connection=0,
                                control_rate=0)
    assert router.address is not None
    c = await NativeClient.open(*router.address)
    n = 25
    for i in range(n):
        assert isinstance(await c.connect("big", b"M%02d" % i), wire.Ok)
    status, _, body = await http_get(_admin(router), "/groups/big?limit=10&offset=20")
    view = json.loads(body)
    assert status == 200 and view["total"] == n and view["offset"] == 20
    assert [m["addr"] for m in view["members"]] == [(b"M%02d" % i).hex() for i in range(20, 25)]
    assert view["next_offset"] is None
    _, _, body = await http_get(_admin(router), "/groups/big?limit=10")
    assert json.loads(body)["next_offset"] == 10


async def test_views_yield_to_the_loop(start_router: Start) -> None:
    """Building /groups, /groups/NAME and /metrics over thousands of items lets other tasks
    run in between (checkpoints), where it used to be one synchronous walk."""
    router = await start_router(metrics="127.0.0.1:0", watches_per_connection=0,
                                addresses_per_connection=0, control_rate=0)
    watcher = await _many_groups(router, N_GROUPS)  # noqa: F841 - kept open
    assert router.address is not None
    member = await NativeClient.open(*router.address)
    await member.send_raw(b"".join(wire.encode(wire.Connect(i + 1, "big", b"M%d" % i, None, ()))
                                   for i in range(N_GROUPS)))
    for i in range(N_GROUPS):
        assert await member.recv(timeout=30) == wire.Ok(i + 1)
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await trio.sleep(0)

    async with trio.open_nursery() as n:
        n.start_soon(tick)
        await trio.sleep(0)
        before = ticks
        await groups_view(router.hub.table)
        assert ticks > before
        before = ticks
        admin = ops_of(router).admin
        assert admin is not None and admin.render_metrics is not None
        await admin.render_metrics()
        assert ticks > before
        before = ticks
        view = await group_view(router.hub.table, "big", 0.0, limit=MAX_LIMIT)
        assert view is not None and len(view["members"]) == N_GROUPS
        assert ticks > before
        done = True


async def test_admin_polling_during_traffic_loses_nothing(start_router: Start) -> None:
    router = await start_router(metrics="127.0.0.1:0", watches_per_connection=0,
                                control_rate=0)
    watcher = await _many_groups(router, N_GROUPS)  # noqa: F841 - kept open

    async def attack(honest: object) -> None:
        for _ in range(5):
            status, _, _ = await http_get(_admin(router), "/groups?limit=10000")
            assert status == 200
            status, _, body = await http_get(_admin(router), "/metrics")
            assert status == 200 and b"gossiprouter_groups" in body

    await during(router, attack)


async def test_bearer_token(start_router: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GR_TEST_ADMIN_TOKEN", "s3cret-admin-token-123")
    router = await start_router(metrics="127.0.0.1:0", admin_token="env:GR_TEST_ADMIN_TOKEN")
    admin = _admin(router)
    for path in ("/groups", "/metrics", "/groups/x"):
        status, headers, body = await http_get(admin, path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        assert "admin_token" in json.loads(body)["error"]

    async def get(path: str, token: str) -> int:
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream(*admin)
            async with stream:
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n"
                                      f"Authorization: Bearer {token}\r\n\r\n".encode())
                raw = b""
                while data := await stream.receive_some(65536):
                    raw += data
        return int(raw.split(b" ", 2)[1])

    assert await get("/groups", "wrong-token-wrong-token") == 401
    assert await get("/groups", "s3cret-admin-token-123") == 200
    assert await get("/metrics", "s3cret-admin-token-123") == 200
    admin_server = ops_of(router).admin
    assert admin_server is not None and admin_server.unauthorized == 4


async def test_idle_connections_never_lock_the_scraper_out(
        start_router: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 idle connections without a token (no request at all), 4 more before every scrape:
    the authorised scraper gets all its 25 answers. Connections still sending their head are
    capped (MAX_UNREAD, the oldest closed for the newest) and each has HEAD_TIMEOUT; a
    request holds one of the MAX_CLIENTS slots only once its head is read. Counted, not timed:
    before, the idle ones held every slot and the scraper was closed at once."""
    monkeypatch.setenv("GR_TEST_ADMIN_TOKEN", "s3cret-admin-token-123")
    router = await start_router(metrics="127.0.0.1:0", admin_token="env:GR_TEST_ADMIN_TOKEN")
    admin = _admin(router)
    idle = [await trio.open_tcp_stream(*admin) for _ in range(64)]
    answers = 0
    for _ in range(25):
        idle += [await trio.open_tcp_stream(*admin) for _ in range(4)]
        try:
            status, _, body = await http_get(
                admin, "/metrics", extra="Authorization: Bearer s3cret-admin-token-123\r\n")
        except (trio.BrokenResourceError, IndexError, ValueError):
            continue  # closed without an answer
        answers += status == 200 and b"gossiprouter_" in body
    assert answers == 25
    server = ops_of(router).admin
    assert server is not None and server.evicted > 0
    for s in idle:
        await s.aclose()


def test_admin_token_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GR_NOT_SET", raising=False)
    cases = {
        "env:GR_NOT_SET": "GR_NOT_SET is not set",
        f"file:{tmp_path / 'missing'}": "file not found",
    }
    for ref, why in cases.items():
        with pytest.raises(ConfigError, match=why):
            check_startup(Config(metrics="127.0.0.1:0", admin_token=ref))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16"):
        check_startup(Config(metrics="127.0.0.1:0", admin_token=f"file:{short}"))
    with pytest.raises(ConfigError, match="metrics is not"):
        check_startup(Config(admin_token=f"file:{short}"))
    with pytest.raises(ConfigError, match="file:PATH or env:NAME"):
        Config(admin_token="plain-token-in-config")
