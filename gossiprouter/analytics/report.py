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
from typing import Any, Final, TypeVar

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_INPUT",
    "EXIT_LOSS",
    "EXIT_OK",
    "Audit",
    "Breakdown",
    "Counts",
    "Finding",
    "Histogram",
    "LatencyPoint",
    "LatencyStats",
    "LoadError",
    "Report",
    "RunEvent",
    "ScopeBreakdown",
    "ThroughputBucket",
    "Verdict",
    "format_summary",
    "load_errors",
    "render_html",
    "run_events",
    "size_bucket",
    "write_report",
]

REPORT_FORMAT: Final = "gossiprouter-loadtest-report/2"

T = TypeVar("T")

# Exit codes of ``gossiprouter analyze`` (the verdict decides 0, 3 and 4).
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The analysis itself failed (Spark error, PySpark or Java missing, master unreachable)."""
EXIT_INPUT: Final = 2
"""Bad input: no such run directory, no records, a bad option."""
EXIT_LOSS: Final = 3
"""Deliveries were lost while the sender and the receiver were both registered."""
EXIT_INCOMPLETE: Final = 4
"""The run did not complete (interrupted or failed): its figures are partial."""


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
class LatencyPoint:
    """Latency of the deliveries of the messages sent in one second of the run."""

    t_s: int
    count: int
    p50_ns: int
    p99_ns: int
    max_ns: int


@dataclass
class Histogram:
    """Latency histogram over log-spaced bins: ``counts[i]`` in ``[edges_ns[i], edges_ns[i+1])``."""

    edges_ns: list[float]
    counts: list[int]


@dataclass
class ThroughputBucket:
    """One second of the run, counted from its start (``t_s`` seconds after it): messages
    sent, deliveries made (first copies, by receive time) and deliveries lost (by send
    time). ``covered_s`` is the part of the second inside the run (below 1 for a last,
    partial second): rates are counts divided by it."""

    t_s: int
    sends: int
    deliveries: int
    lost: int
    covered_s: float = 1.0


@dataclass
class Breakdown:
    """Counts for one group, or one peer process (as sender for ``sent``, as receiver for
    the rest)."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost_registered: int = 0
    lost_reconnect: int = 0
    undetermined: int = 0
    duplicated: int = 0


