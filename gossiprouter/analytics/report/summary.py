"""The plain-text summary table printed by ``gossiprouter analyze``
(:func:`format_summary`): plain text rather than rich, as it goes to logs and CI output as
often as to a terminal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gossiprouter.analytics.report.baseline import (
    COMPARISON_HEADERS,
    baseline_name,
    comparison_rows,
    noise_text,
)
from gossiprouter.analytics.report.environment import environment_rows
from gossiprouter.analytics.report.formatting import fmt_int, fmt_ms
from gossiprouter.analytics.report.manifest import SendSchedule, send_schedule
from gossiprouter.analytics.report.model import Report, ThroughputSummary, throughput_summary
from gossiprouter.analytics.report.rates import error_rates, send_rates
from gossiprouter.analytics.report.sections import (
    LATENCY_HEADERS,
    check_rows,
    latency_rows,
    scenario_name,
    scope_table,
)

__all__ = ["format_summary"]


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]],
           align: str = "") -> list[str]:
    """A plain-text table, trailing blanks stripped. ``align`` has an ``l`` or ``r`` per
    column; by default the first column is left-aligned and the others (figures) right."""
    # Plain text rather than rich: the summary goes to logs and CI output as often as to a tty.
    body = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]

    align = align or "l" + "r" * (len(headers) - 1)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in
                         zip(cells, widths, align, strict=True)).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths)] + [line(r) for r in body]


def _fmt_throughput(tp: ThroughputSummary) -> str:
    mean = f"{tp.mean:,.0f}/s mean over {tp.seconds} s with the drain, {tp.peak:,.0f}/s peak"
    if tp.steady is None:
        return f"{tp.mean:,.0f} deliveries/s mean over {tp.seconds} s, {tp.peak:,.0f}/s peak"
    return (f"{tp.steady:,.0f} deliveries/s steady (sending window, {tp.steady_s:g} s); "
            + mean)


def _fmt_schedule(sc: SendSchedule) -> str:
    share = 100 * sc.achieved / sc.slots
    text = f"{sc.achieved:,} of {sc.slots:,} scheduled ({share:.1f} %)"
    if sc.on_time:
        return text + ", every one on time"
    return (text + f"; {sc.skipped:,} skipped, {sc.late:,} late (a slot or more behind), "
            f"worst {fmt_ms(sc.max_lag_s * 1e9)} ms behind")


def format_summary(report: Report) -> str:
    """The plain-text summary table printed by ``gossiprouter analyze``."""
    c, a = report.counts, report.audit
    name = scenario_name(report)
    scenario = f"  (scenario {name})" if name else ""
    v = report.verdict
    tail = []
    rates = send_rates(report)
    if rates is not None:
        tail.append(["send rate", rates.text()])
    tail += [["throughput", _fmt_throughput(throughput_summary(report))],
             ["error rate", error_rates(report).text()]]
    schedule = send_schedule(report.manifest)
    if schedule is not None:
        tail.append(["sends", _fmt_schedule(schedule)])
    tail += [[k, v] for k, v in environment_rows(report)]
    tail += [
        ["analysis", f"{report.analysis_s:.1f} s on {report.spark_master} "
                     f"(Spark {report.spark_version})"],
        ["verdict", f"{v.status}: {v.text}"],
    ]
    rows = [
        ["run", ", ".join(report.runs) + scenario],
        ["records", f"{fmt_int(c.records)}  (send {fmt_int(c.send_records)}, "
                    f"recv {fmt_int(c.recv_records)})"],
        ["messages", f"{fmt_int(c.messages)}  (without send record "
                     f"{fmt_int(c.messages_without_send_record)})"],
        ["expected deliveries", f"{fmt_int(a.expected)}  (delivered {fmt_int(a.delivered)})"],
        ["lost while registered", f"{fmt_int(a.lost_registered.count)}  (sender and receiver "
                                  "both registered; of which to receivers that later left "
                                  f"{fmt_int(a.lost_to_left)}, later killed "
                                  f"{fmt_int(a.lost_to_killed)})"],
        ["lost across reconnect", f"{fmt_int(a.lost_reconnect.count)}  (sent while a router "
                                  "restart was under way)"],
        ["duplicated", f"{fmt_int(a.duplicated.count)}  (extra copies "
                       f"{fmt_int(a.duplicate_copies)})"],
        ["out of order", f"{fmt_int(a.out_of_order.count)}  (in "
                         f"{fmt_int(a.out_of_order_pairs)} sender->receiver pairs)"],
        ["undetermined", f"{fmt_int(a.undetermined.count)}  (delivered "
                         f"{fmt_int(a.undetermined_delivered)}, settle {report.settle_s:g} s)"],
        ["unexpected", fmt_int(a.unexpected.count)],
        *tail,
    ]
    if report.kind == "topics":
        # Topics runs have no membership, reconnects or ordering audit: their own rows.
        rows = [rows[0],
                ["publications", f"{fmt_int(c.messages)}  (deliveries recorded "
                                 f"{fmt_int(c.recv_records)})"],
                ["expected deliveries", f"{fmt_int(a.expected)}  (delivered "
                                        f"{fmt_int(a.delivered)})"],
                ["lost", fmt_int(a.lost.count)],
                ["duplicated", f"{fmt_int(a.duplicated.count)}  (extra copies "
                               f"{fmt_int(a.duplicate_copies)})"],
                ["unexpected", f"{fmt_int(a.unexpected.count)}  (copies)"],
                ["in flux", f"{fmt_int(a.undetermined.count)}  (subscriber changing "
                            f"patterns, settle {report.settle_s:g} s; not audited)"],
                *tail]
    width = max(len(r[0]) for r in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    errors = report.load_errors
    if errors:
        lines.append("")
        lines += _table(["load-test errors", "count", "by process"],
                        [[e.kind, fmt_int(e.count),
                          ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
                         for e in errors])
    if report.by_scope:
        lines.append("")
        lines += _table(*scope_table(report))
    # Every check with its threshold and result, the passing ones too (as k6 lists each
    # threshold with a tick or a cross): what held matters as much as what failed.
    lines.append("")
    lines += _table(["check", "threshold", "observed", "result"],
                    [list(r) for r in check_rows(report)], "llll")
    lat = latency_rows(report)
    if lat:
        lines.append("")
        lines += _table(LATENCY_HEADERS, lat)
    compared = comparison_rows(report)
    if compared:
        lines += ["", f"compared with the baseline {baseline_name(report)}:",
                  noise_text(report)]
        lines += _table(COMPARISON_HEADERS, compared, "lrrrl")
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
