"""The report's plots, with matplotlib (no display needed), base64-encoded
(:func:`plot_images`): the latency distribution and the latency over time, throughput, CPU
and memory over the run, and the breakdowns by group and peer process; and the caption
that says what the marks on the plots over the run mean (:func:`plot_caption`).

Drawing them takes about a second of Python. :class:`EarlyPlots` draws them in a thread
from a report that lacks only what the plots never show (:data:`LATE_FIELDS`), while the
analysis waits on Spark for the rest.

The two plots over the run (latency and throughput) are SVG, their text kept as text and
each series in a group with an ``id`` (:data:`SERIES_IDS`): sharp at any width, and what
they draw can be read back from the page (the tests do, in headless Chromium). The others
are PNG.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import io
import itertools
import math
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from gossiprouter.analytics.report.environment import environment
from gossiprouter.analytics.report.formatting import fmt_ms
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import Breakdown

__all__ = ["LATE_FIELDS", "SERIES_IDS", "SVG_PLOTS", "EarlyPlots", "log_ticks", "plot_caption",
           "plot_images", "preload"]


T = TypeVar("T")


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


SVG_PLOTS: Final = frozenset({"latency-over-time", "throughput"})
"""The plots drawn as SVG (the others are PNG)."""
SERIES_IDS: Final = {
    "latency-over-time": ("latency-max", "latency-p99", "latency-p95", "latency-p50"),
    "throughput": ("deliveries", "sends", "drain-deliveries", "lost", "drain-span"),
}
"""The ``id`` of each series' group in the SVG plots (a series the run lacks is absent)."""


def _svg(fig: Any, salt: str) -> str:
    # Text as <text>, not paths: readable, searchable and small. The salt keeps the ids
    # matplotlib generates (clip paths, markers) apart between the page's SVGs.
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg")
    return base64.b64encode(buf.getvalue()).decode("ascii")


# Wide figures (1200 px at dpi 100) drawn at the page's width, so they stay sharp on a
# large screen and shrink with a small one. Legends go above the axes, never over the data.
_WIDE: Final = (12.0, 3.6)
_COLORS: Final = {"delivered": "#4c72b0", "sent": "#55a868", "lost": "#c44e52",
                  "reconnect": "#dd8452", "undetermined": "#8c8c8c", "p50": "#4c72b0",
                  "p95": "#8172b3", "p99": "#dd8452", "max": "#c44e52"}


def _pyplot() -> Any:
    # Agg is chosen explicitly so rendering works with no display and ignores MPLBACKEND.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def preload() -> None:
    """Import the plotting library (about a second), e.g. while the JVM starts."""
    with contextlib.suppress(ImportError):
        _pyplot()


def _mark_events(ax: Any, report: Report, labels: bool = True) -> None:
    """Dashed lines for the scenario's events, a shaded span for each router outage (from
    going down until every member was registered again), and the drain period greyed;
    the events named when ``labels``."""
    drain = _drain_span(report)
    if drain is not None and drain[1] > drain[0]:
        span = ax.axvspan(*drain, color="#eeeeee", zorder=0)
        span.set_gid("drain-span")
        if labels:
            # Named where it is, not only in the caption: "sending stopped here".
            ax.annotate("drain (sending stopped)", xy=(drain[0], 0),
                        xycoords=("data", "axes fraction"), xytext=(3, 3),
                        textcoords="offset points", ha="left", va="bottom", fontsize=8,
                        color="#555555", gid="drain-label")
    for i, ev in enumerate(report.events):
        ax.axvline(ev.t_s, color="#555555", linestyle="--", linewidth=1, zorder=1)
        if ev.end_s is not None:
            ax.axvspan(ev.t_s, ev.end_s, color=_COLORS["reconnect"], alpha=0.15, zorder=0)
        if not labels:
            continue
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


