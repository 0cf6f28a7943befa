"""The command line as a new user meets it: addresses that paste back, clean leaving,
and one error format (issue 15, items 3 to 5).

Commands run as real subprocesses against an in-process router on 127.0.0.1 (or
in-process through click's CliRunner where no router is involved).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gossiprouter import RouterStub
from gossiprouter.addresses import (
    format_addr,
    format_hostport,
    parse_addr,
    parse_group,
    parse_hostport,
    parse_hostports,
)
from gossiprouter.cli import main
from gossiprouter.config import ConfigError, load_file
from gossiprouter.protocol.native import MAX_ADDR, MAX_GROUP
from gossiprouter.server import Server
from tests.test_blocking_and_tools import CLI, REPO, cli, hostport
from tests.test_stub import FAST, drain, free_port

PREFIX = "gossiprouter: error: "


# --------------------------------------------------------------------------- addresses


def test_hostport_brackets_ipv6_both_ways() -> None:
    assert parse_hostport("127.0.0.1:12001") == ("127.0.0.1", 12001)
    assert parse_hostport("[::1]:12001") == ("::1", 12001)
    assert parse_hostport("router.example.org:1") == ("router.example.org", 1)
    assert format_hostport("::1", 12001) == "[::1]:12001"
    assert format_hostport("10.0.0.5", 7800) == "10.0.0.5:7800"
    for host, port in (("fd00::5", 7800), ("10.0.0.5", 1), ("name", 65535)):
        assert parse_hostport(format_hostport(host, port)) == (host, port)
    with pytest.raises(ValueError, match=r"IPv6 address goes in brackets, e\.g\. \[::1\]:12001"):
        parse_hostport("::1:12001")
    for bad in ("localhost", "h:0", "h:65536", ":1", "[]:1", "h:x", "[::1:1", ""):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            parse_hostport(bad)
    assert parse_hostport("h:0", allow_zero=True) == ("h", 0)
    assert parse_hostports("a:1, [::1]:2") == [("a", 1), ("::1", 2)]
    with pytest.raises(ValueError):
        parse_hostports(" , ")


def test_member_addresses_print_as_typed() -> None:
    assert format_addr(b"node-a") == "node-a"
    assert format_addr(b"\x0a\x0b") == "hex:0a0b"
    assert format_addr(b"hex:zz") == "hex:" + b"hex:zz".hex()  # would read back as hex
    assert format_addr(b"-x") == "hex:2d78"  # would read as an option
    assert format_addr(b"a b") == "hex:612062"  # would need quotes in a shell
    assert format_addr("grüße".encode()) == "grüße"
    assert parse_addr("hex:0a0b") == b"\x0a\x0b" and parse_addr("node-a") == b"node-a"


@given(st.binary(min_size=1, max_size=MAX_ADDR))
def test_every_printed_address_reads_back_and_needs_no_quoting(addr: bytes) -> None:
    shown = format_addr(addr)
    assert parse_addr(shown) == addr
    assert shlex.split(shown) == [shown]


def test_limits_come_from_the_protocol() -> None:
    assert parse_addr("x" * MAX_ADDR) == b"x" * MAX_ADDR
    with pytest.raises(ValueError, match=f"at most {MAX_ADDR} bytes"):
        parse_addr("x" * (MAX_ADDR + 1))
    with pytest.raises(ValueError, match="hex digits"):
        parse_addr("hex:zz")
    with pytest.raises(ValueError, match="empty"):
        parse_addr("hex:")
    assert parse_group("g" * MAX_GROUP) == "g" * MAX_GROUP
    with pytest.raises(ValueError, match=f"at most {MAX_GROUP} bytes"):
        parse_group("g" * (MAX_GROUP + 1))


def test_config_file_reads_addresses_the_same_way(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('metrics = "[::1]:0"\n[[provisioned]]\ngroup = "g"\naddr = "hex:0a0b"\n'
                 'physical = ["[fd00::5]:7800", "10.0.0.5:7800"]\n')
    values = load_file(f)
    [p] = values["provisioned"]
    assert values["metrics"] == "[::1]:0"
    assert p.addr == b"\x0a\x0b" and p.physical == (("fd00::5", 7800), ("10.0.0.5", 7800))
    f.write_text(f'[[provisioned]]\ngroup = "g"\naddr = "{"x" * (MAX_ADDR + 1)}"\n')
    with pytest.raises(ConfigError, match=f"at most {MAX_ADDR} bytes"):
        load_file(f)
    f.write_text('[[provisioned]]\ngroup = "g"\naddr = "a"\nphysical = ["fd00::5:7800"]\n')
    with pytest.raises(ConfigError, match="brackets"):
        load_file(f)


async def test_printed_addresses_paste_into_send(router: Server) -> None:
    """IPv6 physical addresses print in brackets; what listen prints as its own address
    pastes into send --to and the message arrives."""
    hp = hostport(router)
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as stub:
        await stub.connect("demo", b"v6", physical=[("fd00::5", 7800)])
        r = await cli("members", hp, "demo", "--json")
        assert r.returncode == 0, r.stderr
        assert '"physical": ["[fd00::5]:7800"]' in r.stdout.decode()

        listen = await trio.lowlevel.open_process([*CLI, "listen", hp, "demo"], cwd=REPO,
                                                  stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE)
        try:
            assert listen.stderr is not None and listen.stdout is not None
            err = b""
            with trio.fail_after(20):
                while b"Ctrl-C to stop" not in err:
                    err += await listen.stderr.receive_some(4096)
            me = re.search(rb"listening as (\S+) in", err)
            assert me is not None and me.group(1).startswith(b"hex:"), err
            r = await cli("send", hp, "demo", "--to", me.group(1).decode(), "pasted")
            assert r.returncode == 0, r.stderr
            out = b""
            with trio.fail_after(10):
                while b"pasted" not in out:
                    out += await listen.stdout.receive_some(4096)
            assert re.search(rb"message from gossiprouter-send \(hex:[0-9a-f]+\) to me: pasted",
                             out), out
        finally:
            listen.kill()
            await listen.wait()


# --------------------------------------------------------------------------- clean leave


async def test_failed_send_leaves_cleanly(router: Server) -> None:
    """A unicast to nobody fails (exit 1), and the group sees the tool leave, not
    vanish: "leave", never "suspect"."""
    hp = hostport(router)
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as stub:
        await stub.watch("demo")  # the channel then gets join and leave, besides suspect
        witness = await stub.connect("demo", b"witness")
        r = await cli("send", hp, "demo", "--from", "tool-1", "--to", "hex:ee", "x")
        assert r.returncode == 1
        assert r.stderr.decode() == f"{PREFIX}no member hex:ee in 'demo': message dropped\n"
        with trio.fail_after(5):
            kinds = []
            while "leave" not in kinds and "suspect" not in kinds:
                ev = await witness.events().receive()
                if ev.member.addr == b"tool-1":
                    kinds.append(ev.kind)
        assert kinds == ["join", "leave"]
        assert await drain(witness.events(), 0.2) == []
        assert {e.addr for e in router.hub.table.members("demo")} == {b"witness"}


# --------------------------------------------------------------------------- errors


def _invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), prog_name="gossiprouter")
    return r.exit_code, r.stderr


@pytest.mark.parametrize("args", [
    ("serve", "--port", "70000"),
    ("serve", "--port", "abc"),
    ("serve", "--idle-timeout", "-1"),
    ("serve", "--allow-native", "10.0.0.1/8"),
    ("serve", "--bogus"),
    ("members",),
    ("frob",),
    ("members", "127.0.0.1:1", "demo", "--timeout", "0"),
])
def test_bad_arguments_exit_2_with_the_one_prefix(args: tuple[str, ...]) -> None:
    code, err = _invoke(*args)
    assert code == 2, err
    assert err.startswith(PREFIX) and err.count("\n") == 1, err
    assert "Usage:" not in err and "Traceback" not in err


def test_bad_port_names_option_and_range() -> None:
    code, err = _invoke("serve", "--port", "70000")
    assert (code, err) == (2, f"{PREFIX}invalid value for '--port': 70000: expected a TCP "
                              "port, 0 to 65535 (see 'gossiprouter serve --help')\n")


def test_unknown_config_key_suggests_the_right_one(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("idle_timout = 5\n")
    code, err = _invoke("serve", "--config", str(f))
    assert code == 1
    assert err == f"{PREFIX}config file {f}: unknown key 'idle_timout'; did you mean " \
                  "'idle_timeout'?\n"
    f.write_text("zzz = 5\n")
    code, err = _invoke("serve", "--config", str(f))
    assert code == 1 and "unknown key 'zzz'; expected one of " in err and "did you" not in err


@pytest.mark.parametrize(("command", "hidden", "message"), [
    ("analyze", ("pyspark", "py4j"),
     "the analysis needs PySpark: pip install 'gossiprouter[loadtest]'"),
    ("loadtest", ("pyarrow",),
     "the load test needs pyarrow and rich: pip install 'gossiprouter[loadtest]'"),
])
def test_missing_extra_names_the_package_and_one_install_hint(
        command: str, hidden: tuple[str, ...], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in hidden:  # as if not installed: find_spec gives None, import fails
        monkeypatch.setitem(sys.modules, name, None)
    scenario = tmp_path / "s.toml"
    scenario.write_text('duration = 1.0\n[[groups]]\nname = "a"\nmembers = 2\n')
    args = [str(tmp_path)] if command == "analyze" else [
        str(scenario), "--spawn-router", "--out", str(tmp_path / "run")]
    code, err = _invoke(command, *args)
    assert (code, err) == (1, f"{PREFIX}{message}\n")
    assert "py4j" not in err


# --------------------------------------------------------------------------- not a router


async def _peer(nursery: trio.Nursery, reply: bytes | None, close: bool) -> int:
    """A TCP server on 127.0.0.1 that is no router: it answers ``reply`` (or nothing) to
    whatever arrives, then closes or keeps the connection open."""
    accepted = []

    async def handle(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await stream.receive_some(4096)
        if reply is not None:
            await stream.send_all(reply)
        if close:
            await stream.aclose()
            return
        await trio.sleep_forever()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def test_a_peer_that_is_no_router_is_named(nursery: trio.Nursery) -> None:
    http = await _peer(nursery, b"HTTP/1.0 400 Bad Request\r\nServer: x\r\n\r\n", close=False)
    # --timeout 60: the answer comes from what the peer sent, not from waiting.
    r = await cli("members", f"127.0.0.1:{http}", "demo", "--timeout", "60")
    assert (r.returncode, r.stderr.decode()) == (1, (
        f"{PREFIX}the peer at 127.0.0.1:{http} does not speak the gossiprouter protocol "
        "(got 'HTTP/1.0 400 Bad Request'...)\n"))

    binary = await _peer(nursery, b"\x00\x00\x00\x02\x91\x01", close=False)  # a frame, no WELCOME
    r = await cli("send", f"127.0.0.1:{binary}", "demo", "x", "--timeout", "60")
    assert r.stderr.decode() == (
        f"{PREFIX}the peer at 127.0.0.1:{binary} does not speak the gossiprouter protocol "
        "(got bytes 00 00 00 02 91 01)\n")

    closing = await _peer(nursery, None, close=True)
    r = await cli("members", f"127.0.0.1:{closing}", "demo", "--timeout", "60")
    assert r.returncode == 1
    assert "closed the connection without answering HELLO" in r.stderr.decode()

    silent = await _peer(nursery, None, close=False)
    r = await cli("listen", f"127.0.0.1:{silent}", "demo", "--timeout", "1")
    assert r.returncode == 1
    assert re.fullmatch(
        rf"{PREFIX}the peer at 127\.0\.0\.1:{silent} does not speak the gossiprouter "
        r"protocol \(got no reply to HELLO in \d+\.\ds\)\n", r.stderr.decode()), r.stderr

    refused = free_port()
    r = await cli("members", f"127.0.0.1:{refused}", "demo")
    assert r.stderr.decode() == (
        f"{PREFIX}cannot reach router at 127.0.0.1:{refused}: connection refused\n")


# --------------------------------------------------------------------------- completion


def test_shell_completion_is_documented_and_works() -> None:
    readme = (REPO / "README.md").read_text()
    assert 'eval "$(_GOSSIPROUTER_COMPLETE=bash_source gossiprouter)"' in readme
    exe = Path(sys.executable).parent / "gossiprouter"
    env = os.environ | {"_GOSSIPROUTER_COMPLETE": "bash_complete", "COMP_CWORD": "1",
                        "COMP_WORDS": "gossiprouter se"}
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.split() == ["plain,send", "plain,serve"], r
    env |= {"COMP_WORDS": "gossiprouter serve --slow-consumer-policy ", "COMP_CWORD": "3"}
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["plain,disconnect", "plain,drop"], r
