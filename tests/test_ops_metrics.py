"""Metrics, the admin view, `gossiprouter dump` and JSON logs, over real sockets."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from gossiprouter.core.addresses import parse_addr
from gossiprouter.ops.logs import JsonFormatter
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from gossiprouter.sessions.counters import Counters
from tests.conftest import RouterFactory, ops_of
from tests.ops_client import OpsClient, assert_closed, http_get

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(server: Server) -> Samples:
    address = ops_of(server).admin_address
    assert address is not None
    status, headers, body = await http_get(address, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def v(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_metrics_move_with_traffic(start_router: RouterFactory) -> None:
    server = await start_router(metrics="127.0.0.1:0", grace=30.0)
    before = await scrape(server)
    assert v(before, "gossiprouter_connections", protocol="native") == 0
    assert v(before, "gossiprouter_groups") == 0
    a, b = await OpsClient.to(server), await OpsClient.to(server)
    assert await a.connect("g", b"A", "alpha") == wire.Ok(1)
    assert await b.connect("g", b"B") == wire.Ok(1)
    for _ in range(10):
        await a.send(wire.Route("g", b"B", b"A", b"x" * 100))
    await a.send(wire.Route("g", None, b"A", b"to-all"))
    for _ in range(11):
        assert isinstance(await b.recv(), wire.Route)
    await a.send(wire.Route("g", b"NOBODY", b"A", b"lost"))
    assert isinstance(await a.recv(), wire.Error)  # unknown_destination
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return v(after, name, **labels) - v(before, name, **labels)

    assert v(after, "gossiprouter_connections", protocol="native") == 2
    assert v(after, "gossiprouter_members", kind="connection") == 2
    assert v(after, "gossiprouter_groups") == 1
    assert delta("gossiprouter_connections_accepted_total", protocol="native") == 2
    assert delta("gossiprouter_frames_in_total", type="route") == 12
    assert v(after, "gossiprouter_frames_in_total", type="connect") == 2
    assert v(after, "gossiprouter_frames_in_total", type="hello") == 2
    assert delta("gossiprouter_frames_out_total", type="route") == 11
    assert delta("gossiprouter_drops_total", reason="unknown_destination") == 1
    assert delta("gossiprouter_bytes_in_total") > 1000
    # At least: a's WELCOME, OK, ERROR and b's WELCOME, OK, ROUTEs (batched or not).
    assert delta("gossiprouter_socket_writes_total") >= 5
    assert delta("gossiprouter_bytes_out_total") > 1000
    assert v(after, "gossiprouter_outbound_queued_bytes") >= 0
    assert v(after, "gossiprouter_grace_entries") == 0

    # Reconnect grace: B's connection drops, traffic for it is held.
    await b.aclose()
    await trio.sleep(0.1)
    await a.send(wire.Route("g", b"B", b"A", b"held"))
    with trio.fail_after(5):
        while True:
            s = await scrape(server)
            if v(s, "gossiprouter_grace_held_bytes") > 0:
                break
            await trio.sleep(0.02)
    assert v(s, "gossiprouter_grace_entries") == 1
    assert v(s, "gossiprouter_connections", protocol="native") == 1
    # No per-address or per-group label anywhere (the settings are the config's).
    for name, labels in s:
        if name != "gossiprouter_settings_info":
            assert {k for k, _ in labels} <= {"protocol", "type", "reason", "kind", "what",
                                              "result", "version", "router_id", "code"}
    [settings] = [dict(labels) for name, labels in s if name == "gossiprouter_settings_info"]
    assert settings == {
        "fast_path": "off" if server.fast is None else "on", "dispatcher": "on",
        "direct_send": "on", "coalesce_writes": "off", "slow_consumer_policy": "disconnect",
        "jgroups_slow_consumer_policy": "drop",
        "outbound_queue_bytes": str(server.config.outbound_queue_bytes), "write_timeout": "10",
        "fast_path_threads": "16", "fast_path_sched": "batch"}


def closes(samples: Samples) -> dict[str, float]:
    """gossiprouter_connections_closed_total by reason, the zeros left out."""
    return {dict(labels)["reason"]: n for (name, labels), n in samples.items()
            if name == "gossiprouter_connections_closed_total" and n}


async def wait_no_connections(server: Server) -> Samples:
    """Scrape until no client connection is open (each one's close is counted by then)."""
    with trio.fail_after(10):
        while True:
            s = await scrape(server)
            if sum(n for (name, _), n in s.items() if name == "gossiprouter_connections") == 0:
                return s
            await trio.sleep(0.02)


async def test_handshake_timeouts_counted_by_reason(start_router: RouterFactory) -> None:
    """Both handshake timeouts, before the protocol is known (no session: nothing sent) and
    after the preamble without HELLO (ERROR handshake_timeout), are router closes with reason
    handshake_timeout; a client that closes itself is not counted."""
    server = await start_router(metrics="127.0.0.1:0", handshake_timeout=0.3)
    assert server.address is not None
    silent = await trio.open_tcp_stream(*server.address)
    no_hello = await OpsClient.open(*server.address, hello=False)
    frames = await no_hello.recv_until_closed(timeout=10)
    assert frames == [wire.Error(None, "handshake_timeout", "handshake not done within 0.3s")]
    await assert_closed(silent, timeout=10)
    polite = await OpsClient.to(server)
    await polite.aclose()
    s = await wait_no_connections(server)
    assert closes(s) == {"handshake_timeout": 2}
    await silent.aclose()
    await no_hello.aclose()


async def test_idle_close_counted(start_router: RouterFactory) -> None:
    server = await start_router(metrics="127.0.0.1:0", idle_timeout=0.3)
    c = await OpsClient.to(server)
    assert await c.connect("g", b"A") == wire.Ok(1)
    frames = await c.recv_until_closed(timeout=10)
    assert isinstance(frames[-1], wire.Error) and frames[-1].code == "idle_timeout"
    s = await wait_no_connections(server)
    assert closes(s) == {"idle_timeout": 1}
    assert v(s, "gossiprouter_connections_closed_total", reason="other") == 0
    await c.aclose()


async def test_too_long_connect_counted_as_refusal(start_router: RouterFactory) -> None:
    """A CONNECT refused too_long counts in refusals (the connection stays open, no close)."""
    server = await start_router(metrics="127.0.0.1:0", max_name_bytes=16)
    c = await OpsClient.to(server)
    reply = await c.connect("g", b"A", "n" * 17)
    assert isinstance(reply, wire.Error) and reply.code == "too_long", reply
    assert await c.connect("g", b"A", "short") == wire.Ok(2)  # still open and usable
    s = await scrape(server)
    assert v(s, "gossiprouter_refusals_total", code="too_long") == 1
    assert v(s, "gossiprouter_refusals_total", code="other") == 0
    assert closes(s) == {}
    await c.aclose()


async def test_groups_view_matches_get_members(start_router: RouterFactory) -> None:
    server = await start_router(metrics="127.0.0.1:0")
    admin = ops_of(server).admin_address
    assert admin is not None
    a, b, w = await OpsClient.to(server), await OpsClient.to(server), await OpsClient.to(server)
    await a.connect("g/1", b"\x01\x02", "alpha", (("10.0.0.1", 7800),))
    await b.connect("g/1", b"B", None, (("::1", 7801),))
    await b.connect("h", b"B")
    assert await w.request(wire.Watch(w.req(), "g/1")) == wire.Ok(1)

    status, headers, body = await http_get(admin, "/groups")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"groups": [
        {"name": "g/1", "members": 2, "watchers": 1},
        {"name": "h", "members": 1, "watchers": 0},
    ], "total": 2, "next": None}
    status, _, body = await http_get(admin, "/groups/g%2F1")
    assert status == 200
    view = json.loads(body)
    assert [(bytes.fromhex(m["addr"]), m["name"]) for m in view["members"]] == \
        [(m.addr, m.name) for m in await w.member_list("g/1")]
    assert view["members"][0]["physical"] == ["10.0.0.1:7800"]
    assert view["members"][1]["physical"] == ["[::1]:7801"]
    m0 = view["members"][0]
    assert m0["kind"] == "connection" and m0["sticky"] is False
    assert m0["expires_in"] is None and m0["grace_remaining"] is None
    assert len(m0["connections"]) == 1 and m0["connections"][0]["protocol"] == "native"
    assert m0["connections"][0]["active"] is True
    assert m0["connections"][0]["peer"].startswith("127.0.0.1:")
    assert view["watchers"] == 1

    status, _, body = await http_get(admin, "/groups/nope")
    assert status == 404 and "nope" in json.loads(body)["error"]
    status, _, body = await http_get(admin, "/nothing-here")
    assert status == 404 and "error" in json.loads(body)
    status, headers, body = await http_get(admin, "/groups", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    status, _, body = await http_get(admin, "/groups", method="HEAD")
    assert status == 200 and body == b""


def _wait_for(path: Path, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in log:\n{path.read_text()}")


def _admin_port(log_text: str) -> int:
    line = next(ln for ln in log_text.splitlines() if "admin view on http://" in ln)
    return int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def _router_port(log_text: str) -> int:
    line = next(ln for ln in log_text.splitlines() if "listening on " in ln)
    return int(line.split("listening on ", 1)[1].split()[0].rsplit(":", 1)[1])


def test_dump_end_to_end(tmp_path: Path) -> None:
    """`gossiprouter dump` against a router running in another process."""
    log_path = tmp_path / "router.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
             "--metrics", "127.0.0.1:0", "--log-format", "json"],
            stderr=log_file, stdout=subprocess.DEVNULL)
    try:
        text = _wait_for(log_path, "admin view on http://")
        admin = f"127.0.0.1:{_admin_port(text)}"
        port = _router_port(text)

        async def register_and_dump() -> None:
            c = await OpsClient.open("127.0.0.1", port)
            await c.connect("billing", b"\xab\xcd", "svc-1", (("10.1.2.3", 7800),))
            await c.connect("billing", b"node-b", "svc-2", ())

            def dump(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "gossiprouter", "dump", admin,
                                       *args], capture_output=True, text=True, timeout=30)

            r = await trio.to_thread.run_sync(dump)
            assert r.returncode == 0, r.stderr
            assert r.stdout.split("\n")[0].split() == ["GROUP", "MEMBERS", "WATCHERS"]
            assert r.stdout.split("\n")[1].split() == ["billing", "2", "0"]
            r = await trio.to_thread.run_sync(dump, "billing")
            assert r.returncode == 0, r.stderr
            assert "svc-1" in r.stdout and "10.1.2.3:7800" in r.stdout
            # Addresses as `send --to` reads them back (parse_addr), not the view's bare hex.
            rows = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines()[2:]}
            assert rows == {"svc-1": "hex:abcd", "svc-2": "node-b"}
            r = await trio.to_thread.run_sync(dump, "billing", "--json")
            got = [m["addr"] for m in json.loads(r.stdout)["members"]]
            assert got == ["hex:abcd", "node-b"]
            assert [parse_addr(a) for a in got] == [b"\xab\xcd", b"node-b"]
            r = await trio.to_thread.run_sync(dump, "nope")
            assert r.returncode == 1 and "no group 'nope'" in r.stderr
            await c.aclose()

        trio.run(register_and_dump)
        # JSON logs: one object per line; the join names who, which group, from where.
        lines = [json.loads(ln) for ln in _wait_for(log_path, "joined").splitlines()]
        assert all({"time", "level", "logger", "message"} <= set(o) for o in lines)
        # Nothing internal on any line (ClientText's marker was written on every one).
        assert not [k for o in lines for k in o if k.startswith("_")]
        join = next(o for o in lines if o["message"].startswith("joined"))
        assert "svc-1" in join["message"] and "billing" in join["message"]
        assert "127.0.0.1:" in join["message"] and join["level"] == "info"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "dump", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot reach the admin endpoint" in r.stderr
    assert "Traceback" not in r.stderr


