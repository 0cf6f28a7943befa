"""The load-test tool's real runs, with the real router process and real peer processes,
audited with the Spark analysis (local[*], one session for the module):

* ``small.toml`` through the command line: no loss, plausible latencies;
* ``kill-peer.toml`` through :func:`run_loadtest`: process 2 is killed mid-run; the audit's
  numbers are checked against counts derived here directly from the raw Parquet records
  and membership timeline with pyarrow (not with the audit's code);
* churn with a router restart, and a federated scenario with a router killed.

Scenario validation, the CLI's errors and the payload are in tests/test_loadtest_scenarios.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest
import trio

from gossiprouter.analytics.audit import analyze
from gossiprouter.analytics.report.model import Report
from gossiprouter.loadtest.driver import RunResult, run_loadtest
from gossiprouter.loadtest.scenario import Scenario
from gossiprouter.loadtest.scenario_file import load_scenario, parse_scenario

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scripts" / "scenarios"
S = 1_000_000_000
SETTLE_S = 1.0


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """small.toml through the real command line; returns (run dir, stdout)."""
    run_dir = tmp_path_factory.mktemp("small") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gossiprouter", "loadtest", str(SCENARIOS / "small.toml"),
         "--spawn-router", "--out", str(run_dir), "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


@pytest.mark.slow
@pytest.mark.spark
def test_small_scenario_end_to_end(small_run: tuple[Path, str], spark: SparkSession) -> None:
    run_dir, out = small_run
    m = re.search(r"sent ([\d,]+) messages, recorded ([\d,]+) deliveries, errors 0, "
                  r"dropped 0", out)
    assert m, out
    sent = int(m.group(1).replace(",", ""))
    # 8 members x 50/s x 10 s; a loaded machine may fall behind (senders skip slots
    # once more than a second late).
    assert 2000 <= sent <= 4000, out
    assert f"next: gossiprouter analyze {run_dir}" in out

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["scenario"] == "small" and manifest["status"] == "ok"
    assert manifest["router"]["spawned"] is True
    assert set(manifest["versions"]) >= {"gossiprouter", "python", "trio", "pyarrow"}
    assert manifest["host"]["cores"] >= 1 and manifest["host"]["memory_bytes"] > 0
    assert manifest["scenario_config"]["peers"]["processes"] == 3
    # The environment: the spawned router's settings and CPU and memory from its metrics
    # port, the peers' from their counters, about once a second over the 12 s run.
    res = manifest["resources"]
    assert res["router_settings"]["dispatcher"] == "on"
    assert res["router_settings"]["fast_path"] in ("on", "off")
    # At least 5 over the 12 s run, and never more often than the interval: how many in all
    # depends on how long the run took on this machine (a busy one takes longer).
    span = res["samples"][-1]["t_s"] - res["samples"][0]["t_s"]
    assert 5 <= len(res["samples"]) <= span / res["interval_s"] + 2
    last = res["samples"][-1]["processes"]
    assert set(last) == {"router", "p0", "p1", "p2"}
    assert last["router"]["cpu_s"] > 0 and last["router"]["rss_bytes"] > 1 << 20
    assert last["p0"]["cpu_s"] > 0 and last["p0"]["rss_bytes"] > 1 << 20
    assert last["p0"]["t_s"] <= res["samples"][-1]["t_s"]  # when its counters were taken
    # Every slot the peers' schedule had: 8 members x 50/s x 10 s, skipped or sent.
    slots = sum(manifest["counters"][f"p{i}"]["slots"] for i in range(3))
    assert 3900 <= slots <= 4010
    skipped = sum(manifest["counters"][f"p{i}"]["slots_skipped"] for i in range(3))
    assert sent == slots - skipped
    # One or more record files per process, holding every row each process counted.
    files = sorted(p.name for p in (run_dir / "records").glob("*.parquet"))
    assert {f[:5] for f in files} == {"p0000", "p0001", "p0002"}
    kinds = pq.read_table(run_dir / "records", columns=["kind", "proc"]).to_pylist()
    for proc in range(3):
        counters = manifest["counters"][f"p{proc}"]
        rows = [r["kind"] for r in kinds if r["proc"] == proc]
        assert (counters["sent"], counters["received"]) == (rows.count("send"),
                                                            rows.count("recv"))

    report = analyze(str(run_dir), str(run_dir / "report"), spark=spark)
    a, c = report.audit, report.counts
    assert c.messages == c.send_records == sent
    assert c.messages_without_send_record == 0
    assert a.expected == a.delivered == c.recv_records > 0
    assert a.lost.count == 0 and report.ok
    assert (a.duplicated.count, a.unexpected.count, a.undetermined.count) == (0, 0, 0)
    assert a.out_of_order.count == 0  # FIFO per sender and receiver through one router
    lat = report.latency
    assert lat is not None and lat.count == a.delivered
    assert lat.p50_ns > 0 and lat.p99_ns < 1 * S
    assert set(report.latency_by_cast) == {"multicast", "unicast"}
    assert set(report.latency_by_size) == {"64", "256", "1024"}


@pytest.fixture(scope="module")
def kill_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scenario, RunResult]:
    """kill-peer.toml through run_loadtest (process 2 is killed at 4 s of 8 s)."""
    scenario = load_scenario(SCENARIOS / "kill-peer.toml")
    run_dir = tmp_path_factory.mktemp("kill") / "run"
    result = trio.run(partial(run_loadtest, scenario, run_dir, spawn_router=True))
    return scenario, result


def independent_audit(run_dir: Path, settle_ns: int) -> dict[str, Any]:
    """What the audit should find, derived straight from the raw Parquet files."""
    records = pq.read_table(run_dir / "records").to_pylist()  # hidden files are skipped
    timeline = pq.read_table(run_dir / "membership.parquet").to_pylist()
    joined = {r["member"]: r["t_ns"] for r in timeline if r["event"] == "join"}
    killed = {r["member"]: r["t_ns"] for r in timeline if r["event"] == "killed"}
    group_of = {r["member"]: r["group"] for r in timeline}
    assert not [r for r in timeline if r["event"] == "leave"]
    sends = [r for r in records if r["kind"] == "send"]
    got: dict[str, set[str]] = defaultdict(set)
    last_recv: dict[str, int] = defaultdict(int)
    for r in records:
        if r["kind"] == "recv":
            got[r["receiver"]].add(r["msg_id"])
            last_recv[r["receiver"]] = max(last_recv[r["receiver"]], r["t_recv_ns"])
    # Everyone joined before anyone sent (the start barrier).
    assert max(joined.values()) < min(r["t_send_ns"] for r in sends)

    out: dict[str, Any] = defaultdict(int)
    out["last_recv"] = dict(last_recv)
    out["killed"] = killed
    rows_of_proc: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        rows_of_proc[r["proc"]][r["kind"] == "recv"] += 1
    out["rows_of_proc"] = {p: tuple(n) for p, n in rows_of_proc.items()}
    for member, group in group_of.items():
        due = [r for r in sends if r["group"] == group and r["sender"] != member
               and r["dest"] in (None, member)]
        received = got[member]
        assert len(received) == sum(1 for r in records if r["kind"] == "recv"
                                    and r["receiver"] == member)  # no duplicates
        if member not in killed:
            missing = {r["msg_id"] for r in due} - received
            out["lost_stayed"] += len(missing)
            out["expected"] += len(due)
            continue
        k = killed[member]
        expected = {r["msg_id"] for r in due if r["t_send_ns"] + settle_ns <= k}
        window = {r["msg_id"] for r in due if r["t_send_ns"] <= k < r["t_send_ns"] + settle_ns}
        after = {r["msg_id"] for r in due if r["t_send_ns"] > k}
        assert received <= expected | window  # nothing recorded after its death
        out["expected"] += len(expected)
        out["lost_killed"] += len(expected - received)
        out["undetermined"] += len(window)
        out["undetermined_delivered"] += len(window & received)
        out["missed_while_member"] += len((expected | window) - received)
        out["sent_after_kill"] += len(after)
    return out


@pytest.mark.slow
@pytest.mark.spark
def test_killed_peer_audit_is_exact(kill_run: tuple[Scenario, RunResult],
                                    spark: SparkSession) -> None:
    scenario, result = kill_run
    run_dir = result.run_dir
    assert result.killed == [2]
    victims = {m.name for m in scenario.members_of_process(2)}
    assert victims == {"alpha-2", "beta-1"}
    truth = independent_audit(run_dir, round(SETTLE_S * S))
    assert set(truth["killed"]) == victims
    # The kill was mid-run: plenty was sent to the victims after it.
    assert truth["sent_after_kill"] > 100
    # The freeze flushed every row the process had: the counters it reported after the
    # freeze match its rows on disk, which reach right up to the kill.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["killed_processes"] == [2] and manifest["status"] == "ok"
    counters = manifest["counters"]["p2"]
    assert (counters["sent"], counters["received"]) == truth["rows_of_proc"][2]
    for member in victims:
        assert truth["killed"][member] - truth["last_recv"][member] < S

    report: Report = analyze(str(run_dir), str(run_dir / "report"), settle_s=SETTLE_S,
                             spark=spark)
    a = report.audit
    # No loss for the others.
    assert truth["lost_stayed"] == 0
    assert a.lost_registered.count == 0 and a.lost_to_left == 0 and report.ok
    # Exactly what the killed process missed while it was a member: nothing it was due
    # before the settle window (the flush on freeze kept every row), plus the messages in
    # flight inside the window that it never got.
    assert a.lost_to_killed == truth["lost_killed"] == 0
    assert a.undetermined.count == truth["undetermined"] > 0
    assert a.undetermined_delivered == truth["undetermined_delivered"]
    assert (a.lost_to_killed + a.undetermined.count - a.undetermined_delivered
            == truth["missed_while_member"])
    assert a.expected == truth["expected"] and a.delivered == a.expected
    assert report.counts.messages_without_send_record == 0  # the victims' sends were flushed
    assert (a.duplicated.count, a.unexpected.count) == (0, 0)


CHURN = """
name = "churn-restart"
duration = 6
drain = 1
[peers]
processes = 2
[send]
rate = 20
unicast = 0.3
[stub]
reconnect_initial = 0.1
reconnect_max = 0.5
[[groups]]
name = "g"
members = 3
[[groups]]
name = "h"
members = 3
[[events]]
at = 1.0
action = "leave"
member = "g-1"
[[events]]
at = 1.5
action = "join"
member = "h-2"
[[events]]
at = 2.5
action = "restart-router"
down = 0.3
[[events]]
at = 4.0
action = "join"
member = "g-1"
"""


@pytest.mark.slow
def test_churn_and_router_restart(tmp_path: Path) -> None:
    scenario = parse_scenario(tomllib.loads(CHURN), source="churn")
    assert not scenario.member("h-2").initially_joined
    result = trio.run(partial(run_loadtest, scenario, tmp_path / "run", spawn_router=True))
    assert result.router_restarts == 1 and result.killed == []
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    t0 = manifest["t0_ns"]
    # The events as played, with their times: the restart's down, up and the moment every
    # member was seen registered again (which the audit uses to name reconnect losses).
    played = manifest["events"]
    assert [(e["at"], e["action"]) for e in played] == [
        (1.0, "leave"), (1.5, "join"), (2.5, "restart-router"), (4.0, "join")]
    assert all(t0 + round(e["at"] * S) <= e["t_ns"] for e in played)
    restart = played[2]
    assert restart["t_ns"] + 3 * S // 10 <= restart["up_ns"] < restart["registered_ns"]
    timeline = pq.read_table(tmp_path / "run" / "membership.parquet").to_pylist()
    events = {(r["member"], r["event"]): r["t_ns"] for r in timeline}
    assert sorted((r["member"], r["event"]) for r in timeline) == sorted(
        [(f"g-{i}", "join") for i in range(3)] + [(f"h-{i}", "join") for i in range(3)]
        + [("g-1", "leave"), ("g-1", "join")])
    joins_g1 = sorted(r["t_ns"] for r in timeline if (r["member"], r["event"]) == ("g-1",
                                                                                   "join"))
    leave_g1 = events[("g-1", "leave")]
    assert joins_g1[0] < t0 < t0 + S <= leave_g1 < joins_g1[1]
    assert t0 + 3 * S // 2 <= events[("h-2", "join")] < t0 + 5 * S // 2

    records = pq.read_table(tmp_path / "run" / "records").to_pylist()
    recv = [r for r in records if r["kind"] == "recv"]
    # A member records deliveries only while it is a member.
    for r in recv:
        if r["receiver"] == "g-1":
            assert joins_g1[0] <= r["t_recv_ns"] <= leave_g1 or r["t_recv_ns"] >= joins_g1[1]
        if r["receiver"] == "h-2":
            assert r["t_recv_ns"] >= events[("h-2", "join")]
    # g-1 sends again after rejoining, and after the restart everyone receives again.
    assert any(r["kind"] == "send" and r["sender"] == "g-1" and r["t_send_ns"] > joins_g1[1]
               for r in records)
    late = {r["receiver"] for r in recv if r["t_send_ns"] > t0 + 4 * S}
    assert late == {m.name for m in scenario.members}


def test_progress_lines_are_not_wrapped_off_a_terminal() -> None:
    """A long progress line written to a file (a CI log) stays one line (issue 25, item 12)."""
    import io

    from rich.console import Console

    from gossiprouter.loadtest.progress import Progress

    out = io.StringIO()
    progress = Progress(Console(file=out, width=80))
    assert not progress.live_mode
    line = "router: " + " ".join(f"word{i}" for i in range(40))
    progress.log(line)
    assert out.getvalue() == f"           {line}\n"


def tiny_federated(tmp_path: Path) -> Path:
    """scripts/scenarios/federated.toml, shortened for CI: 4 s of sending, router 1 killed at
    1.5 s for 0.5 s, the rest as shipped."""
    text = (SCENARIOS / "federated.toml").read_text()
    for old, new in (("duration = 14.0", "duration = 4.0"), ("drain = 3.0", "drain = 1.5"),
                     ("at = 5.0", "at = 1.5"), ("down = 1.0", "down = 0.5")):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "federated.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.spark
def test_federated_scenario_loses_nothing_while_both_routers_are_up(
        tmp_path: Path, spark: SparkSession) -> None:
    """Three federated routers, members spread over them, router 1 killed (SIGKILL) and
    restarted: the Spark audit finds no loss for any pair whose routers were both up, and
    names the losses of router 1's outage, pairs with an end on router 1 only."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "gossiprouter", "loadtest", str(tiny_federated(tmp_path)),
         "--spawn-router", "--out", str(run_dir), "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["router"]["federation"]["routers"]) == 3
    assert manifest["router_restarts"] == 1 and manifest["warnings"] == []
    [outage] = manifest["events"]
    on_1 = set(outage["members"])
    assert outage["router"] == 1 and on_1 == {"alpha-1", "alpha-4", "beta-1", "beta-4"}
    # The restarted router listed every member again (its own and the federation's).
    assert outage["registered_ns"] >= outage["up_ns"] > outage["t_ns"]

    report = analyze(str(run_dir), str(run_dir / "report"), spark=spark)
    a = report.audit
    assert a.delivered > 0 and a.lost_registered.count == 0 and report.ok
    assert a.expected == a.delivered + a.lost_reconnect.count
    for s in a.lost_reconnect.sample:
        assert s["sender"] in on_1 or s["receiver"] in on_1, s
    [ev] = report.events
    assert ev.end_s is not None and ev.end_s > ev.t_s  # the outage window, as measured
