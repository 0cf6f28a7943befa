"""Load-test attackers (gossiprouter/loadtest/attacks/) and scripts/scenarios/hostile.toml:
the ``[[attacks]]`` format, each attack against a real router, and the hostile scenario run
end to end with the honest members' deliveries counted from the raw records."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gossiprouter.loadtest.attacks.huge_names import HugeNames
from gossiprouter.loadtest.attacks.process import run_attacks
from gossiprouter.loadtest.attacks.runner import AttackRunner, block_sigterm
from gossiprouter.loadtest.attacks.runner import command as attacks_command
from gossiprouter.loadtest.attacks.spec import KINDS, parse_attacks
from gossiprouter.loadtest.driver import run_loadtest
from gossiprouter.loadtest.scenario_checks import ScenarioError
from gossiprouter.loadtest.scenario_file import load_scenario, parse_scenario
from gossiprouter.protocol import jgroups2 as j2
from tests.procs import RouterProcess, free_port

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "scripts" / "scenarios" / "hostile.toml"


def test_hostile_scenario_has_every_attack_and_round_trips() -> None:
    s = load_scenario(HOSTILE)
    assert {a.kind for a in s.attacks} == set(KINDS)
    assert parse_scenario(s.to_dict(), source=s.source) == s  # what the peers get back
    flood = next(a for a in s.attacks if a.kind == "ping-flood")
    assert flood["bytes_per_s"] == 1048576 and flood["connections"] == 1  # a default


@pytest.mark.parametrize(("attack", "message"), [
    ({"kind": "nope"}, 'attacks[0].kind: expected one of "ping-flood"'),
    ({"kind": "ping-flood", "bytes_per_s": -1}, "attacks[0].bytes_per_s: expected a number"),
    ({"kind": "ping-flood", "bytes_per_s": "fast"}, 'or "max", got \'fast\''),
    ({"kind": "partial-frames", "connections": 0}, "attacks[0].connections: expected an int"),
    ({"kind": "watch-flood", "color": 1}, "unknown key 'color' in attacks[0]"),
    ({"kind": "huge-names", "protocol": "jgroups5", "name_bytes": 70000},
     "attacks[0].name_bytes: expected at most 65535 for a JGroups protocol"),
    ({"kind": "admin-poll", "paths": ["groups"]}, "attacks[0].paths: expected a non-empty"),
])
def test_bad_attack_tables_are_refused_in_one_line(attack: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_attacks([attack], "h.toml")
    assert str(e.value).startswith("h.toml: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_admin_poll_gets_the_metrics_endpoint_of_a_spawned_router(tmp_path: Path) -> None:
    specs = parse_attacks([{"kind": "admin-poll"}], "x")
    spawned = AttackRunner(specs, tmp_path, router_args=(), spawned=True)
    assert spawned.router_args[0] == "--metrics" and spawned.metrics == spawned.router_args[1]
    given = AttackRunner(specs, tmp_path, router_args=("--metrics", "127.0.0.1:9"),
                         spawned=True)
    assert given.router_args == () and given.metrics == "127.0.0.1:9"
    external = AttackRunner(specs, tmp_path, router_args=(), spawned=False)
    assert external.metrics is None and "admin-poll attack skipped" in external.warnings[0]
    assert AttackRunner((), tmp_path, router_args=(), spawned=True).router_args == ()


def test_raw_nul_names_are_read_as_nuls_by_the_router_decoder() -> None:
    """The huge-names attack with raw_nul sends what issue 12 item 1 describes: a name of
    65,535 raw NUL bytes, which the router reads as 65,535 NUL characters (131,070 bytes when
    written back)."""
    spec = parse_attacks([{"kind": "huge-names", "protocol": "jgroups2", "name_bytes": 65535,
                           "raw_nul": True}], "x")[0]
    reg, query = HugeNames(spec, "127.0.0.1", 1, None).frames(0)
    dec = j2.Decoder(max_frame=1 << 20)
    dec.feed(reg + query)
    connect, get = dec.next_event(), dec.next_event()
    assert isinstance(connect, j2.Connect) and connect.name == "\x00" * 65535
    assert isinstance(get, j2.GossipGet) and get.group == "hostile-names"


async def test_each_attack_does_what_it_says_against_a_router() -> None:
    """Every kind, briefly, against a real router: counters show the router's answers (PONGs,
    HEARTBEAT echoes, refusals of the huge name, WATCH answers, HTTP 200s)."""
    mport = free_port()
    with RouterProcess(None, "--log-level", "warning", "--metrics",
                       f"127.0.0.1:{mport}") as router:
        config = {
            "router": f"127.0.0.1:{router.port}", "metrics": f"127.0.0.1:{mport}",
            "t0_ns": time.monotonic_ns(), "end_ns": time.monotonic_ns() + 2_500_000_000,
            "attacks": [
                {"kind": "ping-flood", "bytes_per_s": 200_000, "burst": 7000},
                {"kind": "heartbeat-flood", "bytes_per_s": 200_000, "burst": 7000},
                {"kind": "partial-frames", "connections": 3, "size": 200_000, "hold": 0.5,
                 "protocol": "mixed"},
                {"kind": "huge-names", "members": 1, "name_bytes": 100_000,
                 "query_interval": 0.2},
                {"kind": "watch-flood", "groups": 3000, "watches_per_s": "max"},  # unpaced
                {"kind": "admin-poll", "interval": 0.2},
            ]}
        results = await run_attacks(config)
        assert router.proc is not None and router.proc.poll() is None
    got = {r["kind"]: r["counters"] for r in results}
    assert got["ping-flood"]["bytes_out"] >= 200_000 and got["ping-flood"]["bytes_in"] > 10_000
    assert got["heartbeat-flood"]["bytes_in"] > 10_000
    # Each of the 3 connections sent its frame and was closed and reopened after its hold
    # (the last 3 may be cut short by the end).
    opened = got["partial-frames"]["opened"]
    assert opened >= 6 and got["partial-frames"]["bytes_out"] >= (opened - 3) * 199_000
    # The 100 kB name is sent, and refused (max_name_bytes): the 2.12 CONNECT gets OP_FAIL,
    # so no member list carries it back.
    assert got["huge-names"]["bytes_out"] > 100_000 and got["huge-names"]["refused"] >= 1
    assert got["huge-names"]["bytes_in"] < 100_000
    assert got["watch-flood"]["bytes_in"] > 3000 * 4  # an OK per WATCH
    # Admin answers are slow while the floods run: at least one, and no failure.
    assert got["admin-poll"]["answers"] >= 1 and got["admin-poll"]["failures"] == 0
    assert got["admin-poll"]["bytes_in"] > 0 and got["admin-poll"]["slowest_s"] > 0


def _lost(run_dir: Path, members: dict[str, int]) -> tuple[int, int, set[str]]:
    """(expected deliveries, lost, every sender) from the raw records, independently of the
    audit: a multicast is due to every other member of its group (no membership events in
    this scenario), a unicast to its dest."""
    rows = pq.read_table(run_dir / "records").to_pylist()
    sends = [r for r in rows if r["kind"] == "send"]
    got = {(r["msg_id"], r["receiver"]) for r in rows if r["kind"] == "recv"}
    expected = 0
    lost = 0
    group_members = {g: [f"{g}-{i}" for i in range(n)] for g, n in members.items()}
    for r in sends:
        due = [r["dest"]] if r["dest"] else [m for m in group_members[r["group"]]
                                             if m != r["sender"]]
        expected += len(due)
        lost += sum(1 for m in due if (r["msg_id"], m) not in got)
    return expected, lost, {r["sender"] for r in rows}


@pytest.mark.slow
async def test_hostile_scenario_loses_nothing_among_honest_members(tmp_path: Path) -> None:
    """hostile.toml, shortened (8 s, smaller partial frames and watch flood), through the
    driver with a spawned router: every attack ran, the router stayed up, and every honest
    delivery arrived. Fails while the router can be crashed by the raw-NUL names (issue 12
    item 1)."""
    d = load_scenario(HOSTILE).to_dict()
    d["duration"] = 8.0
    for a in d["attacks"]:
        if a["kind"] == "partial-frames":
            a["size"], a["connections"] = 1 << 20, 8
        if a["kind"] == "watch-flood":
            a["groups"] = 5000
    scenario = parse_scenario(d, source="hostile.toml")
    run_dir = tmp_path / "run"
    result = await run_loadtest(scenario, run_dir, spawn_router=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    attacks = json.loads((run_dir / "attacks.json").read_text())["attacks"]
    assert Counter(a["kind"] for a in attacks) == Counter(a.kind for a in scenario.attacks)
    assert all(a["counters"]["opened"] > 0 for a in attacks)
    expected, lost, senders = _lost(run_dir, {g.name: g.members for g in scenario.groups})
    assert result.sent > 500 and expected > 1000
    assert lost == 0, f"{lost} of {expected} honest deliveries lost"
    assert senders <= {m.name for m in scenario.members}  # attackers are not in the records


def _stopped_by_sigterm(tmp_path: Path, once: str | None) -> list[dict[str, Any]]:
    """Start the attack process as the driver does (SIGTERM held until main()), stop it with
    SIGTERM once its log has a line with ``once`` (at once with None), check it exits 0;
    what it wrote to attacks.json."""
    out = tmp_path / "attacks.json"
    config = tmp_path / "config.json"
    with RouterProcess(None, "--log-level", "warning") as router:
        config.write_text(json.dumps({
            "router": f"127.0.0.1:{router.port}", "metrics": None, "out": str(out),
            "t0_ns": time.monotonic_ns(), "end_ns": time.monotonic_ns() + 60_000_000_000,
            "attacks": [{"kind": "ping-flood", "bytes_per_s": 100_000, "burst": 7000}]}))
        proc = subprocess.Popen(attacks_command(config), cwd=REPO, stderr=subprocess.PIPE,
                                text=True, preexec_fn=block_sigterm)
        try:
            assert proc.stderr is not None
            # Stopped once it has done some work, however long that took.
            if once is not None:
                for line in proc.stderr:
                    if once in line:
                        break
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    attacks: list[dict[str, Any]] = json.loads(out.read_text())["attacks"]
    return attacks


def test_attack_process_writes_its_counters_when_stopped_by_sigterm(tmp_path: Path) -> None:
    """When a run fails the driver stops the attack process with SIGTERM; the counters of
    what it did until then still reach attacks.json."""
    counters = _stopped_by_sigterm(tmp_path, "ping-flood: first bytes sent")[0]["counters"]
    assert counters["opened"] == 1 and counters["bytes_out"] >= 7000


def test_attack_process_stopped_at_once_still_writes_its_counters(tmp_path: Path) -> None:
    """A SIGTERM that arrives while the process is still starting (before trio listens for
    it) stops it cleanly too: attacks.json is written, with what was done (nothing)."""
    [attack] = _stopped_by_sigterm(tmp_path, None)
    assert attack["kind"] == "ping-flood" and attack["counters"]["opened"] <= 1