def test_json_formatter_extra_fields() -> None:
    rec = logging.LogRecord("gossiprouter.ops", logging.WARNING, __file__, 1,
                            "refusing %s", ("1.2.3.4:5",), None)
    rec.peer, rec.reason = "1.2.3.4:5", "network"
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "refusing 1.2.3.4:5" and out["level"] == "warning"
    assert out["logger"] == "gossiprouter.ops" and out["time"].endswith("Z")
    assert out["peer"] == "1.2.3.4:5" and out["reason"] == "network"
    assert "args" not in out and "msg" not in out
    assert os.linesep not in JsonFormatter().format(rec)


def test_close_and_refusal_labels_are_bounded() -> None:
    """Only the router's own codes become label values; the peer's ends are not closes."""
    c = Counters()
    for reason in ("idle_timeout", "made up by someone", "eof", "write failed", "close",
                   "close_marker", ""):
        c.closed(reason)
    c.refused("too_long")
    c.refused("x" * 100)
    assert c.closes == {"idle_timeout": 1, "other": 1}
    assert c.refusals == {"too_long": 1, "other": 1}


def test_dump_timeout_is_typed_as_every_other_timeout() -> None:
    """`dump --timeout` takes seconds, at least 0.1, as the client commands' --timeout does:
    0 or a negative value is a usage error, not a confusing failure to reach the endpoint."""
    from click.testing import CliRunner

    from gossiprouter.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        r = CliRunner().invoke(main, list(args), prog_name="gossiprouter")
        return r.exit_code, r.stdout, r.stderr

    for bad in ("0", "-1", "5s"):
        code, _, err = run("dump", "127.0.0.1:1", "--timeout", bad)
        assert code == 2, err
        assert err.startswith("gossiprouter: error: ") and "--timeout" in err, err
        assert "Traceback" not in err and "admin endpoint" not in err, err

    def timeout_help(command: str) -> str:
        text = run(command, "--help")[1]
        m = re.search(r"--timeout (.*?)(?=\n\s+-|\Z)", text, re.S)
        assert m is not None, text
        return " ".join(m.group(1).split())

    assert timeout_help("dump") == timeout_help("members")
    assert "x>=0.1" in timeout_help("dump")
