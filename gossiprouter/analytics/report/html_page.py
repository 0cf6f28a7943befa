"""report.html (:func:`render_html`): one self-contained page (styles inline, plots embedded
as base64 PNG) with the verdict, the scenario, the checks, the key figures, the comparison
with a baseline, latency, throughput, the environment, the breakdowns, the peers' errors,
the anomalies' samples and the raw manifest."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence

from gossiprouter.analytics.report.baseline import (
    COMPARISON_HEADERS,
    baseline_name,
    comparison_rows,
    noise_text,
)
from gossiprouter.analytics.report.environment import environment_rows
from gossiprouter.analytics.report.formatting import fmt_int, fmt_ms
from gossiprouter.analytics.report.manifest import send_schedule
from gossiprouter.analytics.report.model import Report, throughput_summary
from gossiprouter.analytics.report.parts import Breakdown, Finding
from gossiprouter.analytics.report.plots import SVG_PLOTS, plot_caption, plot_images
from gossiprouter.analytics.report.rates import error_rates, send_rates
from gossiprouter.analytics.report.sections import (
    LATENCY_HEADERS,
    check_rows,
    latency_rows,
    scenario_name,
    scenario_rows,
    scope_table,
)

__all__ = ["render_html"]


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
    kind = "svg+xml" if key in SVG_PLOTS else "png"
    return (f'<img id="plot-{key}" alt="{html.escape(alt)}" '
            f'src="data:image/{kind};base64,{plots[key]}">')


def render_html(report: Report, plots: dict[str, str] | None = None) -> str:
    """The self-contained report.html; ``plots``: its plots, if already drawn
    (:class:`~.plots.EarlyPlots`)."""
    plots = plot_images(report) if plots is None else plots
    caption = plot_caption(report)
    a, c = report.audit, report.counts
    esc = html.escape
    v = report.verdict
    verdict_cls = "ok" if v.status == "OK" else "warn" if v.ok else "bad"
    name = scenario_name(report)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
    if report.run_status not in (None, "ok"):
        warnings = (f"<li><strong>The load test did not complete (status "
                    f"{esc(str(report.run_status))}): every figure below covers a partial "
                    "run.</strong></li>") + warnings
    warn_html = f'<ul class="warnings">{warnings}</ul>' if warnings else ""
    checks = "".join(
        f"<tr><td>{esc(check)}</td><td>{esc(th)}</td><td>{esc(obs)}</td>"
        f'<td class="r-{esc(res.lower())}">{esc(res)}</td></tr>'
        for check, th, obs, res in check_rows(report))
    tp = throughput_summary(report)
    schedule = send_schedule(report.manifest)
    lat = report.latency
    rates, errors_rate = send_rates(report), error_rates(report)
    figures = [
        ("messages sent", fmt_int(c.messages)),
        ("send rate (target / achieved)",
         " / ".join("-" if r is None else f"{r:,.0f}" for r in (rates.target, rates.achieved))
         + " msg/s" + ("" if rates.share is None else f" ({rates.share * 100:.1f} %)")
         if rates else "unknown"),
        ("error rate (send attempts / deliveries lost)",
         f"{errors_rate.error_share} / {errors_rate.lost_share}"),
        ("deliveries expected / made", f"{fmt_int(a.expected)} / {fmt_int(a.delivered)}"),
        ("latency p50 / p95 / p99 / max",
         " / ".join(fmt_ms(v) for v in (lat.p50_ns, lat.p95_ns, lat.p99_ns, lat.max_ns))
         + " ms" if lat else "no deliveries"),
        ("throughput (steady / mean / peak)",
         f"{tp.steady:,.0f} / {tp.mean:,.0f} / {tp.peak:,.0f} deliveries/s"
         if tp.steady is not None else
         f"{tp.mean:,.0f} deliveries/s mean, {tp.peak:,.0f}/s peak, {tp.seconds} s"),
        ("sends achieved / scheduled",
         f"{fmt_int(schedule.achieved)} / {fmt_int(schedule.slots)}"
         + ("" if schedule.on_time else
            f" ({fmt_int(schedule.skipped)} skipped, {fmt_int(schedule.late)} late)")
         if schedule else "not paced (rate max)" if rates and rates.unpaced
         else "unknown (no pacing counters)"),
        ("records", f"{fmt_int(c.records)} (send {fmt_int(c.send_records)}, "
                    f"recv {fmt_int(c.recv_records)})"),
        ("senders / receivers / groups", f"{c.senders} / {c.receivers} / {c.groups}"),
    ]
    figures_html = "".join(f"<div class=fig><div class=k>{esc(k)}</div>"
                           f"<div class=v>{esc(val)}</div></div>" for k, val in figures)
    compared = comparison_rows(report)
    baseline_html = (
        '<section id="baseline"><h2>Compared with the baseline</h2>'
        f"<p>Baseline: {esc(baseline_name(report))}.</p>"
        f'<p class="noise">{esc(noise_text(report))}</p>'
        + _html_table(COMPARISON_HEADERS, compared, "num")
        + "</section>") if compared else ""
    env_rows = environment_rows(report)
    environment_html = (
        '<section id="environment"><h2>Environment</h2>'
        + (_img(plots, "resources", "CPU and memory over time") if "resources" in plots
           else "")
        + '<table class="kv">' + "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>"
                                         for k, val in env_rows)
        + "</table></section>") if env_rows else ""
    lat_rows = latency_rows(report)
    latency_table = _html_table(LATENCY_HEADERS, lat_rows, "num") if lat_rows else ""

    def breakdown_table(title: str, parts: dict[str, Breakdown]) -> str:
        return _html_table(
            [title, "sent", "expected", "delivered", "lost while registered",
             "lost across reconnect", "undetermined", "duplicated"],
            [[k, fmt_int(b.sent), fmt_int(b.expected), fmt_int(b.delivered),
              fmt_int(b.lost_registered), fmt_int(b.lost_reconnect),
              fmt_int(b.undetermined), fmt_int(b.duplicated)] for k, b in parts.items()],
            "num")

    breakdown = ""
    if report.by_scope:
        breakdown += '<h3 id="by-scope">By scope</h3>' + _html_table(
            *scope_table(report), "num")
    if report.by_group:
        breakdown += _img(plots, "by-group", "breakdown by group") + breakdown_table(
            "group", report.by_group)
    if report.by_process:
        breakdown += _img(plots, "by-process", "breakdown by peer process") + \
            breakdown_table("process", report.by_process)
    errors = report.load_errors
    errors_html = _html_table(
        ["error", "count", "by process"],
        [[e.kind, fmt_int(e.count), ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
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
    scenario_html = "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>"
                            for k, val in scenario_rows(report))
    css = (
        "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1280px;"
        "padding:0 1em;color:#222}"
        "h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;"
        "margin-top:1.6em}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;font-size:90%;text-align:left}"
        "table.num td+td{text-align:right;font-variant-numeric:tabular-nums}"
        "#baseline td:last-child{text-align:left}"
        "table.kv th{background:#f6f6f6;font-weight:600;white-space:nowrap}"
        "img{display:block;width:100%;height:auto;margin:.8em 0}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:85%}"
        ".verdict{padding:.8em 1em;border-radius:6px;font-size:110%;margin:.8em 0}"
        ".verdict.ok{background:#e6f4ea;border:1px solid #2a7}"
        ".verdict.warn{background:#fff4e0;border:1px solid #d80}"
        ".verdict.bad{background:#fdecea;border:1px solid #c22}"
        ".warnings{background:#fff4e0;border:1px solid #d80;padding:.6em 2em}"
        ".r-pass{color:#2a7;font-weight:600}.r-fail{color:#c22;font-weight:600}"
        ".r-accepted,.r-warn{color:#d80;font-weight:600}.r-info{color:#666}"
        ".figs{display:flex;flex-wrap:wrap;gap:.8em}"
        ".fig{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:13em}"
        ".fig .k{color:#666;font-size:85%}.fig .v{font-size:115%;font-weight:600}"
        "details summary{cursor:pointer;color:#246}"
        ".caption{color:#555;font-size:90%;margin-top:-.4em}"
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
<table class="kv">{scenario_html}</table></section>
<section id="checks"><h2>Checks</h2>
<table><thead><tr><th>check</th><th>threshold</th><th>observed</th><th>result</th></tr>
</thead><tbody>{checks}</tbody></table></section>
<section id="summary"><h2>Summary</h2><div class="figs">{figures_html}</div></section>
{baseline_html}
<section id="latency"><h2>Latency</h2>
{_img(plots, "latency-over-time", "latency percentiles over time")}
{caption}
{_img(plots, "latency-histogram", "latency distribution")}
{latency_table}</section>
<section id="throughput"><h2>Throughput</h2>
{_img(plots, "throughput", "throughput over time")}
{caption}</section>
{environment_html}
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
