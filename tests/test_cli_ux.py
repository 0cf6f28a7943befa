"""The command line as a new user meets it: addresses that paste back, clean leaving,
and one error format (issue 15, items 3 to 5).

Commands run as real subprocesses against an in-process router on 127.0.0.1 (or
in-process through click's CliRunner where no router is involved).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from functools import partial
from pathlib import Path

import click
import pytest
import trio
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gossiprouter import RouterStub
from gossiprouter.cli.main import main
from gossiprouter.core.addresses import (
    format_addr,
    format_hostport,
    parse_addr,
    parse_group,
    parse_hostport,
    parse_hostports,
)
from gossiprouter.core.cli_errors import install_hint
from gossiprouter.core.config import ConfigError, load_file
from gossiprouter.protocol.native_frames import MAX_ADDR, MAX_GROUP
from gossiprouter.server.listener import Server
from tests.procs import refused_port
from tests.test_blocking_and_tools import CLI, REPO, cli, hostport
from tests.test_stub import FAST, drain

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
    ("analyze", ("pyspark", "py4j"), "the analysis needs PySpark: "),
    ("loadtest", ("pyarrow",), "the load test needs pyarrow and rich: "),
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
    assert (code, err) == (1, f"{PREFIX}{message}{install_hint('loadtest')}\n")
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
        f"{PREFIX}the peer at 127.0.0.1:{http} does not speak the gossiprouter protocol: "
        "an HTTP server answered ('HTTP/1.0 400 Bad Request'): is this the metrics port?\n"))

    binary = await _peer(nursery, b"\x00\x00\x00\x02\x91\x01", close=False)  # a frame, no WELCOME
    r = await cli("send", f"127.0.0.1:{binary}", "demo", "x", "--timeout", "60")
    assert r.stderr.decode() == (
        f"{PREFIX}the peer at 127.0.0.1:{binary} does not speak the gossiprouter protocol "
        "(got bytes 00 00 00 02 91 01)\n")

    closing = await _peer(nursery, None, close=True)
    r = await cli("members", f"127.0.0.1:{closing}", "demo", "--timeout", "60")
    assert r.returncode == 1
    assert r.stderr.decode().startswith(
        f"{PREFIX}the peer at 127.0.0.1:{closing} closed the connection during the handshake: "
        "is this a gossiprouter or JGroups router port?")

    silent = await _peer(nursery, None, close=False)
    r = await cli("listen", f"127.0.0.1:{silent}", "demo", "--timeout", "1")
    assert r.returncode == 1
    assert re.fullmatch(
        rf"{PREFIX}the peer at 127\.0\.0\.1:{silent} does not speak the gossiprouter "
        r"protocol \(got no reply to HELLO in \d+\.\ds\)\n", r.stderr.decode()), r.stderr

    with refused_port() as refused:
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


# --------------------------------------------------------------------------- optional parts

# Every optional dependency, by the name a failing import would stop at.
OPTIONAL = ("paho", "pyarrow", "pyspark", "prometheus_client", "gossiprouter.server._relay")

# Runs `gossiprouter ARGS` for each ARGS of argv[2] (JSON) in this one process, with the
# modules of argv[1] hidden (an import of them raises ImportError, find_spec finds none),
# and prints [exit status, stderr] for each. A traceback is printed into that stderr.
_HIDDEN_RUNNER = """
import contextlib, faulthandler, io, json, sys, traceback
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
from gossiprouter.cli.main import main
from gossiprouter.core.cli_errors import install_hint
out = []
for argv in json.loads(sys.argv[2]):
    # A command that does not end in 90 s (each ends in a few): the runner exits with every
    # thread's stack, after the command's name.
    print('running', argv, file=sys.__stderr__, flush=True)
    faulthandler.dump_traceback_later(90, exit=True, file=sys.__stderr__)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv, prog_name="gossiprouter")
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = None
    faulthandler.cancel_dump_traceback_later()
    out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def _every_subcommand(tmp_path: Path, busy: int, closed: int) -> dict[str, list[str]]:
    """Each subcommand with arguments that use every optional part it has, and end at once
    in a failure when all are there (a taken port, nobody listening, a full directory), so
    each run is one error line whatever is hidden."""
    full = tmp_path / "full"
    full.mkdir(exist_ok=True)
    (full / "x").write_text("")
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    topics = str(REPO / "scripts" / "scenarios" / "topics.toml")
    small = str(REPO / "scripts" / "scenarios" / "small.toml")
    nobody = f"127.0.0.1:{closed}"
    return {
        "serve": ["serve", "--port", str(busy), "--log-level", "error", "--fast-path", "on",
                  "--bridge", f"mqtt://{nobody}", "--metrics", "127.0.0.1:0"],
        "members": ["members", nobody, "demo"],
        "send": ["send", nobody, "demo", "x"],
        "listen": ["listen", nobody, "demo"],
        "publish": ["publish", nobody, "demo", "v1/pos/eu/de", "x"],
        "dump": ["dump", nobody],
        "loadtest": ["loadtest", small, "--router", nobody, "--out", str(tmp_path / "run")],
        # The same again: a run that failed before recording leaves its directory reusable.
        "loadtest again": ["loadtest", small, "--router", nobody, "--out",
                           str(tmp_path / "run")],
        "loadtest topics": ["loadtest", topics, "--out", str(full)],
        "loadtest-topics": ["loadtest-topics", topics, "--out", str(full)],
        "analyze": ["analyze", str(empty)],
    }


