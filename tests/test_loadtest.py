"""Tests of the load-test tool: scenario validation, the payload, the CLI, and two real runs.

The two runs use the real router process and real peer processes and are then audited with
the Spark analysis (local[*], one session for the module):

* ``small.toml`` through the command line: no loss, plausible latencies;
* ``kill-peer.toml`` through :func:`run_loadtest`: process 2 is killed mid-run; the audit's
  numbers are checked against counts derived here directly from the raw Parquet records
  and membership timeline with pyarrow (not with the audit's code).
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
from click.testing import CliRunner

from gossiprouter.analytics.audit import analyze
from gossiprouter.analytics.report.model import Report
from gossiprouter.loadtest.cli import EXIT_INPUT, loadtest_command
from gossiprouter.loadtest.driver import RunInputError, RunResult, run_loadtest
from gossiprouter.loadtest.pacing import Pacer, PaceStats
from gossiprouter.loadtest.peer import HEADER, decode_header, encode_payload
from gossiprouter.loadtest.resources import ResourceSampler, metrics_option
from gossiprouter.loadtest.scenario import MIN_PAYLOAD, Scenario
from gossiprouter.loadtest.scenario_checks import ScenarioError
from gossiprouter.loadtest.scenario_file import load_scenario, parse_scenario

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scripts" / "scenarios"
S = 1_000_000_000
SETTLE_S = 1.0

MINIMAL = """
duration = 5
[[groups]]
name = "g"
members = 2
"""


def write(tmp_path: Path, text: str, name: str = "t.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- scenarios


# topics.toml is the topic-multicast load test's (tests/test_loadtest_topics.py checks it).
@pytest.mark.parametrize("path", sorted(p for p in SCENARIOS.glob("*.toml") if p.stem != "topics"),
                         ids=lambda p: p.stem)
def test_shipped_scenarios_are_valid(path: Path) -> None:
    s = load_scenario(path)
    assert s.name == path.stem
    # The normalised form the peers get describes the same scenario.
    again = parse_scenario(json.loads(json.dumps(s.to_dict())), source=s.source)
    assert again == s
    assert [m.name for m in again.members] == [m.name for m in s.members]


# Two processes, groups g (2 members) and h (3).
TWO_GROUPS = MINIMAL + """
[peers]
processes = 2
[[groups]]
name = "h"
members = 3
"""


def test_defaults_and_member_layout(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, TWO_GROUPS + """
[[events]]
at = 1
action = "join"
member = "h-2"
"""))
    assert (s.name, s.duration, s.drain, s.seed, s.stubs) == ("t", 5.0, 2.0, 0, "per-member")
    g = s.group("g").send
    assert (g.rate, g.sizes, g.size_range, g.unicast) == (10.0, (256,), None, 0.0)
    # Round-robin over the processes, in file order; h-2 starts absent (first event: join).
    assert [(m.name, m.proc, m.initially_joined) for m in s.members] == [
        ("g-0", 0, True), ("g-1", 1, True), ("h-0", 0, True), ("h-1", 1, True),
        ("h-2", 0, False)]


def test_federation_spreads_every_group_over_the_routers(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, TWO_GROUPS + """
[federation]
routers = 3
[[events]]
at = 1
action = "restart-router"
router = 2
signal = "KILL"
"""))
    assert s.federation == 3
    assert [(m.name, m.proc, m.router) for m in s.members] == [
        ("g-0", 0, 0), ("g-1", 1, 1), ("h-0", 0, 2), ("h-1", 1, 0), ("h-2", 0, 1)]
    assert s.events[0].router == 2
    assert s.events[0].describe() == "restart router 2 (SIGKILL, down 1 s)"
    assert s.to_dict()["federation"] == {"routers": 3}


async def test_federation_needs_spawned_routers(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINIMAL + "[federation]\nrouters = 2\n"))
    with pytest.raises(RunInputError, match="federates 2 routers, which needs --spawn-router"):
        await run_loadtest(s, tmp_path / "r", router="127.0.0.1:1")
    assert not (tmp_path / "r").exists()


def test_thresholds_reach_the_manifest_config(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINIMAL + "[thresholds]\nmax_ms = 200\np99_ms = 50\n"))
    assert s.thresholds == (("p99_ms", 50.0), ("max_ms", 200.0))
    assert s.to_dict()["thresholds"] == {"p99_ms": 50.0, "max_ms": 200.0}
    assert parse_scenario(s.to_dict(), source="t.toml") == s


async def test_pacer_counts_late_and_skipped_slots(autojump_clock: trio.abc.Clock) -> None:
    # Four slots a second (0.25 s apart, exact in binary). The second send takes 0.6 s:
    # the third slot starts 0.35 s behind (late), the fourth 0.1 s (on time). The fifth
    # takes 3 s: the sixth is 2.75 s behind, so 11 slots are skipped and it is sent on the
    # grid.
    stats = PaceStats()
    pacer = Pacer(4, trio.current_time(), stats)
    for took in (0, 0.6, 0, 0, 3.0, 0):
        await pacer.wait()
        await trio.sleep(took)
    assert (stats.slots, stats.late, stats.skipped) == (17, 1, 11)
    assert stats.max_lag_s == pytest.approx(2.75)
    assert stats.counters() == {"slots": 17, "slots_late": 1, "slots_skipped": 11,
                                "send_lag_max_s": 2.75}


def test_resource_samples_stay_bounded_over_a_long_run() -> None:
    # An hour at one sample a second: never more than max_samples, the whole run covered.
    sampler = ResourceSampler(max_samples=100)
    t = 0.0
    while t < 3600:
        sampler.add(t, {"router": (t / 10, 1 << 20)})
        t += sampler.interval_s
    assert 50 <= len(sampler.samples) < 100
    assert sampler.samples[0]["t_s"] == 0 and sampler.samples[-1]["t_s"] > 3500
    assert sampler.interval_s == 64.0
    assert metrics_option(("--log-level", "info", "--metrics", "127.0.0.1:9")) == "127.0.0.1:9"
    assert metrics_option(("--metrics=127.0.0.1:8",)) == "127.0.0.1:8"
    assert metrics_option(("--grace", "1")) is None


def test_group_overrides_and_size_range(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, """
duration = 3
[send]
rate = "max"
sizes = {min = 100, max = 200}
[[groups]]
name = "a"
members = 2
rate = 5
unicast = 0.5
"""))
    a = s.group("a").send
    assert (a.rate, a.sizes, a.size_range, a.unicast) == (5.0, None, (100, 200), 0.5)


BAD: list[tuple[str, str]] = [
    ("duration = 5\n", "t.toml: groups: missing (expected at least one [[groups]] table "
                       "with name and members)"),
    (MINIMAL.replace("duration = 5", "duration = -1"),
     "t.toml: duration: expected a number > 0 and <= 86400, got -1"),
    (MINIMAL.replace("duration = 5", "duraton = 5"),
     "t.toml: unknown key 'duraton' (expected one of: name, description, duration, drain, "
     "seed, peers, send, stub, router, federation, groups, events, attacks, thresholds)"),
    (MINIMAL + "[send]\nrate = -5\n",
     't.toml: send.rate: expected a number > 0 and <= 1e+06 (messages per second per member) '
     'or "max", got -5'),
    (MINIMAL + "[send]\nrate = true\n",
     't.toml: send.rate: expected a number > 0 and <= 1e+06 (messages per second per member) '
     'or "max", got True'),
    (MINIMAL + '[send]\nrate = "fast"\n',
     't.toml: send.rate: expected a number > 0 and <= 1e+06 (messages per second per member) '
     "or \"max\", got 'fast'"),
    (MINIMAL + "[send]\nsizes = [64, 10]\n",
     "t.toml: send.sizes: expected a non-empty list of payload sizes in bytes from 64 to "
     "1048576, got [64, 10]"),
    (MINIMAL + "[send]\nsizes = {min = 500, max = 100}\n",
     "t.toml: send.sizes.max: expected a size >= min (500), got 100"),
    (MINIMAL + "[send]\nunicast = 1.5\n",
     "t.toml: send.unicast: expected a fraction from 0 to 1 (the share of unicast messages), "
     "got 1.5"),
    (MINIMAL + "[send]\nrat = 1\n",
     "t.toml: unknown key 'rat' in [send] (expected one of: rate, sizes, unicast)"),
    (MINIMAL + "[peers]\nprocesses = 3\n",
     "t.toml: peers.processes: expected at most 2 (the number of members: a process without "
     "members has nothing to do), got 3"),
    (MINIMAL + '[peers]\nstubs = "shared"\n',
     't.toml: peers.stubs: expected one of "per-member", "per-process", got \'shared\''),
    (MINIMAL + '[router]\nargs = ["--port", "1"]\n',
     "t.toml: router.args: expected options other than --port (the tool sets the address "
     "itself), got ['--port', '1']"),
    ("duration = 5\n[[groups]]\nname = \"g h\"\nmembers = 2\n",
     "t.toml: groups[0].name: expected 1 to 16 letters, digits, '_' or '.', got 'g h'"),
    ("duration = 5\n[[groups]]\nname = \"g\"\n",
     "t.toml: groups[0].members: missing (the number of members)"),
    ("duration = 5\n[[groups]]\nname = \"g\"\nmembers = 1\nunicast = 0.5\n",
     "t.toml: groups[0].unicast: expected 0 for a group of one member (a unicast needs "
     "another member), got 0.5"),
    (MINIMAL + '[[events]]\nat = 1\naction = "explode"\n',
     't.toml: events[0].action: expected one of "leave", "join", "kill", "restart-router", '
     "got 'explode'"),
    (MINIMAL + '[[events]]\nat = 9\naction = "kill"\nprocess = 0\n',
     "t.toml: events[0].at: expected a number of seconds >= 0 and < the duration (5), got 9"),
    (MINIMAL + '[[events]]\nat = 1\naction = "kill"\nprocess = 4\n',
     "t.toml: events[0].process: expected an integer from 0 to 0, got 4"),
    (MINIMAL + '[[events]]\nat = 1\naction = "leave"\nmember = "g-7"\n',
     "t.toml: events[0].member: expected the name of a member (g-0, g-1), got 'g-7'"),
    (MINIMAL + '[[events]]\nat = 1\naction = "leave"\nprocess = 0\nmember = "g-0"\n',
     "t.toml: unknown key 'process' in events[0] (action 'leave') (expected one of: at, "
     "action, member)"),
    (MINIMAL + '[[events]]\nat = 2\naction = "leave"\nmember = "g-0"\n'
               '[[events]]\nat = 1\naction = "leave"\nmember = "g-0"\n',
     "t.toml: events[0].member: 'g-0' cannot leave at 2 s: it is not joined then"),
    (MINIMAL + '[[events]]\nat = 1\naction = "kill"\nprocess = 0\n'
               '[[events]]\nat = 2\naction = "leave"\nmember = "g-1"\n',
     "t.toml: events[1].member: 'g-1' cannot leave at 2 s: its process 0 is killed at 1 s"),
    (MINIMAL + '[[events]]\nat = 1\naction = "restart-router"\nsignal = "HUP"\n',
     't.toml: events[0].signal: expected one of "TERM", "KILL", got \'HUP\''),
    ("duration = 5\n[[groups]\n", "t.toml: not valid TOML: "),
    (MINIMAL + "[federation]\nrouters = 9\n",
     "t.toml: federation.routers: expected an integer from 2 to 8, got 9"),
    (MINIMAL + "[federation]\nrouters = 2\n"
               '[[events]]\nat = 1\naction = "restart-router"\nrouter = 2\n',
     "t.toml: events[0].router: expected an integer from 0 to 1, got 2"),
    (MINIMAL + '[router]\nargs = ["--bridge", "mqtt://x:1"]\n[federation]\nrouters = 2\n',
     "t.toml: router.args: expected no --bridge with [federation] (the tool starts the broker "
     "and bridges the routers itself), got ['--bridge', 'mqtt://x:1']"),
    (MINIMAL + "[thresholds]\np99_ms = -5\n",
     "t.toml: thresholds.p99_ms: expected a number > 0 and <= 600000, got -5"),
    (MINIMAL + '[thresholds]\np99_ms = "50ms"\n',
     "t.toml: thresholds.p99_ms: expected a number > 0 and <= 600000, got '50ms'"),
    (MINIMAL + "[thresholds]\np98_ms = 5\n",
     "t.toml: unknown key 'p98_ms' in [thresholds] (expected one of: p50_ms, p90_ms, p95_ms, "
     "p99_ms, p999_ms, max_ms)"),
    (MINIMAL.replace("duration = 5", "duration = 5\nthresholds = 50"),
     "t.toml: thresholds: expected a table such as [thresholds] p99_ms = 50, got 50"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(": ")[1] for _, m in BAD])
def test_bad_scenarios_name_key_value_and_expectation(
        tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(write(tmp_path, text))
    if message.endswith(": "):
        assert str(e.value).startswith(message)
    else:
        assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"nope\.toml: no such scenario file"):
        load_scenario(tmp_path / "nope.toml")


def test_cli_bad_scenario_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "[send]\nrate = -5\n", "bad.toml")
    result = CliRunner().invoke(loadtest_command,
                                [str(path), "--spawn-router", "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_INPUT
    assert result.output.splitlines() == [
        'gossiprouter: error: bad.toml: send.rate: expected a number > 0 and <= 1e+06 '
        '(messages per second per member) or "max", got -5']
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("args", "message"), [
    ([], "give either --router HOST:PORT or --spawn-router"),
    (["--spawn-router", "--router", "127.0.0.1:1"],
     "give either --router HOST:PORT or --spawn-router"),
    (["--router", "10.0.0.1:12001"], "--router '10.0.0.1:12001': the load test runs on one "
     "machine, so the router must be on 127.0.0.1"),
    # Read by gossiprouter.core.addresses.parse_hostport, as every HOST:PORT is.
    (["--router", "127.0.0.1:0"], "--router '127.0.0.1:0': expected HOST:PORT with a port "
     "from 1 to 65535 (IPv6: [::1]:12001)"),
    (["--router", "::1:12001"], "--router '::1:12001': an IPv6 address goes in brackets, "
     "e.g. [::1]:12001"),
])
def test_cli_router_options(tmp_path: Path, args: list[str], message: str) -> None:
    path = write(tmp_path, MINIMAL)
    result = CliRunner().invoke(loadtest_command, [str(path), "--out", str(tmp_path / "r"),
                                                   *args])
    assert result.exit_code == EXIT_INPUT
    assert result.output.strip() == f"gossiprouter: error: {message}"


async def test_restart_needs_a_spawned_router(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINIMAL + '[[events]]\nat = 1\naction = '
                                                '"restart-router"\n'))
    with pytest.raises(RunInputError, match="needs --spawn-router"):
        await run_loadtest(s, tmp_path / "r", router="127.0.0.1:1")
    assert not (tmp_path / "r").exists()


async def test_run_dir_must_be_new(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "old").write_text("x")
    s = load_scenario(write(tmp_path, MINIMAL))
    with pytest.raises(RunInputError, match="the directory is not empty"):
        await run_loadtest(s, tmp_path / "r", spawn_router=True)


def test_a_run_that_failed_before_recording_leaves_its_directory_reusable(
        tmp_path: Path) -> None:
    """The same command works again once the cause is fixed (issue 25, item 5); a failed
    run that recorded something is kept, as is anything else."""
    from gossiprouter.loadtest.driver import prepare_run_dir

    run = tmp_path / "r"
    (run / "records").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "logs" / "router.log").write_text("x")
    (run / "manifest.json").write_text('{"status": "failed"}')
    prepare_run_dir(run)
    assert sorted(p.name for p in run.iterdir()) == ["logs", "records"]
    assert not any((run / "logs").iterdir())
    (run / "manifest.json").write_text('{"status": "failed"}')
    (run / "records" / "p0.parquet").write_text("x")
    with pytest.raises(RunInputError, match="the directory is not empty"):
        prepare_run_dir(run)


def test_payload_round_trip() -> None:
    longest = "g" * 16 + "-9999"  # the longest member name a scenario allows
    p = encode_payload(longest.encode(), 7, 123_456_789, longest.encode(), MIN_PAYLOAD)
    assert HEADER.size + 2 * len(longest) <= MIN_PAYLOAD == len(p)
    assert decode_header(p) == (longest, 7, 123_456_789, longest)
    p = encode_payload(b"a-0", 0, 5, None, 1000)
    assert len(p) == 1000 and decode_header(p) == ("a-0", 0, 5, None)
    with pytest.raises(ValueError):
        decode_header(b"hello, world, not a load-test payload")


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
    return write(tmp_path, text, "federated.toml")


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
