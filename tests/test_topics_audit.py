"""The Spark audit of topic-multicast load tests (``gossiprouter analyze`` of a
``loadtest-topics --out`` run): hand-made records with known faults, and a short real run
whose Spark audit must agree with the in-process one.

All Spark tests share one local Spark session (module-scoped, as in tests/test_audit.py).
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from click.testing import CliRunner

from gossiprouter.analytics.cli import EXIT_INPUT, EXIT_LOSS, EXIT_OK, analyze_command
from gossiprouter.analytics.report.environment import environment_rows
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.session import run_kind
from gossiprouter.analytics.topics_audit import analyze_topics, match_table
from gossiprouter.core.topics import matches, parse_topic
from gossiprouter.loadtest.records import MANIFEST_FILE
from gossiprouter.loadtest.topic_records import (
    DELIVERIES_FILE,
    PUBLICATIONS_FILE,
    SUBSCRIPTIONS_FILE,
    write_topic_table,
)
from gossiprouter.loadtest.topics import run_topics
from gossiprouter.loadtest.topics_scenario import load_topics_scenario
from tests.audit_runs import run_fixture
from tests.chromium import Browser, find_chromium
from tests.conftest import TopicsScenario

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S = 1_000_000_000
MS = 1_000_000
T0 = 500 * S
SETTLE = 0.3


def test_match_table_agrees_with_the_rule() -> None:
    """Every (id, pattern) pair of a mixed set, against matches() one by one."""
    topics = ["v0/pos/eu/de", "v0/pos/eu", "v0/pos", "v1/pos/us/fr", "v0/speed/eu/de/x",
              "ü/pos/eu/de"]
    patterns = ["v0/pos/*", "+/pos/eu/+", "v0/+/eu/*", "+/+", "v0/pos/us/+", "+/pos/*",
                "ü/pos/+/de", "v1/pos/us/fr", "v0/pos/eu/de/+"]
    want = sorted((t, p) for t, p in itertools.product(topics, patterns)
                  if matches(parse_topic(p), parse_topic(t)))
    got = sorted(match_table(topics, patterns))
    assert got == want
    assert ("v0/pos", "v0/pos/*") in got  # '*' matches zero levels too
    assert len(got) > 10


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[object]]:
    return {k: [r[k] for r in rows] for k in rows[0]}


def build_topics_run(run_dir: Path) -> None:
    """Two routers; one publisher p0-0 on router 0. Subscribers:

    * s0-0 (router 0) holds v0/pos/* throughout;
    * s1-0 (router 1) holds +/pos/eu/+ throughout;
    * s0-1 (router 0) holds v0/pos/us/+ until 5 s, then v1/pos/*: the change is requested
      at 5 s and settled at 5.5 s, so it is in flux over [4.7 s, 5.5 s].

    Publications (t, scope, topic) and what happens:

    * p0-0/0 1 s global v0/pos/eu/de: s0-0 gets it, s1-0 never does (the injected loss);
    * p0-0/1 2 s local v0/pos/eu/fr: s0-0 gets it twice (the duplicate); s1-0 matches but is
      on another router: its copy is unexpected;
    * p0-0/2 5.2 s global v0/pos/us/de: s0-0 gets it; s0-1, in flux, gets it: not audited;
    * p0-0/3 7 s global v1/pos/us/fr: s0-1's new pattern, delivered;
    * p0-0/4 8 s local v0/pos/us/de: s0-0 gets it; s0-1 no longer holds v0/pos/us/+ and
      its change settled: its copy is unexpected.
    """
    run = "unit-topics"
    subs = [
        dict(subscriber="s0-0", router=0, pattern="v0/pos/*", from_ns=T0 - 2 * S,
             settled_from_ns=T0 - S, to_ns=None, settled_to_ns=None),
        dict(subscriber="s1-0", router=1, pattern="+/pos/eu/+", from_ns=T0 - 2 * S,
             settled_from_ns=T0 - S, to_ns=None, settled_to_ns=None),
        dict(subscriber="s0-1", router=0, pattern="v0/pos/us/+", from_ns=T0 - 2 * S,
             settled_from_ns=T0 - S, to_ns=T0 + 5 * S, settled_to_ns=T0 + 5 * S + 310 * MS),
        dict(subscriber="s0-1", router=0, pattern="v1/pos/*", from_ns=T0 + 5 * S + 10 * MS,
             settled_from_ns=T0 + 5 * S + 500 * MS, to_ns=None, settled_to_ns=None),
    ]
    pubs = [(0, 1 * S, "global", "v0/pos/eu/de"), (1, 2 * S, "local", "v0/pos/eu/fr"),
            (2, 5 * S + 200 * MS, "global", "v0/pos/us/de"),
            (3, 7 * S, "global", "v1/pos/us/fr"), (4, 8 * S, "local", "v0/pos/us/de")]
    where = {"s0-0": 0, "s0-1": 0, "s1-0": 1}
    recv = [(0, "s0-0", 1), (1, "s0-0", 1), (1, "s0-0", 3), (1, "s1-0", 4), (2, "s0-0", 2),
            (2, "s0-1", 2), (3, "s0-1", 5), (4, "s0-0", 1), (4, "s0-1", 2)]
    scope = {seq: sc for seq, _, sc, _ in pubs}
    write_topic_table(run_dir, SUBSCRIPTIONS_FILE, _columns([dict(run=run, **s) for s in subs]))
    write_topic_table(run_dir, PUBLICATIONS_FILE, _columns([
        dict(run=run, pub_id=f"p0-0/{seq}", publisher="p0-0", router=0, scope=sc, topic=tp,
             size=100, t_send_ns=T0 + t) for seq, t, sc, tp in pubs]))
    send = {seq: T0 + t for seq, t, _, _ in pubs}
    write_topic_table(run_dir, DELIVERIES_FILE, _columns([
        dict(run=run, pub_id=f"p0-0/{seq}", receiver=r, router=where[r], scope=scope[seq],
             t_recv_ns=send[seq] + ms * MS) for seq, r, ms in recv]))
    (run_dir / MANIFEST_FILE).write_text(json.dumps({
        "kind": "topics", "run": run, "scenario": "unit-topics", "settle_s": SETTLE,
        "status": "ok", "t0_ns": T0, "scenario_config": {"duration": 8.5, "drain": 0.5}}))



unit_run = run_fixture("topics-run", build_topics_run)


@pytest.fixture(scope="module")
def unit_report(spark: SparkSession, unit_run: Path) -> Report:
    return analyze_topics(str(unit_run), str(unit_run / "report"), spark=spark)


@pytest.mark.spark
def test_hand_made_faults_are_found_exactly(unit_report: Report) -> None:
    a, by = unit_report.audit, unit_report.by_scope
    assert [(s["pub_id"], s["receiver"]) for s in a.lost.sample] == [("p0-0/0", "s1-0")]
    assert [(s["pub_id"], s["receiver"], s["copies"]) for s in a.duplicated.sample] == [
        ("p0-0/1", "s0-0", 2)]
    assert [(s["pub_id"], s["receiver"]) for s in a.unexpected.sample] == [
        ("p0-0/1", "s1-0"), ("p0-0/4", "s0-1")]
    assert [(s["pub_id"], s["receiver"]) for s in a.undetermined.sample] == [
        ("p0-0/2", "s0-1")]
    assert a.lost.sample[0]["t_send_s"] == 1.0  # seconds since the manifest's t0
    g, loc = by["global"], by["local"]
    assert (g.sent, g.expected, g.delivered, g.lost, g.duplicated, g.unexpected,
            g.in_flux) == (3, 4, 3, 1, 0, 0, 1)
    assert (loc.sent, loc.expected, loc.delivered, loc.lost, loc.duplicated,
            loc.duplicate_copies, loc.unexpected, loc.in_flux) == (2, 2, 2, 0, 1, 1, 2, 0)
    assert loc.latency is not None and loc.latency.count == 2
    assert loc.latency.max_ns == 1 * MS  # first copies only: the duplicate came at 3 ms
    assert g.latency is not None and g.latency.max_ns == 5 * MS
    # Each scope's histogram on the same bins, so the report can draw them apart.
    assert loc.histogram is not None and g.histogram is not None
    assert (sum(loc.histogram.counts), sum(g.histogram.counts)) == (2, 3)
    assert loc.histogram.edges_ns == g.histogram.edges_ns == unit_report.latency_histogram.edges_ns
    # Latency over time, by send second since t0: p0-0/3 (sent at 7 s) took 5 ms.
    over = {p.t_s: p for p in unit_report.latency_over_time}
    assert sorted(over) == [1, 2, 5, 7, 8] and over[7].max_ns == 5 * MS
    assert unit_report.verdict.status == "LOSS"
    assert unit_report.verdict.exit_code == EXIT_LOSS
    assert "1 delivery lost" in unit_report.verdict.text
    assert "1 delivery duplicated" in unit_report.verdict.text


@pytest.mark.spark
def test_the_report_files_have_the_by_scope_table(unit_report: Report, unit_run: Path) -> None:
    data = json.loads((unit_run / "report" / "report.json").read_text())
    assert data["kind"] == "topics" and data["verdict"]["status"] == "LOSS"
    assert data["by_scope"]["global"]["lost"] == 1
    page = (unit_run / "report" / "report.html").read_text()
    assert '<h3 id="by-scope">By scope</h3>' in page
    assert "<h3>In flux: 1 (showing 1)</h3>" in page
    # Throughput counts every first copy received: 8 pairs, unexpected and in flux included.
    assert sum(b.deliveries for b in unit_report.throughput) == 8
    assert sum(b.lost for b in unit_report.throughput) == 1
    assert "p0-0/0" in page  # the lost sample


@pytest.mark.spark
def test_analyze_dispatches_on_the_run_kind(spark: SparkSession, unit_run: Path,
                                            tmp_path: Path) -> None:
    assert run_kind(str(unit_run)) == "topics"
    runner = CliRunner()
    result = runner.invoke(analyze_command, [str(unit_run), "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_LOSS, result.output
    assert "scope   sent" in result.stdout and "verdict" in result.stdout
    assert result.stderr.strip().splitlines()[-1].endswith("(see the report)")
    # A topics run without its records is bad input, named.
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(unit_run / MANIFEST_FILE, broken / MANIFEST_FILE)
    result = runner.invoke(analyze_command, [str(broken)])
    assert result.exit_code == EXIT_INPUT
    assert "no topics/publications.parquet" in result.stderr


@pytest.mark.spark
def test_a_real_run_spark_agrees_with_the_in_process_audit(
        spark: SparkSession, tmp_path: Path, topics_scenario: TopicsScenario) -> None:
    f = topics_scenario(duration=2.0, drain=1.0, subscribers=4, rate=15, churn_interval=1.0,
                        settle=0.3, patterns=["+/pos/*", "v{p}/pos/eu/+", "+/pos/+/de"])
    out = tmp_path / "run"
    rep = trio.run(run_topics, load_topics_scenario(f), lambda *a: None, out, f)
    report = analyze_topics(str(out), str(out / "report"), spark=spark)
    for scope in ("local", "global"):
        py, sp = rep.rows[scope], report.by_scope[scope]
        assert sp.expected > 0, scope
        assert (sp.sent, sp.expected, sp.delivered, sp.lost, sp.duplicate_copies,
                sp.unexpected) == (py["sent"], py["expected"], py["delivered"], py["lost"],
                                   py["duplicated"], py["unexpected"]), scope
        assert sp.lost == 0
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["status"] == "ok" and manifest["in_process_audit"]["global"]["lost"] == 0
    # The environment: both routers and the loader sampled; the publishers' schedule.
    samples = manifest["resources"]["samples"]
    assert samples and set(samples[-1]["processes"]) == {"router-0", "router-1", "loader"}
    assert manifest["resources"]["router_settings"]["dispatcher"] == "on"
    assert manifest["host"]["cores"] >= 1
    pacing = manifest["counters"]["publishers"]
    assert pacing["sent"] == report.counts.messages and pacing["slots"] >= pacing["sent"]
    env = dict(environment_rows(report))
    assert env["router settings"].startswith("fast path ")
    assert env["router (2 processes)"].startswith("CPU ")
    assert env["load generator"].startswith("CPU ")
    assert report.verdict.exit_code == EXIT_OK


@pytest.mark.spark
def test_topics_report_in_headless_chromium(unit_report: Report, unit_run: Path,
                                            tmp_path: Path) -> None:
    if find_chromium() is None:
        pytest.skip("chromium is not installed (scripts/setup installs it)")
    with Browser() as browser:
        browser.open((unit_run / "report" / "report.html").as_uri(), width=1280)
        images = browser.evaluate(
            "[...document.images].map(i => [i.alt, i.complete, i.naturalWidth])")
        scenario = browser.evaluate("document.getElementById('scenario').innerText")
        scopes = browser.evaluate("document.querySelector('#by-scope + table').innerText")
        latency = browser.evaluate("document.querySelector('#latency table').innerText")
        captions = browser.evaluate("document.querySelectorAll('.caption').length")
        console = browser.console_errors()
    assert [alt for alt, *_ in images] == [
        "latency percentiles over time", "latency distribution", "throughput over time"]
    assert all(complete and natural > 0 for _, complete, natural in images)
    assert "duration\t8.5 s sending + 0.5 s drain" in scenario
    # One unit for every latency: ms, with p95, in the scope table and the latency table.
    assert scopes.splitlines()[0].endswith("p50 ms\tp95 ms\tp99 ms\tmax ms")
    assert latency.splitlines()[0] == "latency (ms)\tcount\tp50\tp90\tp95\tp99\tp99.9\tmax"
    assert "µs" not in scopes + latency
    assert captions == 2  # the drain, under both plots over the run; no events to explain
    assert console == []
