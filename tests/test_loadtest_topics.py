"""The topic-multicast load test: its scenario file, its audit, and one short real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossiprouter.loadtest.topics import Sent, Subscriber, audit, run_topics
from gossiprouter.loadtest.topics_scenario import (
    TopicsScenarioError,
    is_topics_scenario,
    load_topics_scenario,
)
from tests.conftest import TopicsScenario

REPO = Path(__file__).resolve().parent.parent


def _sub(i: int, received: dict[tuple[int, int], list[float]],
         changes: list[list[float]] | None = None) -> Subscriber:
    s = Subscriber(i, 0, None)  # type: ignore[arg-type]  # the audit never touches it
    s.received = received
    s.changes = changes or []
    return s


def test_audit_counts_lost_duplicated_unexpected_and_skips_flux() -> None:
    sent = [
        Sent(0, 0, "local", 1.0, frozenset({0, 1}), frozenset()),
        Sent(0, 1, "global", 2.0, frozenset({0}), frozenset({2})),
        Sent(0, 2, "global", 5.0, frozenset({0, 3}), frozenset()),
    ]
    subs = [
        _sub(0, {(0, 0): [1.01], (0, 1): [2.02, 2.03], (0, 2): [5.01]}),  # a duplicate
        _sub(1, {}),  # lost (0, 0)
        _sub(2, {(0, 1): [2.1]}),  # in flux at send time: not counted at all
        _sub(3, {(0, 0): [1.5]}, [[4.0, 6.0]]),  # unexpected (0, 0); (0, 2) in its change
    ]
    rep = audit(sent, subs)
    assert rep.rows["local"]["expected"] == 2 and rep.rows["local"]["lost"] == 1
    assert rep.rows["local"]["unexpected"] == 1
    assert rep.rows["global"]["expected"] == 2 and rep.rows["global"]["duplicated"] == 1
    assert rep.rows["global"]["lost"] == 0
    assert (rep.total_lost, rep.total_duplicated, rep.total_unexpected) == (1, 1, 1)
    assert rep.rows["local"]["p50_ms"] == pytest.approx(10, abs=0.01)


def test_the_shipped_scenario_loads_and_bad_ones_say_why(tmp_path: Path) -> None:
    sc = load_topics_scenario(REPO / "scripts" / "scenarios" / "topics.toml")
    assert sc.routers == 2 and sc.patterns
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "topics"\n[topics]\npatterns = ["v{p}/pos/*/eu"]\n')
    with pytest.raises(TopicsScenarioError, match="last partition element"):
        load_topics_scenario(bad)
    bad.write_text('kind = "topics"\nrouters = 0\n')
    with pytest.raises(TopicsScenarioError, match="routers"):
        load_topics_scenario(bad)
    small = REPO / "scripts" / "scenarios" / "small.toml"
    with pytest.raises(TopicsScenarioError, match="kind"):
        load_topics_scenario(small)
    assert is_topics_scenario(REPO / "scripts" / "scenarios" / "topics.toml")
    assert not is_topics_scenario(small)


def test_topics_scenario_thresholds(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('kind = "topics"\n[thresholds]\np95_ms = 20\n')
    assert load_topics_scenario(f).thresholds == {"p95_ms": 20.0}
    f.write_text('kind = "topics"\n[thresholds]\np95 = 20\n')
    with pytest.raises(TopicsScenarioError) as e:
        load_topics_scenario(f)
    assert str(e.value) == ("t.toml: unknown key 'p95' in [thresholds] (expected one of: "
                            "p50_ms, p90_ms, p95_ms, p99_ms, p999_ms, max_ms)")


async def test_a_short_federated_run_loses_nothing(topics_scenario: TopicsScenario) -> None:
    f = topics_scenario(duration=1.5, drain=1.0, subscribers=3, rate=10, churn_interval=0.5,
                        settle=1.0, patterns=["+/pos/*", "v{p}/pos/eu/+"])
    rep = await run_topics(load_topics_scenario(f), echo=lambda *a: None)
    assert rep.rows["global"]["expected"] > 0 and rep.rows["local"]["expected"] > 0
    assert (rep.total_lost, rep.total_duplicated, rep.total_unexpected) == (0, 0, 0)


def test_one_loadtest_command_runs_a_topics_scenario(topics_scenario: TopicsScenario,
                                                     tmp_path: Path) -> None:
    """`gossiprouter loadtest` runs any scenario kind (issue 25, item 13); the old name
    loadtest-topics still works, and --router (the classic kind's) is refused with why."""
    from click.testing import CliRunner

    from gossiprouter.cli.main import main

    f = topics_scenario(duration=1.0, drain=0.5, subscribers=2, rate=5, churn_interval=0.5,
                        settle=0.5, patterns=["+/pos/*"])
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["loadtest", str(f), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "scope" in r.stdout and f"audit them with: gossiprouter analyze {out}" in r.stdout
    assert (out / "manifest.json").exists()
    r = CliRunner().invoke(main, ["loadtest", str(f), "--router", "127.0.0.1:1"])
    assert (r.exit_code, r.stderr) == (2, "gossiprouter: error: t.toml is a topics scenario, "
                                          "which starts its own routers: drop --router\n")
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "topics"\nrouters = 0\n')
    for name in ("loadtest", "loadtest-topics"):
        r = CliRunner().invoke(main, [name, str(bad)])
        assert r.exit_code == 2 and r.stderr.startswith("gossiprouter: error: "), r.output


def test_a_router_that_exits_is_shown_with_its_log(topics_scenario: TopicsScenario,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A router of the run that exits at start shows why (its log's last lines) and the
    path of the log, which is kept (issue 25, item 2)."""
    import re
    import shutil

    from click.testing import CliRunner

    from gossiprouter.cli.main import main

    f = topics_scenario(duration=1.0, drain=0.5, subscribers=1, rate=5, churn_interval=0.5,
                        settle=0.5, patterns=["+/pos/*"])
    monkeypatch.setenv("GOSSIPROUTER_FAST_PATH", "bogus")  # the routers refuse to start
    r = CliRunner().invoke(main, ["loadtest", str(f)])
    assert r.exit_code == 1, r.output
    *shown, last = r.stderr.splitlines()
    m = re.fullmatch(r"gossiprouter: error: router 0 exited with status 2 \(its log is kept: "
                     r"(\S+/router-0\.log)\)", last)
    assert m is not None, r.stderr
    log = Path(m.group(1))
    assert shown == [f"  {line}" for line in log.read_text().splitlines()[-5:]]
    assert "GOSSIPROUTER_FAST_PATH='bogus'" in shown[-1]
    shutil.rmtree(log.parent)
