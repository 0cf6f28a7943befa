"""The blocking facade, and the ``members`` / ``send`` / ``listen`` commands end to end.

The commands run as real subprocesses (``python -m gossiprouter ...``) against an
in-process router on 127.0.0.1; the blocking facade runs in a worker thread, as
a non-trio program would use it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from gossiprouter import (
    BlockingRouterStub,
    ChannelClosedError,
    ForbiddenError,
    Message,
    RouterStub,
)
from gossiprouter.core.addresses import parse_addr
from gossiprouter.routing.entries import Kind
from gossiprouter.server.listener import Server
from tests.carriers import named
from tests.procs import refused_port
from tests.test_stub import FAST, drain, eventually

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "gossiprouter"]


def hostport(server: Server) -> str:
    assert server.address is not None
    return f"{server.address[0]}:{server.address[1]}"


async def cli(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(timeout):
        return await trio.run_process([*CLI, *args], capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=REPO)


class Listener:
    """A ``gossiprouter listen --json`` subprocess whose stdout is read line by line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buf = b""

    @classmethod
    async def start(cls, *args: str) -> Listener:
        proc = await trio.lowlevel.open_process([*CLI, "listen", *args, "--json"],
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                cwd=REPO)
        return cls(proc)

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next JSON object on stdout (connection-state lines skipped)."""
        assert self.proc.stdout is not None
        with trio.fail_after(timeout):
            while True:
                while b"\n" not in self.buf:
                    data = await self.proc.stdout.receive_some(65536)
                    if not data:
                        raise EOFError(f"listen exited: {await self.stderr()}")
                    self.buf += data
                line, _, self.buf = self.buf.partition(b"\n")
                obj: dict[str, Any] = json.loads(line)
                if obj["type"] != "state":
                    return obj

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        out = b""
        with trio.move_on_after(1):
            while data := await self.proc.stderr.receive_some(65536):
                out += data
        return out.decode()

    async def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            return await self.proc.wait()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


# --------------------------------------------------------------------------- blocking


async def test_blocking_facade_end_to_end(router: Server) -> None:
    assert router.address is not None
    addr = router.address

    def program() -> None:  # an ordinary, thread-based program
        with BlockingRouterStub([addr], **FAST) as s1, BlockingRouterStub([addr], **FAST) as s2:
            a = s1.connect("g", b"A", name="A", physical=[("10.0.0.5", 7800)])
            b = s2.connect("g", b"B", name="B")
            watch = s2.watch("g")
            a.send(b"hello")
            assert b.receive(timeout=3) == Message("g", b"A", None, b"hello")
            # A receive blocked in one thread while another thread sends.
            got: list[Message] = []
            t = threading.Thread(target=lambda: got.append(a.receive(timeout=3)))
            t.start()
            b.send(b"hi A", dest=b"A")
            t.join(5)
            assert [m.payload for m in got] == [b"hi A"]
            with pytest.raises(TimeoutError):
                a.receive(timeout=0.1)
            assert [m.addr for m in s1.members("g")] == [b"A", b"B"]
            assert b.members()[0].physical == (("10.0.0.5", 7800),)
            with pytest.raises(ForbiddenError):
                s1.connect("jgroups5:x", b"A")
            c = s1.connect("g", b"C")
            c.send(b"from C")
            c.disconnect()
            # s2 watches g, so B's merged stream has C's join, message and leave in order.
            items = [b.receive_any(3) for _ in "123"]
            assert [getattr(x, "kind", "message") for x in items] == ["join", "message", "leave"]
            assert items[1] == Message("g", b"C", None, b"from C")
            assert [(e.kind, e.member.addr) for e in (watch.receive(3), watch.receive(3))] == [
                ("join", b"C"), ("leave", b"C")]
            with pytest.raises(ChannelClosedError):
                c.receive(timeout=1)
            assert [st.state.value for st in s1.status()] == ["connected"]
            watch.close()
        assert s1._thread is not None and not s1._thread.is_alive()
        with pytest.raises(ChannelClosedError):
            s1.members("g")

    await trio.to_thread.run_sync(program)
    assert router.hub.table.members("g") == []  # closing left every group


# --------------------------------------------------------------------------- members/send


async def test_members_and_send_commands(router: Server) -> None:
    hp = hostport(router)
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as stub:
        a = await stub.connect("demo", b"A", name="A", physical=[("10.0.0.5", 7800)])
        b = await stub.connect("demo", bytes.fromhex("0102ff"), name="B")

        r = await cli("members", hp, "demo", "--json")
        assert r.returncode == 0, r.stderr
        # Addresses are shown as they are typed: text, or hex: when not plain text.
        assert json.loads(r.stdout) == [
            {"addr": "A", "name": "A", "physical": ["10.0.0.5:7800"]},
            {"addr": "hex:0102ff", "name": "B", "physical": []},
        ]
        r = await cli("members", hp, "demo")
        assert r.returncode == 0
        lines = r.stdout.decode().splitlines()
        assert lines == ["A           A  10.0.0.5:7800", "hex:0102ff  B  -"]

        # What members prints pastes straight into send --to.
        r = await cli("send", hp, "demo", "--to", lines[1].split()[0], "pasted")
        assert r.returncode == 0, r.stderr
        with trio.fail_after(3):
            assert (await b.receive()).payload == b"pasted"

        r = await cli("send", hp, "demo", "hello all")  # joins, multicasts, leaves
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode().strip()
        assert out.startswith("sent 9 bytes to group 'demo' as hex:")
        sender = parse_addr(out.rsplit(" ", 1)[1])
        for ch in (a, b):
            with trio.fail_after(3):
                assert await ch.receive() == Message("demo", sender, None, b"hello all")

        r = await cli("send", hp, "demo", "--to", "hex:0102ff", "just B", "--json")
        assert r.returncode == 0, r.stderr
        sent = json.loads(r.stdout)
        assert sent["dest"] == "hex:0102ff" and sent["bytes"] == 6
        with trio.fail_after(3):
            m = await b.receive()
        assert (m.payload, m.dest, m.sender) == (b"just B", b"\x01\x02\xff",
                                                 parse_addr(sent["sender"]))

        r = await cli("send", hp, "demo", "--to", "A", "text address")
        assert r.returncode == 0, r.stderr
        with trio.fail_after(3):
            assert (await a.receive()).payload == b"text address"

        r = await cli("send", hp, "demo", "--to", "hex:ee", "nobody")
        assert r.returncode == 1
        assert r.stderr.decode() == (
            "gossiprouter: error: no member hex:ee in 'demo': message dropped\n")

        assert await drain(a, 0.1) == [] and await drain(b, 0) == []
        assert {e.addr for e in router.hub.table.members("demo")} == {b"A", b"\x01\x02\xff"}


# --------------------------------------------------------------------------- listen


async def test_listen_command_prints_messages_and_events(router: Server) -> None:
    hp = hostport(router)
    assert router.address is not None
    listener = await Listener.start(hp, "demo")
    try:
        first = await listener.next()
        assert first["type"] == "members" and first["group"] == "demo"
        [me] = first["members"]
        assert me["name"] == "gossiprouter-listen"
        async with RouterStub([router.address], **FAST) as stub:
            watch = await stub.watch("demo")
            witness = await stub.connect("demo", b"W")  # a member: would get any "suspect"
            join_w = await listener.next()
            assert (join_w["kind"], join_w["addr"]) == ("join", "W")
            a = await stub.connect("demo", b"A", name="A", physical=[("10.0.0.5", 7800)])
            assert await listener.next() == {
                "type": "event", "kind": "join", "group": "demo", "addr": "A", "name": "A",
                "physical": ["10.0.0.5:7800"], "router": hp}
            await a.send(b"hello")
            assert me["addr"].startswith("hex:")  # a random 16-byte address
            await a.send(b"\xff\x00", dest=parse_addr(me["addr"]))
            assert await listener.next() == {
                "type": "message", "group": "demo", "sender": "A", "dest": None,
                "text": "hello", "payload_hex": "68656c6c6f"}
            assert await listener.next() == {
                "type": "message", "group": "demo", "sender": "A", "dest": me["addr"],
                "text": None, "payload_hex": "ff00"}
            await a.disconnect()
            leave = await listener.next()
            assert (leave["kind"], leave["addr"]) == ("leave", "A")

            assert await listener.interrupt() == 0  # Ctrl-C: a clean exit ...
            with trio.fail_after(3):
                seen = [(e.kind, e.member.addr) for e in [await watch.receive() for _ in "1234"]]
            # ... that leaves the group with DISCONNECT: "leave", and no "suspect" for it
            me_addr = parse_addr(me["addr"])
            assert seen == [("join", b"W"), ("join", b"A"), ("leave", b"A"), ("leave", me_addr)]
            events = await drain(witness.events(), 0.1)
            assert [e.kind for e in events if e.member.addr == me_addr] == ["leave"]
        assert "Ctrl-C to stop" in await listener.stderr()
    finally:
        listener.kill()


async def test_jgroups_namespace_members_and_listen_watch_only(router: Server) -> None:
    hp = hostport(router)
    group = "jgroups5:cluster"
    listener = await Listener.start(hp, group, "--watch-only")
    try:
        assert await listener.next() == {"type": "members", "group": group, "members": []}
        # A JGroups member, registered in-process as a JGroups session would be.
        table = router.hub.table

        def watched() -> bool:
            g = table.group(group)
            return g is not None and bool(g.watchers)

        await eventually(watched)
        _, notices, _ = table.connect(named("jgroups-node"), group, b"J1", "jnode",
                                      (("10.0.0.9", 7800),), kind=Kind.IN_PROCESS)
        router.hub.deliver(notices)
        join = await listener.next()
        assert (join["kind"], join["addr"], join["name"]) == ("join", "J1", "jnode")

        r = await cli("members", hp, group, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == [
            {"addr": "J1", "name": "jnode", "physical": ["10.0.0.9:7800"]}]

        router.hub.deliver(table.remove(group, b"J1"))
        leave = await listener.next()
        assert (leave["kind"], leave["addr"]) == ("leave", "J1")
        assert await listener.interrupt() == 0
    finally:
        listener.kill()

    # Joining a JGroups namespace is refused, with a hint.
    r = await cli("listen", hp, group)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.startswith(f"gossiprouter: error: cannot join '{group}': forbidden: ")
    assert err.endswith("(use --watch-only)\n") and err.count("\n") == 1


# --------------------------------------------------------------------------- errors


async def test_commands_fail_with_one_clear_line() -> None:
    with refused_port() as port:
        where = f"127.0.0.1:{port}"
        runs = [(args, await cli(*args)) for args in (
            ["members", where, "demo"], ["send", where, "demo", "hi"], ["listen", where, "demo"])]
    for args, r in runs:
        assert r.returncode == 1, args
        assert r.stderr.decode() == (
            f"gossiprouter: error: cannot reach router at {where}: connection refused\n")
        assert r.stdout == b""

    for args, needle in ((["members", "localhost", "demo"], "bad router address"),
                         (["members", "127.0.0.1:99999", "demo"], "bad router address"),
                         (["send", where, "demo", "--to", "hex:zz", "x"], "bad --to ADDR"),
                         (["send", where, "demo", "--from", "x" * 300, "x"], "at most 255"),
                         (["members", where, ""], "bad GROUP")):
        r = await cli(*args)
        err = r.stderr.decode()
        assert r.returncode == 2, (args, err)
        assert err.startswith("gossiprouter: error: ") and needle in err and err.count("\n") == 1
        assert "Traceback" not in err