def log_ticks(lo: float, hi: float, at_least: int = 4) -> list[float]:
    """Tick positions for a log axis over [lo, hi] (> 0) with at least ``at_least`` of
    them inside: 1-2-5 per decade, else every digit, else evenly spaced values. (On less
    than a decade matplotlib's log locator labels one tick or none.)"""
    if not 0 < lo <= hi:
        return []
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for subs in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in subs]
        inside = [t for t in ticks if lo <= t * (1 + 1e-9) and t <= hi * (1 + 1e-9)]
        if len(inside) >= at_least:
            return inside
    # A narrow range: evenly spaced round values, the widest step that gives enough.
    top = math.floor(math.log10(hi - lo)) if hi > lo else math.floor(math.log10(hi))
    steps = sorted((m * 10.0 ** e for e in range(top - 3, top + 1) for m in (1, 2, 2.5, 5)),
                   reverse=True)
    inside = [lo]
    for step in steps:
        inside = [float(f"{k * step:.12g}") for k in range(math.ceil(lo / step - 1e-9),
                                                          math.floor(hi / step + 1e-9) + 1)]
        if len(inside) >= at_least:
            break
    return inside


def _tick_label(ms: float) -> str:
    # Round tick values read best without trailing zeros ("50", not "50.0").
    text = f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"
    return fmt_ms(ms * 1e6) if "e" in text else text


def _log_axis(axis: Any, lo: float, hi: float) -> None:
    """A log-scale latency axis (ms) over [lo, hi] with readable labels at every tick."""
    from matplotlib import ticker

    ticks = log_ticks(lo, hi)
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FixedFormatter([_tick_label(t) for t in ticks]))
    axis.set_minor_formatter(ticker.NullFormatter())


def _cdf(counts: Sequence[int]) -> list[float]:
    total = sum(counts) or 1
    return list(itertools.accumulate(n / total for n in counts))


def _latency_histogram(fig: Any, ax: Any, report: Report) -> None:
    # A topics run draws each scope on its own: local and global latency are two
    # different paths (one router, or two and the broker), one histogram would mix them.
    scoped = {k: b.histogram for k, b in report.by_scope.items()
              if b.histogram is not None and sum(b.histogram.counts) > 0}
    series = list(scoped.items()) if report.kind == "topics" and scoped else \
        [("deliveries", report.latency_histogram)]
    series = [(k, h) for k, h in series if h.counts and sum(h.counts) > 0]
    if not series:
        _no_deliveries(ax)
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("deliveries")
        return
    ax2 = ax.twinx()
    colors = [_COLORS["delivered"], _COLORS["reconnect"], _COLORS["sent"]]
    lo = hi = 0.0
    for i, (label, hist) in enumerate(series):
        edges_ms = [e / 1e6 for e in hist.edges_ns]
        widths = [b - a for a, b in itertools.pairwise(edges_ms)]
        color = colors[i % len(colors)]
        name = label if label == "deliveries" else f"{label} deliveries"
        ax.bar(edges_ms[:-1], hist.counts, width=widths, align="edge", color=color,
               alpha=0.85 if len(series) == 1 else 0.55, label=name)
        ax2.plot(edges_ms[1:], _cdf(hist.counts), color=color if len(series) > 1
                 else _COLORS["p99"], linestyle="-" if len(series) == 1 else "--",
                 label="cumulative share" if len(series) == 1 else f"{label} CDF")
        used = [(a, b) for (a, b), n in zip(itertools.pairwise(edges_ms), hist.counts,
                                             strict=True) if n]
        lo = min(lo or used[0][0], used[0][0])
        hi = max(hi, used[-1][1])
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    _log_axis(ax.xaxis, lo, hi)
    ax2.set_ylim(0, 1.01)
    ax2.set_ylabel("CDF")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside upper right", ncols=len(h1 + h2),
               frameon=False, fontsize=9)
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("deliveries")


def _latency_over_time(fig: Any, ax: Any, report: Report) -> None:
    pts = report.latency_over_time
    if pts:
        ts = [p.t_s + 0.5 for p in pts]  # drawn at the middle of its second
        values = []
        for key, label in (("max_ns", "max"), ("p99_ns", "p99"), ("p95_ns", "p95"),
                           ("p50_ns", "p50")):
            # p95 is None in an older report: that line is left out, not drawn at 0.
            xy = [(t, getattr(p, key) / 1e6) for t, p in zip(ts, pts, strict=True)
                  if getattr(p, key) is not None]
            if not xy:
                continue
            values += [y for _, y in xy]
            ax.plot([t for t, _ in xy], [y for _, y in xy], marker=".",
                    color=_COLORS[label], label=label, gid=f"latency-{label}")
        ax.set_yscale("log")
        positive = [v for v in values if v > 0]
        if positive:
            lo, hi = min(positive) / 1.15, max(positive) * 1.15
            ax.set_ylim(lo, hi)
            _log_axis(ax.yaxis, lo, hi)
    else:
        _no_deliveries(ax)
    _over_the_run(fig, ax, report, "latency (ms, log scale)")


