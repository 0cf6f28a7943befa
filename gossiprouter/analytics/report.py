"""The load-test report: its data model, report.json, report.html and the terminal summary.

Nothing here needs Spark: :mod:`gossiprouter.analytics.audit` computes a :class:`Report`
and this module renders it. The HTML is self-contained (plots embedded as base64 PNG, made
with matplotlib's Agg backend, so no display is needed).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "Audit",
    "Counts",
    "Finding",
    "Histogram",
    "LatencyStats",
    "Report",
    "ThroughputBucket",
    "format_summary",
    "render_html",
    "write_report",
]

REPORT_FORMAT: Final = "gossiprouter-loadtest-report/1"


@dataclass
class Finding:
    """A counted kind of anomaly, with up to ``sample`` examples (deterministically chosen)."""

    count: int
    sample: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LatencyStats:
    """Latency (receive time minus send time of the first copy received), in nanoseconds."""

    count: int
    min_ns: int
    mean_ns: float
    p50_ns: int
    p90_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int


@dataclass
class Histogram:
    """Latency histogram over log-spaced bins: ``counts[i]`` in ``[edges_ns[i], edges_ns[i+1])``."""

    edges_ns: list[float]
    counts: list[int]


@dataclass
class ThroughputBucket:
    """One second of the run, counted from the first send: messages sent, deliveries made
    (first copies, by receive time) and deliveries lost (by send time)."""

    t_s: int
    sends: int
    deliveries: int
    lost: int


@dataclass
class Counts:
    """What the run's records hold."""

    records: int
    send_records: int
    recv_records: int
    messages: int
    messages_without_send_record: int
    deliveries: int
    """Distinct (message, receiver) pairs received at least once."""
    senders: int
    receivers: int
    groups: int


@dataclass
class Audit:
    """Expected versus actual receivers.

    A (message, receiver) pair is *expected* when the receiver was a member of the group for
    the whole window [t_send, t_send + settle], *undetermined* when it was a member for part
    of that window only. Lost = expected and never received.
    """

    expected: int
    delivered: int
    lost: Finding
    lost_stayed_connected: Finding
    """Lost to receivers with no leave/killed event in that group in the whole run."""
    lost_to_left: int
    """Lost (before they left) to receivers that left the group at some point."""
    lost_to_killed: int
    """Lost (before they were killed) to receivers killed at some point."""
    duplicated: Finding
    """(message, receiver) pairs received more than once."""
    duplicate_copies: int
    """Copies beyond the first, summed over the duplicated pairs."""
    out_of_order: Finding
    """First copies that arrived after a higher seq of the same (group, sender, receiver)."""
    out_of_order_pairs: int
    undetermined: int
    undetermined_delivered: int
    unexpected: Finding
    """Deliveries to a receiver that was neither expected nor undetermined (e.g. to the
    sender itself, to a non-member, or a unicast to someone other than its dest)."""


@dataclass
class Report:
    """Everything the analysis of one run found."""

    run_dir: str
    out_dir: str
    generated_at: str
    settle_s: float
    spark_master: str
    spark_version: str
    analysis_s: float
    manifest: dict[str, Any] | None
    runs: list[str]
    counts: Counts
    audit: Audit
    latency: LatencyStats | None
    latency_by_group: dict[str, LatencyStats]
    latency_by_size: dict[str, LatencyStats]
    latency_by_cast: dict[str, LatencyStats]
    latency_histogram: Histogram
    throughput: list[ThroughputBucket]
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was lost among members that stayed connected."""
        return self.audit.lost_stayed_connected.count == 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form written to report.json."""
        data: dict[str, Any] = {"format": REPORT_FORMAT, "ok": self.ok}
        data.update(dataclasses.asdict(self))
        return data


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def _fmt_us(ns: float) -> str:
    return f"{ns / 1000:,.1f}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    # Plain text rather than rich: the summary goes to logs and CI output as often as to a tty.
    body = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(
        zip(headers, widths, strict=True)))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in body:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
            zip(r, widths, strict=True))))
    return out