@dataclass
class ScopeBreakdown:
    """A topics run's audit for one scope (``local`` or ``global``): publications sent,
    (publication, subscriber) pairs expected, delivered and lost, pairs received more than
    once and their extra copies, copies received by subscribers that were not expected
    (``unexpected``), pairs left unaudited because the subscriber was changing its
    patterns (``in_flux``), and the latency of the first copies."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicate_copies: int = 0
    unexpected: int = 0
    in_flux: int = 0
    latency: LatencyStats | None = None


@dataclass
class RunEvent:
    """A scenario event as played, in seconds since the start of the run. For a router
    restart ``end_s`` is when every member was registered again (None if that was not
    observed) and ``up_s`` when the router listened again."""

    t_s: float
    action: str
    what: str
    up_s: float | None = None
    end_s: float | None = None


@dataclass
class LoadError:
    """An error the load-test peers counted (from the manifest's counters)."""

    kind: str
    count: int
    by_process: dict[str, int]


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
    of that window only. Lost = expected and never received; a loss is *across a reconnect*
    when the window overlaps a router restart (from the router going down until every member
    was registered again), else it was lost *while the sender and the receiver were both
    registered*: the unexplained kind, which fails the verdict.
    """

    expected: int
    delivered: int
    lost: Finding
    """Every loss, of both kinds."""
    lost_registered: Finding
    """Lost while the sender and the receiver were both registered."""
    lost_reconnect: Finding
    """Lost across a reconnect: the window overlaps a router restart."""
    lost_to_left: int
    """Of ``lost_registered``: to receivers that left the group later in the run."""
    lost_to_killed: int
    """Of ``lost_registered``: to receivers whose process was killed later in the run."""
    duplicated: Finding
    """(message, receiver) pairs received more than once."""
    duplicate_copies: int
    """Copies beyond the first, summed over the duplicated pairs."""
    out_of_order: Finding
    """First copies that arrived after a higher seq of the same (group, sender, receiver)."""
    out_of_order_pairs: int
    undetermined: Finding
    """Pairs whose receiver joined or left within the window: not checked."""
    undetermined_delivered: int
    unexpected: Finding
    """Deliveries to a receiver that was neither expected nor undetermined (e.g. to the
    sender itself, to a non-member, or a unicast to someone other than its dest)."""


@dataclass(frozen=True)
class Verdict:
    """The one-word status, a sentence saying why, and the exit code of ``analyze``."""

    status: str
    text: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


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
    """By payload size, bucketed by powers of two (see :func:`size_bucket`)."""
    latency_by_cast: dict[str, LatencyStats]
    latency_histogram: Histogram
    throughput: list[ThroughputBucket]
    warnings: list[str] = field(default_factory=list)
    latency_over_time: list[LatencyPoint] = field(default_factory=list)
    by_group: dict[str, Breakdown] = field(default_factory=dict)
    by_process: dict[str, Breakdown] = field(default_factory=dict)
    events: list[RunEvent] = field(default_factory=list)
    allow_loss: bool = False
    """``--allow-loss``: a loss while registered is accepted (verdict LOSS ACCEPTED, exit 0)."""
    kind: str = "route"
    """``"route"`` (the ROUTE load test) or ``"topics"`` (``loadtest-topics``)."""
    by_scope: dict[str, ScopeBreakdown] = field(default_factory=dict)
    """Topics runs: the audit by scope."""

    @property
    def run_status(self) -> str | None:
        """The load test's own outcome from the manifest: "ok", "interrupted", "failed",
        "running" (the driver never finished it) or None (no manifest)."""
        status = (self.manifest or {}).get("status")
        return str(status) if status is not None else None

    @property
    def load_errors(self) -> list[LoadError]:
        return load_errors(self.manifest)

    @property
    def verdict(self) -> Verdict:
        return _verdict(self)

    @property
    def ok(self) -> bool:
        """True when the verdict lets ``analyze`` exit 0."""
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form written to report.json."""
        v = self.verdict
        data: dict[str, Any] = {
            "format": REPORT_FORMAT, "ok": v.ok,
            "verdict": {"status": v.status, "text": v.text, "exit_code": v.exit_code},
            "run_status": self.run_status,
            "load_errors": [dataclasses.asdict(e) for e in self.load_errors],
        }
        data.update(dataclasses.asdict(self))
        return data


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def _verdict(report: Report) -> Verdict:
    # Precedence: an incomplete run first (its losses may be the interruption's doing, so
    # they prove nothing either way), then an unexplained loss, then OK.
    a = report.audit
    lost, across = a.lost_registered.count, a.lost_reconnect.count
    status = report.run_status
    if status is not None and status != "ok":
        how = {"interrupted": "was interrupted", "failed": "failed",
               "running": "never finished (the load test was stopped abruptly)"}.get(
                   status, f"ended with status {status!r}")
        text = f"the load test {how}: the figures cover a partial run"
        if lost:
            text += f" ({_n(lost, 'delivery', 'deliveries')} lost while registered)"
        return Verdict("INCOMPLETE", text, EXIT_INCOMPLETE)
    framing = sum(e.count for e in report.load_errors if e.kind == FRAMING)
    if framing:  # a member's stream corrupted: whatever the audit says, the run failed
        return Verdict("CORRUPT", f"{_n(framing, 'frame', 'frames')} from the router did not "
                       "parse at the receiving member (a stream cut into)", EXIT_LOSS)
    if report.kind == "topics":
        return _topics_verdict(report)
    reconnect = (f"; {_n(across, 'delivery', 'deliveries')} lost across a reconnect "
                 "(router restart), as expected") if across else ""
    if lost:
        text = (f"{_n(lost, 'delivery', 'deliveries')} lost while the sender and the receiver "
                f"were both registered{reconnect}")
        if report.allow_loss:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    return Verdict("OK", "no delivery lost while the sender and the receiver were both "
                         f"registered{reconnect}", EXIT_OK)


def _topics_verdict(report: Report) -> Verdict:
    # A topic publication reaches every subscriber whose pattern matched, once: a duplicate
    # (an echo through the broker, say) or a delivery to a subscriber that did not match
    # breaks that promise as surely as a loss, so both fail the verdict too.
    a = report.audit
    wrong = []
    if a.duplicated.count:
        wrong.append(f"{_n(a.duplicated.count, 'delivery', 'deliveries')} duplicated "
                     f"({_n(a.duplicate_copies, 'extra copy', 'extra copies')})")
    if a.unexpected.count:
        wrong.append(f"{_n(a.unexpected.count, 'copy', 'copies')} delivered to subscribers "
                     "whose patterns did not match or outside the scope")
    lost = a.lost.count
    if lost:
        text = (f"{_n(lost, 'delivery', 'deliveries')} lost to subscribers whose patterns "
                "matched at send time")
        text += "".join(f"; {w}" for w in wrong)
        if report.allow_loss and not wrong:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    if wrong:
        return Verdict("WRONG DELIVERY", "; ".join(wrong), EXIT_LOSS)
    return Verdict("OK", "every publication reached each subscriber whose patterns matched "
                         "at send time, once, and no other", EXIT_OK)


def size_bucket(size: int) -> tuple[int, int]:
    """The power-of-two bucket [lo, hi] holding a payload ``size`` in bytes."""
    if size <= 0:
        return 0, 0
    lo = 1 << (size.bit_length() - 1)
    return lo, 2 * lo - 1


def run_events(manifest: dict[str, Any] | None, origin_ns: int | None) -> list[RunEvent]:
    """The scenario's events in seconds since ``origin_ns``: as played (the manifest's
    ``events``), else as scheduled (its ``scenario_config``)."""
    if not manifest:
        return []
    played = manifest.get("events")
    out: list[RunEvent] = []
    if isinstance(played, list) and origin_ns is not None:
        def rel(v: Any) -> float | None:
            return (v - origin_ns) / 1e9 if isinstance(v, int) else None

        for e in played:
            if isinstance(e, dict) and isinstance(e.get("t_ns"), int):
                out.append(RunEvent(rel(e["t_ns"]) or 0.0, str(e.get("action", "")),
                                    str(e.get("what") or e.get("action", "")),
                                    rel(e.get("up_ns")), rel(e.get("registered_ns"))))
        return out
    config = manifest.get("scenario_config")
    scheduled = config.get("events") if isinstance(config, dict) else None
    for e in scheduled if isinstance(scheduled, list) else []:
        if isinstance(e, dict) and isinstance(e.get("at"), int | float):
            action = str(e.get("action", ""))
            out.append(RunEvent(float(e["at"]), action,
                                " ".join(str(e[k]) for k in ("action", "member", "process")
                                         if e.get(k) is not None)))
    return out


FRAMING: Final = "frames from the router that did not parse"


def load_errors(manifest: dict[str, Any] | None) -> list[LoadError]:
    """The errors the peers counted, from the manifest's per-process counters."""
    counters = (manifest or {}).get("counters")
    if not isinstance(counters, dict):
        return []
    found: dict[str, dict[str, int]] = {}

    def add(kind: str, proc: str, n: Any) -> None:
        if isinstance(n, int) and n > 0:
            found.setdefault(kind, {})[proc] = found.get(kind, {}).get(proc, 0) + n

    for proc, c in sorted(counters.items()):
        if not isinstance(c, dict):
            continue
        codes = c.get("router_errors_by_code")
        for code, n in (codes.items() if isinstance(codes, dict) else ()):
            add(f"router error: {code}", proc, n)
        add("send failed", proc, c.get("send_errors"))
        add("undecodable payload received", proc, c.get("bad_payloads"))
        add(FRAMING, proc, c.get("framing_violations"))
        add("dropped (receive buffer full)", proc, c.get("dropped"))
    return sorted((LoadError(k, sum(v.values()), v) for k, v in found.items()),
                  key=lambda e: (-e.count, e.kind))


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
    for key, scope in report.by_scope.items():
        if scope.latency is not None:
            add(f"scope {key}", scope.latency)
    for key, s in report.latency_by_group.items():
        add(f"group {key}", s)
    for key, s in report.latency_by_size.items():
        add(f"size {key} B", s)
    return rows


def _scope_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the "by scope" table of a topics run."""
    headers = ["scope", "sent", "expected", "delivered", "lost", "duplicated",
               "extra copies", "unexpected", "in flux", "p50 µs", "p99 µs", "max µs"]
    rows = []
    for key, b in report.by_scope.items():
        lat = b.latency
        rows.append([key, *(_fmt_int(n) for n in (
            b.sent, b.expected, b.delivered, b.lost, b.duplicated, b.duplicate_copies,
            b.unexpected, b.in_flux)),
            *((_fmt_us(lat.p50_ns), _fmt_us(lat.p99_ns), _fmt_us(lat.max_ns)) if lat
              else ("-", "-", "-"))])
    return headers, rows


def _throughput_summary(report: Report) -> tuple[float, float, int]:
    """(mean deliveries/s over the run's seconds, peak deliveries/s, seconds)."""
    series = [b for b in report.throughput if b.covered_s > 0]
    if not series:
        return 0.0, 0.0, 0
    total = sum(b.deliveries for b in series)
    span = sum(b.covered_s for b in series)
    peak = max(b.deliveries / b.covered_s for b in series if b.covered_s >= 0.5) \
        if any(b.covered_s >= 0.5 for b in series) else 0.0
    return total / span, peak, len(series)


def _scenario_name(report: Report) -> str:
    name = (report.manifest or {}).get("scenario")
    return str(name) if isinstance(name, str | int | float) else ""


def _checks(report: Report) -> list[tuple[str, str, str, str]]:
    """(check, threshold, observed, result) rows; result is pass, FAIL, accepted or info."""
    a = report.audit
    status = report.run_status
    rows = [("the load test completed", "status ok", status or "unknown (no manifest)",
             "info" if status is None else "pass" if status == "ok" else "FAIL")]
    if report.kind == "topics":
        lost = a.lost.count
        rows += [
            ("lost (expected subscriber never received it)", "0", _fmt_int(lost),
             "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"),
            ("duplicated", "0", _fmt_int(a.duplicated.count),
             "pass" if a.duplicated.count == 0 else "FAIL"),
            ("unexpected deliveries", "0", _fmt_int(a.unexpected.count),
             "pass" if a.unexpected.count == 0 else "FAIL"),
            (f"in flux (patterns changing, settle {report.settle_s:g} s)", "not checked",
             _fmt_int(a.undetermined.count), "info"),
        ]
        return rows
    lost = a.lost_registered.count
    rows.append(("lost while sender and receiver were both registered", "0", _fmt_int(lost),
                 "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"))
    rows.append(("lost across a reconnect (router restart)", "expected, not checked",
                 _fmt_int(a.lost_reconnect.count), "info"))
    for name, n in (("duplicated", a.duplicated.count), ("out of order", a.out_of_order.count),
                    ("unexpected deliveries", a.unexpected.count)):
        rows.append((name, "not checked", _fmt_int(n), "info"))
    rows.append((f"undetermined (membership changed within the {report.settle_s:g} s window)",
                 "not checked", _fmt_int(a.undetermined.count), "info"))
    return rows


def format_summary(report: Report) -> str:
    """The plain-text summary table printed by ``gossiprouter analyze``."""
    c, a = report.counts, report.audit
    mean_tp, peak_tp, seconds = _throughput_summary(report)
    name = _scenario_name(report)
    scenario = f"  (scenario {name})" if name else ""
    v = report.verdict
    rows = [
        ["run", ", ".join(report.runs) + scenario],
        ["records", f"{_fmt_int(c.records)}  (send {_fmt_int(c.send_records)}, "
                    f"recv {_fmt_int(c.recv_records)})"],
        ["messages", f"{_fmt_int(c.messages)}  (without send record "
                     f"{_fmt_int(c.messages_without_send_record)})"],
        ["expected deliveries", f"{_fmt_int(a.expected)}  (delivered {_fmt_int(a.delivered)})"],
        ["lost while registered", f"{_fmt_int(a.lost_registered.count)}  (sender and receiver "
                                  "both registered; of which to receivers that later left "
                                  f"{_fmt_int(a.lost_to_left)}, later killed "
                                  f"{_fmt_int(a.lost_to_killed)})"],
        ["lost across reconnect", f"{_fmt_int(a.lost_reconnect.count)}  (sent while a router "
                                  "restart was under way)"],
        ["duplicated", f"{_fmt_int(a.duplicated.count)}  (extra copies "
                       f"{_fmt_int(a.duplicate_copies)})"],
        ["out of order", f"{_fmt_int(a.out_of_order.count)}  (in "
                         f"{_fmt_int(a.out_of_order_pairs)} sender->receiver pairs)"],
        ["undetermined", f"{_fmt_int(a.undetermined.count)}  (delivered "
                         f"{_fmt_int(a.undetermined_delivered)}, settle {report.settle_s:g} s)"],
        ["unexpected", _fmt_int(a.unexpected.count)],
        ["throughput", f"{mean_tp:,.0f} deliveries/s mean, {peak_tp:,.0f}/s peak, "
                       f"over {seconds} s"],
        ["analysis", f"{report.analysis_s:.1f} s on {report.spark_master} "
                     f"(Spark {report.spark_version})"],
        ["verdict", f"{v.status}: {v.text}"],
    ]
    if report.kind == "topics":
        # Topics runs have no membership, reconnects or ordering audit: their own rows.
        rows = [rows[0],
                ["publications", f"{_fmt_int(c.messages)}  (deliveries recorded "
                                 f"{_fmt_int(c.recv_records)})"],
                ["expected deliveries", f"{_fmt_int(a.expected)}  (delivered "
                                        f"{_fmt_int(a.delivered)})"],
                ["lost", _fmt_int(a.lost.count)],
                ["duplicated", f"{_fmt_int(a.duplicated.count)}  (extra copies "
                               f"{_fmt_int(a.duplicate_copies)})"],
                ["unexpected", f"{_fmt_int(a.unexpected.count)}  (copies)"],
                ["in flux", f"{_fmt_int(a.undetermined.count)}  (subscriber changing "
                            f"patterns, settle {report.settle_s:g} s; not audited)"],
                *rows[-3:]]
    width = max(len(r[0]) for r in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    errors = report.load_errors
    if errors:
        lines.append("")
        lines += _table(["load-test errors", "count", "by process"],
                        [[e.kind, _fmt_int(e.count),
                          ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
                         for e in errors])
    if report.by_scope:
        lines.append("")
        lines += _table(*_scope_table(report))
    lat = _latency_rows(report)
    if lat:
        lines.append("")
        lines += _table(["latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max"], lat)
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# Wide figures (1200 px at dpi 100) drawn at the page's width, so they stay sharp on a
# large screen and shrink with a small one. Legends go above the axes, never over the data.
_WIDE: Final = (12.0, 3.6)
_COLORS: Final = {"delivered": "#4c72b0", "sent": "#55a868", "lost": "#c44e52",
                  "reconnect": "#dd8452", "undetermined": "#8c8c8c", "p50": "#4c72b0",
                  "p99": "#dd8452", "max": "#c44e52"}


def _pyplot() -> Any:
    # Agg is chosen explicitly so rendering works with no display and ignores MPLBACKEND.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _mark_events(ax: Any, report: Report) -> None:
    """Dashed lines for the scenario's events, a shaded span for each router outage (from
    going down until every member was registered again), and the drain period greyed."""
    config = (report.manifest or {}).get("scenario_config")
    if isinstance(config, dict) and isinstance(config.get("duration"), int | float):
        end = float(config["duration"]) + float(config.get("drain") or 0)
        ax.axvspan(float(config["duration"]), end, color="#eeeeee", zorder=0)
    for i, ev in enumerate(report.events):
        ax.axvline(ev.t_s, color="#555555", linestyle="--", linewidth=1, zorder=1)
        if ev.end_s is not None:
            ax.axvspan(ev.t_s, ev.end_s, color=_COLORS["reconnect"], alpha=0.15, zorder=0)
        # Labels on three staggered rows, so that events close in time stay readable.
        ax.annotate(ev.what, xy=(ev.t_s, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -3 - 11 * (i % 3)), textcoords="offset points", ha="left",
                    va="top", fontsize=8, color="#333333",
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                          "alpha": 0.8})


def _figure(plt: Any, title: str, size: tuple[float, float] = _WIDE) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(True, axis="y", color="#e5e5e5")
    return fig, ax


def _legend(fig: Any, ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper right", ncols=len(handles),
                   frameon=False, fontsize=9)


def _latency_histogram(fig: Any, ax: Any, report: Report) -> None:
    hist = report.latency_histogram
    if hist.counts and sum(hist.counts) > 0:
        edges_us = [e / 1000 for e in hist.edges_ns]
        widths = [b - a for a, b in itertools.pairwise(edges_us)]
        ax.bar(edges_us[:-1], hist.counts, width=widths, align="edge",
               color=_COLORS["delivered"], label="deliveries")
        ax.set_xscale("log")
        total = sum(hist.counts)
        cdf: list[float] = []
        acc = 0
        for n in hist.counts:
            acc += n
            cdf.append(acc / total)
        ax2 = ax.twinx()
        ax2.plot(edges_us[1:], cdf, color=_COLORS["p99"], label="cumulative share")
        ax2.set_ylim(0, 1.01)
        ax2.set_ylabel("CDF")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        fig.legend(h1 + h2, l1 + l2, loc="outside upper right", ncols=2, frameon=False,
                   fontsize=9)
    else:
        _no_deliveries(ax)
    ax.set_xlabel("latency (µs, log scale)")
    ax.set_ylabel("deliveries")


def _latency_over_time(fig: Any, ax: Any, report: Report) -> None:
    pts = report.latency_over_time
    if pts:
        ts = [p.t_s + 0.5 for p in pts]  # drawn at the middle of its second
        for key, label in (("max_ns", "max"), ("p99_ns", "p99"), ("p50_ns", "p50")):
            ax.plot(ts, [getattr(p, key) / 1000 for p in pts], marker=".",
                    color=_COLORS[label], label=label)
        ax.set_yscale("log")
    else:
        _no_deliveries(ax)
    _over_the_run(fig, ax, report, "latency (µs, log scale)")


def _throughput(fig: Any, ax: Any, report: Report) -> None:
    # A second the run covers only partly is drawn as a rate over the part it covers
    # (not as a dip); one covered less than half is left out (a rate over a sliver is
    # noise).
    full = [b for b in report.throughput if b.covered_s >= 0.5]
    ts = [b.t_s + 0.5 for b in full]
    ax.plot(ts, [b.deliveries / b.covered_s for b in full], marker=".",
            color=_COLORS["delivered"], label="deliveries/s")
    ax.plot(ts, [b.sends / b.covered_s for b in full], marker=".",
            color=_COLORS["sent"], label="sends/s")
    lost = [(b.t_s + 0.5, b.lost / b.covered_s) for b in full if b.lost]
    if lost:
        ax.scatter([t for t, _ in lost], [n for _, n in lost], color=_COLORS["lost"],
                   marker="x", label="lost/s (by send second)", zorder=3)
    ax.set_ylim(bottom=0)
    _over_the_run(fig, ax, report, "per second")


def _no_deliveries(ax: Any) -> None:
    ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)


def _over_the_run(fig: Any, ax: Any, report: Report, ylabel: str) -> None:
    """The time axis of a plot over the run (its events marked), its labels and legend."""
    _mark_events(ax, report)
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since the start of the run")
    ax.set_ylabel(ylabel)
    _legend(fig, ax)


def _breakdown_size(parts: dict[str, Breakdown]) -> tuple[float, float]:
    return (12.0, max(2.2, 0.9 + 0.45 * len(parts)))


def _breakdown(fig: Any, ax: Any, parts: dict[str, Breakdown]) -> None:
    names = list(parts)[::-1]  # first at the top
    ys = range(len(names))
    left = [0.0] * len(names)
    for key, label, color in (("delivered", "delivered", _COLORS["delivered"]),
                              ("lost_registered", "lost while registered", _COLORS["lost"]),
                              ("lost_reconnect", "lost across a reconnect",
                               _COLORS["reconnect"]),
                              ("undetermined", "undetermined", _COLORS["undetermined"])):
        vals = [float(getattr(parts[n], key)) for n in names]
        if any(vals):
            ax.barh(ys, vals, left=left, color=color, label=label, height=0.6)
            left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(list(ys), names)
    ax.set_xlim(left=0)
    ax.set_xlabel("(message, receiver) pairs")
    ax.grid(True, axis="x", color="#e5e5e5")
    _legend(fig, ax)


def _plots(report: Report) -> dict[str, str]:
    """Base64 PNGs by section: latency histogram, latency over time, throughput and the
    breakdowns (when there is something to break down)."""
    plt = _pyplot()

    def png(title: str, draw: Callable[[Any, Any, T], None], what: T,
            size: tuple[float, float] = _WIDE) -> str:
        # One figure at a time, closed whatever happens: pyplot keeps every open one.
        fig, ax = _figure(plt, title, size)
        try:
            draw(fig, ax, what)
            return _png(fig)
        finally:
            plt.close(fig)

    plots = {
        "latency-histogram": png("Latency distribution", _latency_histogram, report),
        "latency-over-time": png("Latency over time (by send second)", _latency_over_time,
                                 report),
        "throughput": png("Throughput", _throughput, report),
    }
    for key, title, parts in (("by-group", "By group (receivers)", report.by_group),
                              ("by-process", "By peer process (receivers)",
                               report.by_process)):
        if parts:
            plots[key] = png(title, _breakdown, parts, _breakdown_size(parts))
    return plots


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[object]],
                cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sample_html(title: str, finding: Finding, note: str = "") -> str:
    if not finding.sample:
        return ""
    headers = list(finding.sample[0].keys())
    rows = [["" if s.get(h) is None else s.get(h) for h in headers] for s in finding.sample]
    return (f"<h3>{html.escape(title)}: {finding.count:,} (showing {len(rows)})</h3>"
            + (f"<p>{html.escape(note)}</p>" if note else "")
            + _html_table(headers, rows))


def _img(plots: dict[str, str], key: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{plots[key]}">'


def _scenario_rows(report: Report) -> list[tuple[str, str]]:
    m = report.manifest or {}
    config = m.get("scenario_config") if isinstance(m.get("scenario_config"), dict) else {}
    assert isinstance(config, dict)
    rows: list[tuple[str, str]] = []

    def add(key: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            rows.append((key, str(value)))

    add("scenario", m.get("scenario"))
    add("description", config.get("description"))
    add("scenario file", m.get("scenario_file"))
    if isinstance(config.get("duration"), int | float):
        add("duration", f"{config['duration']:g} s sending + {config.get('drain', 0):g} s drain")
    groups = config.get("groups")
    if isinstance(groups, list):
        add("groups", ", ".join(f"{g.get('name')} ({g.get('members')} members)"
                                for g in groups if isinstance(g, dict)))
    processes = m.get("processes")
    if isinstance(processes, list):
        add("peer processes", len(processes))
    send = config.get("send")
    if isinstance(send, dict):
        add("send", ", ".join(f"{k} {v}" for k, v in send.items()))
    router = m.get("router")
    if isinstance(router, dict):
        how = "spawned" if router.get("spawned") else "external"
        add("router", f"{router.get('address')} ({how})")
    add("events", "; ".join(f"{e.t_s:.1f} s {e.what}" for e in report.events))
    add("run", ", ".join(report.runs))
    add("started", m.get("started_at"))
    add("finished", m.get("finished_at"))
    add("load-test status", report.run_status)
    add("settle window", f"{report.settle_s:g} s")
    return rows


def render_html(report: Report) -> str:
    """The self-contained report.html."""
    plots = _plots(report)
    a, c = report.audit, report.counts
    esc = html.escape
    v = report.verdict
    verdict_cls = "ok" if v.status == "OK" else "warn" if v.ok else "bad"
    name = _scenario_name(report)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
    if report.run_status not in (None, "ok"):
        warnings = (f"<li><strong>The load test did not complete (status "
                    f"{esc(str(report.run_status))}): every figure below covers a partial "
                    "run.</strong></li>") + warnings
    warn_html = f'<ul class="warnings">{warnings}</ul>' if warnings else ""
    checks = "".join(
        f"<tr><td>{esc(check)}</td><td>{esc(th)}</td><td>{esc(obs)}</td>"
        f'<td class="r-{esc(res.lower())}">{esc(res)}</td></tr>'
        for check, th, obs, res in _checks(report))
    mean_tp, peak_tp, seconds = _throughput_summary(report)
    lat = report.latency
    figures = [
        ("messages sent", _fmt_int(c.messages)),
        ("deliveries expected / made", f"{_fmt_int(a.expected)} / {_fmt_int(a.delivered)}"),
        ("latency p50 / p99 / max",
         f"{_fmt_us(lat.p50_ns)} / {_fmt_us(lat.p99_ns)} / {_fmt_us(lat.max_ns)} µs"
         if lat else "no deliveries"),
        ("throughput", f"{mean_tp:,.0f} deliveries/s mean, {peak_tp:,.0f}/s peak, "
                       f"{seconds} s"),
        ("records", f"{_fmt_int(c.records)} (send {_fmt_int(c.send_records)}, "
                    f"recv {_fmt_int(c.recv_records)})"),
        ("senders / receivers / groups", f"{c.senders} / {c.receivers} / {c.groups}"),
    ]
    figures_html = "".join(f"<div class=fig><div class=k>{esc(k)}</div>"
                           f"<div class=v>{esc(val)}</div></div>" for k, val in figures)
    latency_rows = _latency_rows(report)
    latency_table = _html_table(["latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max"],
                                latency_rows, "num") if latency_rows else ""

    def breakdown_table(title: str, parts: dict[str, Breakdown]) -> str:
        return _html_table(
            [title, "sent", "expected", "delivered", "lost while registered",
             "lost across reconnect", "undetermined", "duplicated"],
            [[k, _fmt_int(b.sent), _fmt_int(b.expected), _fmt_int(b.delivered),
              _fmt_int(b.lost_registered), _fmt_int(b.lost_reconnect),
              _fmt_int(b.undetermined), _fmt_int(b.duplicated)] for k, b in parts.items()],
            "num")

    breakdown = ""
    if report.by_scope:
        breakdown += '<h3 id="by-scope">By scope</h3>' + _html_table(
            *_scope_table(report), "num")
    if report.by_group:
        breakdown += _img(plots, "by-group", "breakdown by group") + breakdown_table(
            "group", report.by_group)
    if report.by_process:
        breakdown += _img(plots, "by-process", "breakdown by peer process") + \
            breakdown_table("process", report.by_process)
    errors = report.load_errors
    errors_html = _html_table(
        ["error", "count", "by process"],
        [[e.kind, _fmt_int(e.count), ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
         for e in errors], "num") if errors else "<p>The peers counted no errors.</p>"
    samples = "".join([
        _sample_html("Lost while sender and receiver were both registered", a.lost_registered),
        _sample_html("Lost across a reconnect", a.lost_reconnect),
        _sample_html("Duplicated", a.duplicated),
        _sample_html("Out of order", a.out_of_order),
        _sample_html("Unexpected", a.unexpected),
        _sample_html("In flux", a.undetermined,
                     "The subscriber was changing its patterns around the send time: these "
                     "are counted, not checked.") if report.kind == "topics" else
        _sample_html("Undetermined", a.undetermined,
                     "The receiver joined or left within the settle window: these are "
                     "counted, not checked."),
    ]) or "<p>No anomalies.</p>"
    manifest = esc(json.dumps(report.manifest, indent=2, sort_keys=True))
    scenario_rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>"
                            for k, val in _scenario_rows(report))
    css = (
        "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1280px;"
        "padding:0 1em;color:#222}"
        "h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;"
        "margin-top:1.6em}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;font-size:90%;text-align:left}"
        "table.num td+td{text-align:right;font-variant-numeric:tabular-nums}"
        "table.kv th{background:#f6f6f6;font-weight:600;white-space:nowrap}"
        "img{display:block;width:100%;height:auto;margin:.8em 0}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:85%}"
        ".verdict{padding:.8em 1em;border-radius:6px;font-size:110%;margin:.8em 0}"
        ".verdict.ok{background:#e6f4ea;border:1px solid #2a7}"
        ".verdict.warn{background:#fff4e0;border:1px solid #d80}"
        ".verdict.bad{background:#fdecea;border:1px solid #c22}"
        ".warnings{background:#fff4e0;border:1px solid #d80;padding:.6em 2em}"
        ".r-pass{color:#2a7;font-weight:600}.r-fail{color:#c22;font-weight:600}"
        ".r-accepted{color:#d80;font-weight:600}.r-info{color:#666}"
        ".figs{display:flex;flex-wrap:wrap;gap:.8em}"
        ".fig{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:13em}"
        ".fig .k{color:#666;font-size:85%}.fig .v{font-size:115%;font-weight:600}"
        "details summary{cursor:pointer;color:#246}"
        "footer{color:#777;font-size:85%;margin-top:2em}"
    )
    title = f"Load-test report{': ' + name if name else ''}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} ({esc(", ".join(report.runs))})</title>
<style>{css}</style></head>
<body>
<h1>{esc(title)}</h1>
<div id="verdict" class="verdict {verdict_cls}"><strong>{esc(v.status)}</strong>:
{esc(v.text)} <small>(exit code {v.exit_code})</small></div>
{warn_html}
<section id="scenario"><h2>Scenario</h2>
<table class="kv">{scenario_rows}</table></section>
<section id="checks"><h2>Checks</h2>
<table><thead><tr><th>check</th><th>threshold</th><th>observed</th><th>result</th></tr>
</thead><tbody>{checks}</tbody></table></section>
<section id="summary"><h2>Summary</h2><div class="figs">{figures_html}</div></section>
<section id="latency"><h2>Latency</h2>
{_img(plots, "latency-over-time", "latency percentiles over time")}
{_img(plots, "latency-histogram", "latency distribution")}
{latency_table}</section>
<section id="throughput"><h2>Throughput</h2>
{_img(plots, "throughput", "throughput over time")}
<p>Dashed lines mark the scenario's events; a shaded span runs from a router going down
until every member was registered again; the grey span is the drain.</p></section>
<section id="breakdown"><h2>Breakdown</h2>
{breakdown or "<p>Nothing to break down.</p>"}</section>
<section id="errors"><h2>Load-test errors</h2>
{errors_html}</section>
<section id="anomalies"><h2>Anomalies</h2>
{samples}</section>
<section id="manifest"><h2>Manifest</h2>
<details><summary>raw manifest.json</summary><pre>{manifest}</pre></details></section>
<footer>Run directory <code>{esc(report.run_dir)}</code>; analysed in
{report.analysis_s:.1f} s on {esc(report.spark_master)} (Spark {esc(report.spark_version)}),
generated {esc(report.generated_at)}.</footer>
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