# What each hidden part must be named in, where a command needs it.
_NAMED = {
    ("paho", "serve"): "paho-mqtt", ("paho", "loadtest topics"): "paho-mqtt",
    ("paho", "loadtest-topics"): "paho-mqtt",
    ("gossiprouter.server._relay", "serve"): "gossiprouter.server._relay",
    ("pyarrow", "loadtest"): "pyarrow", ("pyarrow", "loadtest topics"): "pyarrow",
    ("pyarrow", "loadtest-topics"): "pyarrow", ("pyspark", "analyze"): "PySpark",
}


def test_main_lists_every_subcommand_the_matrix_runs(tmp_path: Path) -> None:
    """A new subcommand must join the matrix below (and so be run without each part)."""
    runs = _every_subcommand(tmp_path, 1, 1)
    assert set(main.list_commands(click.Context(main))) == {argv[0] for argv in runs.values()}


@pytest.mark.one_pass  # it sets the fast path itself
@pytest.mark.parametrize("hidden", [None, *OPTIONAL])
def test_every_subcommand_without_each_optional_part_fails_in_one_line(
        hidden: str | None, tmp_path: Path) -> None:
    """Every subcommand, with one optional dependency missing (or none), ends in one
    `gossiprouter: error:` line and exit status 1 or 2, never a traceback; a command that
    needs the missing part names it."""
    with socket.socket() as taken, refused_port() as refused:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        runs = _every_subcommand(tmp_path, taken.getsockname()[1], refused)
        env = {k: v for k, v in os.environ.items() if k != "GOSSIPROUTER_FAST_PATH"}
        r = subprocess.run([sys.executable, "-c", _HIDDEN_RUNNER,
                            json.dumps([hidden] if hidden else []),
                            json.dumps(list(runs.values()))],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    runs_out = dict(zip(runs, json.loads(r.stdout), strict=True))
    for name, (code, err) in runs_out.items():
        assert "Traceback" not in err, f"{name} without {hidden}:\n{err}"
        assert code in (1, 2) and err.startswith(PREFIX) and err.count("\n") == 1, \
            f"{name} without {hidden}: exit {code}\n{err}"
        if hidden and (hidden, name) in _NAMED:
            assert _NAMED[hidden, name] in err, f"{name} without {hidden}: {err}"
    if hidden != "pyarrow":
        assert runs_out["loadtest again"] == runs_out["loadtest"]


def _hidden_run(hidden: tuple[str, ...], *argvs: list[str],
                env: dict[str, str] | None = None) -> list[tuple[int | None, str]]:
    r = subprocess.run([sys.executable, "-c", _HIDDEN_RUNNER, json.dumps(hidden),
                        json.dumps(argvs)], capture_output=True, text=True, cwd=REPO,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return [(code, err) for code, err in json.loads(r.stdout)]


def test_fast_path_environment_errors_are_one_line() -> None:
    """GOSSIPROUTER_FAST_PATH=bogus is a bad value (exit 2); =on without the compiled
    extension cannot start (exit 1). Both before anything listens."""
    serve = ["serve", "--port", "0", "--log-level", "error"]
    [(code, err)] = _hidden_run((), serve, env=os.environ | {"GOSSIPROUTER_FAST_PATH": "bogus"})
    assert (code, err) == (2, f"{PREFIX}GOSSIPROUTER_FAST_PATH='bogus': expected on, off or "
                              "auto\n")
    [(code, err)] = _hidden_run(("gossiprouter.server._relay",), serve,
                                env=os.environ | {"GOSSIPROUTER_FAST_PATH": "on"})
    assert code == 1 and err.startswith(f"{PREFIX}fast_path on: the compiled extension "
                                        "gossiprouter.server._relay is not built"), err
    assert err.count("\n") == 1


def test_install_hints_work_from_a_checkout(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """gossiprouter is on no package index: a hint installs from the checkout."""
    from gossiprouter.core.cli_errors import checkout

    assert checkout() == REPO
    monkeypatch.chdir(REPO)
    hint = install_hint("bridge")
    assert hint.endswith("install -e '.[bridge]' (or scripts/setup for everything)"), hint
    assert "gossiprouter[" not in hint
    monkeypatch.chdir(tmp_path)  # elsewhere: the hint goes there first
    assert install_hint("bridge").startswith(f"cd {REPO} && ")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"metrics", "bridge", "loadtest", "ops"} <= set(extras)
    assert extras["ops"] == ["gossiprouter[metrics,bridge]"]  # the old name, both parts


def test_analyze_a_file_says_it_is_not_a_directory() -> None:
    code, err = _invoke("analyze", str(REPO / "README.md"))
    assert (code, err) == (2, f"{PREFIX}run directory {REPO / 'README.md'} is not a "
                              "directory\n")


def _analyze(run: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gossiprouter", "analyze", str(run), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_analyze_without_java_says_so_before_spark_starts(tmp_path: Path) -> None:
    from tests.audit_runs import build_run

    run = tmp_path / "run"
    build_run(run)
    no_java = tmp_path / "bin"  # a PATH with no java on it
    no_java.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": str(no_java)}
    r = _analyze(run, env=env)
    assert (r.returncode, r.stderr) == (
        1, f"{PREFIX}Java 17+ not found: install a JDK or set JAVA_HOME\n")
    r = _analyze(run, env=env | {"JAVA_HOME": str(tmp_path)})
    assert (r.returncode, r.stderr) == (
        1, f"{PREFIX}Java 17+ not found: JAVA_HOME={tmp_path} has no bin/java (install a "
           "JDK or set JAVA_HOME)\n")
    assert not (run / "report").exists()


@pytest.mark.spark
def test_analyze_with_a_bad_master_quotes_sparks_cause(tmp_path: Path) -> None:
    from tests.audit_runs import build_run

    run = tmp_path / "run"
    build_run(run)
    r = _analyze(run, "--master", "foo://x", env=dict(os.environ))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"{PREFIX}Spark could not start on foo://x: Master must either be yarn or start "
        f"with spark, k8s, or local (Spark log: {run / 'report' / 'spark.log'})")
    assert "Master must either" in (run / "report" / "spark.log").read_text()


def test_run_prints_its_next_steps_only_once_listening(tmp_path: Path) -> None:
    """scripts/run: no "listening" banner before a failure, nor for --help."""
    run = str(REPO / "scripts" / "run")
    r = subprocess.run([run, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "listening" not in r.stderr and "Usage:" in r.stdout
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([run, "--port", str(port)], capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith(PREFIX) and r.stderr.count("\n") == 1, r.stderr
    assert "listening" not in r.stderr and "another terminal" not in r.stderr