def _throughput(fig: Any, ax: Any, report: Report) -> None:
    # A second the run covers only partly is drawn as a rate over the part it covers
    # (not as a dip); one covered less than half is left out (a rate over a sliver is
    # noise).
    full = [b for b in report.throughput if b.covered_s >= 0.5]
    # The drain is not a ramp: the lines stop where sending stopped, and the deliveries
    # that came in afterwards are bars of their own (no sends then, so no sends/s).
    drain = _drain_span(report)
    end = drain[0] if drain is not None else math.inf
    # A second that straddles the end of sending (a duration of 8.5 s) is a rate over its
    # sending part, drawn at that part's middle: over the whole second it would halve.
    sending = [(b, min(b.covered_s, end - b.t_s)) for b in report.throughput
               if b.t_s < end and min(b.covered_s, end - b.t_s) >= 0.5]
    draining = [b for b in full if b.t_s >= end]
    ts = [b.t_s + part / 2 for b, part in sending]
    ax.plot(ts, [b.deliveries / part for b, part in sending], marker=".",
            color=_COLORS["delivered"], label="deliveries/s", gid="deliveries")
    ax.plot(ts, [b.sends / part for b, part in sending], marker=".",
            color=_COLORS["sent"], label="sends/s", gid="sends")
    if draining:
        # One step shape (one SVG group), a flat block per second of the drain.
        first, last = draining[0], draining[-1]
        rate = {b.t_s: b.deliveries / b.covered_s for b in draining}
        seconds = range(first.t_s, last.t_s + 1)
        ax.stairs([rate.get(t, 0.0) for t in seconds],
                  [*seconds, last.t_s + last.covered_s], fill=True,
                  color=_COLORS["delivered"], alpha=0.35, label="deliveries/s in the drain",
                  gid="drain-deliveries")
    lost = [(b.t_s + 0.5, b.lost / b.covered_s) for b in full if b.lost]
    if lost:
        ax.scatter([t for t, _ in lost], [n for _, n in lost], color=_COLORS["lost"],
                   marker="x", label="lost/s (by send second)", zorder=3, gid="lost")
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


def _resources(fig: Any, ax: Any, report: Report) -> None:
    """Three panels over the run: CPU (% of one core) of the router and of the load
    generator, their resident memory, and the host's load average (each on its own
    scale: a loaded host's load would flatten a process's CPU on a shared axis)."""
    env = environment(report)
    assert env is not None
    title = ax.get_title(loc="left")
    ax.remove()
    cpu_ax, mem_ax, load_ax = fig.subplots(3, 1, sharex=True)
    cpu_ax.set_title(title, loc="left", fontsize=11)
    colors = {"router": _COLORS["delivered"], "load generator": _COLORS["sent"]}
    for role, ps in env.series.items():
        color = colors.get(role, "#555555")
        if ps.cpu_pct:
            cpu_ax.plot(ps.t_s, ps.cpu_pct, marker=".", color=color, label=role)
        if ps.rss_bytes:
            mem_ax.plot(ps.rss_t_s, [b / 2**20 for b in ps.rss_bytes], marker=".",
                        color=color)
    if env.load:
        load_ax.plot([t for t, _ in env.load], [v for _, v in env.load], marker=".",
                     color=_COLORS["undetermined"])
        if env.cores:
            load_ax.axhline(env.cores, color="#555555", linestyle=":", linewidth=1)
            load_ax.annotate(f"{env.cores} cores", xy=(0, env.cores),
                             xycoords=("axes fraction", "data"), xytext=(3, 2),
                             textcoords="offset points", fontsize=8, color="#333333")
    for a, label in ((cpu_ax, "CPU (% of a core)"), (mem_ax, "memory (MiB)"),
                     (load_ax, "host load (1 min)")):
        a.grid(True, axis="y", color="#e5e5e5")
        a.set_ylim(bottom=0, top=max(a.get_ylim()[1], 1))
        a.set_ylabel(label, fontsize=9)
        _mark_events(a, report, labels=a is cpu_ax)
    load_ax.set_xlim(left=0)
    load_ax.set_xlabel("seconds since the start of the run")
    handles, labels = cpu_ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper right", ncols=len(handles),
                   frameon=False, fontsize=9)


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


