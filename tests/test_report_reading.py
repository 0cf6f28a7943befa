"""The load-test report read as a k6 or Gatling user reads one (issue 31, papercut 9): rates
in msg/s, target against achieved; an error rate; every threshold with pass or FAIL in the
terminal summary; a p95 line over time; each run's environment and a noise hint in the
baseline table; the drain drawn as such, not as a ramp. On hand-made reports (no Spark);
the page is read back in headless Chromium, from its DOM and its SVG, not its pixels.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gossiprouter.analytics.report.baseline import comparison_rows, load_baseline, noise
from gossiprouter.analytics.report.html_page import render_html
from gossiprouter.analytics.report.manifest import run_events
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import LatencyPoint, LatencyStats, ThroughputBucket
from gossiprouter.analytics.report.plots import _pyplot, _throughput
from gossiprouter.analytics.report.rates import error_rates, send_rates
from gossiprouter.analytics.report.summary import format_summary
from gossiprouter.loadtest.driver import RunResult
from gossiprouter.loadtest.progress import rates_line, target_rate
from gossiprouter.loadtest.scenario_file import load_scenario, parse_scenario
from tests.chromium import Browser, find_chromium
from tests.test_report import HOST, MANIFEST, RESOURCES, T0, _drawn, audit, make_report

REPO = Path(__file__).resolve().parent.parent
MS = 1_000_000


def _manifest(load1: float = 0.5, cores: int = 2, fast_path: str = "on",
              **config: Any) -> dict[str, Any]:
    """MANIFEST (4 members of alpha at 50 msg/s, 2 s + 1 s drain) with its environment:
    every sample at ``load1``, on ``cores`` cores, the fast path ``fast_path``."""
    res = json.loads(json.dumps(RESOURCES))
    res["router_settings"]["fast_path"] = fast_path
    for s in res["samples"]:
        s["load1"] = load1
    host: dict[str, Any] = {**json.loads(json.dumps(HOST["host"])), "cores": cores}
    return dict(MANIFEST, resources=res, host=host, versions=HOST["versions"],
                scenario_config=dict(MANIFEST["scenario_config"], **config))


# --------------------------------------------------------------------------- the summary


def test_summary_gives_rates_in_msg_per_s_and_an_error_rate() -> None:
    report = make_report(audit(lost=2, reconnect=3), _manifest())
    summary = format_summary(report)
    # 4 members x 50 msg/s; make_report sends 100 messages in the 2 s sending window.
    assert re.search(r"^send rate\s+target 200 msg/s \(4 sending members\), achieved 50 msg/s "
                     r"\(25\.0 %\) over the 2 s sending window$", summary, re.M), summary
    # MANIFEST's counters: 1 failed send, 32 router errors; 100 messages sent.
    assert re.search(r"^error rate\s+32\.67 % of send attempts \(33 of 101: failed sends and "
                     r"router errors\); 5\.00 % of expected deliveries lost \(5 of 100, 3 of "
                     r"them across a reconnect\)$", summary, re.M), summary
    e = error_rates(report)
    assert (e.errors, e.attempts, e.lost, e.expected) == (33, 101, 5, 100)
    page = render_html(report)
    assert ("<div class=k>send rate (target / achieved)</div><div class=v>200 / 50 msg/s "
            "(25.0 %)</div>") in page
    assert ("<div class=k>error rate (send attempts / deliveries lost)</div>"
            "<div class=v>32.67 % / 5.00 %</div>") in page


def test_target_rate_leaves_out_receivers_and_unpaced_groups() -> None:
    # Process 1 only receives: its members (alpha-1, alpha-3) have no target.
    m = _manifest(peers={"processes": 2, "receive_only": [1]})
    m["processes"] = [{"proc": 0, "members": ["alpha-0", "alpha-2"]},
                      {"proc": 1, "members": ["alpha-1", "alpha-3"]}]
    r = send_rates(make_report(manifest=m))
    assert r is not None and (r.target, r.senders) == (100.0, 2)
    unpaced = send_rates(make_report(manifest=_manifest(groups=[
        {"name": "alpha", "members": 4, "rate": "max", "sizes": [256], "unicast": 0.0}])))
    assert unpaced is not None and unpaced.target is None
    assert unpaced.text().startswith("target: as fast as possible (rate max), achieved 50 "
                                     "msg/s over the 2 s sending window")
    assert send_rates(make_report(manifest=None)) is None
    assert "send rate" not in format_summary(make_report(manifest=None))
    # A topics run: publishers per router x routers x rate.
    topics = {"kind": "topics", "status": "ok", "scenario_config": {
        "duration": 2.0, "drain": 1.0, "routers": 2, "publishers": 3, "rate": 20.0}}
    t = send_rates(make_report(manifest=topics, kind="topics"))
    assert t is not None and (t.target, t.senders) == (120.0, 6)


def test_summary_lists_every_threshold_passing_or_not() -> None:
    # make_report's latency: p50 0.0015 ms, p99 0.005 ms, max 0.009 ms.
    report = make_report(manifest=_manifest(thresholds={"p50_ms": 0.001, "p99_ms": 1.0,
                                                         "max_ms": 5.0}))
    summary = format_summary(report)
    assert report.verdict.status == "THRESHOLD"
    assert re.search(r"^check\s+threshold\s+observed\s+result$", summary, re.M)
    assert re.search(r"^latency p50\s+<= 0\.001 ms\s+0\.0015 ms\s+FAIL$", summary, re.M)
    # The passing ones too, which the verdict line does not name.
    assert re.search(r"^latency p99\s+<= 1 ms\s+0\.005 ms\s+pass$", summary, re.M)
    assert re.search(r"^latency max\s+<= 5 ms\s+0\.009 ms\s+pass$", summary, re.M)
    assert re.search(r"^lost while sender and receiver were both registered\s+0\s+0\s+pass$",
                     summary, re.M)
    assert re.search(r"^sends on schedule", summary, re.M) is None  # not paced: no row
    verdict = next(line for line in summary.splitlines() if line.startswith("verdict"))
    assert "p99" not in verdict  # only the failed threshold is in the verdict


def test_loadtest_summary_gives_rates_and_an_error_rate(tmp_path: Path) -> None:
    small = load_scenario(REPO / "scripts" / "scenarios" / "small.toml")
    assert target_rate(small) == 400.0  # 8 members x 50 msg/s
    result = RunResult(run_id="r", run_dir=tmp_path, router="127.0.0.1:1", seconds=13.0,
                       sent=3_980, received=27_000, errors=20, dropped=0, killed=[],
                       router_restarts=0, record_files=3, send_errors=5,
                       router_errors={"unknown_destination": 15})
    lines = result.summary(small).splitlines()
    assert ("rate: target 400 msg/s, achieved 398 msg/s (99.5 %) over the 10 s of sending; "
            "error rate 0.50 % (20 of 3,985 send attempts failed or came back as a router "
            "error)") in lines
    quiet = parse_scenario({"duration": 4.0, "peers": {"processes": 2, "receive_only": [1]},
                            "send": {"rate": "max"},
                            "groups": [{"name": "a", "members": 4}]})
    assert target_rate(quiet) is None
    assert rates_line(quiet, 400, 0, 0).startswith(
        "rate: as fast as possible (rate max), achieved 100 msg/s over the 4 s of sending; "
        "error rate 0.00 %")
    paced = parse_scenario({"duration": 4.0, "peers": {"processes": 2, "receive_only": [1]},
                            "send": {"rate": 10}, "groups": [{"name": "a", "members": 4}]})
    assert target_rate(paced) == 20.0  # a-1 and a-3 live in process 1, which only receives


# --------------------------------------------------------------------------- the baseline


def _compared(tmp_path: Path, old: dict[str, Any], new: dict[str, Any],
              p50_ms: float) -> Report:
    """A run with ``new``'s manifest and a p50 of ``p50_ms`` against a baseline with
    ``old``'s and a p50 of 10 ms (every other latency as the baseline's)."""
    def lat(p50: float) -> LatencyStats:
        return LatencyStats(10, MS, 12e6, int(p50 * MS), 20 * MS, 30 * MS, 40 * MS, 50 * MS,
                            50 * MS)

    # report.json alone: all a baseline is read from (rendering the page costs seconds).
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(
        json.dumps(make_report(manifest=old, lat=lat(10)).to_dict()))
    return make_report(manifest=new, lat=lat(p50_ms),
                       baseline=load_baseline(str(tmp_path / "old")))


def test_baseline_table_shows_each_runs_environment(tmp_path: Path) -> None:
    report = _compared(tmp_path, _manifest(load1=0.5), _manifest(load1=3.0), 11.6)
    rows = {r[0]: r[1:] for r in comparison_rows(report)}
    assert [r[0] for r in comparison_rows(report)][:3] == [
        "host load average (1 min, mean)", "host cores", "router fast path"]
    assert rows["host load average (1 min, mean)"] == ["0.50", "3.00", "+2.50", "this run busy"]
    assert rows["host cores"] == ["2", "2", "same", ""]
    assert rows["router fast path"] == ["on", "on", "same", ""]
    summary = format_summary(report)
    assert re.search(r"^host load average \(1 min, mean\)\s+0\.50\s+3\.00\s+\+2\.50\s+this run "
                     r"busy$", summary, re.M), summary
    # An older baseline without the environment: shown unknown, not left out.
    old = tmp_path / "old" / "report.json"
    data = json.loads(old.read_text())
    for key in ("load_mean", "cores", "fast_path"):
        del data["key_figures"][key]
    old.write_text(json.dumps(data))
    report.baseline = load_baseline(str(old))
    report.manifest = _manifest(load1=0.5)
    rows = {r[0]: r[1:] for r in comparison_rows(report)}
    assert rows["host cores"] == ["-", "2", "-", ""]
    assert rows["latency p50 (ms)"][3] == "within noise (±20 %)"
    assert ("Noise band ±20 % (host load not known for the baseline: assumed quiet); a latency "
            "or rate that changed by less is within noise, not a regression.") in \
        format_summary(report)


@pytest.mark.parametrize(("old_load", "new_load", "p50_ms", "hint"), [
    # +16 % p50 on a busy machine (load 11 on 2 cores) is noise, not a regression.
    (0.5, 11.0, 11.6, "within noise (±50 %)"),
    (0.5, 0.7, 11.6, "within noise (±20 %)"),
    (0.5, 0.7, 13.0, "beyond noise (±20 %): worse"),
    (11.0, 0.7, 13.0, "within noise (±50 %)"),  # the baseline's machine was the busy one
    (0.5, 11.0, 16.0, "beyond noise (±50 %): worse"),
    (0.5, 0.5, 7.0, "beyond noise (±20 %): better"),
])
def test_a_latency_change_is_flagged_within_or_beyond_noise(
        tmp_path: Path, old_load: float, new_load: float, p50_ms: float, hint: str) -> None:
    report = _compared(tmp_path, _manifest(load1=old_load), _manifest(load1=new_load), p50_ms)
    rows = {r[0]: r[1:] for r in comparison_rows(report)}
    assert rows["latency p50 (ms)"][3] == hint
    assert rows["latency p99 (ms)"][3] == "same"
    assert rows["lost"][3] == ""  # a count is exact: no noise to speak of


def test_runs_on_different_machines_are_not_comparable(tmp_path: Path) -> None:
    report = _compared(tmp_path, _manifest(cores=2), _manifest(cores=8), 5.0)
    rows = {r[0]: r[1:] for r in comparison_rows(report)}
    assert rows["host cores"] == ["2", "8", "changed", "not comparable"]
    assert rows["latency p50 (ms)"][3] == "not comparable"
    assert "The runs are not comparable: cores 2 in the baseline, 8 in this run" in \
        format_summary(report)
    off = noise({"fast_path": "on"}, {"fast_path": "off"})
    assert (off.band, off.why) == (None, "not comparable: fast path on in the baseline, off "
                                         "in this run")


# --------------------------------------------------------------------------- in a browser


def _browser_report(tmp_path: Path) -> Path:
    """A run of 4 s sending and 2 s drain, with p95 per second, a threshold that passes and
    one that fails, and a baseline on a quiet machine while this one was busy."""
    sending = [ThroughputBucket(t, 200, 190, 0) for t in range(4)]
    draining = [ThroughputBucket(4, 0, 30, 0), ThroughputBucket(5, 0, 4, 0)]
    points = [LatencyPoint(t, 190, 2 * MS, 9 * MS, 15 * MS, p95_ns=6 * MS) for t in range(4)]
    config: dict[str, Any] = {"duration": 4.0, "drain": 2.0,
                              "thresholds": {"p99_ms": 1.0, "max_ms": 100.0}}
    report = _compared(tmp_path, _manifest(load1=0.4), _manifest(load1=11.0, **config), 11.6)
    report.throughput, report.latency_over_time = sending + draining, points
    report.events = run_events(MANIFEST, T0)[:1]
    path = tmp_path / "report.html"
    path.write_text(render_html(report))
    return path


# The SVG of a plot, parsed from its data URL; the x of a path's vertices.
_SVG = ("(id => new DOMParser().parseFromString(atob(document.getElementById(id).src"
        ".split(',')[1]), 'image/svg+xml'))")
_XS = "(p => [...p.getAttribute('d').matchAll(/[ML] ([-\\d.]+) /g)].map(m => +m[1]))"


def test_report_reads_in_headless_chromium(tmp_path: Path) -> None:
    if find_chromium() is None:
        pytest.fail("chromium is not installed (scripts/setup installs it)")
    page = _browser_report(tmp_path)
    with Browser() as browser:
        browser.open(page.as_uri(), width=1280)
        plots = browser.evaluate(
            "[...document.images].filter(i => i.id.startsWith('plot-')).map(i => "
            "[i.id, i.complete, i.naturalWidth, i.getBoundingClientRect().width])")
        latency = browser.evaluate(f"""(() => {{
            const svg = {_SVG}('plot-latency-over-time');
            return ['latency-p50', 'latency-p95', 'latency-p99', 'latency-max'].map(id => {{
              const g = svg.getElementById(id);
              return [id, g ? g.querySelectorAll('use').length : -1];
            }}).concat([[...svg.querySelectorAll('text')].some(
              t => t.textContent.trim() === 'p95')]);
        }})()""")
        drain = browser.evaluate(f"""(() => {{
            const svg = {_SVG}('plot-throughput'), xs = {_XS};
            const line = id => xs(svg.getElementById(id).querySelector('path'));
            const span = xs(svg.getElementById('drain-span').querySelector('path'));
            const blocks = svg.getElementById('drain-deliveries');
            return {{deliveries: line('deliveries'), sends: line('sends'),
                     drain_from: Math.min(...span), drain_to: Math.max(...span),
                     blocks: blocks ? xs(blocks.querySelector('path')) : null,
                     label: [...svg.querySelectorAll('text')].some(
                       t => t.textContent.includes('drain (sending stopped)'))}};
        }})()""")
        summary = browser.evaluate("document.getElementById('summary').innerText")
        checks = browser.evaluate("document.getElementById('checks').innerText")
        baseline = browser.evaluate("document.getElementById('baseline').innerText")
        console = browser.console_errors()
    assert console == []
    for key, complete, natural, shown in plots:
        assert complete and natural > 0 and shown > 1000, key  # decoded, at the page's width
    # A p95 line over time, between p50 and p99: one point per send second.
    assert latency == [["latency-p50", 4], ["latency-p95", 4], ["latency-p99", 4],
                       ["latency-max", 4], True]
    # The drain: the lines stop at the last second of sending (drawn at its middle), left
    # of the grey span; what arrives in the drain is one block per second inside the span,
    # not a line running down to 0.
    assert len(drain["deliveries"]) == len(drain["sends"]) == 4
    assert max(drain["deliveries"] + drain["sends"]) < drain["drain_from"]
    blocks = drain["blocks"]
    assert blocks is not None and len(blocks) >= 4
    assert drain["drain_from"] - 1 <= min(blocks) and max(blocks) <= drain["drain_to"] + 1
    assert drain["label"]
    assert "send rate (target / achieved)\n200 / 200 msg/s (100.0 %)" in summary
    assert "error rate (send attempts / deliveries lost)\n32.67 % / 0.00 %" in summary
    # Every threshold with its result, the one that held too.
    assert "latency p99\t<= 1 ms\t40.0 ms\tFAIL" in checks
    assert "latency max\t<= 100 ms\t50.0 ms\tpass" in checks
    assert "host load average (1 min, mean)\t0.40\t11.00\t+10.60\tthis run busy" in baseline
    assert "host cores\t2\t2\tsame" in baseline and "router fast path\ton\ton\tsame" in baseline
    assert "Noise band ±50 %: this run's host was busy (load 11.00 on 2 cores)" in baseline
    assert "latency p50 (ms)\t10.0\t11.6\t+1.60 ms (+16.0 %)\twithin noise (±50 %)" in baseline


def test_a_second_straddling_the_end_of_sending_is_no_dip() -> None:
    # 2.5 s of sending: second 2 sends for half of it, 100 sends in 0.5 s = 200/s, as
    # seconds 0 and 1; drawn over the whole second it would be a drop to 100/s.
    config = dict(MANIFEST["scenario_config"], duration=2.5, drain=1.0)
    report = make_report(manifest=dict(MANIFEST, scenario_config=config))
    report.throughput = [ThroughputBucket(0, 200, 190, 0), ThroughputBucket(1, 200, 190, 0),
                         ThroughputBucket(2, 100, 120, 0), ThroughputBucket(3, 0, 8, 0,
                                                                            covered_s=0.5)]
    fig, ax = _drawn(_throughput, report)
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert list(lines["sends"].get_xdata()) == [0.5, 1.5, 2.25]
    assert list(lines["sends"].get_ydata()) == [200, 200, 200]
    assert list(lines["deliveries"].get_ydata()) == [190, 190, 240]
    _pyplot().close(fig)