def _latency_rows(report: Report) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(label: str, s: LatencyStats) -> None:
        rows.append([label, _fmt_int(s.count), _fmt_us(s.p50_ns), _fmt_us(s.p90_ns),
                     _fmt_us(s.p99_ns), _fmt_us(s.p999_ns), _fmt_us(s.max_ns)])

    if report.latency is not None:
        add("all", report.latency)
    for key, s in report.latency_by_cast.items():
        add(f"cast {key}", s)
    for key, s in report.latency_by_group.items():
        add(f"group {key}", s)
    for key, s in sorted(report.latency_by_size.items(), key=lambda kv: int(kv[0])):
        add(f"size {key} B", s)
    return rows


def _throughput_summary(report: Report) -> tuple[float, int, int]:
    """(mean deliveries/s over the seconds with traffic, peak deliveries/s, seconds)."""
    series = report.throughput
    if not series:
        return 0.0, 0, 0
    total = sum(b.deliveries for b in series)
    return total / len(series), max(b.deliveries for b in series), len(series)


def format_summary(report: Report) -> str:
    """The plain-text summary table printed by ``gossiprouter analyze``."""
    c, a = report.counts, report.audit
    mean_tp, peak_tp, seconds = _throughput_summary(report)
    scenario = ""
    if report.manifest and isinstance(report.manifest.get("scenario"), str | int | float):
        scenario = f"  (scenario {report.manifest['scenario']})"
    rows = [
        ["run", ", ".join(report.runs) + scenario],
        ["records", f"{_fmt_int(c.records)}  (send {_fmt_int(c.send_records)}, "
                    f"recv {_fmt_int(c.recv_records)})"],
        ["messages", f"{_fmt_int(c.messages)}  (without send record "
                     f"{_fmt_int(c.messages_without_send_record)})"],
        ["expected deliveries", f"{_fmt_int(a.expected)}  (delivered {_fmt_int(a.delivered)})"],
        ["lost", f"{_fmt_int(a.lost.count)}  (stayed connected "
                 f"{_fmt_int(a.lost_stayed_connected.count)}, left {_fmt_int(a.lost_to_left)}, "
                 f"killed {_fmt_int(a.lost_to_killed)})"],
        ["duplicated", f"{_fmt_int(a.duplicated.count)}  (extra copies "
                       f"{_fmt_int(a.duplicate_copies)})"],
        ["out of order", f"{_fmt_int(a.out_of_order.count)}  (in "
                         f"{_fmt_int(a.out_of_order_pairs)} sender->receiver pairs)"],
        ["undetermined", f"{_fmt_int(a.undetermined)}  (delivered "
                         f"{_fmt_int(a.undetermined_delivered)}, settle {report.settle_s:g} s)"],
        ["unexpected", _fmt_int(a.unexpected.count)],
        ["throughput", f"{mean_tp:,.0f} deliveries/s mean, {_fmt_int(peak_tp)}/s peak, "
                       f"over {seconds} s"],
        ["analysis", f"{report.analysis_s:.1f} s on {report.spark_master} "
                     f"(Spark {report.spark_version})"],
        ["verdict", "OK" if report.ok else "LOSS among members that stayed connected"],
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lat = _latency_rows(report)
    if lat:
        lines.append("")
        lines += _table(["latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max"], lat)
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plots(report: Report) -> tuple[str, str]:
    """Base64 PNGs: the latency histogram with its CDF, and throughput over time."""
    # Agg is chosen explicitly so rendering works with no display and ignores MPLBACKEND.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    hist = report.latency_histogram
    fig, ax = plt.subplots(figsize=(8, 4))
    try:
        if hist.counts and sum(hist.counts) > 0:
            edges_us = [e / 1000 for e in hist.edges_ns]
            widths = [b - a for a, b in itertools.pairwise(edges_us)]
            ax.bar(edges_us[:-1], hist.counts, width=widths, align="edge", color="#4c72b0")
            ax.set_xscale("log")
            total = sum(hist.counts)
            cdf: list[float] = []
            acc = 0
            for n in hist.counts:
                acc += n
                cdf.append(acc / total)
            ax2 = ax.twinx()
            ax2.plot(edges_us[1:], cdf, color="#dd8452")
            ax2.set_ylim(0, 1.01)
            ax2.set_ylabel("CDF")
        else:
            ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("latency (µs, log scale)")
        ax.set_ylabel("deliveries")
        ax.set_title("Latency distribution")
        latency_png = _png(fig)
    finally:
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    try:
        ts = [b.t_s for b in report.throughput]
        ax.plot(ts, [b.deliveries for b in report.throughput], label="deliveries/s")
        ax.plot(ts, [b.sends for b in report.throughput], label="sends/s")
        lost = [(b.t_s, b.lost) for b in report.throughput if b.lost]
        if lost:
            ax.scatter([t for t, _ in lost], [n for _, n in lost], color="red", marker="x",
                       label="lost (by send second)", zorder=3)
        ax.set_xlabel("seconds since first send")
        ax.set_ylabel("per second")
        ax.set_title("Throughput")
        ax.legend(loc="best")
        throughput_png = _png(fig)
    finally:
        plt.close(fig)
    return latency_png, throughput_png


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sample_html(title: str, finding: Finding) -> str:
    if not finding.sample:
        return ""
    headers = list(finding.sample[0].keys())
    rows = [[s.get(h, "") for h in headers] for s in finding.sample]
    return (f"<h3>{html.escape(title)}: {finding.count:,} (showing {len(rows)})</h3>"
            + _html_table(headers, rows))


def render_html(report: Report) -> str:
    """The self-contained report.html."""
    latency_png, throughput_png = _plots(report)
    a = report.audit
    esc = html.escape
    summary = esc(format_summary(report))
    samples = "".join([
        _sample_html("Lost among members that stayed connected", a.lost_stayed_connected),
        _sample_html("Lost (all)", a.lost),
        _sample_html("Duplicated", a.duplicated),
        _sample_html("Out of order", a.out_of_order),
        _sample_html("Unexpected", a.unexpected),
    ]) or "<p>No anomalies.</p>"
    manifest = esc(json.dumps(report.manifest, indent=2, sort_keys=True))
    verdict = "OK" if report.ok else "LOSS among members that stayed connected"
    css = (
        "body{font-family:sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.2em .5em;font-size:90%}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
        ".ok{color:#2a7}.bad{color:#c22}"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Load-test report {esc(", ".join(report.runs))}</title>
<style>{css}</style></head>
<body>
<h1>Load-test report</h1>
<p>Run directory <code>{esc(report.run_dir)}</code>, generated {esc(report.generated_at)}.
Verdict: <strong class="{"ok" if report.ok else "bad"}">{esc(verdict)}</strong></p>
<h2>Summary</h2>
<pre>{summary}</pre>
<h2>Latency</h2>
<img alt="latency distribution" src="data:image/png;base64,{latency_png}">
<h2>Throughput</h2>
<img alt="throughput over time" src="data:image/png;base64,{throughput_png}">
<h2>Anomalies</h2>
{samples}
<h2>Manifest</h2>
<pre>{manifest}</pre>
</body></html>
"""


def _finite(o: Any) -> Any:
    # Strict JSON has no NaN/inf; report such values (e.g. a mean over nothing) as null.
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def _write_local(path: str, data: bytes) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def write_report(
    report: Report,
    out_dir: str,
    write: Callable[[str, bytes], None] | None = None,
) -> list[str]:
    """Write report.json and report.html into ``out_dir``; returns the paths written.

    ``write(path, data)`` writes one file; the default writes local files. The Spark job
    passes a Hadoop FileSystem writer for non-local URIs (hdfs://, s3a://, ...).
    """
    writer = write or _write_local
    base = out_dir.rstrip("/")
    json_path, html_path = f"{base}/report.json", f"{base}/report.html"
    data = json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False)
    writer(json_path, (data + "\n").encode())
    writer(html_path, render_html(report).encode())
    return [json_path, html_path]
