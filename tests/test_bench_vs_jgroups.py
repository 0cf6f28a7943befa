"""bench-vs-jgroups' protocol side (no Java needed; benchmarks/vs_jgroups_load.py): the 5.x
registration handshake its loaders rely on, against gossiprouter on 127.0.0.1, and the
--jgroups5 option's parsing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from benchmarks import bench_vs_jgroups as bench
from benchmarks import vs_jgroups_load as load
from tests.conftest import RouterFactory


def _register_all(port: int, members: range) -> list[socket.socket]:
    """What Blaster does per member: write the registration, read exactly the expected reply."""
    proto = load.JGroups5()
    socks = []
    for i in members:
        reg, skip, ok = proto.register(i)
        assert skip == 0
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(reg)
        got = b""
        while len(got) < len(ok):
            chunk = s.recv(len(ok) - len(got))
            assert chunk, "router closed the connection"
            got += chunk
        assert got == ok  # the echoed HEARTBEAT, byte for byte
        socks.append(s)
    return socks


async def test_jgroups5_registration_reply_and_member_count(
        start_router: RouterFactory) -> None:
    router = await start_router()
    assert router.address is not None
    port = router.address[1]
    socks = await trio.to_thread.run_sync(_register_all, port, range(3))
    try:
        # A member registered before its HEARTBEAT came back: GET_MBRS lists all three.
        assert await trio.to_thread.run_sync(load.JGroups5().count_members, port) == 3
        # A 5.x message is delivered byte for byte, as the loaders' counting assumes.
        frame = load.JGroups5().send_frame(0, 1, bytes(100))
        assert load.JGroups5().recv_frame(0, 1, bytes(100)) == frame

        def route() -> bytes:
            socks[0].sendall(frame)
            got = b""
            while len(got) < len(frame):
                got += socks[1].recv(len(frame) - len(got))
            return got

        assert await trio.to_thread.run_sync(route) == frame
    finally:
        for s in socks:
            s.close()


def test_without_jgroups5_the_three_routers_run() -> None:
    assert bench.parse_args([]).routers == list(bench.ROUTERS)


def test_jgroups5_adds_the_5x_routers(tmp_path: Path) -> None:
    args = bench.parse_args(["--jgroups5", str(tmp_path)])
    assert args.routers == list(bench.ROUTERS + bench.ROUTERS5)


def test_java5_without_classpath_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--routers", "java5"])
    assert "needs --jgroups5 CLASSPATH" in capsys.readouterr().err


def test_missing_jgroups5_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--jgroups5", "/nonexistent/jgroups-5.jar"])
    assert "no such file or directory: /nonexistent/jgroups-5.jar" in capsys.readouterr().err


def test_variant_tree_must_hold_gossiprouter(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--variant-tree", str(tmp_path)])
    assert f"no gossiprouter package in {tmp_path}" in capsys.readouterr().err
    (tmp_path / "gossiprouter").mkdir()
    (tmp_path / "gossiprouter" / "__main__.py").write_text("")
    assert bench.parse_args(["--variant-tree", str(tmp_path)]).variant_tree == tmp_path
    assert bench.parse_args([]).variant_tree == bench.REPO


def test_paced_fanout_case_paces_both_senders_and_checks_no_stamp() -> None:
    """fanout-paced: 2 senders at half the rate each into the group of 8, latency stamps in
    the payload, and the checked prefix of a delivered frame stops short of the stamp (with
    the 2.12 protocol a multicast's header is shorter than the 16 bytes checked otherwise)."""
    case = next(c for c in load.CASES if c.name == "fanout-paced")
    members = load.layout(case)
    senders = [m for m in members if m.sender_id is not None]
    assert len(members) == load.FANOUT_MEMBERS and len(senders) == load.FANOUT_SENDERS
    assert all(m.rate == case.rate // load.FANOUT_SENDERS and m.dest is None for m in senders)
    assert f"{case.rate * (load.FANOUT_MEMBERS - 1):,} deliveries/s" in case.title
    for proto in (load.JGroups212(), load.Native()):
        configs = load.loader_configs(case, proto, 1, 2, 60)
        words = dict(w.split("=", 1) for line in configs[0] if line.startswith("member")
                     for w in line.split()[1:] if "=" in w)
        pay_off = int(words["rlen"]) - case.size
        assert int(words["tsoff"]) == pay_off
        assert len(bytes.fromhex(words["check"])) <= pay_off