def plot_images(report: Report) -> dict[str, str]:
    """Base64 PNGs by section: latency histogram, latency over time, throughput and the
    breakdowns (when there is something to break down)."""
    plt = _pyplot()

    def png(title: str, draw: Callable[[Any, Any, T], None], what: T,
            size: tuple[float, float] = _WIDE, svg: str = "") -> str:
        # One figure at a time, closed whatever happens: pyplot keeps every open one.
        fig, ax = _figure(plt, title, size)
        try:
            draw(fig, ax, what)
            return _svg(fig, svg) if svg else _png(fig)
        finally:
            plt.close(fig)

    plots = {
        "latency-histogram": png("Latency distribution", _latency_histogram, report),
        "latency-over-time": png("Latency over time (by send second)", _latency_over_time,
                                 report, svg="latency-over-time"),
        "throughput": png("Throughput", _throughput, report, svg="throughput"),
    }
    env = environment(report)
    if env is not None and (env.series or env.load):
        plots["resources"] = png("CPU, memory and host load over time", _resources, report,
                                 (12.0, 6.4))
    for key, title, parts in (("by-group", "By group (receivers)", report.by_group),
                              ("by-process", "By peer process (receivers)",
                               report.by_process)):
        if parts:
            plots[key] = png(title, _breakdown, parts, _breakdown_size(parts))
    return plots


def _drain_span(report: Report) -> tuple[float, float] | None:
    config = (report.manifest or {}).get("scenario_config")
    if isinstance(config, dict) and isinstance(config.get("duration"), int | float):
        duration = float(config["duration"])
        return duration, duration + float(config.get("drain") or 0)
    return None


def plot_caption(report: Report) -> str:
    """What the marks on the plots over the run mean: only the marks there are (a run
    without events has no dashed lines to explain)."""
    parts = []
    if report.events:
        parts.append("dashed lines mark the scenario's events")
    if any(e.end_s is not None for e in report.events):
        parts.append("a shaded span is an outage: from a router going down until every "
                     "member was registered again")
    drain = _drain_span(report)
    if drain is not None and drain[1] > drain[0]:
        parts.append("the grey span is the drain: sending stopped, and the deliveries still "
                     "arriving are drawn as blocks of their own, not as the lines running "
                     "down to 0")
    if not parts:
        return ""
    text = "; ".join(parts)
    return f"<p class=caption>{html.escape(text[0].upper() + text[1:])}.</p>"


LATE_FIELDS: Final = frozenset({"audit", "analysis_s", "generated_at", "warnings", "baseline",
                                "allow_loss"})
"""The fields of a :class:`Report` no plot reads: the anomaly samples and the order check
(``audit``), and what is known only when the report is written. (A test holds the plots to
it.)"""


_SWITCH_S: Final = 0.0002


def _plot_inputs(report: Report) -> tuple[Any, ...]:
    return tuple(getattr(report, f.name) for f in dataclasses.fields(report)
                 if f.name not in LATE_FIELDS)


class EarlyPlots:
    """The plots of ``report`` drawn in a daemon thread, started now: an analysis makes
    this from its report before the order check and the samples are in, and the thread
    draws while the main one waits on Spark (it releases the GIL).

    :meth:`images` gives them for the final report if it matches ``report`` on every field
    but :data:`LATE_FIELDS`; otherwise (or if drawing failed) it draws them again."""

    def __init__(self, report: Report) -> None:
        self._inputs = _plot_inputs(report)
        self._images: dict[str, str] | None = None
        self._thread = threading.Thread(target=self._draw, args=(report,), daemon=True,
                                        name="report plots")
        self._thread.start()

    def _draw(self, report: Report) -> None:
        # The main thread waits on Spark's answers; each one should not wait for the GIL
        # for the default 5 ms.
        old = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_S)
        try:
            with contextlib.suppress(Exception):  # drawn again, and raised, by images()
                self._images = plot_images(report)
        finally:
            sys.setswitchinterval(old)

    def images(self, report: Report) -> dict[str, str]:
        """The plots of ``report`` (the final one)."""
        self._thread.join()
        if self._images is not None and _plot_inputs(report) == self._inputs:
            return self._images
        return plot_images(report)
