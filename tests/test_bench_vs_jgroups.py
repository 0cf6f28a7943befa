"""bench-vs-jgroups' protocol side (no Java needed; benchmarks/vs_jgroups_load.py): the 5.x
registration handshake its loaders rely on, against gossiprouter on 127.0.0.1, the C floors
(benchmarks/floor/relay.c and threads.c, router kinds of vs_jgroups_procs.py) relaying the
native frames the loaders write, their rows in the printed tables, the CPU latency request the
benchmark can hold, and the option parsing."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import trio

from benchmarks import bench_vs_jgroups as bench
from benchmarks import machine
from benchmarks import vs_jgroups_load as load
from benchmarks import vs_jgroups_procs as procs
from tests.conftest import RouterFactory
from tests.procs import free_port


def _recv_exact(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        assert chunk, "router closed the connection"
        got += chunk
    return got


def _register_all(port: int, members: range,
                  proto: load.Proto | None = None) -> list[socket.socket]:
    """What Blaster does per member: write the registration, skip the reply frames it is told
    to (u32-length-prefixed), then read exactly the expected reply."""
    proto = proto or load.JGroups5()
    socks = []
    for i in members:
        reg, skip, ok = proto.register(i)
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(reg)
        for _ in range(skip):
            _recv_exact(s, int.from_bytes(_recv_exact(s, 4), "big"))
        assert _recv_exact(s, len(ok)) == ok  # 5.x: the echoed HEARTBEAT; native: OK
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


@pytest.mark.parametrize("kind", [procs.FLOOR, procs.FLOOR_THREADS])
def test_floor_relays_native_frames_byte_for_byte(tmp_path: Path, kind: str) -> None:
    """Each floor (the epoll one and the thread-per-connection one) answers the native handshake
    the loaders expect (WELCOME skipped, then the exact OK) and forwards ROUTE frames unchanged:
    unicast to its destination only, multicast to every other member, frames split across
    writes or several in one write."""
    port = free_port()
    router = procs.Router(kind, port, tmp_path / "floor.log")
    proto = load.Native()
    socks = _register_all(port, range(3), proto)
    try:
        uni = [proto.send_frame(0, 1, bytes([k]) * 100) for k in range(3)]
        assert proto.recv_frame(0, 1, bytes(100)) == proto.send_frame(0, 1, bytes(100))
        socks[0].sendall(uni[0][:7])  # a frame cut inside its prefix and header ...
        socks[0].sendall(uni[0][7:] + uni[1] + uni[2])  # ... then three frames in one write
        assert _recv_exact(socks[1], sum(map(len, uni))) == b"".join(uni)
        multi = proto.send_frame(2, None, b"m" * 100)
        socks[2].sendall(multi)
        assert _recv_exact(socks[0], len(multi)) == multi
        assert _recv_exact(socks[1], len(multi)) == multi
        # The sender got no copy of its multicast (written with the others, or before them by
        # its own thread): the next bytes on its connection are a later unicast to it.
        back = proto.send_frame(1, 2, b"u" * 100)
        socks[1].sendall(back)
        assert _recv_exact(socks[2], len(back)) == back
        assert router.alive()
        # The threading each floor stands for: one thread for every connection, or one per
        # connection beside the accepting one (at least: the thread of wait_listening's probe
        # connection may not have seen its end yet).
        if kind == procs.FLOOR_THREADS:
            assert router.threads() >= 1 + len(socks)
        else:
            assert router.threads() == 1
    finally:
        for s in socks:
            s.close()
        router.stop()


def _paced_result(router: str, cpu_us: float, p50: float, p99: float) -> bench.RunResult:
    return bench.RunResult(case="paced-100", router=router, run=1, seconds=4.0,
                           deliveries_per_s=10_000, echo_per_s=0, sent_per_s=10_000,
                           router_cpu_us_per_msg=cpu_us, router_cpu_cores=cpu_us / 100,
                           loader_cpu_cores=0.5, machine_busy_cores=1.0, other_cpu_cores=0.0,
                           p50_us=p50, p99_us=p99)


def test_tables_print_the_floor_beside_the_routers(capsys: pytest.CaptureFixture[str]) -> None:
    case = next(c for c in load.CASES if c.name == "paced-100")
    routers = ["java5", "gr-5", "gr-native", procs.FLOOR]
    results = [_paced_result("java5", 20.5, 45, 167), _paced_result("gr-5", 17.5, 50, 229),
               _paced_result("gr-native", 16.0, 40, 200),
               _paced_result(procs.FLOOR, 10.0, 20, 50)]
    summary = bench.summarize([case], routers, results)
    bench.print_table([case], routers, summary)
    table = capsys.readouterr().out
    assert "| gr 5.x / C floor | gr native / C floor |" in table
    assert "| router CPU µs/msg | 20.50 | 17.50 | 16.00 | 10.00 | 0.854x | 1.75x | 1.6x |" \
        in table
    bench.print_floor_table([case], routers, summary)
    floor = capsys.readouterr().out
    assert "| metric | Java 5.x | gossiprouter 5.x | gossiprouter native | C floor | " \
           "gr 5.x / C floor | gr native / C floor |" in floor
    assert "| router CPU µs/msg | 20.50 | 17.50 | 16.00 | 10.00 | 1.75x | 1.6x |" in floor
    assert "| p50 latency µs | 45 | 50 | 40 | 20 | 2.5x | 2x |" in floor
    assert "| p99 latency µs | 167 | 229 | 200 | 50 | 4.58x | 4x |" in floor
    bench.print_floor_table([case], routers[:-1], summary)  # no floor in the run: no table
    assert capsys.readouterr().out == ""


def test_without_jgroups5_the_default_routers_run() -> None:
    assert bench.parse_args([]).routers == [*bench.ROUTERS, procs.FLOOR, procs.FLOOR_THREADS]


def test_jgroups5_adds_the_5x_routers(tmp_path: Path) -> None:
    args = bench.parse_args(["--jgroups5", str(tmp_path)])
    assert args.routers == [*bench.ROUTERS, *bench.ROUTERS5, procs.FLOOR, procs.FLOOR_THREADS]


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


def _cpu_latency_request() -> int:
    """The machine's CPU latency request now, in µs (what every holder of the device asks)."""
    return int.from_bytes(machine.CPU_DMA_LATENCY.read_bytes()[:4], sys.byteorder, signed=True)


# The request is the machine's: scripts/test's two passes run side by side, and this test in
# both at once would see the other's hold. It runs in the first pass only.
@pytest.mark.one_pass
def test_cpu_latency_is_held_while_the_runs_go_and_let_go_after() -> None:
    before = _cpu_latency_request()
    with machine.cpu_latency(3):
        assert _cpu_latency_request() <= 3
    assert _cpu_latency_request() == before
    with machine.cpu_latency(None):  # not asked for: the device is left alone
        assert _cpu_latency_request() == before


def test_cpu_latency_says_why_it_cannot_be_held(tmp_path: Path) -> None:
    held = machine.cpu_latency(0, tmp_path / "nowhere")
    with pytest.raises(SystemExit, match=r"cannot open .*nowhere.*needs root"):
        held.__enter__()
    with pytest.raises(SystemExit):
        bench.parse_args(["--cpu-latency-us", "-1"])
    assert bench.parse_args(["--cpu-latency-us", "0"]).cpu_latency_us == 0


def test_the_header_names_the_idle_driver() -> None:
    info = procs.machine_info()
    assert info["cpuidle"] == machine.cpu_idle()
    assert info["cpuidle"] == "n/a" or "/" in info["cpuidle"]

