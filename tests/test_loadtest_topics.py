"""The topic-multicast load test: its scenario file, its audit, and one short real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossiprouter.loadtest.topics import (
    Sent,
    Subscriber,
    TopicsScenarioError,
    audit,
    is_topics_scenario,
    load_topics_scenario,
    run_topics,
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


async def test_a_short_federated_run_loses_nothing(topics_scenario: TopicsScenario) -> None:
    f = topics_scenario(duration=1.5, drain=1.0, subscribers=3, rate=10, churn_interval=0.5,
                        settle=1.0, patterns=["+/pos/*", "v{p}/pos/eu/+"])
    rep = await run_topics(load_topics_scenario(f), echo=lambda *a: None)
    assert rep.rows["global"]["expected"] > 0 and rep.rows["local"]["expected"] > 0
    assert (rep.total_lost, rep.total_duplicated, rep.total_unexpected) == (0, 0, 0)


async def test_a_router_that_exits_at_start_keeps_its_log(
        topics_scenario: TopicsScenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A router of the run that exits at start is named with its exit status and its log,
    which is kept for the user to read (the run's other files are removed)."""
    import re
    import shutil

    from gossiprouter.loadtest.topics import ProcessExited

    f = topics_scenario(duration=1.0, drain=0.5, subscribers=1, rate=5, churn_interval=0.5,
                        settle=0.5, patterns=["+/pos/*"])
    monkeypatch.setenv("GOSSIPROUTER_FAST_PATH", "bogus")  # the routers refuse to start
    with pytest.raises(ProcessExited) as e:
        await run_topics(load_topics_scenario(f), echo=lambda *a: None)
    assert re.fullmatch(r"router 0 exited with status \d+ \(its log is kept: \S+\)",
                        str(e.value)), str(e.value)
    assert e.value.log is not None and e.value.log.name == "router-0.log"
    assert "GOSSIPROUTER_FAST_PATH='bogus'" in e.value.last_lines()[-1]
    shutil.rmtree(e.value.log.parent)
