"""Tests of the load-test tool without a run: scenario validation (the shipped scenarios, the
defaults, every refusal naming its key, value and expectation), the command line's one-line
errors, the pacer, the resource sampler and the payload. The real runs are in
tests/test_loadtest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from gossiprouter.loadtest.cli import EXIT_INPUT, loadtest_command
from gossiprouter.loadtest.driver import RunInputError, run_loadtest
from gossiprouter.loadtest.pacing import Pacer, PaceStats
from gossiprouter.loadtest.peer import HEADER, decode_header, encode_payload
from gossiprouter.loadtest.resources import ResourceSampler, metrics_option
from gossiprouter.loadtest.scenario import MIN_PAYLOAD
from gossiprouter.loadtest.scenario_checks import ScenarioError
from gossiprouter.loadtest.scenario_file import load_scenario, parse_scenario

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scripts" / "scenarios"

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
